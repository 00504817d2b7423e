"""The "prepare" step of ``submit``: from the configuration and the request to the complete job -- entrypoint,
runtime env, submission id, metadata, run record, output dir (or, for ``--mode launcher``, the launcher command
or its Polyaxon operation) -- before anything talks to a cluster. Pure: it receives what it needs (config,
request, the resolved head address, the records it may reuse, the time) and returns data or raises a typed
error; ``miles_ray.services.runs.submit.submit`` then does the I/O.

Two steps, so that bad input fails before any I/O (even before the head address is looked up):
:func:`validate_request` (config and flags alone) and :func:`prepare_submit` (with the head address). The checks
against the live cluster (:func:`check_topology`, :func:`check_head_ray_version`) are pure verdicts on what the
service read from the head after preparing.

One module a step: :mod:`.validation` (the request, checked alone), :mod:`.prepare` (the job on a target),
:mod:`.resubmit` (a run name is one request) and :mod:`.live` (the verdicts on the live head); their public names are
importable from here.
"""

from __future__ import annotations

from miles_ray.core.submission.live import check_head_ray_version, check_topology, live_shape, topology_fix
from miles_ray.core.submission.prepare import (REHEARSAL_DRIVER, SubmitJob, SubmitTarget, prepare_submit,
                                               supervision_of, supervisor_kind, unkept_checkpoints)
from miles_ray.core.submission.resubmit import refuse_changed_request, request_differences
from miles_ray.core.submission.validation import (SubmitRequest, ValidRequest, check_extra_args, check_launcher_layout,
                                                  check_max_restarts, parse_env, split_extra_args, validate_request)

__all__ = ["REHEARSAL_DRIVER", "SubmitJob", "SubmitRequest", "SubmitTarget", "ValidRequest", "check_extra_args",
           "check_head_ray_version", "check_launcher_layout", "check_max_restarts", "check_topology", "live_shape",
           "parse_env", "prepare_submit", "refuse_changed_request", "request_differences", "split_extra_args",
           "supervision_of", "supervisor_kind", "topology_fix", "unkept_checkpoints", "validate_request"]
