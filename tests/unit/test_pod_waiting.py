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
