"""comm-check: a collective across every GPU worker, submitted as a Ray job (``launchers/comm_check.py``)
to the cluster's head through the Jobs API, with the payload shipped as the job's working_dir."""

from __future__ import annotations

import datetime as _dt
import json
import re
import sys
from typing import Any, Callable
from urllib.parse import urlparse

from miles_ray.core.config import MilesRayConfig
from miles_ray.core.errors import ClusterError, ConfigError

Progress = Callable[[str], None] | None
RESULT_PREFIX = "COMM_CHECK_RESULT "
FAULT = re.compile(r"^(closed-port|no-start):[A-Za-z0-9.:_-]+$")


def _python_for(backend: str, url: str) -> str:
    """The interpreter of the job driver: this one for a cluster on this machine (same venv), else the
    image's python3."""
    host = urlparse(url).hostname or ""
    if backend == "local" or host in ("127.0.0.1", "localhost", "::1"):
        return sys.executable
    return "python3"


def parse_result(log_text: str) -> dict[str, Any] | None:
    for line in reversed((log_text or "").splitlines()):
        idx = line.find(RESULT_PREFIX)
        if idx >= 0:
            try:
                return json.loads(line[idx + len(RESULT_PREFIX):])
            except ValueError:
                return None
    return None


def comm_check(cfg: MilesRayConfig, *, address: str | None, backend: str, size_mb: float, timeout: float,
               fault: str | None = None, progress: Progress = None) -> dict[str, Any]:
    """Submit the check, wait for it, return its report (``ok``, ``backend``, ``nodes`` ...)."""
    from miles_ray.adapters import ray_jobs
    from miles_ray.services.jobs import launchers_dir, resolve_address

    if size_mb <= 0 or size_mb > 4096:
        raise ConfigError(f"--size-mb {size_mb:g} is out of range", hint="use 0 < size <= 4096 MiB")
    if fault is not None and not FAULT.match(fault):
        raise ConfigError(f"--inject-fault {fault!r} is not closed-port:<node ip|id> or no-start:<node ip|id>")
    chosen, url = resolve_address(cfg, address, backend)
    topo = ray_jobs.cluster_topology(url)
    gpu_nodes = [n for n in topo["nodes"] if n["gpus"] > 0]
    if not gpu_nodes:
        raise ClusterError(f"no GPU worker is alive in the cluster at {url}",
                           hint="wait for the workers ('miles-ray status') or scale up")
    py = _python_for(chosen, url)
    argv = [py, "comm_check.py", "--size-mb", f"{size_mb:g}", "--timeout", f"{timeout:g}"]
    if fault:
        argv += ["--fault", fault]
    stamp = _dt.datetime.now(_dt.timezone.utc).strftime("%Y%m%d%H%M%S%f")
    sid = f"miles-ray-{cfg.name}-comm-check-{stamp}"
    if progress:
        progress(f"submitting the comm check to {url} ({len(gpu_nodes)} GPU nodes, {size_mb:g} MiB)")
    job_id, _ = ray_jobs.submit(url, " ".join(argv), {"working_dir": str(launchers_dir()),
                                                       "env_vars": {"PYTHONUNBUFFERED": "1"}},
                                sid, {"miles_ray": "comm-check", "cluster": cfg.name})
    # placement + actor start + ring each bounded by --timeout inside the job; plus job start-up
    budget = 3 * timeout + 60
    try:
        info = ray_jobs.wait(url, job_id, timeout=budget)
    except ClusterError:
        ray_jobs.stop(url, job_id)
        raise ClusterError(f"comm check job {job_id} did not finish within {budget:.0f}s on {url}",
                           hint="see 'ray job logs' for it; is a GPU node stuck?") from None
    text = ray_jobs.logs(url, job_id)
    result = parse_result(text)
    if result is None:
        tail = " | ".join(line for line in text.strip().splitlines()[-3:]) if text else "no output"
        raise ClusterError(f"comm check job {job_id} ended {info['status']} without a report ({tail[:400]})",
                           hint="the payload could not run on the head: check the image's python and ray")
    result.update({"address": url, "job_id": job_id, "job_status": info["status"]})
    return result
