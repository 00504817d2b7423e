"""Run records: the provenance kept with every submitted run, and the resume rules. Pure."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

SCHEMA = "miles-ray/run-record/v1"


class RunRecord(BaseModel):
    model_config = ConfigDict(extra="forbid")

    schema_: str = Field(SCHEMA, alias="schema")
    run: str
    cluster: str
    backend: Literal["local", "kuberay", "polyaxon", "address"]
    address: str
    submission_id: str
    mode: Literal["direct", "launcher", "rehearse"]
    created: str
    image: str | None
    image_digest: str | None
    ray_version: str | None
    miles_commit: str | None = None  # the image's (read by the probe in direct mode, else --miles-commit)
    miles_version: dict[str, Any] | None = None  # direct mode: catalog vs image commit (miles_ray.core.miles_version)
    model_revision: str | None = None
    dataset_revision: str | None = None
    recipe: str
    recipe_hash: str
    recipe_spec: dict[str, Any]
    split: dict[str, Any]
    output_dir: str
    resumed_from: str | None = None
    entrypoint: str
    kube_context: str | None = None  # how a k8s:// address was reached when the run was submitted
    kubeconfig: str | None = None
    polyaxon_run_uuid: str | None = None  # --mode launcher on Kubernetes: the Polyaxon job running the launcher
    polyaxon_owner: str | None = None
    polyaxon_project: str | None = None

    def split_key(self) -> dict[str, Any]:
        return split_key(self.split)


def split_key(split: dict[str, Any]) -> dict[str, Any]:
    """What must match for a checkpoint to be reused: the parallel layout Miles saved with."""
    keys = ("layout", "nodes", "gpus_per_node", "actor_num_nodes", "trainer_gpus", "rollout_num_gpus",
            "rollout_num_gpus_per_engine")
    return {k: split.get(k) for k in keys}


def resume_differences(previous: RunRecord, recipe_hash: str, split: dict[str, Any]) -> list[str]:
    """Why a new run may not reuse ``previous``'s output dir (empty: compatible)."""
    diffs: list[str] = []
    if previous.recipe_hash != recipe_hash:
        diffs.append(f"recipe hash {previous.recipe_hash[:19]} (run {previous.run}, recipe {previous.recipe}) != "
                     f"{recipe_hash[:19]}")
    old, new = previous.split_key(), split_key(split)
    for k in old:
        if old[k] != new[k]:
            diffs.append(f"{k} {old[k]} != {new[k]}")
    return diffs
