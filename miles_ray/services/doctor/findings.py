"""What a doctor finding is: the check, the item of the troubleshooting checklist it answers (the questions of
docs/troubleshooting.md), a status, a one-line summary, the evidence looked at and the fix; and the report of one
diagnosis (:class:`DoctorReport`)."""

from __future__ import annotations

from typing import Literal

from miles_ray.core.results import Result

PROBLEM, WARNING, OK, SKIPPED = "problem", "warning", "ok", "skipped"
Status = Literal["problem", "warning", "ok", "skipped"]
CHECKLIST = {
    "pending": "The pod stays Pending",
    "data": "The launcher cannot find a checkpoint or dataset",
    "startup": "Ray or NCCL fails during startup",
    "resume": "Training restarts from scratch",
    "drift": "Keep the container image and Ray version aligned across replicas",
    "training": "Training stalls or diverges",
    "memory": "Validate GPU memory requirements for your recipe",
}


class Finding(Result):
    """One check's answer: ``checklist`` is the question of :data:`CHECKLIST` it answers."""

    check: str
    checklist: str
    status: Status
    summary: str
    evidence: list[str]
    fix: str


class DoctorReport(Result):
    """A diagnosis of a cluster or a run: every finding, and how many are problems and warnings. ``address``:
    the Ray head looked at, when there was one."""

    target: str
    kind: Literal["run", "cluster"]
    cluster: str
    backend: str
    address: str | None = None
    findings: list[Finding]
    problems: int
    warnings: int


def finding(check: str, item: str, status: Status, summary: str, evidence: list[str] | None = None,
            fix: str = "") -> Finding:
    """One finding; ``item`` is a key of :data:`CHECKLIST` (the report carries its question as ``checklist``)."""
    return Finding(check=check, checklist=CHECKLIST[item], status=status, summary=summary,
                   evidence=list(evidence or []), fix=fix)
