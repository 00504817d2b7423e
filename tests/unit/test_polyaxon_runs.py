"""What a Miles run's own Polyaxon run holds (core/polyaxon_runs.py), and the names Polyaxon keeps metrics under."""

from __future__ import annotations

from miles_ray.adapters.polyaxon_api.tracked import polyaxon_metric_name
from miles_ray.core.polyaxon_runs import reporter_section, run_inputs

RECORD = {"run": "q4-a", "recipe": "Qwen3-4B", "recipe_hash": "sha256:abc", "split": {"nodes": 4},
          "image": "img:1", "image_digest": None, "miles_commit": "abc123", "model_revision": "m1",
          "dataset_revision": None, "mode": "direct", "entrypoint": "python3 /root/miles/train.py --save /mnt/c",
          "checkpoint_dir": "/mnt/c", "output_dir": "/mnt/runs/q4-a", "submission_id": "miles-ray-q4-a"}


def test_the_inputs_are_the_request_and_the_exact_command_line():
    inputs = run_inputs(RECORD)
    assert inputs["command"] == RECORD["entrypoint"] and inputs["miles_ray_run"] == "q4-a"
    assert {k: inputs[k] for k in ("recipe", "recipe_hash", "split", "miles_commit", "model_revision")} == {
        "recipe": "Qwen3-4B", "recipe_hash": "sha256:abc", "split": {"nodes": 4}, "miles_commit": "abc123",
        "model_revision": "m1"}
    assert "image_digest" not in inputs and "dataset_revision" not in inputs  # not known: not an input


def test_only_a_tracked_run_has_a_reporter_section():
    assert reporter_section(RECORD) is None
    tracked = {**RECORD, "polyaxon_tracked": True, "polyaxon_host": "http://px:8000", "polyaxon_owner": "acme",
               "polyaxon_project": "miles", "polyaxon_run_uuid": "u1"}
    section = reporter_section(tracked, work_dir="/w")
    assert section == {"host": "http://px:8000", "owner": "acme", "project": "miles", "run_uuid": "u1",
                       "checkpoint_dir": "/mnt/c", "upload_seconds": 10.0, "work_dir": "/w"}
    assert reporter_section(tracked, image="polyaxon/polyaxon-sidecar:2.18.0")["image"] == "polyaxon/polyaxon-sidecar:2.18.0"


def test_metric_names_as_polyaxon_keeps_them():
    from polyaxon._utils.fqn_utils import to_fqn_name

    for name in ("train/loss", "eval/aime-truncated_ratio", "perf/rollout_time", "rollout/raw_reward", "a.b c"):
        assert polyaxon_metric_name(name) == to_fqn_name(name)
