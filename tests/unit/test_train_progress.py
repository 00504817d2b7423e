"""The pure progress core (miles_ray.core.train_progress): step/of/fraction/pace/ETA/stall from Miles' metric lines
with their timestamps and attempt headers, key metrics with trends, and the stall/NaN/collapse findings. Logs are
written the way Miles' rank-0 logger and ``logs RUN`` print them (0-based rollout ids)."""

from __future__ import annotations

import datetime as _dt
import math

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from miles_ray.core import train_progress as tp
from miles_ray.core.metrics import parse_metrics
from miles_ray.services.runs.supervised import header

UTC = _dt.timezone.utc
T0 = _dt.datetime(2026, 3, 1, 12, 0, 0, tzinfo=UTC).timestamp()


def stamp(t: float) -> str:
    return _dt.datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%d %H:%M:%S,%f")[:-3]


def rollout_lines(rid: int, t: float, reward: float | None = None, loss: float | str = 0.05,
                  prefix: str = "") -> list[str]:
    """What Miles' rank 0 logs for one rollout (perf, rollout, step), at time ``t`` (reward: rising by default)."""
    reward = round(0.01 * rid, 4) if reward is None else reward
    at = f"{prefix}[{stamp(t)} rank0]"
    return [f"{at} rollout.py:88 - perf {rid}: {{'rollout/episode_raw_reward': {reward}, 'perf/rollout_time': 1.5, "
            f"'perf/tokens_per_gpu_per_sec': {1000 + rid}}}",
            f"{at} actor.py:512 - rollout {rid}: {{'rollout/raw_reward': {reward}, 'rollout/log_probs': -0.3}}",
            f"{at} actor.py:601 - step {rid}: {{'train/loss': {loss}, 'train/grad_norm': 0.2}}"]


def log(steps: range, pace: float = 10.0, start: float = T0, **kw) -> str:
    return "\n".join(line for rid in steps for line in rollout_lines(rid, start + (rid - steps.start) * pace, **kw))


def test_zero_based_rollouts_give_step_of_fraction_pace_and_eta():
    text = log(range(0, 12), pace=10.0)  # rollouts 0..11 every 10 s: 12 of 40 done
    series = tp.parse_series(text)
    p = tp.progress(series, of=40, now=T0 + 115, running=True)
    assert (p["step"], p["of"], p["fraction"]) == (11, 40, 0.3)
    assert p["seconds_per_step"] == 10.0 and p["eta_seconds"] == 280.0  # 28 rollouts left x 10 s
    assert p["last_step_at"] == "2026-03-01T12:01:50+00:00"
    assert (p["stalled"], p["stalled_for_seconds"]) == (False, None)
    assert p["stall_after_seconds"] == 60.0  # 5 x 10 s is under the 60 s floor
    # the same lines parse_metrics (runs compare) reads: one series point per value it counts
    assert series.lines == parse_metrics(text)["lines"] == 36


def test_a_run_that_stops_printing_is_stalled_after_k_times_its_step_time():
    text = log(range(0, 20), pace=30.0)  # 30 s per rollout: bound 5 x 30 = 150 s
    series = tp.parse_series(text)
    last = T0 + 19 * 30
    assert tp.progress(series, 40, now=last + 149, running=True)["stalled"] is False
    p = tp.progress(series, 40, now=last + 151, running=True)
    assert (p["stalled"], p["stalled_for_seconds"], p["stall_after_seconds"]) == (True, 151.0, 150.0)
    assert tp.progress(series, 40, now=last + 10_000, running=False)["stalled"] is False  # ended: not stalled
    assert tp.progress(series, 20, now=last + 10_000, running=True)["stalled"] is False  # every rollout done
    found = tp.findings("q4", series, p, text)
    assert [f["check"] for f in found] == ["stall"]
    assert "no new rollout for 151s (after rollout 19)" in found[0]["summary"]
    assert "miles-ray doctor q4" in found[0]["next"] and "not stopped" in found[0]["next"]


def test_the_first_rollout_has_the_model_load_floor():
    """Before an attempt's second rollout there is no usual step time: the first-step floor, from its start."""
    empty = tp.parse_series("")
    p = tp.progress(empty, 40, now=T0 + 600, running=True, started_at=T0)
    assert (p["step"], p["stalled"], p["stall_after_seconds"]) == (None, False, tp.FIRST_STEP_SECONDS)
    p = tp.progress(empty, 40, now=T0 + tp.FIRST_STEP_SECONDS + 1, running=True, started_at=T0)
    assert p["stalled"] is True and p["fraction"] == 0.0
    one = tp.parse_series(log(range(0, 1)))
    assert tp.progress(one, 40, now=T0 + 1000, running=True)["stalled"] is False


def test_a_resumed_attempt_counts_what_is_left_at_its_own_pace():
    """Attempt 1 ran rollouts 0..9 (then died); attempt 2 resumed from checkpoint 7 and runs 8.. at another pace."""
    a1 = {"attempt": 1, "submission_id": "miles-x"}
    a2 = {"attempt": 2, "submission_id": "miles-x-a2", "resumed_from": "/ckpt", "resumed_iteration": 7}
    t2 = T0 + 3600
    text = header(a1) + log(range(0, 10), pace=10) + "\n" + header(a2) + log(range(8, 14), pace=20, start=t2)
    series = tp.parse_series(text)
    assert [(m.attempt, m.first_step, m.resumed_from) for m in series.attempts] == [
        (1, 0, None), (2, 8, "/ckpt iter 7, from rollout 8")]
    p = tp.progress(series, 40, now=t2 + 5 * 20 + 1, running=True)
    assert (p["step"], p["attempt"]) == (13, 2)
    # the intervals never cross the restart (the hour between the attempts is not a step): the last 10 are five of
    # attempt 1 (10 s) and five of attempt 2 (20 s)
    assert p["seconds_per_step"] == 15.0
    assert p["eta_seconds"] == (40 - 14) * 15.0
    # a fresh attempt with no rollout yet: from its start, with the first-rollout floor
    text3 = text + "\n" + header({"attempt": 3, "submission_id": "miles-x-a3"})
    p3 = tp.progress(tp.parse_series(text3), 40, now=T0 + 99999, running=True, attempt=3,
                     started_at=T0 + 99999 - 60)
    assert (p3["step"], p3["attempt"], p3["stalled"]) == (13, 3, False)


def test_key_metrics_last_value_and_trend():
    text = "\n".join(line for rid in range(12) for line in rollout_lines(
        rid, T0 + rid, reward=round(0.1 * rid, 3), loss=round(0.5 - 0.01 * rid, 3)))
    text += "\n[2026-03-01 12:00:20 rank0] rollout.py:61 - eval 11: {'eval/aime': 0.3, 'eval/aime-truncated_ratio': 0.1}"
    m = tp.key_metrics(tp.parse_series(text))
    assert m["reward"] == {"metric": "rollout/raw_reward", "value": 1.1, "step": 11, "trend": "up"}
    assert m["loss"]["metric"] == "train/loss" and m["loss"]["trend"] == "down"
    assert m["eval"] == {"metric": "eval/aime", "value": 0.3, "step": 11, "trend": None}
    assert m["throughput"]["metric"] == "perf/tokens_per_gpu_per_sec" and m["throughput"]["value"] == 1011
    assert tp.key_metrics(tp.parse_series(""))["reward"] is None


def test_nan_loss_and_collapsed_reward_are_findings():
    lines = [line for rid in range(12) for line in rollout_lines(rid, T0 + rid, reward=0.0,
                                                                  loss="nan" if rid >= 10 else 0.1)]
    series = tp.parse_series("\n".join(lines))
    p = tp.progress(series, 40, now=T0 + 13, running=True)
    found = {f["check"]: f for f in tp.findings("r", series, p)}
    assert set(found) == {"nan_loss", "reward_collapse"}
    assert "train/loss is nan at rollout 11" in found["nan_loss"]["summary"]
    assert "first at rollout 10" in found["nan_loss"]["evidence"][0]
    assert "rollout/raw_reward has been 0 for its last 10 rollouts" in found["reward_collapse"]["summary"]
    assert tp.key_metrics(series)["loss"]["value"] == "nan"  # strict JSON
    # a rising reward is no collapse, an inf loss is
    ok = tp.parse_series(log(range(0, 12), loss="inf", reward=0.2))
    assert [f["check"] for f in tp.findings("r", ok, tp.progress(ok, 40, T0, True))] == ["nan_loss", "reward_collapse"]
    fine = tp.parse_series("\n".join(line for rid in range(12) for line in rollout_lines(rid, T0, reward=rid / 10)))
    assert tp.findings("r", fine, tp.progress(fine, 40, T0, True)) == []


def test_the_quiet_actor_is_named_where_the_ray_prefixes_tell():
    text = "\n".join([
        "(MegatronTrainRayActor pid=11, ip=10.0.0.2) hello", "(MegatronTrainRayActor pid=12, ip=10.0.0.3) hello",
        "(MegatronTrainRayActor pid=11, ip=10.0.0.2) step", "(MegatronTrainRayActor pid=11, ip=10.0.0.2) step"])
    quiet = tp.quiet_actors(text)
    assert quiet[0].startswith("MegatronTrainRayActor pid=12 on 10.0.0.3: quiet for its last 2 log line(s)")


def test_timestamps_with_and_without_zone_and_num_rollout():
    assert tp.line_time("[2026-03-01 12:00:00,500 rank0]", UTC) == T0 + 0.5
    assert tp.line_time("2026-03-01T13:00:00+01:00 x") == T0
    assert tp.line_time("2026-03-01T12:00:00Z") == T0
    assert tp.line_time("no time here") is None
    assert tp.num_rollout({"entrypoint": "python3 train.py --num-rollout 10 --x --num-rollout 40"}) == 40
    assert tp.num_rollout({"entrypoint": "python3 train.py", "recipe_spec": {"num_rollout": 3000}}) == 3000
    assert tp.num_rollout({"entrypoint": "train.py --num-rollout nope"}) is None


def test_lines_without_time_give_no_pace_and_no_stall():
    text = "\n".join(f"step {rid}: {{'train/loss': 0.1}}" for rid in range(5))
    p = tp.progress(tp.parse_series(text), 10, now=T0, running=True)
    assert (p["step"], p["fraction"], p["seconds_per_step"], p["eta_seconds"], p["stalled"]) == (4, 0.5, None,
                                                                                                  None, False)


# -- generated inputs ----------------------------------------------------------------------------------------------

@settings(max_examples=150, deadline=None)
@given(gaps=st.lists(st.floats(0.01, 500), min_size=1, max_size=30), of=st.integers(1, 60),
       start=st.integers(0, 20), quiet=st.floats(0, 5000), running=st.booleans())
@example(gaps=[0.03125], of=3, start=0, quiet=0.0, running=True)  # found in a whole run: 1 left, ETA read 0
def test_generated_runs_keep_the_invariants(gaps, of, start, quiet, running):
    times = [T0]
    for g in gaps:
        times.append(times[-1] + g)
    text = "\n".join(line for i, t in enumerate(times) for line in rollout_lines(start + i, t))
    series = tp.parse_series(text)
    now = times[-1] + quiet
    p = tp.progress(series, of, now, running)
    assert p["step"] == start + len(gaps)
    assert 0 <= p["fraction"] <= 1
    assert p["fraction"] == round(min((p["step"] + 1) / of, 1.0), 4)
    recent = [g for g in gaps][-tp.RECENT_STEPS:]
    assert min(recent) - 1e-3 <= p["seconds_per_step"] <= max(recent) + 1e-3
    if running:
        assert p["eta_seconds"] >= 0
        assert (p["eta_seconds"] == 0) == (p["step"] + 1 >= of)
    else:
        assert p["eta_seconds"] is None and p["stalled"] is False
    bound = p["stall_after_seconds"]
    assert bound >= tp.STALL_FLOOR_SECONDS
    if running and p["step"] + 1 < of and quiet > bound + 0.1:
        assert p["stalled"] and p["stalled_for_seconds"] >= bound
    if quiet < bound - 0.1:
        assert not p["stalled"] and p["stalled_for_seconds"] is None


@settings(max_examples=150, deadline=None)
@given(values=st.lists(st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.integers(-10, 10)),
                       min_size=0, max_size=25))
def test_generated_metric_values_never_break_the_summary(values):
    lines = [f"[{stamp(T0 + i)} rank0] a - step {i}: {{'train/loss': {float(v)!r}, 'rollout/raw_reward': {float(v)!r}}}"
             for i, v in enumerate(values)]
    series = tp.parse_series("\n".join(lines))
    m = tp.key_metrics(series)
    checks = [f["check"] for f in tp.findings("r", series, tp.progress(series, 30, T0, True))]
    if not values:
        assert m["loss"] is None and checks == []
        return
    last = float(values[-1])
    assert m["loss"]["value"] == (last if math.isfinite(last) else str(last))
    assert m["loss"]["trend"] in (None, "up", "down", "flat")
    assert ("nan_loss" in checks) == any(not math.isfinite(float(v)) for v in values)
    tail = [float(v) for v in values[-tp.COLLAPSE_WINDOW:]]
    collapsed = len(tail) == tp.COLLAPSE_WINDOW and all(map(math.isfinite, tail)) and len(set(tail)) == 1
    assert ("reward_collapse" in checks) == collapsed


def test_steps_faster_than_the_logs_second_have_their_mean_pace():
    """Miles' log lines carry whole seconds: rollouts 0.4 s apart read as intervals of 0 and 1 s (median 0); the pace
    is their mean, and the ETA of the rollouts left is not 0."""
    from miles_ray.core.train_progress import seconds_per_step

    stamps = [(rid, float(int(100 + 0.4 * rid))) for rid in range(11)]  # 100, 100, 100, 101, 101, 102 ...
    assert seconds_per_step({1: stamps}) == pytest.approx(0.4, abs=0.05)
    assert seconds_per_step({1: [(0, 100.0), (1, 130.0), (2, 160.0)]}) == 30.0  # the median when it says something
