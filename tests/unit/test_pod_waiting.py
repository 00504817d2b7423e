"""Which waiting containers make `up`/`scale` give up at once (adapters.kube.waiting_is_fatal)."""

from __future__ import annotations

import pytest

from miles_ray.adapters.kube import CRASHLOOP_RESTARTS, waiting_is_fatal


@pytest.mark.parametrize("reason", ["ImagePullBackOff", "ErrImagePull", "CreateContainerConfigError",
                                    "InvalidImageName"])
def test_a_container_that_cannot_be_created_is_fatal_at_once(reason):
    assert waiting_is_fatal(reason, 0) is True


@pytest.mark.parametrize("reason", ["ContainerCreating", "PodInitializing", ""])
def test_ordinary_start_up_is_not_fatal(reason):
    assert waiting_is_fatal(reason, 0) is False


def test_a_crash_loop_is_given_the_kubelets_first_restarts():
    """A Ray worker whose head restarted, or a first `ray start` that timed out on a slow node, recovers on a
    restart: only from the third restart on is CrashLoopBackOff a verdict."""
    assert CRASHLOOP_RESTARTS == 3
    assert [waiting_is_fatal("CrashLoopBackOff", n) for n in range(5)] == [False, False, False, True, True]


def _pod(phase, conditions=(), statuses=()):
    from types import SimpleNamespace as S
    return S(status=S(phase=phase, conditions=[S(**c) for c in conditions],
                      container_statuses=[S(restart_count=r, state=S(waiting=S(reason=w, message=m)))
                                          for w, m, r in statuses]))


def test_why_a_pod_waits_is_its_phase_its_scheduling_or_its_container_and_says_when_it_is_fatal():
    """One reading for every wait on a pod miles-ray creates (preflight probe pods, pull pods)."""
    from miles_ray.adapters.kube.pods import waiting_why

    assert waiting_why(_pod(None)) == ("Pending", False)
    unschedulable = dict(type="PodScheduled", status="False", reason="Unschedulable", message="0/2 nodes")
    assert waiting_why(_pod("Pending", [unschedulable])) == ("Unschedulable: 0/2 nodes", False)
    assert waiting_why(_pod("Pending", [unschedulable], [("ContainerCreating", "", 0)])) == ("ContainerCreating", False)
    assert waiting_why(_pod("Pending", statuses=[("ErrImagePull", "no such image", 0)])) == \
        ("ErrImagePull: no such image", True)
    assert waiting_why(_pod("Running", statuses=[("CrashLoopBackOff", "back-off", CRASHLOOP_RESTARTS - 1)]))[1] is False
    assert waiting_why(_pod("Running", statuses=[("CrashLoopBackOff", "back-off", CRASHLOOP_RESTARTS)]))[1] is True
