"""Miles' numbering of rollouts and checkpoints, held against the STAND-IN trainers (tests/fakes/fake_ckpt_train.py,
fake_metrics_train.py; fake_ray_ckpt_train.py runs fake_ckpt_train's loop) and against the supervisor's reading of
checkpoints (launchers/supervise.py with miles_ray/core/supervision.py).

The rules, as stated from Miles' source (radixark/miles at the pinned 31f1ca9, the commit of the recipe catalog):

R1 ``train.py`` line 95: ``for rollout_id in range(args.start_rollout_id, args.num_rollout):`` -- rollout ids are
   0-based, one train step each (the stand-ins print one ``step <rollout_id>`` line per rollout).
R2 ``train.py`` lines 96-97: ``if args.eval_interval is not None and rollout_id == args.start_rollout_id and not
   args.skip_eval_before_train: await rollout_manager.eval.remote(rollout_id)`` -- an eval BEFORE the job's first
   rollout is trained.
R3 ``train.py`` lines 121-125: after training, ``if external_save or should_run_periodic_action(rollout_id,
   args.save_interval, num_rollout_per_epoch, args.num_rollout): await save(rollout_id)``.
R4 ``train.py`` lines 77-91 -> ``miles/backends/megatron_utils/actor.py`` line 688 ``save(rollout_id, self.model,
   ...)`` -> ``miles/backends/megatron_utils/model.py`` lines 873-903 ``save(iteration, ...)`` ->
   ``save_checkpoint(iteration, ...)``: Megatron's ``iter_{rollout_id:07d}`` and ``latest_checkpointed_iteration.txt``
   = rollout_id, so iteration N means rollout N was trained (iteration 0: rollout 0).
R5 ``train.py`` lines 136-137: ``if should_run_periodic_action(rollout_id, args.eval_interval,
   num_rollout_per_epoch): await rollout_manager.eval.remote(rollout_id)`` -- no ``num_rollout``: the last rollout
   is not forced.
R6 ``miles/utils/misc.py`` lines 144-151 (``should_run_periodic_action``): False when the interval is None; True when
   ``num_rollout`` is given and ``rollout_id == num_rollout - 1``; else ``(rollout_id + 1) % interval == 0`` (or an
   epoch boundary, ``(rollout_id + 1) % num_rollout_per_epoch == 0``).
R7 ``miles/backends/megatron_utils/actor.py`` line 212: ``start_rollout_id = loaded_rollout_id + 1``, used when
   ``--start-rollout-id`` is not given (``miles/ray/placement_group.py`` lines 177-178); no tracker in ``--load``:
   ``args.start_rollout_id = 0`` (``miles/utils/arguments.py`` lines 3047-3058).
R8 ``miles/ray/rollout/metrics.py`` line 53: ``logger.info(f"eval {rollout_id}: {log_dict}")``.

The oracle below is written from those statements alone (not from the stand-ins' code); the stand-ins run for real
(in-process, or as processes when one SIGKILLs itself) and what they print and write on disk is compared with it.
"""

from __future__ import annotations

import itertools
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from miles_ray.controller import rules
from miles_ray.core import supervision as sv
from miles_ray.services.runs.supervised import header
from tests.conftest import REPO
from tests.infra.scripts import load_script
from tests.infra.fake_ray_head import shipped_program

CKPT = REPO / "tests" / "fakes" / "fake_ckpt_train.py"
METRICS = REPO / "tests" / "fakes" / "fake_metrics_train.py"


# -- the oracle: Miles' loop, from the rules above --------------------------------------------------------------

def periodic(rollout_id: int, interval: int | None, num_rollout: int | None = None) -> bool:
    """R6 (no epoch boundary: the stand-ins have no dataset)."""
    if interval is None:
        return False
    if num_rollout is not None and rollout_id == num_rollout - 1:
        return True
    return (rollout_id + 1) % interval == 0


def miles_loop(num_rollout: int, save_interval: int | None, eval_interval: int | None, *, loaded: int | None = None,
               skip_eval_before_train: bool = False) -> list[tuple[str, int]]:
    """What Miles' train.py does, in order: ("eval" | "step" | "save", rollout_id)."""
    start = 0 if loaded is None else loaded + 1  # R7
    out = []
    for rid in range(start, num_rollout):  # R1
        if eval_interval is not None and rid == start and not skip_eval_before_train:  # R2
            out.append(("eval", rid))
        out.append(("step", rid))
        if periodic(rid, save_interval, num_rollout):  # R3, R6
            out.append(("save", rid))
        if periodic(rid, eval_interval):  # R5, R6
            out.append(("eval", rid))
    return out


def test_the_oracle_on_numbers_worked_by_hand():
    """The oracle itself, on cases worked out by hand from R1-R7."""
    assert [r for k, r in miles_loop(8, 3, None) if k == "save"] == [2, 5, 7]  # (r+1) % 3 == 0, and the last
    assert [r for k, r in miles_loop(8, None, None) if k == "save"] == []  # no --save-interval: no checkpoint
    assert [r for k, r in miles_loop(8, None, 3) if k == "eval"] == [0, 2, 5]  # before training, then every 3rd
    assert [r for k, r in miles_loop(8, None, 3, skip_eval_before_train=True) if k == "eval"] == [2, 5]
    assert miles_loop(8, 4, 4, loaded=5) == [("eval", 6), ("step", 6), ("step", 7), ("save", 7), ("eval", 7)]
    assert miles_loop(3, 1, None, loaded=2) == []  # loaded the last rollout: nothing left to train


# -- the stand-ins against it -----------------------------------------------------------------------------------

EVENT = re.compile(r"(?:\] \S+ - )(eval|step) (\d+): \{|saved checkpoint from iteration\s+(\d+) to ")


def events_of(text: str) -> list[tuple[str, int]]:
    out = []
    for line in text.splitlines():
        m = EVENT.search(line)
        if m:
            out.append(("save", int(m.group(3))) if m.group(3) is not None else (m.group(1), int(m.group(2))))
    return out


def on_disk(save: Path) -> tuple[list[int], int | None]:
    """The iterations Megatron's dirs name, and the tracker's."""
    its = sorted(int(p.name[5:]) for p in save.glob("iter_*") if p.is_dir()) if save.is_dir() else []
    tracker = save / "latest_checkpointed_iteration.txt"
    return its, (rules.read_latest_iteration(tracker.read_text()) if tracker.exists() else None)


def run_standin(script: Path, argv: list[str], capsys) -> str:
    mod = load_script(str(script.relative_to(REPO)), f"miles_numbering_{script.stem}")
    assert mod.main(argv) == 0
    return capsys.readouterr().out


GRID = list(itertools.product((1, 5, 7, 12), (None, 1, 3, 5), (None, 2, 4), (None, "mid", "last"), (False, True)))


@pytest.mark.parametrize("num_rollout, save_interval, eval_interval, resume, skip", GRID)
def test_the_metrics_stand_in_runs_miles_loop(tmp_path, capsys, monkeypatch, num_rollout, save_interval,
                                              eval_interval, resume, skip):
    save = tmp_path / "ckpt"
    loaded = {None: None, "mid": num_rollout // 2, "last": num_rollout - 1}[resume]
    if loaded is not None:  # a checkpoint a previous job saved (its tracker names it)
        save.mkdir()
        (save / f"iter_{loaded:07d}").mkdir()
        (save / "latest_checkpointed_iteration.txt").write_text(str(loaded))
    argv = ["--num-rollout", str(num_rollout), "--save", str(save), "--load", str(save)]
    argv += ["--save-interval", str(save_interval)] if save_interval else []
    argv += ["--eval-interval", str(eval_interval), "--eval-prompt-data", "aime", "/d"] if eval_interval else []
    argv += ["--skip-eval-before-train"] if skip else []
    monkeypatch.setenv("MILESRAY_TEST_FAKE_ROLLOUT_SECONDS", "0")
    want = miles_loop(num_rollout, save_interval, eval_interval, loaded=loaded, skip_eval_before_train=skip)
    assert events_of(run_standin(METRICS, argv, capsys)) == want
    saved = [r for k, r in want if k == "save"]
    its, tracker = on_disk(save)
    assert its == sorted(set(saved) | ({loaded} if loaded is not None else set()))  # R4: iter_<rollout_id>
    assert tracker == (saved[-1] if saved else loaded)


@pytest.mark.parametrize("num_rollout, save_interval, resume, eval_interval", list(itertools.product(
    (1, 4, 9), (None, 1, 2, 4), (None, "first", "mid"), (None, 3))))
def test_the_checkpointing_stand_in_runs_miles_loop(tmp_path, capsys, monkeypatch, num_rollout, save_interval,
                                                    resume, eval_interval):
    """Its evals (with MILESRAY_TEST_FAKE_EVAL_PEAK set: a best checkpoint for --keep-best) included."""
    save = tmp_path / "ckpt"
    loaded = {None: None, "first": 0, "mid": num_rollout // 2}[resume]
    if loaded is not None:
        save.mkdir()
        (save / "latest_checkpointed_iteration.txt").write_text(str(loaded))
    argv = ["--num-rollout", str(num_rollout), "--save", str(save), "--load", str(save)]
    argv += ["--save-interval", str(save_interval)] if save_interval else []
    argv += ["--eval-interval", str(eval_interval)] if eval_interval else []
    monkeypatch.setenv("MILESRAY_TEST_STEP_SECONDS", "0")
    for k in ("MILESRAY_TEST_CRASH_AT_STEP", "MILESRAY_TEST_CRASH_EVERY", "MILESRAY_TEST_CRASH_ON_FILE"):
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setenv("MILESRAY_TEST_FAKE_EVAL_PEAK", "4")
    want = [e for e in miles_loop(num_rollout, save_interval, eval_interval, loaded=loaded)]
    assert events_of(run_standin(CKPT, argv, capsys)) == want
    its, tracker = on_disk(save)
    saved = [r for k, r in want if k == "save"]
    assert its == saved and tracker == (saved[-1] if saved else loaded)


def test_the_checkpointing_stand_ins_eval_peaks_at_the_checkpoint_asked_for(tmp_path, capsys, monkeypatch):
    """MILESRAY_TEST_FAKE_EVAL_PEAK=8, 12 rollouts, checkpoints and evals every 3: the supervisor's reading of its
    evals (sv.CheckpointScores) makes checkpoint 8 the best -- not the newest (11) -- also after a resume from 5
    (its eval before training measures checkpoint 5 the same); without the variable it logs no eval."""
    monkeypatch.setenv("MILESRAY_TEST_STEP_SECONDS", "0")
    save = tmp_path / "ckpt"
    argv = ["--num-rollout", "12", "--save-interval", "3", "--eval-interval", "3", "--save", str(save), "--load",
            str(save), "--eval-prompt-data", "aime", "/d", "--eval-prompt-data", "score", "/d"]
    assert "eval " not in run_standin(CKPT, [*argv[:-6], "--save", str(tmp_path / "plain")], capsys)
    monkeypatch.setenv("MILESRAY_TEST_FAKE_EVAL_PEAK", "8")
    first = run_standin(CKPT, argv, capsys)
    scores = sv.checkpoint_scores([(1, first)])
    assert sv.best_checkpoint([2, 5, 8, 11], scores, "eval/score") == 8
    (save / "latest_checkpointed_iteration.txt").write_text("5")
    resumed = sv.checkpoint_scores([(2, run_standin(CKPT, argv, capsys))])
    assert {it: resumed.value(it, "eval/score") for it in (5, 8, 11)} == {
        it: scores.value(it, "eval/score") for it in (5, 8, 11)}


def test_a_killed_stand_in_resumes_right_after_its_last_checkpoint_as_miles_does(tmp_path):
    """The checkpointing stand-in SIGKILLed after rollout 7 (checkpoints every 3: iterations 2 and 5), then run again
    with --load: it starts at rollout 6 (R7: 5 + 1) and only rollouts 6 and 7 are trained twice; what the supervisor
    reads of that (the tracker) is rollout 5 trained, and the next attempt starts at sv.resume_rollout(5) == 6."""
    save = tmp_path / "ckpt"
    argv = [sys.executable, str(CKPT), "--num-rollout", "12", "--save-interval", "3", "--save", str(save), "--load",
            str(save)]
    env = {**os.environ, "MILESRAY_TEST_STEP_SECONDS": "0", "MILESRAY_TEST_CRASH_AT_STEP": "7"}
    first = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60)
    assert first.returncode == -9, first.stderr
    assert events_of(first.stdout) == [e for e in miles_loop(12, 3, None) if e[1] <= 7]
    its, latest = on_disk(save)
    assert (its, latest) == ([2, 5], 5)
    assert rules.checkpoint_step(latest, None) == 5  # what attempt 1 is proven to have trained
    second = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60)
    assert second.returncode == 0, second.stderr
    assert events_of(second.stdout) == miles_loop(12, 3, None, loaded=5)
    assert events_of(second.stdout)[0] == ("step", sv.resume_rollout(latest)) == ("step", 6)
    assert f"loaded checkpoint from {save} at iteration 5" in second.stdout
    assert on_disk(save) == ([2, 5, 8, 11], 11)
    steps = [line.split() for line in (save / ".stand-in-steps").read_text().splitlines()]
    by_pid: dict[str, list[int]] = {}
    for pid, step in steps:
        by_pid.setdefault(pid, []).append(int(step))
    a, b = by_pid.values()
    assert a == list(range(0, 8)) and b == list(range(6, 12)) and sorted(set(a) & set(b)) == [6, 7]


# -- the supervisor reads checkpoints Miles' way ------------------------------------------------------------------

@pytest.fixture(scope="module")
def supervise(tmp_path_factory):
    """The shipped supervisor program (supervise.py with the modules it ships with beside it), imported."""
    with shipped_program(tmp_path_factory.mktemp("program"), "numbering_supervise") as mod:
        yield mod


def _supervisor(supervise, ckpt: Path):
    spec = supervise.sv.SupervisorSpec.of({"run": "r", "head_url": "http://127.0.0.1:1", "submission_id": "s",
                                           "first_job": {"entrypoint": "x"}, "resume_job": {"entrypoint": "y"},
                                           "checkpoint_dir": str(ckpt)})
    return supervise.Supervisor(spec, api=None, out=lambda line: None)


@pytest.mark.parametrize("tracker, resumed, want", [
    (None, None, None),  # no checkpoint: nothing proven
    ("0", None, 0),  # iteration 0 is a real checkpoint: rollout 0 was trained
    ("5", None, 5),  # iteration 5: rollouts 0..5 trained (not 4)
    ("5", 5, None),  # the checkpoint it loaded: nothing new
    ("8", 5, 8),
    ("garbage", None, None),
])
def test_the_supervisor_reads_a_checkpoint_as_the_rollout_it_holds(supervise, tmp_path, tracker, resumed, want):
    if tracker is not None:
        (tmp_path / "latest_checkpointed_iteration.txt").write_text(tracker)
    sup = _supervisor(supervise, tmp_path)
    sup.resumed_iteration[2] = resumed
    assert sup.checkpoint_progress(2) == want
    assert sup.steps.get(2) == want


def test_a_head_lost_right_after_checkpoint_0_is_retried(supervise, tmp_path):
    """Attempt 1 lost with its head (its logs with it) right after Miles saved iteration 0: it trained rollout 0,
    so it is progress, and the run is retried (not "failed before its first training step")."""
    (tmp_path / "latest_checkpointed_iteration.txt").write_text("0")
    sup = _supervisor(supervise, tmp_path)
    step = sup.checkpoint_progress(1)
    verdict = rules.classify("FAILED", lost="the head is gone")
    decision = rules.decide(1, verdict, step, None, 3)
    assert step == 0 and decision.retry is True and "step 0" in decision.why


def test_the_resume_lines_say_the_rollout_it_starts_at():
    a2 = {"attempt": 2, "submission_id": "s-a2", "resumed_from": "/c", "resumed_iteration": 5}
    assert header(a2) == "== attempt 2 (s-a2), resumed from /c iter 5, from rollout 6 ==\n"
    assert header({**a2, "resumed_iteration": 0}) == "== attempt 2 (s-a2), resumed from /c iter 0, from rollout 1 ==\n"
    assert header({**a2, "resumed_iteration": None}) == "== attempt 2 (s-a2), resumed from /c ==\n"
    assert [sv.resume_rollout(x) for x in (None, 0, 5)] == [0, 1, 6]
