"""Every run record this tool has written, brought to today's shape (:data:`SCHEMA`): one step per schema, keyed on
the record's ``schema``. A step renames and fills in; it never drops a key a user (or a newer miles-ray) wrote.
Pure."""

from __future__ import annotations

import copy
import shlex
from collections.abc import Callable, Mapping
from typing import Any

from pydantic import TypeAdapter, ValidationError

from miles_ray.core.entrypoint import checkpoint_dirs
from miles_ray.core.records.run import SCHEMA, RunRecord

V1 = "miles-ray/run-record/v1"


def _v1_to_v2(rec: dict[str, Any]) -> dict[str, Any]:
    """v1, as every miles-ray before v2 wrote it:
    - ``backend: polyaxon`` (the first records of a run on a Polyaxon-made cluster: a RayCluster, reached like any
      other by its k8s:// address) -> ``kuberay``;
    - no ``checkpoint_dirs_from`` (written before miles-ray kept checkpoint dirs): a direct-mode job's own
      ``--save``/``--load`` read from its train.py command line (``entrypoint``), else ``<output_dir>/checkpoints``
      assumed (``assumed``), as every reader of such a record took them."""
    if rec.get("backend") == "polyaxon":
        rec["backend"] = "kuberay"
    if rec.get("checkpoint_dirs_from") is None and rec.get("output_dir"):
        rec.update(checkpoints_before_v2(rec))
    rec["schema"] = SCHEMA
    return rec


def checkpoints_before_v2(rec: Mapping[str, Any]) -> dict[str, Any]:
    """The checkpoint dirs of a record written before miles-ray kept them (see :func:`_v1_to_v2`)."""
    argv = _split(rec.get("entrypoint")) if rec.get("mode") == "direct" else []
    save, load = checkpoint_dirs(argv)
    if save:
        return {"checkpoint_dir": save, "load_dir": load, "checkpoint_dirs_from": "entrypoint"}
    legacy = f"{str(rec['output_dir']).rstrip('/')}/checkpoints"
    return {"checkpoint_dir": legacy, "load_dir": legacy, "checkpoint_dirs_from": "assumed"}


def _split(command: str | None) -> list[str]:
    try:
        return shlex.split(command or "")
    except ValueError:
        return []


# schema -> the step that brings a record of it one schema further (a record without one was written as v1)
STEPS: dict[str, Callable[[dict[str, Any]], dict[str, Any]]] = {V1: _v1_to_v2}


def upgrade(data: Mapping[str, Any]) -> dict[str, Any]:
    """``data`` (a record as read from disk) in today's shape. A schema this code does not know (a newer miles-ray
    wrote it) is read as it is."""
    rec = copy.deepcopy(dict(data))
    rec.setdefault("schema", V1)
    seen = set()
    while rec["schema"] in STEPS and rec["schema"] not in seen:
        seen.add(rec["schema"])
        rec = STEPS[rec["schema"]](rec)
    return rec


def read_record(data: Mapping[str, Any]) -> RunRecord:
    """A record as read from disk, upgraded and typed. One that lacks a field today's records have (made by hand, or
    by a tool that writes a part of one) is read as written: its fields typed where it has them."""
    rec = upgrade(data)
    try:
        return RunRecord.model_validate(rec)
    except ValidationError:
        fields = {f.alias or name: (name, f) for name, f in RunRecord.model_fields.items()}
        values = {}
        for key, value in rec.items():
            name, field = fields.get(key, (key, None))
            values[name] = _typed(field.annotation, value) if field is not None else value
        given = set(values)
        for name, field in RunRecord.model_fields.items():  # a field it lacks reads None (and is not written)
            if field.is_required():
                values.setdefault(name, None)
        return RunRecord.model_construct(_fields_set=given, **values)


def as_record(record: RunRecord | Mapping[str, Any]) -> RunRecord:
    """``record`` typed: as it is when it is a :class:`RunRecord`, else read (:func:`read_record`)."""
    return record if isinstance(record, RunRecord) else read_record(record)


def _typed(annotation: Any, value: Any) -> Any:
    """``value`` as a field of ``annotation`` holds it (its typed part), else as it is."""
    try:
        return TypeAdapter(annotation).validate_python(value)
    except ValidationError:
        return value
