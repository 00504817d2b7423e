"""Data and checkpoint preflight on a live Ray cluster: what the Miles launcher will read and write, checked
from the head and every alive GPU worker node by a probe job (``launchers/check_data.py``).

``check_data`` is what ``miles-ray check-data``, ``miles-ray doctor`` and ``submit`` (before it submits) call.
It returns a report; it raises only when the check itself could not run.
"""

from __future__ import annotations

from pathlib import PurePosixPath

from miles_ray.adapters import state
from miles_ray.adapters.ray_head import open_head
from miles_ray.core.config import MilesRayConfig
from miles_ray.core.entrypoint import checkpoint_dirs, filled_train_args
from miles_ray.core.errors import ConfigError
from miles_ray.core.probes import check_data_probe, check_data_report
from miles_ray.core.recipes import Recipe
from miles_ray.core.results import Result
from miles_ray.core.runs import ResumeTarget, resume_target, run_id_of
from miles_ray.services.heads import resolve_address
from miles_ray.services.probes import payload_python, probe_token, run_probe
from miles_ray.core.progress import Progress


class PathCheck(Result):
    """One path checked on one node (the payload's keys, in its order): ``what`` it is for, whether it is usable
    (``ok``; else ``problem``), and the evidence: a mount point, the tracker's iteration, a note."""

    iteration: str | None = None
    mountpoint: bool | None = None
    note: str | None = None
    ok: bool
    path: str
    problem: str | None = None
    what: str


class MissingPath(Result):
    path: str
    problem: str
    what: str


class NodeReport(Result):
    """What one node (the head or a GPU worker) sees: every check, every problem (``missing``), the mount, and
    whether it sees what the reference node wrote (``same_storage``). A node whose probe did not answer has only
    that problem."""

    checks: list[PathCheck]
    gpus: int | float
    hostname: str | None = None
    missing: list[MissingPath]
    mount_device: str | None = None
    mount_exists: bool | None = None
    mount_is_mountpoint: bool | None = None
    node_id: str
    node_ip: str | None
    role: str
    same_storage: bool | None = None
    writable_dir: str | None = None


class SameStorage(Result):
    """The same-storage check: the reference node that wrote a token and where (``problem``: why not done)."""

    directory: str | None
    problem: str | None = None
    reference: str | None


class CheckDataReport(Result):
    """check-data's report: the head (``address``) and the probe job (``job``) that checked, every node's checks
    with their evidence and ``missing`` problems (``nodes``), every problem as one
    line (``missing``), the same-storage check, and for a resume the output dir and the checkpoint dir whose
    tracker was checked."""

    address: str
    job: str
    recipe: str
    mount_path: str
    resume_output_dir: str | None
    resume_checkpoint_dir: str | None
    ok: bool
    missing: list[str]
    nodes: list[NodeReport]
    same_storage: SameStorage
    seconds: float | None


def resume_of(cfg: MilesRayConfig, recipe: Recipe, resume_from: str | None) -> ResumeTarget | None:
    """--resume-from RUN|DIR -> the output dir a resumed run writes to and the checkpoint dir it loads from: the
    dir the run's record says it saved to (an output dir: the run recorded with it; with no record, where
    ``recipe``'s job saves for that output dir). Bad input (exit 2) when no checkpoint dir is known."""
    if not resume_from:
        return None
    if "/" not in resume_from:
        return resume_target(state.load_record(resume_from))
    p = PurePosixPath(resume_from)
    if not p.is_absolute():
        raise ConfigError(f"--resume-from {resume_from}: an output dir must be an absolute path")
    record = state.find_record_by_output_dir(str(p))
    if record is not None:
        return resume_target(record)
    save = checkpoint_dirs(filled_train_args(cfg, recipe, str(p), run_id_of(str(p))))[0]
    if not save:
        raise ConfigError(f"--resume-from {resume_from}: no run is recorded with that output dir and recipe "
                          f"{recipe.name}'s job passes no --save, so there is no checkpoint dir to check",
                          hint="pass the run name, or the recipe the run used (--recipe)")
    return ResumeTarget(output_dir=str(p), checkpoint_dir=save)


def check_data(cfg: MilesRayConfig, url: str, recipe: Recipe, resume: ResumeTarget | None = None, *,
               timeout: float = 60, python: str = "python3", progress: Progress = None) -> CheckDataReport:
    """Run the preflight probe on the head at ``url`` (an http URL) and return its report. A typed error when the job cannot run, times out (it is stopped) or gives no
    result."""
    probe = check_data_probe(cfg, recipe, resume, timeout, probe_token())
    if progress:
        progress(f"checking {cfg.mount_path} on every node of {url} (job {probe.submission_id})")
    ran = run_probe(url, probe, python)
    return CheckDataReport(address=url, job=ran.job, **check_data_report(ran.result, cfg, recipe, resume))


def check_data_at(cfg: MilesRayConfig, recipe: Recipe, *, address: str | None, backend: str,
                  resume: ResumeTarget | None, timeout: float, progress: Progress = None) -> CheckDataReport:
    """``miles-ray check-data``: resolve the head (``--address`` -- a URL, ``k8s://NS/NAME`` or ``local://NAME`` --
    or the cluster made by up), reach it (a port-forward for a Kubernetes head) and run the preflight there
    (``resume``: :func:`resume_of` the --resume-from given)."""
    _, head = resolve_address(cfg, address, backend)
    with open_head(head, kube_context=cfg.kube_context, kubeconfig=cfg.kubeconfig) as url:
        report = check_data(cfg, url, recipe, resume, timeout=timeout, python=payload_python(head),
                            progress=progress)
    return report.model_copy(update={"address": head})
