"""The Miles commit in the image, read on the live cluster by a probe job (``launchers/miles_commit.py``) and
compared with the commit the catalog mirrors (:mod:`miles_ray.core.miles_version`). ``submit`` (direct mode) and
``doctor`` call it on a head they have already reached."""

from __future__ import annotations

from miles_ray.core import miles_version
from miles_ray.core.config import MilesRayConfig
from miles_ray.core.errors import ClusterError
from miles_ray.core.miles_version import MilesVersion
from miles_ray.core.probes import miles_commit_probe
from miles_ray.core.progress import Progress
from miles_ray.core.results import Result
from miles_ray.services.probes import probe_token, run_probe


class ImageCommit(Result):
    """The Miles commit in the image, as the probe read it: ``commit`` (None: unknown, ``problem`` says why),
    how (``source``: git or git-files) and on which node (``where``), the checkout looked at (``root``); ``job``:
    the probe job, when it answered."""

    commit: str | None
    node_ip: str | None = None
    problem: str | None = None
    root: str
    root_exists: bool | None = None
    source: str | None
    where: str | None
    job: str | None = None
    entry: str | None = None  # ROOT/train.py, the entry point direct mode runs, and whether it is there
    entry_exists: bool | None = None


def read_image_commit(cfg: MilesRayConfig, url: str, python: str, progress: Progress = None) -> ImageCommit:
    """The probe's answer. A probe that could not run is an
    answer too: ``commit`` None and the reason in ``problem`` (an unknown commit is a notice, never a refusal)."""
    probe = miles_commit_probe(cfg, probe_token())
    if progress:
        progress(f"reading the Miles commit at {cfg.miles_root} in the image (job {probe.submission_id})")
    try:
        ran = run_probe(url, probe, python)
    except ClusterError as e:  # TimedOut included: the job was stopped
        return ImageCommit(commit=None, source=None, where=None, root=cfg.miles_root,
                           problem=f"the probe did not answer: {e.message}")
    return ImageCommit(**ran.result, job=ran.job)


def check_image_miles(cfg: MilesRayConfig, url: str, python: str, *, asserted: str | None, allow_drift: bool,
                      progress: Progress = None) -> tuple[MilesVersion, ImageCommit]:
    """Read the image's commit and compare it with the catalog's. Raises ``Conflict`` for a drift (unless
    ``allow_drift``) and for a --miles-commit the image contradicts; returns the verdict and the probe's answer."""
    answer = read_image_commit(cfg, url, python, progress)
    version = miles_version.resolve(miles_version.catalog_commit(), answer.commit, asserted,
                                    where=answer.where, allow_drift=allow_drift)
    refused = miles_version.refusal(version, cfg.miles_root)
    if refused is not None:
        raise refused
    return version, answer
