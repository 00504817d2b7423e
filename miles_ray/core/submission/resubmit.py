"""A run name is one request: what a submit again under the same name may change (:func:`request_differences`) and
its refusal when the request differs."""

from __future__ import annotations

import shlex
from collections.abc import Mapping
from typing import Any

from miles_ray.core.errors import ConfigError
from miles_ray.core.records import RunRecord, as_record


def _drop_flag(argv: list[str], flag: str) -> list[str]:
    """``argv`` without ``flag`` and its value."""
    return [a for i, a in enumerate(argv) if a != flag and (i == 0 or argv[i - 1] != flag)]


def _self_resumed(record: RunRecord) -> bool:
    """An attempt after the first (a job lost with its head): it resumes from the run's own checkpoints."""
    return bool(record.run) and record.resumed_from == record.run


def _request_entrypoint(record: RunRecord, attempt_resume: bool = False) -> Any:
    """The entrypoint as a request: a rehearsal's ``--timeout`` (how long it waits for its placement, from submit's
    --timeout) is how long to wait, not what to run, so re-running the same submit with another --timeout finds
    the same run; a later attempt's ``--load`` of the run's own checkpoints (``attempt_resume``) is the attempt's,
    not the user's request."""
    entrypoint = record.entrypoint
    if not isinstance(entrypoint, str) or not (record.mode == "rehearse" or attempt_resume):
        return entrypoint
    argv = shlex.split(entrypoint)
    if record.mode == "rehearse":
        argv = _drop_flag(argv, "--timeout")
    if attempt_resume:
        argv = _drop_flag(argv, "--load")
    return argv


def request_differences(existing: Mapping[str, Any], record: Mapping[str, Any]) -> list[str]:
    """How the run ``record`` about to be made differs from the ``existing`` record of that run name, field by
    field (empty: the same request, a re-submit)."""
    diffs: list[str] = []
    old_rec, new_rec = as_record(existing), as_record(record)
    attempt_resume = _self_resumed(old_rec)  # the run's later attempt: compare with the request it continues
    was, now = old_rec.request_fields(), new_rec.request_fields()
    for key in was:
        if key == "recipe_hash" and was["recipe"] != now["recipe"]:
            continue  # a different recipe says it already
        if key == "resumed_from" and attempt_resume:
            continue
        if key == "entrypoint" and diffs:
            continue  # the entrypoint follows from the fields above
        old, new = was[key], now[key]
        if key == "entrypoint":
            old, new = _request_entrypoint(old_rec, attempt_resume), _request_entrypoint(new_rec, attempt_resume)
        if old != new:
            if key == "recipe_hash":
                old, new = str(old)[:19], str(new)[:19]
            if key == "entrypoint":
                diffs.append("the job's command line (--extra-args, --num-rollout or a setting it is built from)")
            else:
                diffs.append(f"{key} {old} != {new}")
    old_split, new_split = old_rec.split or {}, new_rec.split or {}
    for key in new_split:
        if key != "miles_args" and key in old_split and old_split[key] != new_split[key]:  # (older records lack some)
            diffs.append(f"{key} {old_split.get(key)} != {new_split.get(key)}")
    return diffs


def refuse_changed_request(run: str, existing: Mapping[str, Any], record: Mapping[str, Any]) -> None:
    """A run name is one request: submitting it again with the same request finds its job (a no-op); with another
    request it is refused (exit 2), naming what differs."""
    diffs = request_differences(existing, record)
    if diffs:
        raise ConfigError(f"run {run!r} already exists with a different request: " + "; ".join(diffs),
                          hint=f"submit it under a new --run name, or continue its checkpoints with a new --run name "
                               f"and --resume-from {run}")
