"""How a local node's start is waited for (``local_ray.nodes.poll_nodes``), against real loopback sockets (the
fake head of tests/infra/fake_ray_head.py): a dashboard that refuses connections for HEAD_GONE seconds in a row
means the head is gone (HeadLost), one that answers slowly or with errors only means "not ready yet" until the
attempt's time runs out."""

from __future__ import annotations

import socket
import subprocess
import threading
import time

import pytest

from miles_ray.adapters.local_ray import nodes
from tests.infra.fake_ray_head import FakeRayHead


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_a_dashboard_refusing_connections_long_enough_is_a_lost_head():
    url = f"http://127.0.0.1:{_free_port()}"  # nothing listens there
    t0 = time.monotonic()
    with pytest.raises(nodes.HeadLost) as exc:
        nodes.poll_nodes(lambda ns: ns, url, budget=60, head_gone_after=1.0)
    assert time.monotonic() - t0 < 30  # not the attempt's whole budget
    assert f"its dashboard at {url} has refused connections for" in exc.value.reason


def test_a_head_whose_ray_start_has_exited_is_lost_at_once_and_a_live_one_is_waited_for():
    """The head's own `ray start --block` (here a real process) gone: HeadLost at the first look, naming its PID,
    long before head_gone_after; while it lives, refusals count towards head_gone_after as before."""
    url = f"http://127.0.0.1:{_free_port()}"  # nothing listens there
    ended = subprocess.Popen(["true"])
    ended.wait()
    t0 = time.monotonic()
    with pytest.raises(nodes.HeadLost) as exc:
        nodes.poll_nodes(lambda ns: ns, url, budget=60, head_gone_after=30.0, head={"pid": ended.pid, "_popen": ended})
    assert time.monotonic() - t0 < 10  # not head_gone_after (30 s)
    assert exc.value.reason.startswith(f"the head node's `ray start` (PID {ended.pid}) has exited")
    alive = subprocess.Popen(["sleep", "60"])
    try:
        t0 = time.monotonic()
        with pytest.raises(nodes.HeadLost) as exc:
            nodes.poll_nodes(lambda ns: ns, url, budget=60, head_gone_after=1.0, head={"pid": alive.pid, "_popen": alive})
        assert f"its dashboard at {url} has refused connections for" in exc.value.reason
        assert time.monotonic() - t0 >= 1.0
    finally:
        alive.kill()
        alive.wait()


def test_without_head_gone_after_refusals_only_time_the_attempt_out():
    url = f"http://127.0.0.1:{_free_port()}"
    with pytest.raises(nodes.NodeDidNotStart) as exc:
        nodes.poll_nodes(lambda ns: ns, url, budget=2.0)
    assert exc.value.timed_out and "not ready within 2.0s" in exc.value.reason and "refused" in exc.value.reason


def test_a_dashboard_answering_errors_is_not_ready_yet_not_lost():
    srv = FakeRayHead(status=503)
    try:
        with pytest.raises(nodes.NodeDidNotStart) as exc:
            nodes.poll_nodes(lambda ns: ns, srv.url, budget=2.5, head_gone_after=0.5)
        assert exc.value.timed_out and "503" in exc.value.reason
    finally:
        srv.close()


def test_refusals_then_an_answer_reset_the_lost_head_clock():
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    row = {"node_name": "w", "state": "ALIVE"}
    started: list[FakeRayHead] = []

    def start_later():
        time.sleep(1.0)  # refused for 1 s, less than head_gone_after
        started.append(FakeRayHead(port=port, rows=[row]))

    t = threading.Thread(target=start_later)
    t.start()
    try:
        got = nodes.poll_nodes(lambda ns: [n for n in ns if n["node_name"] == "w"], url, budget=30, head_gone_after=3.0)
        assert got == [row]
    finally:
        t.join()
        for s in started:
            s.close()


@pytest.mark.parametrize("status", [401, 403])
def test_a_dashboard_refusing_this_clusters_token_is_another_clusters_and_fails_the_attempt_at_once(status, monkeypatch):
    # Two clusters starting at once can both find 8265 free; the head that lost the race then polls the other
    # cluster's dashboard, which refuses its token. That attempt must end (new ports next time), not wait it out.
    monkeypatch.setattr(nodes, "FOREIGN_DASHBOARD_SECONDS", 1.0)
    srv = FakeRayHead(status=status)
    try:
        t0 = time.monotonic()
        with pytest.raises(nodes.NodeDidNotStart) as exc:
            nodes.poll_nodes(lambda ns: ns, srv.url, budget=60)
        assert time.monotonic() - t0 < 30
        assert not exc.value.timed_out
        assert f"{srv.url} answers HTTP {status} to this cluster's token" in exc.value.reason
    finally:
        srv.close()


def test_one_refusal_of_the_token_then_an_answer_is_not_a_foreign_dashboard(monkeypatch):
    monkeypatch.setattr(nodes, "FOREIGN_DASHBOARD_SECONDS", 1.5)
    srv = FakeRayHead(status=403, rows=[{"state": "ALIVE"}])
    try:
        threading.Timer(0.6, lambda: setattr(srv, "status", 200)).start()
        got = nodes.poll_nodes(lambda ns: ns, srv.url, budget=20)
        assert got == [{"state": "ALIVE"}]
    finally:
        srv.close()
