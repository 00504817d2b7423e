"""The wait for GPU workers, one rule for the CLI and the run supervisor (core/supervision.py gpu_workers_ready, shipped
beside launchers/supervise.py): a node whose pod was deleted stays ALIVE in Ray until its health checks fail, and
it never stands in for its replacement. The supervisor -- whose wait runs right after a node loss, with no view of
the pods -- is the shipped program, imported from its own directory, against a stand-in head API on a fake clock."""

from __future__ import annotations


import pytest

from miles_ray.adapters import ray_jobs
from miles_ray.controller import rules
from miles_ray.core import supervision as sv
from miles_ray.core.errors import TimedOut
from tests.infra.fake_ray_head import node, shipped_program


HEAD = node("H", "10.0.0.1", gpus=0, head=True)


@pytest.fixture
def program(tmp_path):
    with shipped_program(tmp_path, "shipped_supervise_wait") as mod:
        yield mod


class Clock:
    """time.time / time.monotonic of the program, moved on by its sleeps."""

    def __init__(self) -> None:
        self.now = 1000.0

    def time(self) -> float:
        return self.now

    def monotonic(self) -> float:
        return self.now


class Head:
    """The head's node table over time: a worker pod (10.0.0.3) deleted just before the wait, its node still ALIVE
    until ``dead_at``; its replacement (10.0.0.4) joins at ``joins_at``; the other worker (10.0.0.2) lives on."""

    def __init__(self, clock: Clock, joins_at: float, dead_at: float) -> None:
        self.clock, self.t0, self.joins_at, self.dead_at = clock, clock.now, joins_at, dead_at

    def nodes(self) -> list[dict]:
        t = self.clock.now - self.t0
        rows = [HEAD, node("A", "10.0.0.2"), node("B", "10.0.0.3", state="DEAD" if t >= self.dead_at else "ALIVE")]
        return rows + ([node("C", "10.0.0.4")] if t >= self.joins_at else [])


def supervisor(program, monkeypatch, clock: Clock, head: Head):
    monkeypatch.setattr(program, "time", clock)
    spec = sv.SupervisorSpec.of({"run": "r", "head_url": "http://h:8265", "submission_id": "s", "max_restarts": 1,
                                 "first_job": {"entrypoint": "python3 train.py"},
                                 "resume_job": {"entrypoint": "python3 train.py --load /c"},
                                 "gpu_workers": 2, "gpus_per_node": 8, "workers_timeout": 600, "poll_seconds": 2})
    events: list[dict] = []
    sup = program.Supervisor(spec, head, out=lambda line: events.extend(sv.parse_events(line)))

    def sleep() -> None:
        clock.now += spec.poll_seconds

    sup.sleep = sleep
    return sup, events


NODE_LOST = rules.classify("FAILED", "ray.exceptions.ActorDiedError: The actor died unexpectedly")


def test_the_supervisor_does_not_count_a_deleted_pods_node_still_alive(program, monkeypatch):
    """Right after the loss Ray lists 2 GPU workers ALIVE (the survivor and the deleted pod's node): the wait goes on
    until the replacement joined, and ends once Ray has had the time to find the lost node dead."""
    clock = Clock()
    head = Head(clock, joins_at=12, dead_at=18)
    sup, events = supervisor(program, monkeypatch, clock, head)
    start = clock.now
    assert sup.wait_for_workers() is True  # no verdict said: a node may have been lost
    waited = clock.now - start
    assert waited >= 12  # never before the replacement joined: the stale node did not stand in for it
    assert waited <= rules.NODE_DEATH_SECONDS + 2  # and not longer than Ray takes to find a lost node dead
    said = [e for e in events if e["event"] == "waiting_for_workers"]
    assert said and said[0]["have"] < 2 and said[0]["want"] == 2


def test_the_supervisor_waits_for_a_replacement_that_joins_late(program, monkeypatch):
    """The replacement joins after Ray found the lost node dead: the survivor alone is 1 of 2 until then."""
    clock = Clock()
    sup, events = supervisor(program, monkeypatch, clock, Head(clock, joins_at=50, dead_at=18))
    assert rules.node_loss_possible(NODE_LOST)
    start = clock.now
    assert sup.wait_for_workers(NODE_LOST) is True
    assert clock.now - start >= 50
    assert [e["have"] for e in events if e["event"] == "waiting_for_workers"] == [0, 1]


def test_the_supervisor_does_not_wait_when_no_worker_can_have_been_lost(program, monkeypatch):
    """The trainer's own driver killed (it runs on the head): every worker ALIVE counts at once."""
    clock = Clock()
    head = Head(clock, joins_at=0, dead_at=0)  # nothing stale: B is DEAD, C is there
    sup, events = supervisor(program, monkeypatch, clock, head)
    killed = rules.classify("FAILED", "driver killed", exit_code=137)
    assert not rules.node_loss_possible(killed)
    start = clock.now
    assert sup.wait_for_workers(killed) is True and clock.now == start and events == []


# -- the rule itself, and the CLI's wait using it ------------------------------------------------------------

def test_the_rule_counts_the_pods_of_now_started_after_their_pod():
    rows = [HEAD, node("A", "10.0.0.2", started=5_000),
            node("B-old", "10.0.0.3", started=1_000),  # its pod deleted; its IP is the replacement's now
            node("B-new", "10.0.0.3", started=9_000),
            node("D", "10.0.0.5", started=2_000),  # a pod deleted, not replaced at its IP
            node("E", "10.0.0.6", started=3_000, state="DEAD"),
            node("F", "10.0.0.7", gpus=4, started=3_000)]  # too few GPUs
    ids = lambda got: sorted(n["node_id"] for n in got)  # noqa: E731
    assert ids(rules.gpu_workers_ready(rows, 8)) == ["A", "B-new", "B-old", "D"]  # no view of the pods: all ALIVE
    pods = {"10.0.0.2": 4_000.0, "10.0.0.3": 8_500.0}  # the worker pods that exist now, and when each was made
    assert ids(rules.gpu_workers_ready(rows, 8, pods=pods)) == ["A", "B-new"]
    assert ids(rules.gpu_workers_ready(rows, 8, pods={"10.0.0.2", "10.0.0.3"})) == ["A", "B-new"]  # IPs only
    assert ids(rules.gpu_workers_ready(rows, 8, pods={"10.0.0.2": 5_500.0})) == ["A"]  # 0.5 s of clock allowed
    assert ids(rules.gpu_workers_ready(rows, 8, pods={"10.0.0.2": 7_000.0})) == []  # A started before that pod
    assert ids(rules.gpu_workers_ready(rows, 8, suspect={"A", "D"})) == ["B-new", "B-old"]
    assert len(rules.gpu_workers_ready(rows, 4)) == 5 and len(rules.gpu_workers_ready(rows, 0)) == 5


def test_the_cli_wait_does_not_count_a_replaced_pods_node_at_the_same_ip(monkeypatch):
    """A worker pod replaced at the same IP: the old pod's node, still ALIVE, is not the new pod's."""
    rows = [HEAD, node("A", "10.0.0.2", started=5_000), node("B-old", "10.0.0.3", started=1_000)]
    asked: list[bool] = []
    monkeypatch.setattr(ray_jobs, "_node_rows",
                        lambda address, timeout=5.0, detail=False: asked.append(detail) or list(rows))
    pods = {"10.0.0.2": 4_000.0, "10.0.0.3": 8_500.0}  # the worker pods of now (the replacement made at 8.5 s)
    said: list[str] = []
    with pytest.raises(TimedOut) as e:
        ray_jobs.wait_for_gpu_nodes("http://h:8265", 2, 8, timeout=0, progress=said.append, poll=0,
                                    among=lambda: pods)
    assert "only 1 of 2 nodes with 8 GPUs joined" in e.value.message
    assert said == ["waiting for 2 nodes with 8 GPUs: 1 ready (1 more still ALIVE in Ray from pods that are gone)"]
    assert asked == [True]  # the rows with their start times
    rows.append(node("B-new", "10.0.0.3", started=9_000))
    topo = ray_jobs.wait_for_gpu_nodes("http://h:8265", 2, 8, timeout=0, poll=0, among=lambda: pods)
    assert topo["gpu_node_count"] == 3  # Ray's own view, returned as it is
