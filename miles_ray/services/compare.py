"""Compare two runs: their records (provenance, split, eval setup) and the final metrics Miles logged,
read from each run's job logs through the Ray Jobs API (each run's head reached like every other head: a
Kubernetes head through a port-forward). The judgement itself is pure
(:func:`miles_ray.core.metrics.compare_runs`)."""

from __future__ import annotations

from typing import Any

from miles_ray.adapters import ray_jobs, state
from miles_ray.adapters.ray_head import open_head
from miles_ray.core.errors import ClusterError, ConfigError
from miles_ray.core.metrics import compare_runs, parse_metrics


def run_metrics(record: dict[str, Any], kube_context: str | None = None,
                kubeconfig: str | None = None) -> tuple[dict[str, Any] | None, str | None]:
    """(parsed metrics, None) from the run's job log, or (None, why not)."""
    if record.get("mode") == "rehearse":
        return None, "a rehearsal run (no training, no metrics)"
    if record.get("mode") == "launcher":
        return None, ("a launcher-mode run: the upstream launcher submits its own Ray job, which miles-ray "
                      "does not track")
    try:
        with open_head(record["address"], kube_context=kube_context or record.get("kube_context"),
                       kubeconfig=kubeconfig or record.get("kubeconfig")) as url:
            text = ray_jobs.logs(url, record["submission_id"])
    except ClusterError as e:
        return None, f"no job log ({e.message})"
    return parse_metrics(text or ""), None


def compare(run_a: str, run_b: str, kube_context: str | None = None, kubeconfig: str | None = None) -> dict[str, Any]:
    if run_a == run_b:
        raise ConfigError(f"compare needs two different runs (got {run_a!r} twice)")
    rec_a, rec_b = state.load_record(run_a), state.load_record(run_b)
    logs_a, err_a = run_metrics(rec_a, kube_context, kubeconfig)
    logs_b, err_b = run_metrics(rec_b, kube_context, kubeconfig)
    errors = {r: e for r, e in ((run_a, err_a), (run_b, err_b)) if e}
    return compare_runs(rec_a, rec_b, logs_a, logs_b, errors)
