#!/usr/bin/env python3
"""STAND-IN for Miles's ``train.py`` in tests (no GPU, no Miles here): prints Miles-like metric lines
and writes Megatron-like checkpoint directories. It is not Miles and trains nothing.

It reads the flags miles-ray passes to ``train.py`` (unknown ones are ignored): ``--num-rollout``,
``--save`` / ``--save-interval``, ``--load``, ``--start-rollout-id``, ``--eval-interval``,
``--skip-eval-before-train``, ``--eval-prompt-data NAME PATH``. Its loop is Miles' own (radixark/miles 31f1ca9,
``train.py`` lines 95-137), the training left out: for each 0-based ``rollout_id`` in ``range(start_rollout_id,
num_rollout)``:

* at the first rollout id of the job, with ``--eval-interval`` and without ``--skip-eval-before-train``, an eval
  BEFORE training (lines 96-97: of the model it started with);
* the lines Miles's rank 0 logs for the rollout and its train step (formats from ``miles/ray/rollout/metrics.py``
  and the Megatron actor), with a logger-like prefix;
* ``save(rollout_id)`` when ``should_run_periodic_action(rollout_id, save_interval, None, num_rollout)``
  (``miles/utils/misc.py`` 130-151, copied verbatim below: every K rollouts and at the last one): Megatron's
  ``<save>/iter_<rollout_id:07d>/`` (with a marker file), then ``<save>/latest_checkpointed_iteration.txt``;
* an eval when ``should_run_periodic_action(rollout_id, eval_interval, None)`` (lines 136-137: every K rollouts,
  NOT forced at the last one).

    [<time> rank0] rollout.py:88 - perf 19: {'rollout/episode_raw_reward': ..., 'perf/rollout_time': ...}
    [<time> rank0] actor.py:512 - rollout 19: {'rollout/raw_reward': ..., 'rollout/log_probs': ...}
    [<time> rank0] actor.py:601 - step 19: {'train/loss': ..., 'train/grad_norm': ...}
    [<time> rank0] checkpoint.py:40 - saved checkpoint from iteration      19 to DIR
    [<time> rank0] rollout.py:61 - eval 19: {'eval/aime': ..., 'eval/aime-truncated_ratio': ...}

A job whose ``--load`` dir has ``latest_checkpointed_iteration.txt`` = L starts at rollout L + 1
(``miles/backends/megatron_utils/actor.py`` line 212); none there: at 0; ``--start-rollout-id`` wins.

Values: the eval score climbs linearly to ``$MILESRAY_TEST_FAKE_EVAL_FINAL`` (default 0.4), the reward to
``$MILESRAY_TEST_FAKE_REWARD_FINAL`` (default 0.5); with ``$MILESRAY_TEST_FAKE_EVAL_PEAK=P`` the eval score peaks
at checkpoint P and falls after it (a best checkpoint that is not the newest). ``$MILESRAY_TEST_FAKE_TRAIN_EXIT`` sets the exit code;
``$MILESRAY_TEST_FAKE_ROLLOUT_SECONDS`` (default 0) how long each rollout takes (a run that is still running);
``$MILESRAY_TEST_FAKE_HANG_AFTER=N`` makes it print nothing more after rollout N, as a stuck NCCL collective does.

With ``--save DIR``, every metric value it prints is also stated in ``DIR/.stand-in-metrics`` (``<name> <rollout id>
<value>`` a line, appended as printed), so a test can hold what a reader made of the log lines (miles-ray's parser,
Polyaxon's points) to the values themselves, never to a second parse of the same lines.
Standard library only.
"""

from __future__ import annotations

import os
import sys
import time


def _flag(argv: list[str], name: str, default: str | None = None) -> str | None:
    """The value of the LAST ``name`` (as argparse: --extra-args come last and win)."""
    value = default
    for i, arg in enumerate(argv[:-1]):
        if arg == name:
            value = argv[i + 1]
    return value


def _eval_names(argv: list[str]) -> list[str]:
    if "--eval-prompt-data" not in argv:
        return []
    i = argv.index("--eval-prompt-data") + 1
    vals = []
    while i < len(argv) and not argv[i].startswith("--"):
        vals.append(argv[i])
        i += 1
    return vals[0::2]


def _log(where: str, message: str) -> None:
    stamp = time.strftime("%Y-%m-%d %H:%M:%S")
    print(f"[{stamp} rank0] {where} - {message}", flush=True)


def _state(save: str | None, rid: int, metrics: dict[str, object]) -> None:
    """Append the values just printed to ``<save>/.stand-in-metrics`` (none without --save)."""
    if save:
        os.makedirs(save, exist_ok=True)
        with open(os.path.join(save, ".stand-in-metrics"), "a") as fh:
            fh.writelines(f"{name} {rid} {value}\n" for name, value in metrics.items())


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
    """Where Miles starts: ``--start-rollout-id`` when given, else the loaded iteration + 1, else 0."""
    if given is not None:
        return given
    try:
        with open(os.path.join(load or "", "latest_checkpointed_iteration.txt")) as fh:
            loaded = int(fh.read().strip())
    except (OSError, ValueError):
        return 0
    _log("checkpoint.py:12", f"loaded checkpoint from {load} at iteration {loaded}")
    return loaded + 1


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    num_rollout = int(_flag(argv, "--num-rollout", "40"))
    save = _flag(argv, "--save")
    save_interval = _int_or_none(_flag(argv, "--save-interval"))
    eval_interval = _int_or_none(_flag(argv, "--eval-interval"))
    skip_eval_before_train = "--skip-eval-before-train" in argv
    evals = _eval_names(argv)
    if not evals:
        eval_interval = None  # no eval data: nothing to evaluate (Miles refuses the flag without it)
    eval_final = float(os.environ.get("MILESRAY_TEST_FAKE_EVAL_FINAL", "0.4"))
    reward_final = float(os.environ.get("MILESRAY_TEST_FAKE_REWARD_FINAL", "0.5"))
    start = start_rollout_id(_flag(argv, "--load"), _int_or_none(_flag(argv, "--start-rollout-id")))
    print(f"STAND-IN train.py (tests/fakes/fake_metrics_train.py): rollouts {start}..{num_rollout - 1}, save "
          f"{save} every {save_interval}, eval {evals} every {eval_interval}", flush=True)
    pause = float(os.environ.get("MILESRAY_TEST_FAKE_ROLLOUT_SECONDS", "0") or 0)

    peak = _int_or_none(os.environ.get("MILESRAY_TEST_FAKE_EVAL_PEAK"))

    def evaluate(rid: int, trained: int) -> None:  # the model after ``trained`` rollouts
        parts, stated = [], {}
        # climbing; with $MILESRAY_TEST_FAKE_EVAL_PEAK=P, falling again after checkpoint P (P + 1 rollouts trained)
        score = trained if peak is None or trained <= peak + 1 else 2 * (peak + 1) - trained
        for name in evals:
            stated[f"eval/{name}"] = round(eval_final * score / num_rollout, 6)
            parts.append(f"'eval/{name}': {stated[f'eval/{name}']}")
            parts.append(f"'eval/{name}-truncated_ratio': 0.03")
            parts.append(f"'eval/{name}-none_reward_ratio': 0.0")
        _log("rollout.py:61", f"eval {rid}: {{{', '.join(parts)}}}")
        _state(save, rid, stated)

    for rid in range(start, num_rollout):
        if eval_interval is not None and rid == start and not skip_eval_before_train:
            evaluate(rid, rid)
        if pause:
            time.sleep(pause)
        frac = (rid + 1) / num_rollout
        reward = round(reward_final * frac, 6)
        _log("rollout.py:88", f"perf {rid}: {{'rollout/episode_raw_reward': {reward}, "
                              f"'rollout/num_training_samples': 256, 'perf/rollout_time': 1.5}}")
        _log("actor.py:512", f"rollout {rid}: {{'rollout/raw_reward': {reward}, 'rollout/log_probs': -0.31, "
                             f"'rollout/ref_log_probs': -0.3}}")
        nan_from = os.environ.get("MILESRAY_TEST_FAKE_NAN_LOSS_FROM")  # a diverged loss (nan) from this rollout id
        loss = "nan" if nan_from and rid >= int(nan_from) else round(0.05 * (1 - frac), 6)
        _log("actor.py:601", f"step {rid}: {{'train/loss': {loss}, "
                             f"'train/grad_norm': 0.21, 'train/kl_loss': 0.0}}")
        _state(save, rid, {"rollout/episode_raw_reward": reward, "perf/rollout_time": 1.5, "rollout/raw_reward": reward,
                           "train/loss": loss})
        if save and should_run_periodic_action(rid, save_interval, None, num_rollout):
            path = os.path.join(save, f"iter_{rid:07d}")
            os.makedirs(path, exist_ok=True)
            with open(os.path.join(path, "STAND_IN_CHECKPOINT"), "w") as fh:
                fh.write(f"stand-in checkpoint of rollout {rid}\n")
            with open(os.path.join(save, "latest_checkpointed_iteration.txt"), "w") as fh:
                fh.write(str(rid))
            _log("checkpoint.py:40", f"saved checkpoint from iteration {rid:7d} to {save}")
        if should_run_periodic_action(rid, eval_interval, None):
            evaluate(rid, rid + 1)
        hang_after = os.environ.get("MILESRAY_TEST_FAKE_HANG_AFTER")  # a stuck collective: silent from here on
        if hang_after and rid >= int(hang_after):
            time.sleep(3600)
    return int(os.environ.get("MILESRAY_TEST_FAKE_TRAIN_EXIT", "0") or 0)

if __name__ == "__main__":
    sys.exit(main())
