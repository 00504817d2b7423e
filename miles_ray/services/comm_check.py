"""comm-check: a collective across every GPU worker, run as a probe job (``launchers/comm_check.py``) on the
cluster's head, reached like every other head (a URL, ``k8s://NAMESPACE/RAYCLUSTER`` through a port-forward,
``local://NAME``, or the cluster made by up)."""

from __future__ import annotations

from miles_ray.adapters import ray_jobs
from miles_ray.adapters.ray_head import open_head
from miles_ray.core.config import MilesRayConfig
from miles_ray.core.errors import ClusterError
from miles_ray.core.probes import comm_check_probe
from miles_ray.core.progress import Progress
from miles_ray.core.results import Result
from miles_ray.services.heads import resolve_address
from miles_ray.services.probes import payload_python, probe_token, run_probe


class CommNode(Result):
    """One GPU node in the all-reduce (the payload's answer for it, its keys in its order): where it is (``ip``,
    ``node_id``, its placement ``bundle``, the network ``interface`` owning the IP, its ``address`` and how it was
    found, ``via``), its ``rank`` in the ring, the result (``ok``, ``status``, ``error``, ``note``) and the ring's
    bytes and rate. A node the check could not place or start has only what is known of it."""

    address: str | None = None
    bundle: int | None = None
    bytes_per_s: float | None = None
    bytes_sent: int | None = None
    error: str | None = None
    gpu_ids: list[str] | None = None
    interface: str | None = None
    ip: str | None = None
    node_id: str | None = None
    note: str | None = None
    ok: bool | None = None
    rank: int | None = None
    seconds: float | None = None
    status: str | None = None
    via: str | None = None


class CommCheckReport(Result):
    """The all-reduce's report (the payload's answer, its keys in its order, then where it ran): the collective
    ``backend`` (once the actors started), every problem (``errors``), the GPU nodes found, the slowest node's
    ring rate, per node its interface, result and rate (``nodes``), ``ok``; the
    head, the probe job and its final status."""

    backend: str | None = None
    errors: list[str]
    gpu_nodes: int
    min_bytes_per_s: float | None = None
    nodes: list[CommNode]
    ok: bool
    seconds_start: float | None = None
    seconds_total: float | None = None
    size_bytes: int
    address: str
    job_id: str
    job_status: str


def comm_check(cfg: MilesRayConfig, *, address: str | None, backend: str, size_mb: float, timeout: float,
               progress: Progress = None) -> CommCheckReport:
    """Submit the check, wait for it (bounded; stopped on timeout), return its report."""
    probe = comm_check_probe(cfg, size_mb, timeout, probe_token())  # bad input fails before any I/O
    _, head = resolve_address(cfg, address, backend)
    with open_head(head, kube_context=cfg.kube_context, kubeconfig=cfg.kubeconfig) as url:
        gpu_nodes = [n for n in ray_jobs.cluster_topology(url)["nodes"] if n["gpus"] > 0]
        if not gpu_nodes:
            raise ClusterError(f"no GPU worker is alive in the cluster at {head}",
                               hint="wait for the workers ('miles-ray status') or scale up")
        if progress:
            progress(f"submitting the comm check to {head} ({len(gpu_nodes)} GPU nodes, {size_mb:g} MiB)")
        ran = run_probe(url, probe, payload_python(head))
    return CommCheckReport(**ran.result, address=head, job_id=ran.job, job_status=ran.status)
