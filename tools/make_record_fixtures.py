"""Regenerate tests/data/records/: run records as THIS checkout's code writes them, and the golden outputs of its
CLI reading them back once their cluster is gone (tests/unit/test_records_from_older_main.py holds later code to
them). Needs real Ray (an embedded cluster of 1 head + 1 worker x 8 fake GPUs is started and stopped here) and the
Polyaxon server sandbox of the test tier (tests/infra/haupt.py): run it under the heavy-test lock::

    flock /tmp/miles-heavy.lock .venv/bin/python tools/make_record_fixtures.py

Cases (each a state dir of its own under tests/data/records/CASE/):

* ``supervised_local``: ``submit`` on the embedded cluster (real CLI, real supervisor process); the STAND-IN
  train.py (tests/fakes/fake_ckpt_train.py) is SIGKILLed after step 7, attempt 2 resumes from iteration 5 and the
  run SUCCEEDS;
* ``kuberay``: a run on KubeRay cluster ``ml/q4`` (``--max-restarts 0``: a plain Ray job), submitted by submit's own
  I/O step (``services.runs.submit._execute``) through the head it holds open -- the embedded head stands for the
  port-forward to ``q4-head-svc`` (no Kubernetes here) -- then read once it ended, which saves its copy;
* ``polyaxon_tracked``: ``submit`` on the embedded cluster recorded as made through Polyaxon (as
  ``up --via polyaxon`` records it), so the run is tracked as a Polyaxon run on the sandbox server;
* ``launcher_job``: ``--mode launcher`` for KubeRay cluster ``ml/q4``: the upstream launcher as a Polyaxon job,
  created on the sandbox server by ``services.runs.polyaxon_job.launcher_as_polyaxon_job`` (as
  tests/integration/test_launcher_job.py does).

Ray's usual dashboard port (8265) is held while the cluster starts, so the records name a head on a port nothing
else is likely to use when the test reads them. Then the cluster and the server are stopped, and each case's golden outputs are written by this checkout's CLI
(``golden/*.txt``: exit code, stdout, stderr, normalized by the test's ``normalize``).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.unit.test_records_from_older_main import CASES, golden_outputs  # noqa: E402

CLUSTER = "fixtures"
CRASH_AT = 7


def _cli(args: list[str], env: dict[str, str], cwd: Path, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "miles_ray.cli.app", *args], capture_output=True, text=True,
                          env=env, cwd=cwd, timeout=timeout)


def _wait_finished(run: str, env: dict[str, str], cwd: Path, timeout: float = 420) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        p = _cli(["status", run, "-o", "json"], env, cwd)
        if p.stdout.strip():
            info = json.loads(p.stdout)
            if (info.get("supervisor") or {}).get("finished"):
                return info
        time.sleep(2)
    raise SystemExit(f"run {run}: its supervisor did not finish in {timeout:.0f} s")


def _checkout(tmp: Path, name: str, stand_in: str) -> Path:
    """A Miles checkout whose train.py is the STAND-IN, and a config naming it; returns the dir to run from."""
    d = tmp / name
    (d / "miles").mkdir(parents=True)
    shutil.copy(REPO / "tests" / "fakes" / stand_in, d / "miles" / "train.py")
    (d / "miles-ray.yaml").write_text(f"miles_root: {d / 'miles'}\nmount_path: {d / 'mnt'}\n")
    return d


def _submit(address: str, run: str, *extra: str) -> list[str]:
    return ["submit", "--address", address, "--run", run, "--nodes", "1", "--num-rollout", "12",
            "--miles-commit", "abc123", "--allow-miles-drift", "--no-follow", "-o", "json", *extra]


def make_supervised_local(address: str, env: dict[str, str], tmp: Path) -> None:
    cwd = _checkout(tmp, "sup", "fake_ckpt_train.py")
    p = _cli([*_submit(address, "sup-twice", "--extra-args", "--save-interval 3", "--env",
                       f"MILESRAY_TEST_CRASH_AT_STEP={CRASH_AT}")], env, cwd)
    assert p.returncode == 0, p.stderr
    info = _wait_finished("sup-twice", env, cwd)
    assert info["status"] == "SUCCEEDED" and [a["status"] for a in info["attempts"]] == ["FAILED", "SUCCEEDED"], info
    _cli(["logs", "sup-twice"], env, cwd)  # what a user reads at the end: the last attempt's copy is saved
    _cli(["runs", "outputs", "sup-twice"], env, cwd)  # its checkpoints listed while they are there (kept)


def make_kuberay(url: str, env: dict[str, str], tmp: Path) -> None:
    from miles_ray.core.config import load_config
    from miles_ray.core.submission import SubmitRequest, SubmitTarget, prepare_submit, validate_request
    from miles_ray.services.probes import payload_python
    from miles_ray.services.runs.ray_job import RayJob
    from miles_ray.services.runs.submit import _execute, _now, launchers_dir, supervisor_kinds

    cwd = _checkout(tmp, "kuberay", "fake_ckpt_train.py")
    cfg = load_config({"name": "q4", "namespace": "ml", "nodes": 1, "miles_root": str(cwd / "miles"),
                       "mount_path": str(cwd / "mnt")}, environ={})
    valid = validate_request(cfg, SubmitRequest(run="kr-1", num_rollout=4, max_restarts=0,
                                                miles_commit="abc123", check_data=False))
    address = "k8s://ml/q4"
    target = SubmitTarget(backend="kuberay", address=address, python=payload_python(address),
                          supervisors=supervisor_kinds())
    job = prepare_submit(cfg, valid, target, created=_now(), launchers_dir=str(launchers_dir()), environ={})
    submitted = _execute(cfg, job, url, None, allow_miles_drift=True)
    rec = json.loads(Path(submitted.record).read_text())
    deadline = time.monotonic() + 240
    while RayJob(rec, url=url).state().status not in ("SUCCEEDED", "FAILED", "STOPPED"):
        if time.monotonic() > deadline:
            raise SystemExit("run kr-1 did not end in 240 s")
        time.sleep(2)


def make_polyaxon_tracked(address: str, env: dict[str, str], tmp: Path, haupt, local_state: Path) -> None:
    from miles_ray.adapters.local_ray import state as lr

    haupt.create_project("miles-tracked")
    before = lr.read_state(local_state, CLUSTER)
    lr.write_state(local_state, CLUSTER, {**before, "via": "polyaxon", "polyaxon_owner": "default",
                                          "polyaxon_project": "miles-tracked", "polyaxon_host": haupt.host})
    try:
        cwd = _checkout(tmp, "tracked", "fake_metrics_train.py")
        p = _cli([*_submit(address, "tracked-1", "--name", CLUSTER, "--dataset-revision", "d1",
                           "--model-revision", "m1")], env, cwd)
        assert p.returncode == 0, p.stderr
        info = _wait_finished("tracked-1", env, cwd)
        assert info["status"] == "SUCCEEDED", info
        _cli(["logs", "tracked-1"], env, cwd)
        _cli(["runs", "outputs", "tracked-1"], env, cwd)
    finally:
        lr.write_state(local_state, CLUSTER, before)


def make_launcher_job(haupt) -> None:
    from miles_ray.core.config import load_config
    from tests.conftest import IMAGE
    from miles_ray.core.submission import SubmitRequest, SubmitTarget, prepare_submit, validate_request
    from miles_ray.services.runs.polyaxon_job import launcher_as_polyaxon_job

    haupt.create_project("miles-launch")
    cfg = load_config({"nodes": 2, "image": IMAGE, "namespace": "ml", "name": "q4", "polyaxon_host": haupt.host,
                       "polyaxon_project": "miles-launch"}, environ={})
    valid = validate_request(cfg, SubmitRequest(run="launch-1", mode="launcher"))
    job = prepare_submit(cfg, valid, SubmitTarget("kuberay", "k8s://ml/q4"), created="2026-12-07T00:00:00+00:00",
                         launchers_dir="/unused")
    launcher_as_polyaxon_job(cfg, job.with_head_ray_version(cfg, "2.60.0").record, job.operation)


def _keep(state: Path, run: str, out: Path) -> None:
    """The run's files as the state dir keeps them: its record, its saved copies, its supervisor's dir -- but for
    the copy of the supervisor's program (``program/``: code, not state; nothing that reads a run reads it). This
    checkout's own path (in the interpreter a local supervisor runs with) is written as ``/opt/miles-ray``, as if
    the state dir came from a machine with miles-ray installed there (the repository names no path outside it)."""
    if out.exists():
        shutil.rmtree(out)
    for rel in (f"runs/{run}.json", f"runs/{run}.saved", f"supervisors/{run}"):
        src = state / rel
        if src.is_dir():
            shutil.copytree(src, out / rel, ignore=shutil.ignore_patterns("*.lock", ".*.tmp", "program"))
        elif src.exists():
            (out / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, out / rel)
    for path in sorted(p for p in out.rglob("*") if p.is_file()):
        text = path.read_text()
        if str(REPO) in text:
            path.write_text(text.replace(str(REPO), "/opt/miles-ray"))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=REPO / "tests" / "data" / "records")
    ap.add_argument("--goldens-only", action="store_true", help="keep the records, write the golden outputs again")
    ap.add_argument("--from-state", type=Path, help="take the records from this state dir (a run of this tool "
                                                    "that stopped before its end) instead of making them")
    args = ap.parse_args(argv)
    if args.from_state:
        for case, run in CASES.items():
            _keep(args.from_state, run, args.out / case)
    elif not args.goldens_only:
        from miles_ray.adapters import local_ray as lr
        from tests.infra import haupt as hp

        tmp = Path(tempfile.mkdtemp(prefix="miles-ray-fixtures-"))
        state = tmp / "state"
        env = {k: v for k, v in os.environ.items() if not k.startswith("MILES_RAY_") and k not in (
            "RAY_ADDRESS", "POLYAXON_HOST", "RAY_API_SERVER_ADDRESS")}
        env.update(MILES_RAY_STATE_DIR=str(state), PYTHONPATH=str(REPO))
        os.environ.update(MILES_RAY_STATE_DIR=str(state))
        # Ray's usual dashboard port held while the cluster starts: it takes a free one, so a cluster that happens
        # to run on 8265 where the test reads these records is not the head they name
        usual = socket.socket()
        try:
            usual.bind(("0.0.0.0", 8265))
            usual.listen()
        except OSError:
            pass  # taken already: the cluster takes another one anyway
        info = lr.up(state / "local", CLUSTER, 1, 8, 8, timeout=240)
        token = lr.read_state(state / "local", CLUSTER).get("token_path") or ""
        server = None
        try:
            if token:
                env["RAY_AUTH_TOKEN_PATH"] = os.environ["RAY_AUTH_TOKEN_PATH"] = token
            address = info["dashboard_url"]
            make_supervised_local(address, env, tmp)
            make_kuberay(address, env, tmp)
            server = hp.start(hp.ensure_venv(), tmp / "haupt")
            make_polyaxon_tracked(address, env, tmp, server, state / "local")
            make_launcher_job(server)
        finally:
            usual.close()
            lr.down(state / "local", CLUSTER)
            if server is not None:
                server.stop()
        for case, run in CASES.items():
            _keep(state, run, args.out / case)
        shutil.rmtree(tmp, ignore_errors=True)  # the mount, the checkouts: gone, as after a cluster is deleted
    for case, run in CASES.items():
        golden = args.out / case / "golden"
        shutil.rmtree(golden, ignore_errors=True)
        golden.mkdir(parents=True)
        for name, text in golden_outputs(args.out / case, run).items():
            (golden / f"{name}.txt").write_text(text)
        print(f"{case}: {args.out / case}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
