"""What a Miles run's own Polyaxon run holds (pure): its inputs, and the section of its supervisor's spec that
tells the reporter (``launchers/polyaxon_report.py``) which Polyaxon run to keep current. The I/O is
:mod:`miles_ray.services.runs.polyaxon_tracked`."""

from __future__ import annotations

from typing import Any, Mapping

from miles_ray.core.records import as_record

INPUT_FIELDS = ("recipe", "recipe_hash", "split", "image", "image_digest", "model_revision", "dataset_revision",
                "miles_commit", "mode", "output_dir", "checkpoint_dir", "load_dir", "resumed_from", "cluster",
                "ray_version")
UPLOAD_SECONDS = 10.0


def run_inputs(record: Mapping[str, Any]) -> dict[str, Any]:
    """The run's inputs as Polyaxon shows them: its request (recipe and hash, split, image digest, model and data
    revisions, Miles commit, ...), and the exact command line of its job (``command``)."""
    rec = as_record(record)
    inputs = {k: record.get(k) for k in INPUT_FIELDS if record.get(k) is not None}
    inputs.update(command=rec.entrypoint, miles_ray_run=rec.run)
    return inputs


def reporter_section(record: Mapping[str, Any], work_dir: str | None = None,
                     image: str | None = None, host: str | None = None) -> dict[str, Any] | None:
    """The supervisor spec's ``polyaxon`` section for a run with a Polyaxon run of its own (``polyaxon_tracked`` in
    its record), None for any other run. ``work_dir``: where the reporter writes its files before upload;
    ``image``: an image with python3 + polyaxon for a supervisor that runs in a pod (Polyaxon's sidecar image; the
    reporter cannot run in the Miles image); ``host``: the Polyaxon API as the supervisor reaches it (a pod may not
    reach the user's ``polyaxon_host``), default the record's."""
    rec = as_record(record)
    if not rec.polyaxon_tracked:
        return None
    ref = rec.polyaxon("tracked")
    section = {"host": host or ref.host, "owner": ref.owner, "project": ref.project, "run_uuid": ref.uuid,
               "checkpoint_dir": rec.checkpoint_dir, "upload_seconds": UPLOAD_SECONDS}
    if work_dir:
        section["work_dir"] = work_dir
    if image:
        section["image"] = image
    return section
