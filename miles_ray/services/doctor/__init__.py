"""miles-ray doctor: the troubleshooting checklist (docs/troubleshooting.md), automated. Each finding names
the checklist question it answers, what was looked at (evidence) and what to do (fix).

Checklist items:
  pending      "The pod stays Pending"            -> pods_pending
  data         "cannot find a checkpoint/dataset" -> data (check-data's checks, where a head is reachable)
  startup      "Ray or NCCL fails during startup" -> container_failures, shm, gpu_visibility, external_ray,
                                                        ray_membership
  resume       "Training restarts from scratch"   -> resume (run record + checkpoint tracker), gcs_ft (a long run
                                                        on a RayCluster without GCS fault tolerance)
  drift        "keep image and Ray version aligned across replicas" -> image_drift, ray_version, miles_version
  training     "Training stalls or diverges" (RUN) -> stall, nan_loss, reward_collapse (from its logs, as status RUN)
  memory       "Validate GPU memory requirements" -> memory_trainer, memory_rollout, memory_host, memory_storage
                                                        (the estimate of miles_ray.core.memory, per part)

Kubernetes (KubeRay or Polyaxon-created RayClusters): everything (the Ray side through a port-forward to the
head, when it answers). Local backend and plain --address: the Ray-side subset (nodes alive, Ray version, data,
resume). The backend's own checks are chosen from :data:`SIDES`, keyed by the backend kind. One module per part:
:mod:`.findings`, :mod:`.kube_checks`, :mod:`.ray_checks`.
"""

from __future__ import annotations

import re
from contextlib import ExitStack
from dataclasses import dataclass, field
from typing import Any, Callable

from pydantic import ValidationError

from miles_ray.adapters import local_ray, state
from miles_ray.adapters.ray_head import open_head
from miles_ray.core.config import MilesRayConfig
from miles_ray.core.errors import ClusterError, ConfigError, plain
from miles_ray.core.progress import Progress
from miles_ray.core.records import RunRecord, as_record
from miles_ray.core.runs import describe_head
from miles_ray.services.doctor.findings import OK, PROBLEM, WARNING, DoctorReport, Finding, finding
from miles_ray.services.doctor.kube_checks import kube_findings, ray_membership
from miles_ray.services.doctor.memory_checks import memory_findings
from miles_ray.services.doctor.ray_checks import (check_local_nodes, check_ray_version, data_findings, miles_findings,
                                                 resume_findings)
from miles_ray.services.doctor.training_checks import training_findings
from miles_ray.services.heads import dashboard_address, pick_backend
from miles_ray.services.probes import side_by_side
from miles_ray.services.runs import backend_for

__all__ = ["DoctorReport", "Finding", "doctor"]

RECORD_BACKENDS = {"local": "local", "kuberay": "kubernetes"}


@dataclass
class _Side:
    """What the backend's own checks found before the Ray head is reached: their findings, the head they point at
    (None: none known), whether the head the backend made may simply not run yet (then, unless the head was
    given by --address, an unreached head is said by the other checks, not as a problem of its own), and the
    checks that need the head's answer (``url`` None: not reached, ``unreached`` says why)."""

    findings: list[Finding] = field(default_factory=list)
    head: str | None = None
    head_optional: bool = False
    with_head: Callable[[str | None, str | None], list[Finding]] = lambda url, unreached: []


def _kubernetes_side(cfg: MilesRayConfig, address: str | None, progress: Progress) -> _Side:
    """The RayCluster's spec and pods, and every Ready pod against Ray's nodes once the head answers. Its head
    may simply not run yet: the pod checks say why."""
    found, pods, gcs_ft = kube_findings(cfg, progress)
    return _Side(found, address or dashboard_address(cfg, "kubernetes")[1], head_optional=True,
                 with_head=lambda url, unreached: [ray_membership(pods, url, unreached),
                                                  gcs_ft(url, unreached)])


def _local_side(cfg: MilesRayConfig, address: str | None, progress: Progress) -> _Side:
    """The local cluster's nodes and processes."""
    try:
        st = local_ray.status(state.local_clusters_dir(), cfg.name)
    except ClusterError as e:
        return _Side([finding("container_failures", "startup", PROBLEM, str(e), [],
                              e.hint or "'miles-ray up --backend local'")], address)
    return _Side([check_local_nodes(st)], address or st["dashboard_url"])


def _address_side(cfg: MilesRayConfig, address: str | None, progress: Progress) -> _Side:
    """A head given by its address: only the Ray side is known."""
    return _Side(head=address)


SIDES: dict[str, Callable[[MilesRayConfig, str | None, Progress], _Side]] = {
    "kubernetes": _kubernetes_side, "local": _local_side, "address": _address_side}
"""The backend's own checks, by the backend the cluster (or the run's record) names."""


def check_target(cfg: MilesRayConfig, target: str | None) -> None:
    """Bad input before anything is looked at (the verb calls it before its progress display): ``target`` is a
    run of this machine or a valid cluster name."""
    if target and not (re.fullmatch(r"^[a-z0-9-]+$", target) and state.read_json(state.record_path(target))):
        try:
            MilesRayConfig.model_validate({**cfg.model_dump(), "name": target})
        except ValidationError as e:
            raise ConfigError(f"doctor {target}: not a run of this machine, and not a valid cluster name "
                              f"({plain(str(e.errors()[0]['msg']))})",
                              hint="'miles-ray runs' lists runs; cluster names are DNS-1035 labels") from None


def _run_head(record: RunRecord, url: str | None, cfg: MilesRayConfig) -> Finding:
    """doctor RUN: the head the run's job started on, against the head serving now (a job whose head is gone was
    lost with it: FAILED, whatever Ray's job table still says)."""
    run = record.run
    lost = backend_for(record, url=url, kube_context=cfg.kube_context, kubeconfig=cfg.kubeconfig).head_lost()
    head = describe_head(record.head.model_dump() if record.head is not None else {})
    if lost:
        return finding("run_head", "resume", PROBLEM, f"the job of run {run} was lost with its head: "
                       f"{lost.reason}", [f"attempt {lost.attempt}: {lost.submission_id} "
                                          f"started {lost.started} on {head}"],
                       f"'miles-ray submit' of the same run starts attempt {(lost.attempt or 1) + 1} from "
                       "its checkpoints")
    return finding("run_head", "resume", OK, f"run {run}'s job started on the head serving now ({head})"
                   if url else f"run {run}'s job started on {head}; the head does not answer now", [])


def doctor(cfg: MilesRayConfig, target: str | None = None, backend: str = "auto", address: str | None = None,
           timeout: float = 60, progress: Progress = None) -> DoctorReport:
    """Diagnose a cluster (by name) or a run (by run name). Returns findings; never raises for a finding."""
    record = state.read_json(state.record_path(target)) if target and re.fullmatch(r"^[a-z0-9-]+$", target) else None
    rec = as_record(record) if record else None
    kind = "run" if record else "cluster"
    head = address
    if rec is not None:
        cfg = cfg.model_copy(update={"name": rec.cluster, "kube_context": rec.kube_context or cfg.kube_context,
                                     "kubeconfig": rec.kubeconfig or cfg.kubeconfig})
        backend = RECORD_BACKENDS.get(rec.backend, "address")
        head = address or rec.address
    elif target:
        try:
            cfg = MilesRayConfig.model_validate({**cfg.model_dump(), "name": target})
        except ValidationError as e:
            raise ConfigError(f"doctor {target}: not a run of this machine, and not a valid cluster name "
                              f"({plain(str(e.errors()[0]['msg']))})",
                              hint="'miles-ray runs' lists runs; cluster names are DNS-1035 labels") from None
    if backend == "auto":
        backend = "address" if address and not record else pick_backend("auto", cfg)
    report: dict[str, Any] = {"target": target or cfg.name, "kind": kind, "cluster": cfg.name, "backend": backend}
    expected_ray = rec.ray_version if rec is not None else None

    side = SIDES[backend](cfg, head, progress)
    findings = list(side.findings)
    head = side.head
    resume, resume_target = resume_findings(record)
    with ExitStack() as stack:
        url, unreached = None, None
        if head:
            report["address"] = head
            try:
                url = stack.enter_context(open_head(head, kube_context=cfg.kube_context, kubeconfig=cfg.kubeconfig))
                findings.append(check_ray_version(url, head, cfg, expected_ray))
            except ClusterError as e:
                url, unreached = None, str(e)
                if not (side.head_optional and address is None):
                    findings.append(finding("ray_version", "drift", PROBLEM, f"the Ray head does not answer: {e}", [],
                                            "'miles-ray status' shows why; a recreated head needs its workers to "
                                            "rejoin"))
        findings += side.with_head(url, unreached)
        if rec is not None and rec.head:
            findings.append(_run_head(rec, url, cfg))
        findings += resume
        findings += memory_findings(cfg, record, head)
        if record:
            findings += training_findings(record, cfg.kube_context, cfg.kubeconfig)
        data, miles = side_by_side(  # two probe jobs, at the same time
            lambda: data_findings(cfg, url, head, record, resume_target, timeout, progress, unreached),
            lambda: miles_findings(cfg, url, head, record, progress, unreached))
        findings += data + miles
    return DoctorReport(**report, findings=findings, problems=sum(1 for f in findings if f.status == PROBLEM),
                        warnings=sum(1 for f in findings if f.status == WARNING))
