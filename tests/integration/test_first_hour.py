"""The first hour on the embedded cluster (issue 25, part A): the current cluster is every verb's default,
'miles-ray env' lets Ray's own CLI in (`ray job list`, `ray status`, token auth included), an error naming a
missing cluster names the ones there are, and scripts/first-hour.sh -- the README's first steps, nothing
else -- exits 0."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from miles_ray.core.config import MilesRayConfig
from miles_ray.services import known_clusters
from tests.conftest import REPO

pytestmark = pytest.mark.ray

VENV_BIN = Path(sys.executable).parent  # where this interpreter's `ray` and `miles-ray` are
RAY_VARS = ("RAY_ADDRESS", "RAY_API_SERVER_ADDRESS", "RAY_AUTH_MODE", "RAY_AUTH_TOKEN_PATH", "RAY_AUTH_TOKEN")


@pytest.fixture
def current(local_ray, monkeypatch, tmp_path):
    """A state dir of this test's own in which the session's local Ray cluster is the current cluster (as
    'up' leaves it); no MILES_RAY_*/RAY_* from the developer's shell or the session."""
    root = tmp_path / "state"
    root.mkdir()
    (root / "local").symlink_to(local_ray.state_dir)
    monkeypatch.setenv("MILES_RAY_STATE_DIR", str(root))
    for key in [k for k in os.environ if k.startswith("MILES_RAY_") and k != "MILES_RAY_STATE_DIR"] + list(RAY_VARS):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.chdir(tmp_path)
    known_clusters.make_current(MilesRayConfig(name=local_ray.name), "local", True)
    return local_ray


def ray_cli(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    base = {k: v for k, v in os.environ.items() if k not in RAY_VARS}
    return subprocess.run([str(VENV_BIN / "ray"), *args], env={**base, "RAY_USAGE_STATS_ENABLED": "0", **env},
                          capture_output=True, text=True, timeout=120)


def exported(lines: str) -> dict[str, str]:
    """The variables of `export K=V` lines, as a shell's eval would set them."""
    out = {}
    for line in lines.splitlines():
        if line.startswith("export "):
            key, _, value = line[len("export "):].partition("=")
            out[key] = shlex.split(value)[0]
    return out


def test_verbs_default_to_the_current_cluster_and_ray_cli_gets_in_with_env(current, cli):
    code, out, err = cli("status")  # no --name, no --backend: the current cluster
    assert code == 0, err
    assert current.name in out
    assert f'eval "$(miles-ray env {current.name})"' in err  # the one-line hint, on stderr
    code, out, _ = cli("status", "-o", "json")
    assert "miles-ray env" not in out and json.loads(out)["name"] == current.name

    code, out, err = cli("submit", "--rehearse", "--nodes", "1", "--run", "first-hour-rehearse", "-o", "json")
    assert code == 0, err
    submission = json.loads(out)["submission_id"]

    code, lines, err = cli("env")
    assert code == 0, err
    variables = exported(lines)
    token = Path(variables["RAY_AUTH_TOKEN_PATH"])
    assert variables["RAY_AUTH_MODE"] == "token" and token == current.token_path
    assert token.stat().st_mode & 0o777 == 0o600
    assert token.read_text().strip() not in lines

    # without the token Ray's own CLI is refused; with what 'env' printed it gets in
    refused = ray_cli("job", "list", env={"RAY_ADDRESS": current.address})
    assert refused.returncode != 0
    jobs = ray_cli("job", "list", env=variables)
    assert jobs.returncode == 0, jobs.stderr
    assert submission in jobs.stdout + jobs.stderr
    status = ray_cli("status", env=variables)
    assert status.returncode == 0, status.stderr
    assert "GPU" in status.stdout

    # miles-ray itself reads the same environment: the Jobs API URL, not the GCS address 'ray status' needs
    os.environ.update(variables)
    try:
        code, out, err = cli("status", "first-hour-rehearse")
        assert code in (0, 5), err
    finally:
        for key in variables:
            os.environ.pop(key, None)


def test_clusters_lists_the_current_cluster(current, cli):
    code, out, err = cli("clusters", "-o", "json")
    assert code == 0, err
    data = json.loads(out)
    assert data["current"] == current.name
    assert [c["state"] for c in data["clusters"] if c["name"] == current.name] == ["running"]
    code, out, err = cli("clusters", "--live", "-o", "json")
    assert code == 0, err
    live = {c["name"]: c for c in json.loads(out)["clusters"]}
    assert live[current.name]["state"] == "running" and live[current.name]["checked"] == "live"


def test_an_error_naming_a_missing_cluster_names_the_current_one(current, cli):
    for args in (("status", "--name", "typo", "--backend", "local"),
                 ("submit", "--rehearse", "--name", "typo", "--backend", "local", "--run", "typo-run")):
        code, _, err = cli(*args)
        assert code != 0
        assert "no local cluster named typo" in err and f"{current.name} (local, running, current)" in err, err


def test_the_first_hour_script_exits_0():
    """scripts/first-hour.sh: the README's first steps, its own state dir and cluster, `miles-ray` and `ray`
    from this interpreter's venv (the tree under test first on PYTHONPATH)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("MILES_RAY_") and k not in RAY_VARS}
    env.update(PATH=f"{VENV_BIN}:{env.get('PATH', '')}", PYTHONPATH=str(REPO))
    proc = subprocess.run(["bash", str(REPO / "scripts" / "first-hour.sh")], env=env, capture_output=True, text=True,
                          timeout=900)
    tail = (proc.stdout + proc.stderr)[-6000:]
    assert proc.returncode == 0, tail
    assert "miles-ray-ux-first-hour" in proc.stdout + proc.stderr, tail  # the rehearsal, in Ray's job list
    assert "Autoscaler status" in proc.stdout, tail  # ray status
    assert "no cluster on this machine yet" in proc.stdout, tail  # down cleared the current cluster
