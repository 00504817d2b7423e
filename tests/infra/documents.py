"""Reading the documents the builders make (tests only)."""

from __future__ import annotations

from typing import Any


def head_and_worker_containers(doc: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """The head's and the (first) worker group's container, from either kind of document."""
    if doc.get("kind") == "RayCluster":
        spec = doc["spec"]
        return (spec["headGroupSpec"]["template"]["spec"]["containers"][0],
                spec["workerGroupSpecs"][0]["template"]["spec"]["containers"][0])
    run = doc["component"]["run"] if doc.get("kind") == "operation" else doc["run"]
    worker = next(iter(run["workers"].values()))
    return run["head"]["container"], worker["container"]
