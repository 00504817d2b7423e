"""Compare two runs: their records (provenance, split, eval setup) and the final metrics Miles logged,
read from each run's job logs through the Ray Jobs API (each run's head reached like every other head: a
Kubernetes head through a port-forward). The judgement itself is pure
(:func:`miles_ray.core.metrics.compare_runs`)."""

from __future__ import annotations

from typing import Any

from miles_ray.adapters import checkpoint_files, ray_jobs, state
from miles_ray.adapters.ray_head import open_head
from miles_ray.core.errors import ClusterError, ConfigError, MilesRayError
from miles_ray.core.metrics import compare_runs, parse_metrics
from miles_ray.core.outputs import CheckpointSummary, checkpoint_summary, scores_of
from miles_ray.core.records import RunRecord, as_record
from miles_ray.core.results import Result
from miles_ray.services.runs import run_logs


class FieldRow(Result):
    """One recorded field (provenance or split) of both runs."""

    field: str
    a: Any
    b: Any
    same: bool


class EvalSetup(Result):
    """The evaluation data and procedure one run used (:func:`miles_ray.core.metrics.eval_setup`)."""

    data: dict[str, str]
    procedure: dict[str, str]
    dataset_revision: Any
    source: str


class EvalComparison(Result):
    a: EvalSetup
    b: EvalSetup
    same: bool
    differences: list[str]


class MetricRow(Result):
    """A metric's last logged value in each run (NaN/inf as strings) and the step it was logged at."""

    metric: str
    a: Any
    a_at: Any
    b: Any
    b_at: Any


class MetricLines(Result):
    a: int
    b: int


class Verdict(Result):
    """Which run has the better final eval metric (``better``), or why compare will not say (``refused``)."""

    better: str | None
    metric: str | None
    statement: str
    caveat: str
    refused: bool


class CheckpointPair(Result):
    """Each run's newest complete and best checkpoint (:func:`miles_ray.core.outputs.checkpoint_summary`)."""

    a: CheckpointSummary
    b: CheckpointSummary


class CompareResult(Result):
    """Two runs side by side: provenance, split, evaluation setup, final metrics, and the verdict; ``errors``:
    why a run has no metrics; ``checkpoints``: each run's newest complete and best checkpoint, from its saved
    outputs listing (``runs outputs``)."""

    a: str
    b: str
    provenance: list[FieldRow]
    split: list[FieldRow]
    eval: EvalComparison
    metrics: list[MetricRow]
    metric_lines: MetricLines
    errors: dict[str, str]
    verdict: Verdict
    checkpoints: CheckpointPair


class RunMetrics(Result):
    """What a run's job log says: the parsed metrics (:func:`miles_ray.core.metrics.parse_metrics`), or why there
    are none (``why_not``)."""

    parsed: dict[str, Any] | None = None
    why_not: str | None = None
    text: str = ""


def run_metrics(run_record: RunRecord | dict[str, Any], kube_context: str | None = None,
                kubeconfig: str | None = None) -> RunMetrics:
    """The metrics parsed from the run's job log, or why there are none."""
    record = as_record(run_record)
    if record.mode == "rehearse":
        return RunMetrics(why_not="a rehearsal run (no training, no metrics)")
    if record.mode == "launcher":
        return RunMetrics(why_not="a launcher-mode run: the upstream launcher submits its own Ray job, which miles-ray "
                                  "does not track")
    try:
        with open_head(record.address, kube_context=kube_context or record.kube_context,
                       kubeconfig=kubeconfig or record.kubeconfig) as url:
            text = ray_jobs.logs(url, record.submission_id)
    except ClusterError as e:
        return RunMetrics(why_not=f"no job log ({e.message})")
    return RunMetrics(parsed=parse_metrics(text or ""), text=text or "")


def _keep_best(rec: RunRecord) -> str | None:
    """The metric a supervised run keeps its best checkpoints by (its retention), if any."""
    return rec.supervisor.keep_best if rec.supervisor else None


def _saved_logs(run: str, kube_context: str | None, kubeconfig: str | None) -> str:
    """The run's logs, every attempt's, from wherever they are (the saved copy after ``down``); "" if none."""
    try:
        return "".join(run_logs(run, False, kube_context=kube_context, kubeconfig=kubeconfig))
    except MilesRayError:
        return ""


def compare(run_a: str, run_b: str, kube_context: str | None = None, kubeconfig: str | None = None) -> CompareResult:
    """Compare two runs (their records, and the metrics in their job logs; ``kube_context``/``kubeconfig``
    override what the records kept)."""
    if run_a == run_b:
        raise ConfigError(f"compare needs two different runs (got {run_a!r} twice)")
    rec_a, rec_b = state.RunStore.load(run_a), state.RunStore.load(run_b)
    logs_a, logs_b = run_metrics(rec_a, kube_context, kubeconfig), run_metrics(rec_b, kube_context, kubeconfig)
    errors = {r: m.why_not for r, m in ((run_a, logs_a), (run_b, logs_b)) if m.why_not}
    checkpoints = {side: checkpoint_summary(rec.run, checkpoint_files.last_seen(rec.run),
                                            scores_of(m.text or _saved_logs(rec.run, kube_context, kubeconfig)),
                                            _keep_best(rec))
                   for side, rec, m in (("a", rec_a, logs_a), ("b", rec_b, logs_b))}
    return CompareResult.model_validate({**compare_runs(rec_a.dump(), rec_b.dump(), logs_a.parsed, logs_b.parsed,
                                                        errors),
                                         "checkpoints": checkpoints})
