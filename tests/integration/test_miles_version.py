"""Miles version awareness on the real embedded Ray cluster (4 x 8 fake GPUs): ``submit`` (direct mode) reads the
Miles commit in the image with a probe job on a GPU worker and refuses a job whose catalog mirrors another Miles;
``doctor`` reports the drift.

No Miles image runs here: ``miles_root`` points at a FAKE Miles checkout made by the test (a real git repository
holding the stand-in train.py, tests/fakes/fake_train.py), which every local worker sees. The catalog's commit is
the module constant the product reads (``miles_ray.core.miles_version.CATALOG_MILES_COMMIT``), set per test to the
FAKE checkout's HEAD (match) or to another commit (drift)."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from miles_ray.adapters import ray_jobs
from miles_ray.core import miles_version
from tests.conftest import REPO

pytestmark = pytest.mark.ray

OTHER = "0123456789abcdef0123456789abcdef01234567"


@pytest.fixture
def fake_miles_checkout(tmp_path) -> tuple[Path, str]:
    """A FAKE Miles checkout: a git repository with the stand-in train.py and a model-args script, one commit.
    Returns (root, its HEAD commit)."""
    root = tmp_path / "miles"
    (root / "scripts" / "models").mkdir(parents=True)
    shutil.copy(REPO / "tests" / "fakes" / "fake_train.py", root / "train.py")
    (root / "scripts" / "models" / "qwen3-4B.sh").write_text("MODEL_ARGS=(--num-layers 36)\n")
    git = ["git", "-C", str(root), "-c", "user.name=t", "-c", "user.email=t@example.invalid"]
    subprocess.run([*git, "init", "-q"], check=True)
    subprocess.run([*git, "add", "-A"], check=True)
    subprocess.run([*git, "commit", "-q", "-m", "fake miles"], check=True)
    head = subprocess.run([*git, "rev-parse", "HEAD"], check=True, capture_output=True, text=True).stdout.strip()
    (tmp_path / "miles-ray.yaml").write_text(f"miles_root: {root}\n")
    return root, head


def submit(cli, address: str, *args: str) -> tuple[int, dict | None, str]:
    code, out, err = cli("submit", "--address", address, "--name", "miles-test", "--no-follow", "-o", "json", *args)
    return code, (json.loads(out) if out.strip() else None), err


def record(cli, run: str) -> dict | None:
    _, out, _ = cli("runs", "-o", "json")
    return next((r for r in json.loads(out) if r["run"] == run), None)


def test_a_matching_image_goes_ahead_and_the_record_keeps_the_commit(env, cli, fake_miles_checkout, monkeypatch):
    root, head = fake_miles_checkout
    monkeypatch.setattr(miles_version, "CATALOG_MILES_COMMIT", head)
    code, res, err = submit(cli, env.address, "--run", "mv-match", "--nodes", "1")
    assert code == 0, err
    assert res["created"] is True and res["miles_version"]["status"] == "match" and res["miles_notice"] is None
    assert res["miles_version"]["where"].startswith("GPU worker 127.0.0.")  # read on a worker, not the driver
    rec = record(cli, "mv-match")
    assert rec["miles_commit"] == head
    assert rec["miles_version"] == {"status": "match", "catalog_commit": head, "image_commit": head, "source": "probe",
                                    "where": res["miles_version"]["where"], "allowed_drift": False}


def test_a_drifted_image_is_refused_unless_allowed(env, cli, fake_miles_checkout, monkeypatch):
    root, head = fake_miles_checkout
    monkeypatch.setattr(miles_version, "CATALOG_MILES_COMMIT", OTHER)
    code, res, err = submit(cli, env.address, "--run", "mv-drift", "--nodes", "1")
    assert code == 1, err  # like the other refusals of what the live cluster runs (e.g. its Ray version)
    lines = [ln for ln in err.splitlines() if ln.startswith("error:")]
    assert len(lines) == 1 and f"({head[:12]} at {root})" in lines[0] and OTHER[:12] in lines[0], err
    assert "--mode launcher" in err and "--allow-miles-drift" in err and "Traceback" not in err
    assert record(cli, "mv-drift") is None  # nothing recorded ...
    assert not [j for j in ray_jobs.list_jobs(env.address) if j["job_id"] == "miles-ray-miles-test-mv-drift"]

    code, res, err = submit(cli, env.address, "--run", "mv-drift", "--nodes", "1", "--allow-miles-drift")
    assert code == 0, err
    assert res["created"] is True and "--allow-miles-drift" in err  # the notice
    rec = record(cli, "mv-drift")
    assert rec["miles_commit"] == head
    assert rec["miles_version"]["status"] == "drift" and rec["miles_version"]["allowed_drift"] is True
    assert rec["miles_version"]["catalog_commit"] == OTHER


def test_an_unreadable_commit_is_a_notice_and_miles_commit_contradicting_the_image_is_refused(
        env, cli, fake_miles_checkout, monkeypatch):
    root, head = fake_miles_checkout
    monkeypatch.setattr(miles_version, "CATALOG_MILES_COMMIT", head)
    code, _, err = submit(cli, env.address, "--run", "mv-assert", "--nodes", "1", "--miles-commit", OTHER[:8])
    assert code == 1 and f"--miles-commit {OTHER[:8]} but the Miles checkout in the image is at {head[:12]}" in err
    assert record(cli, "mv-assert") is None
    shutil.rmtree(root / ".git")  # no git checkout: the commit cannot be read
    code, res, err = submit(cli, env.address, "--run", "mv-unknown", "--nodes", "1")
    assert code == 0, err
    assert res["miles_version"]["status"] == "unknown" and "could not be read" in err
    assert record(cli, "mv-unknown")["miles_commit"] is None
    code, _, err = cli("submit", "--address", env.address, "--rehearse", "--allow-miles-drift", "--run", "mv-r")
    assert code == 2 and "--allow-miles-drift applies to --mode direct" in err


def test_direct_mode_refuses_a_cluster_without_the_trainer_entry_point(env, cli, tmp_path):
    """miles_root is an empty dir on the nodes: the job would fail at once on 'can't open file .../train.py'."""
    empty = tmp_path / "no-miles"
    empty.mkdir()
    (tmp_path / "miles-ray.yaml").write_text(f"miles_root: {empty}\n")
    code, res, err = submit(cli, env.address, "--run", "mv-noentry", "--nodes", "1")
    assert code == 2, err
    lines = [ln for ln in err.splitlines() if ln.startswith("error:")]
    assert len(lines) == 1 and f"{empty}/train.py" in lines[0] and "GPU worker 127.0.0." in lines[0], err
    assert record(cli, "mv-noentry") is None  # nothing recorded, no job
    assert not [j for j in ray_jobs.list_jobs(env.address) if j["job_id"] == "miles-ray-miles-test-mv-noentry"]


def test_doctor_reports_a_drift(env, cli, fake_miles_checkout, monkeypatch):
    root, head = fake_miles_checkout
    monkeypatch.setattr(miles_version, "CATALOG_MILES_COMMIT", OTHER)
    code, out, err = cli("doctor", "--address", env.address, "-o", "json", "--timeout", "60")
    assert code == 4, err
    f = {x["check"]: x for x in json.loads(out)["findings"]}["miles_version"]
    assert f["status"] == "problem" and f"the image holds Miles {head[:12]}, the catalog mirrors {OTHER[:12]}" in f["summary"]
    assert f["checklist"] == "Keep the container image and Ray version aligned across replicas"
    assert "--mode launcher" in f["fix"] and any(head in e for e in f["evidence"])
    monkeypatch.setattr(miles_version, "CATALOG_MILES_COMMIT", head)
    code, out, err = cli("doctor", "--address", env.address, "-o", "json", "--timeout", "60")
    assert {x["check"]: x for x in json.loads(out)["findings"]}["miles_version"]["status"] == "ok"
