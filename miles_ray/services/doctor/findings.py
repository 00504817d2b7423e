"""What a doctor finding is: the check, the item of the troubleshooting checklist it answers (the questions of
docs/troubleshooting.md), a status, a one-line summary, the evidence looked at and the fix."""

from __future__ import annotations

from typing import Any

PROBLEM, WARNING, OK, SKIPPED = "problem", "warning", "ok", "skipped"
CHECKLIST = {
    "pending": "The pod stays Pending",
    "data": "The launcher cannot find a checkpoint or dataset",
    "startup": "Ray or NCCL fails during startup",
    "resume": "Training restarts from scratch",
    "drift": "Keep the container image and Ray version aligned across replicas",
}


def finding(check: str, item: str, status: str, summary: str, evidence: list[str] | None = None,
            fix: str = "") -> dict[str, Any]:
    """One finding; ``item`` is a key of :data:`CHECKLIST` (the report carries its question as ``checklist``)."""
    return {"check": check, "checklist": CHECKLIST[item], "status": status, "summary": summary,
            "evidence": list(evidence or []), "fix": fix}
