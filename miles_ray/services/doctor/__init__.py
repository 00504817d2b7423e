"""miles-ray doctor: the troubleshooting checklist (docs/troubleshooting.md), automated. Each finding names
the checklist question it answers, what was looked at (evidence) and what to do (fix).

Checklist items:
  pending      "The pod stays Pending"            -> pods_pending
  data         "cannot find a checkpoint/dataset" -> data (check-data's checks, where a head is reachable)
  startup      "Ray or NCCL fails during startup" -> container_failures, shm, gpu_visibility, external_ray,
                                                        ray_membership
  resume       "Training restarts from scratch"   -> resume (run record + checkpoint tracker)
  drift        "keep image and Ray version aligned across replicas" -> image_drift, ray_version, miles_version

Kubernetes (KubeRay or Polyaxon-created RayClusters): everything (the Ray side through a port-forward to the
head, when it answers). Local backend and plain --address: the Ray-side subset (nodes alive, Ray version, data,
resume). One module per part: :mod:`.findings`, :mod:`.kube_checks`, :mod:`.ray_checks`.
"""

from __future__ import annotations

import re
from contextlib import ExitStack
from typing import Any

from pydantic import ValidationError

from miles_ray.adapters import local_ray, state
from miles_ray.adapters.ray_head import open_head
from miles_ray.core.config import MilesRayConfig
from miles_ray.core.errors import ClusterError, ConfigError
from miles_ray.services.doctor.findings import PROBLEM, WARNING, finding
from miles_ray.services.doctor.kube_checks import kube_findings, ray_membership
from miles_ray.services.doctor.ray_checks import (check_local_nodes, check_ray_version, data_findings, miles_findings,
                                                 resume_findings)
from miles_ray.services.heads import dashboard_address, pick_backend
from miles_ray.core.progress import Progress

RECORD_BACKENDS = {"local": "local", "kuberay": "kubernetes", "polyaxon": "kubernetes"}


def doctor(cfg: MilesRayConfig, target: str | None = None, backend: str = "auto", address: str | None = None,
           timeout: float = 60, progress: Progress = None) -> dict[str, Any]:
    """Diagnose a cluster (by name) or a run (by run name). Returns findings; never raises for a finding."""
    record = state.read_json(state.record_path(target)) if target and re.fullmatch(r"^[a-z0-9-]+$", target) else None
    kind = "run" if record else "cluster"
    head = address
    if record:
        cfg = cfg.model_copy(update={"name": record["cluster"],
                                     "kube_context": record.get("kube_context") or cfg.kube_context,
                                     "kubeconfig": record.get("kubeconfig") or cfg.kubeconfig})
        backend = RECORD_BACKENDS.get(record["backend"], "address")
        head = address or record["address"]
    elif target:
        try:
            cfg = MilesRayConfig.model_validate({**cfg.model_dump(), "name": target})
        except ValidationError as e:
            raise ConfigError(f"doctor {target}: not a run of this machine, and not a valid cluster name "
                              f"({str(e.errors()[0]['msg']).removeprefix('Value error, ')})",
                              hint="'miles-ray runs' lists runs; cluster names are DNS-1035 labels") from None
    if backend == "auto":
        backend = "address" if address and not record else pick_backend("auto", cfg)
    out: dict[str, Any] = {"target": target or cfg.name, "kind": kind, "cluster": cfg.name, "backend": backend}
    expected_ray = record.get("ray_version") if record else None

    findings: list[dict[str, Any]] = []
    # A KubeRay head reached through the cluster (not a given --address) may simply not run yet: the pod checks
    # say why, and the data checks are skipped with the reason.
    head_optional = backend == "kubernetes" and address is None
    pods: list[dict] = []
    if backend == "kubernetes":
        kube_found, pods = kube_findings(cfg, progress)
        findings += kube_found
        head = head or dashboard_address(cfg, "kubernetes")[1]
    elif backend == "local":
        try:
            st = local_ray.status(state.local_clusters_dir(), cfg.name)
            findings.append(check_local_nodes(st))
            head = head or st["dashboard_url"]
        except ClusterError as e:
            findings.append(finding("container_failures", "startup", PROBLEM, str(e), [],
                                    e.hint or "'miles-ray up --backend local'"))
    resume, resume_target = resume_findings(record)
    with ExitStack() as stack:
        url, unreached = None, None
        if head:
            out["address"] = head
            try:
                url = stack.enter_context(open_head(head, kube_context=cfg.kube_context, kubeconfig=cfg.kubeconfig))
                findings.append(check_ray_version(url, head, cfg, expected_ray))
            except ClusterError as e:
                url, unreached = None, str(e)
                if not head_optional:
                    findings.append(finding("ray_version", "drift", PROBLEM, f"the Ray head does not answer: {e}", [],
                                            "'miles-ray status' shows why; a recreated head needs its workers to "
                                            "rejoin"))
        if backend == "kubernetes":
            findings.append(ray_membership(pods, url, unreached))
        findings += resume
        findings += data_findings(cfg, url, head, record, resume_target, timeout, progress, unreached)
        findings += miles_findings(cfg, url, head, record, progress, unreached)
    out["findings"] = findings
    out["problems"] = sum(1 for f in findings if f["status"] == PROBLEM)
    out["warnings"] = sum(1 for f in findings if f["status"] == WARNING)
    return out
