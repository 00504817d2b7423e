"""The retention's cost per checkpoint (issue 37), measured side by side with writing the checkpoint, in one run.

The shipped supervisor program (launchers/supervise.py with miles_ray/core/supervision.py beside it, as a run's
supervisor runs it) with ``--keep-checkpoints 2 --keep-best eval/aime``: for each of ROUNDS new checkpoints (Megatron's
layout: FILES files of FILE_KIB KiB each in ``iter_<N:07d>``, then the tracker) the time to write it, then the time of
the supervisor's pruning that follows it (``Supervisor.prune``: listing the checkpoint dir, the plan, and deleting the
one that falls out of the window, with its ``checkpoint_deleted`` event). Prints the median of each and their ratio.
Here the checkpoints are small and on local disk: the pruning's own cost (listing, plan, the deletion's
walk + rmtree) is what it shows; on a shared filesystem the deletion of a real checkpoint's files costs what that
filesystem charges per file.

Run: .venv/bin/python benchmarks/bench_retention.py (ROUNDS=N, FILES=N, FILE_KIB=N)
"""

from __future__ import annotations

import importlib.util
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from miles_ray.controller.program import program_files  # noqa: E402

ROUNDS = int(os.environ.get("ROUNDS", "40"))
FILES = int(os.environ.get("FILES", "64"))  # a torch_dist checkpoint: one .distcp per rank, .metadata, common.pt
FILE_KIB = int(os.environ.get("FILE_KIB", "256"))


def load_program(d: Path):
    for name, text in program_files().items():
        (d / name).write_text(text)
    spec = importlib.util.spec_from_file_location("bench_supervise", d / "supervise.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def main() -> int:
    with tempfile.TemporaryDirectory(prefix="bench-retention-") as tmp:
        tmp_path = Path(tmp)
        (tmp_path / "program").mkdir()
        program = load_program(tmp_path / "program")
        root = tmp_path / "ckpt"
        root.mkdir()
        lines: list[str] = []
        spec = program.sv.SupervisorSpec.of({
            "run": "bench", "head_url": "http://127.0.0.1:9", "submission_id": "bench", "max_restarts": 0,
            "first_job": {"entrypoint": "python3 train.py"}, "checkpoint_dir": str(root), "keep_checkpoints": 2,
            "keep_best": "eval/aime"})
        sup = program.Supervisor(spec, api=None, out=lines.append)
        sup.resumed_iteration[1] = None
        blob = os.urandom(FILE_KIB * 1024)
        write, prune = [], []
        for it in range(ROUNDS):
            t = time.perf_counter()
            d = root / f"iter_{it:07d}"
            d.mkdir()
            for i in range(FILES):
                (d / f"__{i}_0.distcp").write_bytes(blob)
            (root / "latest_checkpointed_iteration.txt").write_text(str(it))
            write.append(time.perf_counter() - t)
            sup.scores.feed(1, f"step {it}: {{}}\neval {it}: {{'eval/aime': {0.5 if it == 3 else 0.1}}}\n")
            t = time.perf_counter()
            sup.prune(1, live=True)
            prune.append(time.perf_counter() - t)
        deleted = sum('"checkpoint_deleted"' in line for line in lines)
        left = sorted(p.name for p in root.iterdir() if p.name.startswith("iter_"))
    w, p = statistics.median(write), statistics.median(prune)
    print(f"checkpoints: {ROUNDS} of {FILES} files x {FILE_KIB} KiB ({FILES * FILE_KIB / 1024:.0f} MiB each); "
          f"deleted {deleted}, left {left}")
    print(f"write a checkpoint (median): {w * 1000:.1f} ms")
    print(f"the retention after it (median: list, plan, delete one): {p * 1000:.1f} ms")
    print(f"ratio retention / write: {p / w:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
