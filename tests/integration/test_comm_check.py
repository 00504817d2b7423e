"""`miles-ray comm-check` against the real embedded Ray cluster (head + 4 worker raylets x 8 fake GPUs).

torch is not installed here, so the all-reduce is the payload's plain-TCP ring (backend
"tcp (torch not installed)"): real bytes between the worker nodes' IPs (127.0.0.3..6 on loopback).
The unreachable-node cases are FAULTS INJECTED BY THE TEST BACKEND, not by the product (which has no switch
for them): an extra GPU worker joins the cluster with tests/infra/comm_fault/sitecustomize.py loaded in its
processes, so on that node the comm check's listener never listens, or its actor never starts."""

from __future__ import annotations

from miles_ray.core.errors import EXIT_CHECKS_FAILED
import json
import time

import pytest

from miles_ray.adapters.ray_jobs import cluster_topology
from tests.infra.faulty_nodes import NodeSpec, comm_fault_env, extra_nodes

pytestmark = pytest.mark.ray

CHECK_FAILED = EXIT_CHECKS_FAILED  # checks found problems (the report is printed first)


def gpu_nodes(address: str) -> list[dict]:
    return [n for n in cluster_topology(address)["nodes"] if n["gpus"] > 0]


def test_all_four_nodes_pass_with_bandwidth(env, cli):
    nodes = gpu_nodes(env.address)
    assert len(nodes) == 4
    t0 = time.monotonic()
    code, out, err = cli("comm-check", "--address", env.address, "--size-mb", "8", "--timeout", "60", "-o", "json")
    seconds = time.monotonic() - t0
    assert code == 0, err
    report = json.loads(out)
    assert report["ok"] is True and report["backend"] == "tcp (torch not installed)"
    assert report["job_status"] == "SUCCEEDED" and report["gpu_nodes"] == 4
    assert {n["ip"] for n in report["nodes"]} == {n["ip"] for n in nodes}
    assert {n["node_id"] for n in report["nodes"]} == {n["node_id"] for n in nodes}
    for n in report["nodes"]:
        assert n["ok"] is True and n["status"] == "ok"
        assert n["bytes_per_s"] > 0 and n["bytes_sent"] == 2 * 3 * (8 * 2**20 // 4)  # 2(N-1) chunks of size/N
        assert n["interface"] == "lo"  # 127.0.0.x belongs to the loopback interface (127.0.0.1/8)
    print(f"\ncomm-check 4 nodes, 8 MiB tcp ring: slowest node {report['min_bytes_per_s'] / 1e6:.1f} MB/s, "
          f"per node {[round(n['bytes_per_s'] / 1e6, 1) for n in report['nodes']]} MB/s, CLI {seconds:.1f}s")


def test_table_output_names_backend_and_passes(env, cli):
    code, out, err = cli("comm-check", "--address", env.address, "--size-mb", "1", "--timeout", "60")
    assert code == 0, err
    assert "tcp (torch not installed)" in out and "comm check passed" in out
    assert out.count("PASS") == 4


def test_closed_port_names_the_unreachable_node(env, cli):
    """FAULT INJECTED BY THE TEST BACKEND: on an extra GPU node, the ring's listener is announced but never
    listens, so the peer that must connect to it is refused."""
    healthy = gpu_nodes(env.address)
    with extra_nodes(env.status(), [NodeSpec("127.0.0.71", "closed-port", env=comm_fault_env("closed-port"))]) as [node]:
        code, out, err = cli("comm-check", "--address", env.address, "--size-mb", "1", "--timeout", "20", "-o", "json")
    assert code == CHECK_FAILED, out + err
    report = json.loads(out)
    assert report["ok"] is False and report["gpu_nodes"] == len(healthy) + 1 == 5
    bad = [n for n in report["nodes"] if n["status"] == "unreachable"]
    assert [(n["ip"], n["node_id"]) for n in bad] == [(node.ip, node.node_id)]
    assert "Connection refused" in bad[0]["error"]
    assert any(node.ip in e and node.node_id[:12] in e for e in report["errors"])


def test_actor_that_never_starts_is_named_and_the_rest_still_ring(env, cli):
    """FAULT INJECTED BY THE TEST BACKEND: on an extra GPU node, the comm check's actor blocks in its constructor
    past the timeout (20 s: on a fully loaded machine a healthy node's actor once took over 10 s to start)."""
    healthy = gpu_nodes(env.address)
    with extra_nodes(env.status(), [NodeSpec("127.0.0.72", "no-start", env=comm_fault_env("no-start"))]) as [node]:
        code, out, err = cli("comm-check", "--address", env.address, "--size-mb", "1", "--timeout", "20")
    assert code == CHECK_FAILED, out + err
    assert node.ip in out and "actor did not start within 20s" in out and "comm check FAILED" in out
    assert out.count("PASS") == len(healthy) == 4  # the four others formed a ring among themselves


def test_bad_input_and_no_head(env, cli):
    code, _, err = cli("comm-check", "--address", env.address, "--size-mb", "0")
    assert code == 2 and "--size-mb" in err
    # fault injection is the test backend's job: the product has no such option
    code, _, err = cli("comm-check", "--address", env.address, "--inject-fault", "explode:1.2.3.4")
    assert code == 2 and "No such option: --inject-fault" in err
    code, _, err = cli("comm-check", "--address", "k8s://ml")
    assert code == 2 and "is not k8s://NAMESPACE/RAYCLUSTER" in err
    code, _, err = cli("comm-check", "--address", "http://127.0.0.1:9")
    assert code == 1 and "cannot reach the Ray Jobs API at http://127.0.0.1:9" in err
    assert "Traceback" not in err


# ---------------------------------------------------------------------------------------------
# the payload's pieces, in one process (real sockets on 127.0.0.x, no Ray)
# ---------------------------------------------------------------------------------------------

def _ring(n: int, size: int, close_rank: int | None = None, timeout: float = 10.0) -> list[dict]:
    import socket
    import threading

    from launchers.comm_check import ring_allreduce

    listeners = []
    for i in range(n):
        s = socket.socket()
        s.bind((f"127.0.0.{10 + i}", 0))
        s.listen(4)
        listeners.append(s)
    peers = [s.getsockname() for s in listeners]
    if close_rank is not None:
        listeners[close_rank].close()  # FAULT INJECTION: an announced port that is closed
    results: list = [None] * n
    threads = [threading.Thread(target=lambda r=r: results.__setitem__(
        r, ring_allreduce(listeners[r], r, peers, size, timeout))) for r in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout + 10)
    return results


def test_tcp_ring_sums_and_counts_bytes():
    results = _ring(3, 3 * 2**20)
    lanes = 3 * 2**20 // 8 // 3 * 3
    for r in results:
        assert r["ok"] is True and r["bytes"] == lanes * 8
        assert r["bytes_sent"] == 2 * 2 * (lanes // 3 * 8) and r["bytes_per_s"] > 0


def test_tcp_ring_blames_the_node_with_the_closed_port():
    results = _ring(3, 2**16, close_rank=1, timeout=8)
    assert not any(r["ok"] for r in results)
    assert results[0]["blame"] == 1 and "Connection refused" in results[0]["error"]
    assert results[1]["blame"] == 1  # its own listener is gone


def test_interface_owning_an_ip():
    from launchers.comm_check import interface_for

    assert interface_for("127.0.0.1")["interface"] == "lo"
    assert interface_for("127.0.0.5")["interface"] == "lo"  # inside lo's 127.0.0.0/8
    assert interface_for("203.0.113.7")["interface"] is None  # TEST-NET-3: owned by nothing here
