#!/usr/bin/env python3
"""STAND-IN for Miles's ``train.py`` in the supervised-run tests (no GPU, no Miles here): it trains nothing. It
prints Miles' ``step N: {...}`` lines, checkpoints the way Megatron does and resumes from ``--load`` -- what a
run supervisor relies on -- and crashes when the TEST asks it to (through ``submit --env``: the fault is injected by
the test, never by the product).

Its loop is Miles' own (radixark/miles 31f1ca9, ``train.py`` lines 95-125): rollout ids are 0-based, ``for
rollout_id in range(start_rollout_id, num_rollout)``, one ``step <rollout_id>`` line each (one train step per
rollout); after rollout id r it saves when :func:`should_run_periodic_action` (``miles/utils/misc.py`` lines
130-151, copied verbatim) says so for ``(r, save_interval, None, num_rollout)`` -- ``(r + 1) % K == 0`` or r is the
last rollout -- as ``save(rollout_id)``: Megatron's ``DIR/iter_<r:07d>/`` is written first, THEN
``DIR/latest_checkpointed_iteration.txt`` = r (atomically), so that file only ever names a complete checkpoint and
iteration N means rollout N was trained. A resumed job starts at ``loaded_rollout_id + 1``
(``miles/backends/megatron_utils/actor.py`` line 212); no tracker in ``--load``: from rollout 0
(``miles/utils/arguments.py`` lines 3047-3058); ``--start-rollout-id`` wins over both
(``miles/ray/placement_group.py`` lines 177-178).

Flags it reads (others are ignored, as the flags of a real recipe): ``--num-rollout T`` (default 40),
``--save DIR`` / ``--save-interval K`` (Miles' default: none, no checkpoint), ``--load DIR``,
``--start-rollout-id S``. A flag starting with ``--bogus`` is refused the way argparse refuses an unknown flag
(exit 2 before any step).

Faults, from the environment (set by the test with ``submit --env``):

* ``MILESRAY_TEST_CRASH_AT_STEP=S``: right after step S, once per checkpoint dir (a marker file
  ``DIR/.stand-in-crashed-at-S`` says it happened), the process SIGKILLs itself (as the OOM killer or a lost node
  would end it);
* ``MILESRAY_TEST_CRASH_EVERY=N``: every attempt SIGKILLs itself after training N steps;
* ``MILESRAY_TEST_CRASH_ON_FILE=PATH``: after the first step that finds PATH existing, once per checkpoint dir
  (marker ``DIR/.stand-in-crashed-on-file``), the process SIGKILLs itself (the test decides when);
* ``MILESRAY_TEST_STEP_SECONDS`` (default 0.3): the time one step takes.

Evals, only with ``MILESRAY_TEST_FAKE_EVAL_PEAK=P`` (as fake_metrics_train.py: a best checkpoint that is not the
newest, for ``submit --keep-best``): with ``--eval-interval E``, Miles' evals (``train.py`` lines 96-97 and 136-137:
one before the job's first rollout unless ``--skip-eval-before-train``, then after rollout r when
``should_run_periodic_action(r, E, None)``), each one line ``eval <r>: {'eval/<NAME>': score}`` (NAME: the first
name of the last ``--eval-prompt-data``, else ``score``; R8 of tests/unit/test_miles_numbering.py) whose score,
for the model after ``n`` rollouts, climbs with n up to checkpoint P (n = P + 1) and falls after it.

Every step is also appended to ``DIR/.stand-in-steps`` (``<pid> <step>`` a line), so a test can see which steps
were trained twice. Standard library only.
"""

from __future__ import annotations

import os
import signal
import sys
import time


def _flag(argv: list[str], name: str, default: str | None = None) -> str | None:
    """The value of the LAST ``name`` (as argparse: --extra-args come last and win)."""
    value = default
    for i, arg in enumerate(argv[:-1]):
        if arg == name:
            value = argv[i + 1]
    return value


def _eval_name(argv: list[str]) -> str:
    """The first name of the last ``--eval-prompt-data NAME PATH ...`` (as argparse: the last one wins), else
    ``score``."""
    at = [i for i, arg in enumerate(argv[:-1]) if arg == "--eval-prompt-data"]
    return argv[at[-1] + 1] if at else "score"


def _log(where: str, message: str) -> None:
    print(f"[{time.strftime('%Y-%m-%d %H:%M:%S')} rank0] {where} - {message}", flush=True)


def _write_atomic(path: str, text: str) -> None:
    tmp = f"{path}.tmp-{os.getpid()}"
    with open(tmp, "w") as fh:
        fh.write(text)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


def _int_or_none(text: str | None) -> int | None:
    return None if text in (None, "", "None") else int(text)


def should_run_periodic_action(
    rollout_id: int,
    interval: int | None,
    num_rollout_per_epoch: int | None = None,
    num_rollout: int | None = None,
) -> bool:
    """Miles' rule for a periodic save or eval, verbatim (radixark/miles 31f1ca9, miles/utils/misc.py 130-151)."""
    if interval is None:
        return False

    if num_rollout is not None and rollout_id == num_rollout - 1:
        return True

    step = rollout_id + 1
    return (step % interval == 0) or (num_rollout_per_epoch is not None and step % num_rollout_per_epoch == 0)


def start_rollout_id(load: str | None, given: int | None = None) -> int:
    """Where Miles starts: ``--start-rollout-id`` when given, else the loaded iteration + 1, else 0 (module doc)."""
    if given is not None:
        return given
    if not load:
        return 0
    try:
        with open(os.path.join(load, "latest_checkpointed_iteration.txt")) as fh:
            loaded = int(fh.read().strip())
    except (OSError, ValueError):
        _log("checkpoint.py:12", f"no checkpoint in {load}: training from scratch")
        return 0
    _log("checkpoint.py:12", f"loaded checkpoint from {load} at iteration {loaded}")
    return loaded + 1


def save_checkpoint(save: str, rollout_id: int) -> str:
    """``save(rollout_id)`` as Megatron writes it: ``iter_<rollout_id:07d>/`` first, then the tracker."""
    path = os.path.join(save, f"iter_{rollout_id:07d}")
    os.makedirs(path, exist_ok=True)
    _write_atomic(os.path.join(path, "STAND_IN_CHECKPOINT"), f"stand-in checkpoint of rollout {rollout_id}\n")
    _write_atomic(os.path.join(save, "latest_checkpointed_iteration.txt"), str(rollout_id))
    _log("checkpoint.py:40", f"saved checkpoint from iteration {rollout_id:7d} to {save}")
    return path


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    bogus = [a for a in argv if a.startswith("--bogus")]
    if bogus:
        print(f"usage: train.py [-h] ...\ntrain.py: error: unrecognized arguments: {' '.join(bogus)}", file=sys.stderr,
              flush=True)
        return 2
    target = int(_flag(argv, "--num-rollout", "40"))
    save = _flag(argv, "--save")
    load = _flag(argv, "--load")
    interval = _int_or_none(_flag(argv, "--save-interval"))
    step_seconds = float(os.environ.get("MILESRAY_TEST_STEP_SECONDS", "0.3"))
    crash_at = os.environ.get("MILESRAY_TEST_CRASH_AT_STEP")
    crash_every = int(os.environ.get("MILESRAY_TEST_CRASH_EVERY", "0") or 0)
    start = start_rollout_id(load, _int_or_none(_flag(argv, "--start-rollout-id")))
    peak = _int_or_none(os.environ.get("MILESRAY_TEST_FAKE_EVAL_PEAK"))
    eval_interval = _int_or_none(_flag(argv, "--eval-interval")) if peak is not None else None
    eval_name = _eval_name(argv)

    def evaluate(rid: int, trained: int) -> None:  # the model after ``trained`` rollouts
        score = trained if trained <= peak + 1 else 2 * (peak + 1) - trained
        _log("rollout.py:61", f"eval {rid}: {{'eval/{eval_name}': {round(score / target, 6)}}}")

    print(f"STAND-IN train.py (tests/fakes/fake_ckpt_train.py): rollouts {start}..{target - 1}, save {save} every "
          f"{interval}", flush=True)
    trained = 0
    for rid in range(start, target):
        if eval_interval is not None and rid == start and "--skip-eval-before-train" not in argv:
            evaluate(rid, rid)
        time.sleep(step_seconds)
        _log("actor.py:601", f"step {rid}: {{'train/loss': {round(0.05 / (rid + 1), 6)}, 'train/grad_norm': 0.2}}")
        trained += 1
        if save:
            os.makedirs(save, exist_ok=True)
            with open(os.path.join(save, ".stand-in-steps"), "a") as fh:
                fh.write(f"{os.getpid()} {rid}\n")
        if save and should_run_periodic_action(rid, interval, None, target):
            save_checkpoint(save, rid)
        if should_run_periodic_action(rid, eval_interval, None):
            evaluate(rid, rid + 1)
        marker = os.path.join(save or ".", f".stand-in-crashed-at-{crash_at}")
        if crash_at is not None and rid == int(crash_at) and not os.path.exists(marker):
            with open(marker, "w") as fh:
                fh.write(f"{os.getpid()}\n")
            _log("fault", f"STAND-IN: crashing at step {rid} (SIGKILL, injected by the test)")
            os.kill(os.getpid(), signal.SIGKILL)
        on_file = os.environ.get("MILESRAY_TEST_CRASH_ON_FILE")
        file_marker = os.path.join(save or ".", ".stand-in-crashed-on-file")
        if on_file and os.path.exists(on_file) and not os.path.exists(file_marker):
            with open(file_marker, "w") as fh:
                fh.write(f"{os.getpid()} {rid}\n")
            _log("fault", f"STAND-IN: crashing after step {rid}: {on_file} exists (SIGKILL, injected by the test)")
            os.kill(os.getpid(), signal.SIGKILL)
        if crash_every and trained >= crash_every and rid < target - 1:
            _log("fault", f"STAND-IN: crashing after {trained} steps (SIGKILL, injected by the test)")
            os.kill(os.getpid(), signal.SIGKILL)
    _log("train.py:99", f"training done at step {target - 1}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
