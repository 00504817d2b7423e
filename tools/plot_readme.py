"""Regenerate docs/watching-a-run.png, the figure of the README section "Watching a run": `miles-ray runs plot` of
two runs, one of them resumed.

No cluster: the two runs are recorded as `miles-ray submit` records them (its own preparation, for a Ray head that
is gone, as tests/unit/test_watch_cli.py makes its runs) and their driver logs saved as `down` saves them; `runs
plot` then reads the saved copies, as it does after `down`. The logs are what the STAND-IN trainer
tests/fakes/fake_metrics_train.py prints (Miles' loop and metric lines; it trains nothing, so its curves are
straight): run q4-a 40 rollouts in one go; run q4-b 40 rollouts in two attempts, the second resumed from the
checkpoint of rollout 19 the first saved, its log as `logs RUN` prints a supervised run's (each attempt after its
`== attempt N (...) ==` header). Everything lives in one temp dir, removed at the end.

Run: .venv/bin/python tools/plot_readme.py [--out docs/watching-a-run.png]
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
STAND_IN = REPO / "tests" / "fakes" / "fake_metrics_train.py"
PNG = REPO / "docs" / "watching-a-run.png"
CREATED = "2026-08-22T00:00:00+00:00"
ROLLOUTS = 40
FLAGS = ["--num-rollout", str(ROLLOUTS), "--eval-interval", "10", "--eval-prompt-data", "aime", "/data/aime.jsonl",
         "--save-interval", "10"]


def stand_in(args: list[str], **env: str) -> str:
    """What the STAND-IN trainer prints for ``args`` (its STAND-IN banner line left out)."""
    proc = subprocess.run([sys.executable, str(STAND_IN), *FLAGS, *args], capture_output=True, text=True, check=True,
                          env={**os.environ, **env})
    return "".join(ln for ln in proc.stdout.splitlines(keepends=True) if not ln.startswith("STAND-IN"))


def record(run: str) -> str:
    """Record ``run`` as `miles-ray submit` does (a direct-mode run of ROLLOUTS rollouts on a head now gone);
    its submission id."""
    from miles_ray.adapters import state
    from miles_ray.core.config import load_config
    from miles_ray.core.submission import SubmitRequest, SubmitTarget, prepare_submit, validate_request

    cfg = load_config({"name": "wt", "recipe": "Qwen3-4B", "nodes": 4}, environ={})
    valid = validate_request(cfg, SubmitRequest(run=run, num_rollout=ROLLOUTS, max_restarts=0,
                                                dataset_revision="d1"))
    job = prepare_submit(cfg, valid, SubmitTarget("address", "http://127.0.0.1:9", supervisors=frozenset()),
                         created=CREATED, launchers_dir="/unused")
    state.create_record(job.record)
    return job.record["submission_id"]


def save(run: str, sid: str, logs: str) -> None:
    """The run's job info and driver log saved, as `down` saves them."""
    from miles_ray.adapters import state

    state.save_run_copy(run, {"job_id": sid, "submission_id": sid, "status": "SUCCEEDED", "start_time": 1}, logs,
                        "down", CREATED)


def make_runs(work: Path) -> None:
    ckpt = work / "ckpt-b"
    sid = record("q4-a")
    save("q4-a", sid, stand_in([], MILESRAY_TEST_FAKE_EVAL_FINAL="0.31", MILESRAY_TEST_FAKE_REWARD_FINAL="0.42"))
    sid = record("q4-b")
    b_env = {"MILESRAY_TEST_FAKE_EVAL_FINAL": "0.38", "MILESRAY_TEST_FAKE_REWARD_FINAL": "0.55"}
    # attempt 1 lost after rollout 24 (its last checkpoint: rollout 19), attempt 2 resumed from it
    first = stand_in(["--save", str(ckpt)], **b_env)
    first = first[:first.index("] rollout.py:88 - perf 25:")].rpartition("\n")[0] + "\n"
    (ckpt / "latest_checkpointed_iteration.txt").write_text("19")
    second = stand_in(["--save", str(ckpt), "--load", str(ckpt)], **b_env)
    save("q4-b", sid, f"== attempt 1 ({sid}) ==\n{first}== attempt 2 ({sid}-2), resumed from {ckpt} iter 19, "
                      f"from rollout 20 ==\n{second}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=PNG, help=f"the image to write (default: {PNG.relative_to(REPO)})")
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="plot-readme-"))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MILES_RAY_", "RAY_", "POLYAXON"))}
    env["MILES_RAY_STATE_DIR"] = os.environ["MILES_RAY_STATE_DIR"] = str(work / "state")
    try:
        make_runs(work)
        exe = Path(sys.executable).parent / "miles-ray"
        proc = subprocess.run([str(exe), "runs", "plot", "q4-a", "q4-b", "--out", str(args.out.resolve())],
                              cwd=work, env=env, capture_output=True, text=True, timeout=300)
        print(proc.stdout + proc.stderr, end="")
        return proc.returncode
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
