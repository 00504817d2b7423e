"""The typed run record: every shape of record this tool wrote is read by the upgrade chain (keyed on ``schema``) and
nothing a user wrote is lost; ``RunStore.update`` holds the record's lock across its read-modify-write (two processes
changing one record keep both changes); one rule says where a Polyaxon run lives."""

from __future__ import annotations

import json
import multiprocessing

import pytest

from miles_ray.adapters import state
from miles_ray.core.records import SCHEMA, PolyaxonRef, RunRecord, polyaxon_ref, read_record, upgrade
from miles_ray.core.records.upgrade import V1
from miles_ray.core.runs import run_checkpoints


def _v1(**over) -> dict:
    """A record as miles-ray wrote it before v2 (``schema`` v1, the fields of that time)."""
    rec = {"schema": V1, "run": "r1", "cluster": "c", "backend": "kuberay", "address": "k8s://ml/c",
           "submission_id": "miles-r1", "mode": "direct", "created": "2026-01-01T00:00:00+00:00",
           "image": "img:1", "image_digest": None, "ray_version": "2.49.1", "recipe": "Qwen3-4B",
           "recipe_hash": "sha256:ab", "recipe_spec": {"name": "Qwen3-4B"}, "split": {"nodes": 1},
           "output_dir": "/mnt/miles/runs/r1/", "entrypoint": "python3 train.py --save /ck/r1 --load /ck/r0",
           "kube_context": None}
    rec.update(over)
    return rec


@pytest.fixture
def state_dir(clean_env, monkeypatch):
    monkeypatch.setenv("MILES_RAY_STATE_DIR", str(clean_env / "state"))
    return clean_env / "state"


# -- the upgrade chain -----------------------------------------------------------------------------------------

def test_a_record_of_the_first_version_naming_a_polyaxon_backend_is_read():
    """The first records (f98b76f) allowed ``backend: polyaxon`` for a run on a Polyaxon-made cluster."""
    rec = read_record(_v1(backend="polyaxon", polyaxon_run_uuid=None))
    assert rec.backend == "kuberay" and rec.schema_ == SCHEMA


def test_a_direct_run_recorded_before_checkpoint_dirs_keeps_its_own_save_and_load():
    rec = read_record(_v1())
    assert (rec.checkpoint_dir, rec.load_dir, rec.checkpoint_dirs_from) == ("/ck/r1", "/ck/r0", "entrypoint")
    ck = run_checkpoints(rec.dump())
    assert ck.source == "entrypoint" and "recorded before miles-ray kept checkpoint dirs" in ck.note


def test_a_launcher_run_recorded_before_checkpoint_dirs_has_them_assumed_under_its_output_dir():
    rec = read_record(_v1(mode="launcher", entrypoint="python3 run.py"))
    assert (rec.checkpoint_dir, rec.checkpoint_dirs_from) == ("/mnt/miles/runs/r1/checkpoints", "assumed")
    assert run_checkpoints(rec.dump()).source == "assumed"


def test_a_record_read_without_the_upgrade_says_the_same_of_its_checkpoints():
    """A reader given the record as written (not read through the store) reaches the same dirs."""
    assert run_checkpoints(_v1()) == run_checkpoints(upgrade(_v1()))


def test_the_upgrade_keeps_every_key_and_changes_a_current_record_only_in_its_schema():
    current = _v1(checkpoint_dir="/ck/r1", load_dir=None, checkpoint_dirs_from="job", my_note="keep me",
                  head={"node_id": "n1", "pod": "ml/h", "pod_uid": "u1", "zone": "a"},
                  attempts=[{"attempt": 1, "submission_id": "miles-r1", "started": "t", "head": {"node_id": "n1"},
                             "resumed_from": None, "resumed_iteration": 3}],
                  supervisor={"kind": "local", "max_restarts": 2, "where": {"dir": "supervisors/r1"},
                              "keep_best": "eval/acc"})
    out = read_record(current).dump()
    assert out == {**current, "schema": SCHEMA}
    assert upgrade(current) is not current and current["schema"] == V1  # the input is not changed


def test_a_record_of_a_newer_schema_is_read_as_it_is():
    newer = _v1(schema="miles-ray/run-record/v99", checkpoint_dirs_from="job", shiny=[1])
    assert upgrade(newer) == newer


def test_a_record_missing_fields_is_read_as_written():
    """A partial record (made by hand, or by a tool writing a part of one): what it has, typed; nothing added but
    what the upgrade fills in."""
    rec = read_record({"run": "p", "output_dir": "/o", "head": {"node_id": "n"}, "extra": 1})
    assert rec.run == "p" and rec.head is not None and rec.head.node_id == "n"
    assert rec.dump() == {"schema": SCHEMA, "run": "p", "output_dir": "/o", "head": {"node_id": "n"}, "extra": 1,
                          "checkpoint_dir": "/o/checkpoints", "load_dir": "/o/checkpoints",
                          "checkpoint_dirs_from": "assumed"}


def test_provenance_and_request_fields_come_from_the_model():
    rec = read_record(_v1(checkpoint_dirs_from="job", model_revision="m@1"))
    assert list(rec.provenance())[:2] == ["recipe", "recipe_hash"] and rec.provenance()["model_revision"] == "m@1"
    assert set(rec.request_fields()) == {"recipe", "recipe_hash", "mode", "image", "model_revision",
                                         "dataset_revision", "resumed_from", "entrypoint"}
    assert set(RunRecord.fields_for("provenance")) <= set(RunRecord.model_fields) | {"schema"}


# -- RunStore.update: the lock held across read-modify-write ----------------------------------------------------

def _increment(state_dir: str, times: int, start) -> None:
    import os

    os.environ["MILES_RAY_STATE_DIR"] = state_dir
    from miles_ray.adapters import state as st

    def bump(rec):
        rec.counter = (rec.model_extra or {}).get("counter", 0) + 1  # a key the model does not know: kept

    start.wait()  # both at once (without the lock, about half the changes are lost: 41 of 80 when tried)
    for _ in range(times):
        st.RunStore.update("r1", bump)


def test_two_processes_updating_one_record_lose_no_change(state_dir):
    state.RunStore.create(_v1(checkpoint_dirs_from="job", counter=0))
    ctx = multiprocessing.get_context("spawn")
    start = ctx.Barrier(2)
    procs = [ctx.Process(target=_increment, args=(str(state_dir), 40, start)) for _ in range(2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
    assert [p.exitcode for p in procs] == [0, 0]
    data = json.loads(state.record_path("r1").read_text())
    assert data["counter"] == 80 and data["schema"] == SCHEMA and data["run"] == "r1"


def test_update_of_a_run_without_a_record_is_not_found(state_dir):
    from miles_ray.core.errors import NotFound

    with pytest.raises(NotFound):
        state.RunStore.update("nope", lambda rec: None)


# -- one rule for where a Polyaxon run lives ---------------------------------------------------------------------

def test_where_a_polyaxon_run_lives_is_what_its_entry_keeps_else_the_configuration():
    cluster = {"via": "polyaxon", "polyaxon_uuid": "u-c", "polyaxon_owner": "acme", "polyaxon_project": "p",
               "polyaxon_host": "http://kept:8000"}
    assert polyaxon_ref("cluster", cluster, host="http://cfg:8000", owner="o", project="q") == PolyaxonRef(
        host="http://kept:8000", owner="acme", project="p", uuid="u-c", role="cluster")
    # a cluster recorded before the host was kept: the configured host (it was ignored by park/resume/down before)
    older = {k: v for k, v in cluster.items() if k != "polyaxon_host"}
    assert polyaxon_ref("cluster", older, host="http://cfg:8000").host == "http://cfg:8000"
    launcher = read_record(_v1(mode="launcher", polyaxon_run_uuid="u-j", polyaxon_project="p"))
    ref = launcher.polyaxon()
    assert (ref.role, ref.uuid, ref.owner, ref.host) == ("launcher-job", "u-j", "default", None)  # None: $POLYAXON_HOST
    tracked = read_record(_v1(polyaxon_run_uuid="u-t", polyaxon_project="p", polyaxon_owner="acme",
                              polyaxon_host="http://h:1", polyaxon_tracked=True))
    assert tracked.polyaxon() == PolyaxonRef("http://h:1", "acme", "p", "u-t", "tracked")
    assert polyaxon_ref("registry", None, host=None, owner="o", project="q") == PolyaxonRef(None, "o", "q", None,
                                                                                            "registry")


def test_the_compared_provenance_is_the_models():
    """core/metrics.py ships with the supervisor (stdlib only) and keeps its own copy of the list: the model's."""
    from miles_ray.core.metrics import PROVENANCE

    assert PROVENANCE == RunRecord.fields_for("provenance")
