#!/usr/bin/env python3
"""Cross-node communication check: runs AS a Ray job before training.

One actor per GPU node -- a placement group of one ``{GPU: 1, CPU: 1}`` bundle per node, strategy
STRICT_SPREAD, with a bounded wait -- reports its node IP and the network interface that owns that IP
(``ip -j addr``, else the SIOCGIFADDR/SIOCGIFNETMASK ioctls), then all actors run one all-reduce:

* ``nccl`` (torch.distributed) when every node has torch with CUDA (the Miles image);
* ``gloo`` (torch.distributed, CPU) when every node has torch but no GPU;
* otherwise ``tcp (torch not installed)``: a ring all-reduce over plain TCP sockets implemented here
  (reduce-scatter then all-gather, 2(N-1) steps of size/N bytes per node) -- the stand-in used where
  torch is absent (CI). It moves real bytes between the nodes' IPs and checks the sum.

For each node: pass/fail, the interface, bytes/second of its ring traffic, and why it failed. A node
whose actor does not start within ``--timeout`` or whose ring connection fails is named by IP and node
id; the remaining nodes still run the ring among themselves.

Last line: ``MILES_RAY_PROBE_RESULT {json}``; exit 0 when every node passed, 1 otherwise. Imports only ray,
the standard library and torch when present. What runs on the peers (the interface, the transports, the
``Peer`` actor) is here, shipped by value; the driver's verdict is in ``comm_check_verdict.py`` beside it.
"""

from __future__ import annotations

import argparse
import ipaddress
import json
import os
import socket
import struct
import subprocess
import sys
import threading
import time

RESULT_PREFIX = "MILES_RAY_PROBE_RESULT "
TCP_BACKEND = "tcp (torch not installed)"


# ------------------------------------------------------------------------------------------------
# network interface owning an IP
# ------------------------------------------------------------------------------------------------

def _iface_from_ip_json(ip: str) -> tuple[str, str, str] | None:
    try:
        res = subprocess.run(["ip", "-j", "addr"], capture_output=True, text=True, timeout=5)
        data = json.loads(res.stdout) if res.returncode == 0 else None
    except (OSError, ValueError, subprocess.SubprocessError):
        return None
    if not isinstance(data, list):
        return None
    target = ipaddress.ip_address(ip)
    containing = None
    for link in data:
        for a in link.get("addr_info") or []:
            try:
                net = ipaddress.ip_interface(f"{a['local']}/{a.get('prefixlen', 32)}")
            except (KeyError, ValueError):
                continue
            if net.ip == target:
                return link.get("ifname", "?"), str(net), "ip -j addr"
            if containing is None and target in net.network:
                containing = (link.get("ifname", "?"), str(net), "ip -j addr (subnet)")
    return containing


def _iface_from_ioctl(ip: str) -> tuple[str, str, str] | None:
    try:
        import fcntl
    except ImportError:  # pragma: no cover - not Linux
        return None
    target = ipaddress.ip_address(ip)
    containing = None
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        for _, name in socket.if_nameindex():
            req = struct.pack("256s", name[:15].encode())
            try:
                addr = socket.inet_ntoa(fcntl.ioctl(s.fileno(), 0x8915, req)[20:24])  # SIOCGIFADDR
                mask = socket.inet_ntoa(fcntl.ioctl(s.fileno(), 0x891B, req)[20:24])  # SIOCGIFNETMASK
            except OSError:
                continue
            net = ipaddress.ip_interface(f"{addr}/{mask}")
            if net.ip == target:
                return name, str(net), "ioctl"
            if containing is None and target in net.network:
                containing = (name, str(net), "ioctl (subnet)")
    finally:
        s.close()
    return containing


def interface_for(ip: str) -> dict:
    """The interface owning ``ip`` (exact address, else the interface whose subnet contains it)."""
    for fn in (_iface_from_ip_json, _iface_from_ioctl):
        try:
            found = fn(ip)
        except Exception:  # noqa: BLE001 - best effort; reported as unknown
            found = None
        if found:
            return {"interface": found[0], "address": found[1], "via": found[2]}
    return {"interface": None, "address": None, "via": "no interface owns this IP"}


# ------------------------------------------------------------------------------------------------
# the plain-TCP ring all-reduce (stand-in where torch is absent)
# ------------------------------------------------------------------------------------------------

def _recv_exact(conn: socket.socket, view: memoryview) -> None:
    got = 0
    while got < len(view):
        n = conn.recv_into(view[got:])
        if n == 0:
            raise ConnectionError("peer closed the connection")
        got += n


def ring_allreduce(listener: socket.socket, rank: int, peers: list[tuple[str, int]], size_bytes: int,
                   timeout: float) -> dict:
    """Sum a float64 vector of ~size_bytes across ``peers`` (rank order) over TCP; verify; time it."""
    m = len(peers)
    # uint64 lanes holding small numbers: adding two chunks as little-endian big integers is then a
    # lane-wise sum (no carry can cross a lane), so the reduction runs at C speed without numpy.
    lanes = max(m, size_bytes // 8 // m * m)
    chunk = lanes // m * 8
    data = bytearray(struct.pack("<Q", rank + 1) * lanes)
    nxt, prv = (rank + 1) % m, (rank - 1) % m
    deadline = time.monotonic() + timeout
    accepted: dict = {}

    def _accept() -> None:
        try:
            listener.settimeout(max(0.1, deadline - time.monotonic()))
            conn, _ = listener.accept()
            accepted["conn"] = conn
        except Exception as e:  # noqa: BLE001
            accepted["error"] = e

    t_acc = threading.Thread(target=_accept, daemon=True)
    t_acc.start()
    out_conn = None
    last_err: Exception | None = None
    # Every listener exists before any ring starts, so a refusal that lasts ~2 s means the port is closed.
    refused_until = time.monotonic() + min(2.0, timeout)
    while time.monotonic() < deadline:
        try:
            out_conn = socket.create_connection(peers[nxt], timeout=max(0.1, min(5.0, deadline - time.monotonic())))
            break
        except OSError as e:
            last_err = e
            if isinstance(e, ConnectionRefusedError) and time.monotonic() > refused_until:
                break
            time.sleep(0.1)
    if out_conn is None:
        listener.close()  # pending connections from our upstream peer get a reset instead of a stall
        return {"ok": False, "blame": nxt, "error": f"cannot connect to ring peer {peers[nxt][0]}:{peers[nxt][1]} "
                                                    f"({type(last_err).__name__}: {last_err})"}
    t_acc.join(max(0.1, deadline - time.monotonic()))
    in_conn = accepted.get("conn")
    if in_conn is None:
        out_conn.close()
        listener.close()
        err = accepted.get("error")
        if err is not None and not isinstance(err, (socket.timeout, TimeoutError)):
            return {"ok": False, "blame": rank, "error": f"this node's ring listener failed ({type(err).__name__}: {err})"}
        return {"ok": False, "blame": prv, "error": f"ring peer {peers[prv][0]} never connected within {timeout:g}s"}
    for c in (in_conn, out_conn):
        c.settimeout(max(1.0, deadline - time.monotonic()))
        c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def view(i: int) -> memoryview:
        return memoryview(data)[i * chunk:(i + 1) * chunk]

    recv_buf = bytearray(chunk)
    recv_view = memoryview(recv_buf)
    sent = 0
    t0 = time.monotonic()
    try:
        for phase in ("reduce-scatter", "all-gather"):
            for s in range(m - 1):
                if phase == "reduce-scatter":
                    send_i, recv_i = (rank - s) % m, (rank - s - 1) % m
                else:
                    send_i, recv_i = (rank - s + 1) % m, (rank - s) % m
                payload = view(send_i)
                err: dict = {}

                def _send(p=payload) -> None:
                    try:
                        out_conn.sendall(p)
                    except Exception as e:  # noqa: BLE001
                        err["e"] = e

                ts = threading.Thread(target=_send, daemon=True)
                ts.start()
                _recv_exact(in_conn, recv_view)
                ts.join()
                if "e" in err:
                    raise err["e"]
                sent += len(payload)
                lo, hi = recv_i * chunk, (recv_i + 1) * chunk
                if phase == "reduce-scatter":
                    total = int.from_bytes(data[lo:hi], "little") + int.from_bytes(recv_buf, "little")
                    data[lo:hi] = total.to_bytes(chunk, "little")
                else:
                    data[lo:hi] = recv_buf
    except Exception as e:  # noqa: BLE001
        return {"ok": False, "blame": None, "error": f"ring transfer failed after {sent} bytes "
                                                     f"({type(e).__name__}: {e})"}
    finally:
        for c in (in_conn, out_conn, listener):
            try:
                c.close()
            except OSError:
                pass
    seconds = time.monotonic() - t0
    expected = m * (m + 1) // 2
    ok = data == struct.pack("<Q", expected) * lanes
    return {"ok": ok, "blame": None if ok else rank,
            "error": None if ok else f"wrong all-reduce result (expected every element == {expected})",
            "seconds": round(seconds, 6), "bytes": lanes * 8, "bytes_sent": sent,
            "bytes_per_s": round(sent / seconds, 1) if seconds > 0 else None}


def torch_allreduce(backend: str, rank: int, world: int, master: tuple[str, int], size_bytes: int,
                    timeout: float, iface: str | None) -> dict:
    """All-reduce through torch.distributed (nccl on GPU, gloo on CPU). Not exercised where torch is absent."""
    import datetime

    import torch
    import torch.distributed as dist

    if iface:
        os.environ.setdefault("NCCL_SOCKET_IFNAME" if backend == "nccl" else "GLOO_SOCKET_IFNAME", iface)
    dist.init_process_group(backend, init_method=f"tcp://{master[0]}:{master[1]}", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=timeout))
    try:
        n = max(1, size_bytes // 4)
        device = "cuda" if backend == "nccl" else "cpu"
        x = torch.full((n,), float(rank + 1), dtype=torch.float32, device=device)
        dist.all_reduce(x)  # warm-up
        x.fill_(float(rank + 1))
        if device == "cuda":
            torch.cuda.synchronize()
        t0 = time.monotonic()
        dist.all_reduce(x)
        if device == "cuda":
            torch.cuda.synchronize()
        seconds = time.monotonic() - t0
        expected = world * (world + 1) / 2
        ok = bool(torch.all(x == expected).item())
        sent = 2 * (world - 1) * (n * 4 // world)  # ring-equivalent bytes per rank (NCCL-tests busbw)
        return {"ok": ok, "blame": None if ok else rank, "error": None if ok else "wrong all-reduce result",
                "seconds": round(seconds, 6), "bytes": n * 4, "bytes_sent": sent,
                "bytes_per_s": round(sent / seconds, 1) if seconds > 0 else None}
    finally:
        dist.destroy_process_group()


# ------------------------------------------------------------------------------------------------
# driver
# ------------------------------------------------------------------------------------------------

def emit(result: dict) -> None:
    sys.stdout.flush()
    # one write call: print() writes the text and its newline separately, and Ray's log thread
    # prints the workers' lines to this stdout in between
    sys.stdout.write(RESULT_PREFIX + json.dumps(result, sort_keys=True) + "\n")
    sys.stdout.flush()


def _peer_class(ray):
    """The actor on each GPU node: its IP, interface and torch, then its part of the all-reduce. Defined in this
    script (the ``__main__`` module) so that Ray ships it and the transports above by value: the peers run in the
    nodes' plain workers, without this job's working_dir (probe_tasks.py)."""

    @ray.remote(num_gpus=1, num_cpus=1)
    class Peer:
        def __init__(self):
            self.ip = ray.util.get_node_ip_address()
            self.node_id = ray.get_runtime_context().get_node_id()
            self.listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            self.listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            self.listener.bind((self.ip, 0))
            self.listener.listen(4)
            self.port = self.listener.getsockname()[1]

        def hello(self) -> dict:
            info = {"ip": self.ip, "node_id": self.node_id, "port": self.port, **interface_for(self.ip),
                    "gpu_ids": [str(x) for x in ray.get_gpu_ids()], "torch": None, "cuda": False}
            try:
                import torch

                info["torch"] = torch.__version__
                info["cuda"] = bool(torch.cuda.is_available())
            except Exception:  # noqa: BLE001 - torch absent or broken: the TCP stand-in is used
                pass
            return info

        def run(self, transport: str, rank: int, peers: list, size_bytes: int, timeout: float) -> dict:
            if transport == "tcp":
                return ring_allreduce(self.listener, rank, [tuple(x) for x in peers], size_bytes, timeout)
            if rank == 0:
                self.listener.close()  # torch's TCPStore takes rank 0's port
            iface = interface_for(self.ip)["interface"]
            return torch_allreduce(transport, rank, len(peers), tuple(peers[0]), size_bytes, timeout, iface)

    return Peer


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--size-mb", type=float, default=16.0, help="all-reduce payload per node (MiB)")
    p.add_argument("--timeout", type=float, default=60.0, help="bound on placement, actor start and the ring (s)")
    p.add_argument("--backend", choices=("auto", "tcp", "gloo", "nccl"), default="auto")
    p.add_argument("--address", default=None)
    args = p.parse_args(argv)
    t_start = time.monotonic()
    result: dict = {"ok": False, "nodes": [], "errors": [], "size_bytes": int(args.size_mb * 2**20)}

    import ray
    from ray.util.placement_group import placement_group, placement_group_table, remove_placement_group
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    address = args.address or os.environ.get("RAY_ADDRESS") or "auto"
    if address.startswith(("http://", "https://")):
        address = "auto"
    from comm_check_verdict import choose_transport, conclude, judge_ring, read_hellos, unplaceable
    from probe_tasks import without_the_jobs_runtime_env

    without_the_jobs_runtime_env()  # the peers run in the nodes' plain workers (probe_tasks.py)
    ray.init(address=address, logging_level="WARNING", log_to_driver=True)

    alive = [n for n in ray.nodes() if n.get("Alive") and float((n.get("Resources") or {}).get("GPU", 0)) > 0]
    alive.sort(key=lambda n: (n.get("NodeManagerAddress") or "", n["NodeID"]))
    ip_of = {n["NodeID"]: n.get("NodeManagerAddress") for n in alive}
    n_nodes = len(alive)
    result["gpu_nodes"] = n_nodes
    print(f"comm-check: {n_nodes} GPU node(s): {', '.join(ip_of[n['NodeID']] for n in alive)}", flush=True)
    if n_nodes == 0:
        result["errors"].append("no alive node advertises a GPU")
        emit(result)
        return 1

    # ---- one bundle per GPU node, STRICT_SPREAD, bounded wait ----------------------------------
    pg = placement_group([{"GPU": 1, "CPU": 1}] * n_nodes, strategy="STRICT_SPREAD")
    ready, _ = ray.wait([pg.ready()], timeout=args.timeout)
    if not ready:
        unplaceable(result, alive, ip_of, args.timeout)
        remove_placement_group(pg)
        emit(result)
        return 1
    bundle_node = placement_group_table(pg).get("bundles_to_node_id", {})

    # ---- a peer in each bundle says where it is ------------------------------------------------
    Peer = _peer_class(ray)
    actors = [Peer.options(scheduling_strategy=PlacementGroupSchedulingStrategy(
        placement_group=pg, placement_group_bundle_index=i)).remote() for i in range(n_nodes)]
    hellos, per_node = read_hellos(ray, actors, bundle_node, ip_of, args.timeout, result)
    ranks = sorted(hellos, key=lambda i: (hellos[i]["ip"], hellos[i]["node_id"]))
    transport = choose_transport(args.backend, [hellos[i] for i in ranks])
    result["backend"] = TCP_BACKEND if transport == "tcp" else transport
    print(f"comm-check: backend {result['backend']}, {len(ranks)} of {n_nodes} node(s) in the ring, "
          f"{result['size_bytes']} bytes", flush=True)

    # ---- the all-reduce among the peers that answered ------------------------------------------
    if len(ranks) >= 2:
        peers = [(hellos[i]["ip"], hellos[i]["port"]) for i in ranks]
        run_refs = [actors[i].run.remote(transport, r, peers, result["size_bytes"], args.timeout)
                    for r, i in enumerate(ranks)]
        judge_ring(ray, run_refs, ranks, peers, per_node, args.timeout + 15)
    elif len(ranks) == 1:
        entry = per_node[ranks[0]]
        entry["rank"] = 0
        if n_nodes == 1:
            entry.update({"ok": True, "status": "ok", "error": None, "bytes_per_s": None,
                          "note": "single GPU node: no cross-node traffic to measure"})
        else:
            entry.update({"ok": False, "status": "failed", "error": "no other reachable node to form a ring with"})

    for a in actors:
        try:
            ray.kill(a)
        except Exception:  # noqa: BLE001
            pass
    remove_placement_group(pg)
    conclude(result, per_node, t_start)
    emit(result)
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
