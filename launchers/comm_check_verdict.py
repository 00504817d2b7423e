"""comm-check's verdict (part of ``comm_check.py``, run by its driver and shipped beside it): why the group was not
placed, what each peer said when it started, the transport (the ``--backend`` flag and the result's ``backend``
field), who a failed ring blames, and the result's summary. Only the standard library; ``ray`` is passed in."""

from __future__ import annotations

import time


def _first_line(e: Exception) -> str:
    return f"{type(e).__name__}: {str(e).splitlines()[0][:200]}"


def unplaceable(result: dict, alive: list[dict], ip_of: dict, timeout: float) -> None:
    """The group of one bundle per GPU node was not ready within ``timeout``: each node, busy or unknown, and
    the error, into ``result``."""
    try:
        from ray._private.state import available_resources_per_node

        free = available_resources_per_node()
    except Exception:  # noqa: BLE001
        free = {}
    for n in alive:
        avail = free.get(n["NodeID"], {})
        busy = free and (avail.get("GPU", 0) < 1 or avail.get("CPU", 0) < 1)
        result["nodes"].append({"ip": ip_of[n["NodeID"]], "node_id": n["NodeID"], "ok": False,
                                "status": "unplaceable" if busy else "unknown",
                                "error": (f"no free GPU+CPU on this node (free GPU {avail.get('GPU', 0):g}, "
                                          f"CPU {avail.get('CPU', 0):g}): is a job running?") if busy else
                                         "placement group not ready"})
    result["errors"].append(f"placement group of {len(alive)} bundles {{GPU: 1, CPU: 1}} (STRICT_SPREAD, one per "
                            f"GPU node) not ready after {timeout:g}s")


def read_hellos(ray, actors: list, bundle_node: dict, ip_of: dict, timeout: float,
                result: dict) -> tuple[dict[int, dict], dict[int, dict]]:
    """Ask every peer where it is (bounded by ``timeout``): the answers by bundle, and each bundle's entry of the
    result (an unreachable one says why)."""
    hello_refs = [a.hello.remote() for a in actors]
    t_hello = time.monotonic()
    done, _ = ray.wait(hello_refs, num_returns=len(hello_refs), timeout=timeout)
    hellos: dict[int, dict] = {}
    per_node: dict[int, dict] = {}
    for i, ref in enumerate(hello_refs):
        nid = bundle_node.get(i) or "?"
        entry = {"ip": ip_of.get(nid, "?"), "node_id": nid, "bundle": i}
        if ref in done:
            try:
                hellos[i] = ray.get(ref)
                entry.update({k: hellos[i][k] for k in ("ip", "node_id", "interface", "address", "via", "gpu_ids")})
            except Exception as e:  # noqa: BLE001 - the actor died while starting
                entry.update({"ok": False, "status": "unreachable", "error": f"actor failed to start: {_first_line(e)}"})
        else:
            entry.update({"ok": False, "status": "unreachable", "error": f"actor did not start within {timeout:g}s"})
        per_node[i] = entry
    result["seconds_start"] = round(time.monotonic() - t_hello, 2)
    return hellos, per_node


def choose_transport(asked: str, infos: list[dict]) -> str:
    """The transport: the one asked for, else nccl when every peer has torch with CUDA, gloo when every peer has
    torch, else the TCP stand-in."""
    if asked != "auto":
        return asked
    if infos and all(x["torch"] and x["cuda"] for x in infos):
        return "nccl"
    if infos and all(x["torch"] for x in infos):
        return "gloo"
    return "tcp"


def judge_ring(ray, run_refs: list, ranks: list[int], peers: list[tuple[str, int]], per_node: dict[int, dict],
               bound: float) -> None:
    """Wait for every rank's part of the all-reduce (bounded by ``bound``) and mark each node: ok, failed, or
    unreachable when other ranks blame their connection to it."""
    finished, _ = ray.wait(run_refs, num_returns=len(run_refs), timeout=bound)
    outcomes = []
    for r, ref in enumerate(run_refs):
        if ref in finished:
            try:
                outcomes.append(ray.get(ref))
            except Exception as e:  # noqa: BLE001
                outcomes.append({"ok": False, "blame": r, "error": _first_line(e)})
        else:
            outcomes.append({"ok": False, "blame": None, "error": f"ring did not finish within {bound:g}s"})
    blamed = {o["blame"] for o in outcomes if not o["ok"] and o.get("blame") is not None}
    for r, (i, o) in enumerate(zip(ranks, outcomes)):
        entry = per_node[i]
        entry.update({k: o.get(k) for k in ("seconds", "bytes_sent", "bytes_per_s")})
        entry["rank"] = r
        if o["ok"] and r not in blamed:
            entry.update({"ok": True, "status": "ok", "error": None})
        elif r in blamed:
            who = [f"{peers[q][0]} (rank {q})" for q, oo in enumerate(outcomes)
                   if not oo["ok"] and oo.get("blame") == r and q != r]
            entry.update({"ok": False, "status": "unreachable",
                          "error": (f"ring connection to this node failed (reported by {', '.join(who)}: "
                                    + "; ".join(oo["error"] for q, oo in enumerate(outcomes)
                                                if not oo["ok"] and oo.get("blame") == r and q != r) + ")")
                          if who else o.get("error")})
        else:
            entry.update({"ok": False, "status": "failed", "error": o.get("error")})


def conclude(result: dict, per_node: dict[int, dict], t_start: float) -> None:
    """The nodes in order, the unreachable ones named, the verdict and the slowest rate into ``result``; one line
    per node printed."""
    nodes = sorted(per_node.values(), key=lambda e: (e.get("ip") or "", e.get("node_id") or ""))
    result["nodes"] = nodes
    unreachable = [e for e in nodes if e.get("status") == "unreachable"]
    if unreachable:
        result["errors"].append("unreachable: " + ", ".join(f"{e['ip']} ({(e['node_id'] or '?')[:12]})"
                                                             for e in unreachable))
    result["ok"] = bool(nodes) and all(e.get("ok") for e in nodes)
    bw = [e["bytes_per_s"] for e in nodes if e.get("ok") and e.get("bytes_per_s")]
    result["min_bytes_per_s"] = min(bw) if bw else None
    result["seconds_total"] = round(time.monotonic() - t_start, 2)
    for e in nodes:
        rate = f"{e['bytes_per_s'] / 1e6:.1f} MB/s" if e.get("bytes_per_s") else "-"
        print(f"  {e['ip']:<16} {(e['node_id'] or '?')[:12]:<12} {str(e.get('interface')):<10} "
              f"{'PASS' if e.get('ok') else 'FAIL'} {rate:>12}  {e.get('error') or ''}", flush=True)
