"""Every job miles-ray submits with a local working_dir (probes, rehearsals) gets a package of its own.

Ray names a working_dir package by the hash of its content and deletes it once no job references it; a job that
reuses a package of the same hash does not pin it in time (ray-project/ray#36703). Seen here: a comm-check probe
started in a directory that had just been deleted ("getcwd() failed ... can't open file 'comm_check.py'").
Against the session's real local Ray cluster: two submissions of the same directory get two different
packages, each job runs its payload from it, and the local copy made for the upload is gone afterwards."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import pytest

from miles_ray.adapters import ray_auth, ray_jobs, ray_package
from tests.infra.fixtures import poll

pytestmark = pytest.mark.ray


def test_the_same_directory_is_two_packages_and_each_job_runs_from_its_own(env, tmp_path):
    wd = tmp_path / "payload"
    wd.mkdir()
    (wd / "hello.py").write_text("import os\nprint('HELLO_FROM', sorted(os.listdir('.')))\n")
    before = set(Path(tempfile.gettempdir()).glob("miles-ray-pkg-*"))
    ids = []
    for i in range(2):
        job_id, created = ray_jobs.submit(env.address, "python hello.py", {"working_dir": str(wd)},
                                          submission_id=f"pkg-test-{i}-{tmp_path.name}")
        assert created
        ids.append(job_id)
    assert set(Path(tempfile.gettempdir()).glob("miles-ray-pkg-*")) == before  # the upload copies are removed
    from ray.job_submission import JobStatus, JobSubmissionClient

    client = JobSubmissionClient(env.address, headers=ray_auth.headers(env.address))
    for job_id in ids:
        poll(f"job {job_id} to end", lambda j=job_id: client.get_job_status(j).is_terminal(), 120)
    infos = [client.get_job_info(j) for j in ids]
    packages = [i.runtime_env["working_dir"] for i in infos]
    assert packages[0] != packages[1] and all(p.startswith("gcs://_ray_pkg_") for p in packages), packages
    for job_id, info in zip(ids, infos):
        assert info.status == JobStatus.SUCCEEDED, (info.status, info.message)
        logs = client.get_job_logs(job_id)
        line = next(ln for ln in logs.splitlines() if ln.startswith("HELLO_FROM"))
        listed = json.loads(line.split(" ", 1)[1].replace("'", '"'))
        assert "hello.py" in listed and ray_package.PACKAGE_MARK in listed, listed
