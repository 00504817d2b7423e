"""The run record, typed (:mod:`.run`), its upgrade from every older shape (:mod:`.upgrade`) and where a Polyaxon
run lives (:mod:`.polyaxon_ref`). Pure."""

from miles_ray.core.records.polyaxon_ref import PolyaxonRef, polyaxon_ref
from miles_ray.core.records.run import (RECORDED_ON_CREATION, SCHEMA, Attempt, CheckpointSource, Controller, Head,
                                        RunRecord, split_key)
from miles_ray.core.records.upgrade import as_record, read_record, upgrade

__all__ = ["RECORDED_ON_CREATION", "SCHEMA", "Attempt", "CheckpointSource", "Controller", "Head", "PolyaxonRef",
           "RunRecord", "as_record", "polyaxon_ref", "read_record", "split_key", "upgrade"]
