"""services.probes.side_by_side: submit's two preflight probes and doctor's two probe jobs run at the same time.
No Ray here: the calls are plain functions; that they overlap is shown by a barrier both must reach together
(one after the other, the first would wait at it alone and the barrier would break)."""

from __future__ import annotations

import threading

import pytest

from miles_ray.core.errors import ClusterError, Conflict
from miles_ray.services.probes import side_by_side


def test_the_calls_run_at_the_same_time_and_results_keep_their_order():
    meet = threading.Barrier(2, timeout=30)
    seen = []

    def call(name):
        def run():
            meet.wait()  # breaks (BrokenBarrierError) unless the other call is running too
            seen.append(threading.current_thread().name)
            return name
        return run

    assert side_by_side(call("image"), call("data")) == ["image", "data"]
    assert len(set(seen)) == 2 and threading.current_thread().name not in seen


def test_a_call_not_wanted_gives_none_and_a_lone_call_runs_in_this_thread():
    where = []
    assert side_by_side(None, lambda: where.append(threading.current_thread()) or 7) == [None, 7]
    assert where == [threading.current_thread()]
    assert side_by_side(None, None) == [None, None]


def test_the_first_error_in_order_is_raised_after_every_call_ended():
    ended = threading.Event()

    def refused():
        raise Conflict("the image holds another Miles")

    def slower_failure():
        ended.wait(0.2)
        ended.set()
        raise ClusterError("data preflight failed")

    with pytest.raises(Conflict, match="another Miles"):
        side_by_side(refused, slower_failure)
    assert ended.is_set()  # the second call had ended before the error came back
    with pytest.raises(ClusterError, match="data preflight"):
        side_by_side(lambda: 1, slower_failure)
