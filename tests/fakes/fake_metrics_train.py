#!/usr/bin/env python3
"""STAND-IN for Miles's ``train.py`` in tests (no GPU, no Miles here): prints Miles-like metric lines
and writes Megatron-like checkpoint directories. It is not Miles and trains nothing.

It reads the flags miles-ray passes to ``train.py`` (unknown ones are ignored): ``--num-rollout``,
``--save`` / ``--save-interval``, ``--eval-interval``, ``--eval-prompt-data NAME PATH``. For each rollout
id it prints the lines Miles's rank 0 logs (formats from radixark/miles ``miles/ray/rollout/metrics.py``
and the Megatron actor), with a logger-like prefix:

    [<time> rank0] rollout.py:88 - perf 19: {'rollout/episode_raw_reward': ..., 'perf/rollout_time': ...}
    [<time> rank0] actor.py:512 - rollout 19: {'rollout/raw_reward': ..., 'rollout/log_probs': ...}
    [<time> rank0] actor.py:601 - step 19: {'train/loss': ..., 'train/grad_norm': ...}
    [<time> rank0] rollout.py:61 - eval 19: {'eval/aime': ..., 'eval/aime-truncated_ratio': ...}

Every ``--save-interval`` rollouts it creates ``<save>/iter_<rollout_id + 1:07d>/`` (with a marker file)
and ``<save>/latest_checkpointed_iteration.txt``, as Megatron does.

Values: the eval score climbs linearly to ``$MILESRAY_TEST_FAKE_EVAL_FINAL`` (default 0.4), the reward to
``$MILESRAY_TEST_FAKE_REWARD_FINAL`` (default 0.5). ``$MILESRAY_TEST_FAKE_TRAIN_EXIT`` sets the exit code;
``$MILESRAY_TEST_FAKE_ROLLOUT_SECONDS`` (default 0) how long each rollout takes (a run that is still running).
Standard library only.
"""

from __future__ import annotations

import os
import sys
import time


def _flag(argv: list[str], name: str, default: str | None = None) -> str | None:
    if name in argv:
        i = argv.index(name)
        if i + 1 < len(argv):
            return argv[i + 1]
    return default


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


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    num_rollout = int(_flag(argv, "--num-rollout", "40"))
    save = _flag(argv, "--save")
    save_interval = int(_flag(argv, "--save-interval", "20"))
    eval_interval = int(_flag(argv, "--eval-interval", "0") or 0)
    evals = _eval_names(argv)
    eval_final = float(os.environ.get("MILESRAY_TEST_FAKE_EVAL_FINAL", "0.4"))
    reward_final = float(os.environ.get("MILESRAY_TEST_FAKE_REWARD_FINAL", "0.5"))
    print(f"STAND-IN train.py (tests/fakes/fake_metrics_train.py): {num_rollout} rollouts, save {save} every "
          f"{save_interval}, eval {evals} every {eval_interval}", flush=True)
    pause = float(os.environ.get("MILESRAY_TEST_FAKE_ROLLOUT_SECONDS", "0") or 0)
    for rid in range(num_rollout):
        if pause:
            time.sleep(pause)
        frac = (rid + 1) / num_rollout
        reward = round(reward_final * frac, 6)
        _log("rollout.py:88", f"perf {rid}: {{'rollout/episode_raw_reward': {reward}, "
                              f"'rollout/num_training_samples': 256, 'perf/rollout_time': 1.5}}")
        _log("actor.py:512", f"rollout {rid}: {{'rollout/raw_reward': {reward}, 'rollout/log_probs': -0.31, "
                             f"'rollout/ref_log_probs': -0.3}}")
        _log("actor.py:601", f"step {rid}: {{'train/loss': {round(0.05 * (1 - frac), 6)}, "
                             f"'train/grad_norm': 0.21, 'train/kl_loss': 0.0}}")
        if save and save_interval and (rid + 1) % save_interval == 0:
            iteration = rid + 1
            path = os.path.join(save, f"iter_{iteration:07d}")
            os.makedirs(path, exist_ok=True)
            with open(os.path.join(path, "STAND_IN_CHECKPOINT"), "w") as fh:
                fh.write(f"stand-in checkpoint, rollout {rid}\n")
            with open(os.path.join(save, "latest_checkpointed_iteration.txt"), "w") as fh:
                fh.write(str(iteration))
            _log("checkpoint.py:40", f"saved checkpoint from iteration {iteration:7d} to {save}")
        if evals and eval_interval and ((rid + 1) % eval_interval == 0 or rid == num_rollout - 1):
            parts = []
            for name in evals:
                parts.append(f"'eval/{name}': {round(eval_final * frac, 6)}")
                parts.append(f"'eval/{name}-truncated_ratio': 0.03")
                parts.append(f"'eval/{name}-none_reward_ratio': 0.0")
            _log("rollout.py:61", f"eval {rid}: {{{', '.join(parts)}}}")
    return int(os.environ.get("MILESRAY_TEST_FAKE_TRAIN_EXIT", "0") or 0)


if __name__ == "__main__":
    sys.exit(main())
