"""Doctor's checks of a run's training, from its logs (what ``status RUN`` shows as WARN lines): a stall (no new
rollout for 5x its usual step time), a NaN/inf loss, a reward collapsed to a constant
(:mod:`miles_ray.core.train_progress`). Told, never acted on: the run is not stopped."""

from __future__ import annotations

from typing import Any

from miles_ray.core.errors import MilesRayError
from miles_ray.core.train_progress import TrainingProgress
from miles_ray.services.doctor.findings import OK, SKIPPED, WARNING, Finding, finding
from miles_ray.services.training import has_training, run_training


def _how_far(prog: TrainingProgress) -> str:
    if prog.step is None:
        return "no rollout logged yet"
    words = f"rollout {prog.step} ({prog.step + 1} of {prog.of or '?'} done)"
    if prog.seconds_per_step is not None:
        words += f", {prog.seconds_per_step:g} s per rollout"
    return words


def training_findings(record: dict[str, Any], kube_context: str | None = None,
                      kubeconfig: str | None = None) -> list[Finding]:
    """A training run's stall and divergence findings (one ``ok`` finding when there are none)."""
    if not has_training(record):
        return []
    run = record["run"]
    try:
        info = run_training(run, kube_context=kube_context, kubeconfig=kubeconfig)
    except MilesRayError as e:
        return [finding("training", "training", SKIPPED, f"run {run}'s state cannot be read: {e}", [],
                        f"'miles-ray status {run}'")]
    prog = info.progress
    if prog is None:
        return [finding("training", "training", SKIPPED, f"run {run}'s log cannot be read now", [],
                        f"'miles-ray logs {run}'")]
    found = [finding(f["check"], "training", WARNING, f["summary"], f["evidence"], f["next"])
             for f in prog.findings]
    return found or [finding("training", "training", OK, f"run {run} ({info.status}): {_how_far(prog)}; no stall, "
                             "no NaN/inf loss, no collapsed reward", [])]
