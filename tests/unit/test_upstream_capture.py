"""The upstream launchers' capture is a data file (miles_ray/core/upstream_jobs.json) with a typed loader: what it
holds is checked when it is read, and what the catalog reads is a copy."""

from __future__ import annotations

import json
from importlib import resources

import pytest
from pydantic import ValidationError

from miles_ray.core import upstream_jobs


def raw() -> dict:
    return json.loads(resources.files("miles_ray.core").joinpath(upstream_jobs.DATA_FILE).read_text())


def test_every_job_of_the_file_is_loaded_as_written():
    data = raw()
    assert data["miles_commit"] == upstream_jobs.UPSTREAM_MILES_COMMIT
    assert upstream_jobs.JOBS == data["jobs"] and len(upstream_jobs.JOBS) > 20
    assert data["made_by"].startswith("tools/capture_upstream_jobs.py ")


def test_what_a_caller_changes_is_its_own_copy():
    name = next(iter(upstream_jobs.JOBS))
    upstream_jobs.JOBS[name]["train_args"].append("--changed")
    try:
        assert "--changed" not in upstream_jobs.CAPTURE.jobs[name].train_args
    finally:
        upstream_jobs.JOBS[name]["train_args"].pop()


@pytest.mark.parametrize("change", [
    lambda d: d.update(schema=2),
    lambda d: d.update(miles_commit="31f1ca9"),
    lambda d: next(iter(d["jobs"].values())).pop("model_args"),
    lambda d: next(iter(d["jobs"].values())).update(train_args="--lr 1e-6"),
    lambda d: d.update(extra_key=1),
], ids=["unknown-schema", "short-commit", "missing-field", "wrong-type", "unknown-key"])
def test_a_broken_file_is_refused_when_read(change):
    data = raw()
    change(data)
    with pytest.raises((ValidationError, ValueError)):
        upstream_jobs.load(json.dumps(data))
