"""Issue 37 on the embedded cluster: the outputs a run keeps. On the session's REAL local Ray cluster, a supervised
run whose train.py is the STAND-IN tests/fakes/fake_metrics_train.py (Miles cannot run here: it prints Miles' metric
lines and writes Megatron-shaped checkpoints by Miles' numbering) checkpoints every 2 of 10 rollouts and evaluates
every 2, its eval score peaking at checkpoint 3 (``MILESRAY_TEST_FAKE_EVAL_PEAK``, set by the test); submitted with
``--keep-checkpoints 2 --keep-best eval/aime``, its supervisor (the real program, a detached process) keeps exactly
the two newest and the best on disk, ``runs outputs`` lists every checkpoint with its size as on disk, and ``runs pull``
brings the newest and the best home byte for byte."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from miles_ray.adapters import state
from miles_ray.core.supervision import parse_events
from tests.conftest import REPO
from tests.infra.fixtures import poll

pytestmark = [pytest.mark.ray]


@pytest.fixture
def world(env, tmp_path):
    root = tmp_path / "miles"
    root.mkdir()
    shutil.copy(REPO / "tests" / "fakes" / "fake_metrics_train.py", root / "train.py")  # STAND-IN train.py
    mount = tmp_path / "mnt"
    (tmp_path / "miles-ray.yaml").write_text(f"miles_root: {root}\nmount_path: {mount}\n")
    return {"cluster": env, "mount": mount}


def on_disk(path: Path) -> int:
    return sum(os.lstat(os.path.join(d, f)).st_size for d, _, files in os.walk(path) for f in files)


def test_retention_keeps_the_two_newest_and_the_best_and_outputs_lists_them(world, cli):
    run = "keep-best"
    code, out, err = cli("submit", "--address", world["cluster"].address, "--run", run, "--nodes", "1",
                         "--num-rollout", "10", "--extra-args", "--save-interval 2 --eval-interval 2",
                         "--keep-checkpoints", "2", "--keep-best", "eval/aime", "--miles-commit", "abc123",
                         "--allow-miles-drift", "--no-follow", "-o", "json",
                         "--env", "MILESRAY_TEST_FAKE_EVAL_PEAK=3", "--env", "MILESRAY_TEST_FAKE_ROLLOUT_SECONDS=0.5")
    assert code == 0, err
    record = state.load_record(run)
    assert record["supervisor"]["keep_checkpoints"] == 2 and record["supervisor"]["keep_best"] == "eval/aime"

    def done():
        code, out, _ = cli("status", run, "-o", "json")
        info = json.loads(out) if out else {}
        return info if (info.get("supervisor") or {}).get("finished") else None

    info = poll(f"run {run}'s supervisor to finish", done, 240, interval=1.0)
    assert info["status"] == "SUCCEEDED", info

    ckpt = Path(record["checkpoint_dir"])
    assert sorted(p.name for p in ckpt.iterdir() if p.name.startswith("iter_")) == [
        "iter_0000003", "iter_0000007", "iter_0000009"]
    events = parse_events((state.state_dir() / "supervisors" / run / "events.log").read_text())
    deleted = [e for e in events if e["event"] == "checkpoint_deleted"]
    assert sorted(e["iteration"] for e in deleted) == [1, 5] and all(e["bytes"] > 0 for e in deleted)

    code, out, err = cli("runs", "outputs", run, "-o", "json")
    assert code == 0, err
    result = json.loads(out)
    assert result["seen"]["live"] is True and result["latest"] == "9"
    rows = {r["iteration"]: r for r in result["checkpoints"]}
    assert sorted(rows) == [1, 3, 5, 7, 9]
    for it in (3, 7, 9):
        row = rows[it]
        assert (row["complete"], row["kept"], row["attempt"], row["registered"]) == (True, True, 1, [])
        assert row["bytes"] == on_disk(ckpt / f"iter_{it:07d}") and row["path"] == str(ckpt / f"iter_{it:07d}")
        assert set(row) >= {"iteration", "complete", "bytes", "path", "attempt", "metrics", "registered", "kept"}
    assert rows[3]["metrics"]["eval/aime"] == max(r["metrics"]["eval/aime"] for r in rows.values())
    assert "the best by eval/aime" in rows[3]["why"] and "newest complete" in rows[9]["why"]
    for it in (1, 5):
        assert (rows[it]["state"], rows[it]["kept"]) == ("deleted", False) and "deleted by the retention" in \
            rows[it]["why"]
    code, out, err = cli("runs", "outputs", run)
    assert code == 0, err
    assert "the best by eval/aime" in out and "keep the newest 2 and the best by eval/aime" in out

    # runs pull: the newest and (--iteration, --best) the best home byte for byte; a second pull copies nothing
    def files_of(d: Path) -> dict[str, bytes]:
        return {str(p.relative_to(d)): p.read_bytes() for p in sorted(d.rglob("*")) if p.is_file()}

    home = world["mount"].parent / "home"
    for args, it in ((), 9), (("--iteration", "3"), 3), (("--best", "eval/aime"), 3):
        dest = home / f"pulled-{'-'.join(args) or 'newest'}".replace("/", "_")
        code, out, err = cli("runs", "pull", run, *args, "--to", str(dest), "-o", "json")
        assert code == 0, err
        assert json.loads(out)["iteration"] == it
        assert files_of(dest / f"iter_{it:07d}") == files_of(ckpt / f"iter_{it:07d}")
        assert (dest / "latest_checkpointed_iteration.txt").read_text() == str(it)
    code, out, err = cli("runs", "pull", run, "--to", str(home / "pulled-newest"), "-o", "json")
    assert code == 0 and json.loads(out)["copied_files"] == 0, err
