"""Run records written by an older miles-ray are read the same: tests/data/records/CASE/ holds the state-dir files
of runs as the commit named in tests/data/records/README.md wrote them (tools/make_record_fixtures.py, on real Ray
and the Polyaxon sandbox server) -- a supervised local run that needed two attempts, a KubeRay run, a Polyaxon-tracked
run, a launcher job -- and ``golden/*.txt``, what that commit's CLI said reading them back with their cluster gone
(``status RUN -o json``, ``status RUN``, ``logs RUN``, ``runs -o json``, ``runs outputs RUN -o json``). This
checkout's CLI, given a copy of each state dir, must say the same: exit code, stdout and stderr.

No cluster: the heads and the Polyaxon server those records name are gone (their ports closed), as after ``down``;
the kubeconfig names a Kubernetes API server that is gone too (a closed port)."""

from __future__ import annotations

import contextlib
import io
import os
import re
import shutil
import tempfile
from pathlib import Path

import pytest

from miles_ray.core.records.run import SCHEMA
from miles_ray.core.records.upgrade import V1

RECORDS = Path(__file__).resolve().parents[1] / "data" / "records"
CASES = {"supervised_local": "sup-twice", "kuberay": "kr-1", "polyaxon_tracked": "tracked-1",
         "launcher_job": "launch-1"}
COMMANDS = {
    "status_json": ["status", "{run}", "-o", "json"],
    "status": ["status", "{run}"],
    "logs": ["logs", "{run}"],
    "runs_json": ["runs", "-o", "json"],
    "outputs_json": ["runs", "outputs", "{run}", "-o", "json"],
}

KUBECONFIG = """apiVersion: v1
kind: Config
clusters: [{name: gone, cluster: {server: "https://127.0.0.1:9"}}]
users: [{name: gone, user: {token: "t0ken"}}]
contexts: [{name: gone, context: {cluster: gone, user: gone, namespace: ml}}]
current-context: gone
"""
_AGE = re.compile(r"\b\d+(\.\d+)?\s?(s|m|h|d|min|sec|seconds|minutes|hours|days) ago\b")


def normalize(text: str, state: Path) -> str:
    """What differs between two reads of the same records and is not what they say: the state dir's absolute path
    (a tmp dir each time: ``<STATE>``) and ages counted from now (``12m ago``: ``<AGE> ago``). Nothing else."""
    return _AGE.sub("<AGE> ago", text.replace(str(state), "<STATE>"))


def golden_outputs(case_dir: Path, run: str) -> dict[str, str]:
    """This checkout's CLI on a copy of ``case_dir`` as its state dir (cwd: an empty dir, no MILES_RAY_*/Ray/
    Polyaxon environment, a kubeconfig whose API server is gone, 200 columns), per command: exit code, stdout,
    stderr, normalized."""
    from miles_ray.cli.app import main

    out: dict[str, str] = {}
    saved_env, saved_cwd = dict(os.environ), os.getcwd()
    with tempfile.TemporaryDirectory(prefix="records-") as tmp:
        state = Path(tmp) / "state"
        shutil.copytree(case_dir, state, ignore=shutil.ignore_patterns("golden"))
        (Path(tmp) / "cwd").mkdir()
        (Path(tmp) / "kubeconfig").write_text(KUBECONFIG)
        try:
            for key in [k for k in os.environ if k.startswith(("MILES_RAY_", "RAY_", "POLYAXON_"))]:
                del os.environ[key]
            os.environ.update(MILES_RAY_STATE_DIR=str(state), KUBECONFIG=str(Path(tmp) / "kubeconfig"),
                              COLUMNS="200")  # tables as wide wherever they are read
            os.chdir(Path(tmp) / "cwd")
            for name, args in COMMANDS.items():
                stdout, stderr = io.StringIO(), io.StringIO()
                with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
                    code = main([a.format(run=run) for a in args])
                out[name] = normalize(f"exit: {code}\n--- stdout ---\n{stdout.getvalue()}--- stderr ---\n"
                                      f"{stderr.getvalue()}", state)
        finally:
            os.chdir(saved_cwd)
            os.environ.clear()
            os.environ.update(saved_env)
    return out


@pytest.mark.parametrize("case", sorted(CASES))
def test_records_written_by_an_older_main_read_the_same(case):
    case_dir = RECORDS / case
    said = golden_outputs(case_dir, CASES[case])
    for name in COMMANDS:
        # the values reading changes on purpose: the record's schema, which the upgrade chain brings from v1 to
        # today's, and what is said since the fixtures were made (CHANGED_SINCE)
        golden = (case_dir / "golden" / f"{name}.txt").read_text().replace(f'"schema": "{V1}"', f'"schema": "{SCHEMA}"')
        for was, now in CHANGED_SINCE.get((case, name), []):
            assert was in golden, f"{case}: {name}: {was!r} is no longer in the golden output: drop it here"
            golden = golden.replace(was, now)
        assert said[name] == golden, f"{case}: {name}"


# (case, command) -> (text the fixtures' commit said, what is said now): each a deliberate change, with its reason
CHANGED_SINCE: dict[tuple[str, str], list[tuple[str, str]]] = {
    # runs outputs names the checkpoint a resumed attempt loaded (the retention never deletes it)
    ("supervised_local", "outputs_json"): [
        ('iter_0000005",\n      "written": "2026-12-07T13:36:29+00:00",\n      "attempt": 1,\n      "metrics": {},\n'
         '      "registered": [],\n      "kept": true,\n      "why": "no retention: every checkpoint is kept"\n',
         'iter_0000005",\n      "written": "2026-12-07T13:36:29+00:00",\n      "attempt": 1,\n      "metrics": {},\n'
         '      "registered": [],\n      "kept": true,\n'
         '      "why": "no retention: every checkpoint is kept; attempt 2 loaded it"\n')],
}
