"""Register a checkpoint of a run as a model version in Polyaxon's model registry.

Registration records a selection: which checkpoint of which run, with its provenance. It is not a
quality or deployment gate, and nothing here judges the model.

Before anything is written, the checkpoint must exist where the run wrote it. Where that is checked:

* ``local`` backend (the embedded Ray cluster): the workers are processes on THIS machine and share its
  filesystem, so the path is stat'ed here (:data:`CHECKPOINTS_SEEN_FROM`).
* any other run (KubeRay, Polyaxon, an --address head): the shared volume is mounted on the cluster, not
  here. A probe job (``launchers/list_checkpoints.py``, through the one probe runner) goes to the run's head
  (a Kubernetes head through a port-forward); its driver schedules one task with 0.01 CPU on a GPU worker (the
  nodes that write checkpoints; the head advertises no CPUs, so the task cannot land there) and falls back to
  listing on the driver itself when no worker has room. It lists the run's checkpoint dir and reports the
  ``iter_*`` directories and ``latest_checkpointed_iteration.txt``.

The checkpoint dir is the one the run record says the job saves to (``checkpoint_dir``: the ``--save`` of its
train.py command line, see :func:`miles_ray.core.runs.run_checkpoints`); a record from before miles-ray kept it
falls back to ``<output_dir>/checkpoints``; a run that saves none is refused.

Polyaxon side (polyaxon 2.18 ``ProjectClient.register_model_version``): with a Polyaxon run uuid in the
run record (every run on a Polyaxon-made cluster has one, in its cluster's project, where it is then registered:
see :mod:`miles_ray.services.runs.polyaxon_tracked`; a launcher run's Polyaxon job too), the checkpoint (and HF dir) are first logged as MODEL lineage on that run, then the version
is registered with ``run=<uuid>`` and ``artifacts=[those lineage names]``; without one (a run submitted
straight to Ray), the version carries no Polyaxon run link and the source run name, artifact paths and
provenance go into its description and ``content`` (JSON).
"""

from __future__ import annotations

import json
import os
import re
import shlex
from enum import Enum
from pathlib import Path
from typing import Any

from miles_ray.adapters import checkpoint_files, state
from miles_ray.adapters.polyaxon_api import ModelRegistry
from miles_ray.adapters.ray_head import open_head
from miles_ray.core.config import MilesRayConfig
from miles_ray.core.entrypoint import flag_value
from miles_ray.core.errors import ClusterError, ConfigError, NotFound
from miles_ray.core.probes import checkpoint_list_probe
from miles_ray.core.progress import Progress
from miles_ray.core.records import PolyaxonRef, RunRecord, split_key
from miles_ray.core.results import Result
from miles_ray.core.runs import run_checkpoints
from miles_ray.services import polyaxon_where
from miles_ray.services.probes import payload_python, probe_token, run_probe

NOT_A_GATE = ("registration records a selection; it is not a quality gate or a deployment check: keep approval "
              "criteria explicit and validate the model in its serving environment before release")
VERSION_NAME = re.compile(r"^[a-z0-9][-a-z0-9_.]{0,62}$")
TAG = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,63}$")


class CheckVia(str, Enum):
    """Where register looks for the checkpoint (--check-via): ``auto`` (where the run's backend sees it, see
    :data:`CHECKPOINTS_SEEN_FROM`), this machine, or a probe job on the run's cluster."""

    auto = "auto"
    this_machine = "local"
    cluster = "cluster"


CHECKPOINTS_SEEN_FROM = {"local": CheckVia.this_machine}
"""Where a run's checkpoints are seen, by the backend its record names (the local backend's workers share this
machine's filesystem); any other run: through its cluster."""


class CheckpointListing(Result):
    """A run's checkpoint dir as seen from one node: the ``iter_*`` iterations in it, its tracker's content
    (``latest``), whether each extra path is a directory (``paths``) and where that was seen (``where``; a probe
    job's answer also names its ``host`` and ``ip``)."""

    host: str | None = None
    root: str
    exists: bool
    iterations: list[int]
    latest: str | None
    where: str
    paths: dict[str, bool]
    ip: str | None = None
    # per iteration (str): bytes, files, mtime, registered, missing (miles_ray.adapters.checkpoint_files.describe)
    details: dict[str, dict[str, Any]] | None = None


class Artifact(Result):
    name: str
    kind: str
    path: str
    format: str


class Checked(Result):
    """Where the checkpoint was found, and the iterations there."""

    where: str | None
    iterations: list[int]


class RegisterResult(Result):
    """The model version registered (or ``updated``), the run it came from, its artifacts and lineage, the check
    made before, and the version as the registry reads it back (``registered``)."""

    version: str
    project: str
    host: str
    updated: bool
    run: str
    polyaxon_run_uuid: str | None
    checkpoint: str
    hf_dir: str | None
    hf_dir_note: str | None
    artifacts: list[Artifact]
    lineage: list[str]
    tags: list[str]
    checked: Checked
    registered: dict[str, Any]
    note: str
    # where the run's checkpoints are listed with their evals (this one marked registered: never pruned)
    outputs: str


def checkpoint_root(record: dict[str, Any]) -> str:
    """The dir the run saves checkpoints to (from its record); bad input when it saves none miles-ray knows of."""
    ck = run_checkpoints(record)
    if not ck.save:
        raise ConfigError(f"run {record['run']} has no checkpoint dir: {ck.note}",
                          hint="register a checkpoint of a run whose job saves checkpoints (--save)")
    return ck.save


def checkpoint_dir(root: str, iteration: int) -> str:
    """Megatron's dir of checkpoint ``iteration`` (Miles' numbering: saved once rollout ``iteration`` is trained)."""
    return f"{root.rstrip('/')}/iter_{iteration:07d}"


def hf_dir_from_entrypoint(entrypoint: str, iteration: int) -> str | None:
    """The HF export Miles writes with ``--save-hf TEMPLATE`` beside checkpoint ``iteration``: Miles saves both after
    training rollout ``rollout_id`` (``iter_<rollout_id:07d>`` and ``TEMPLATE.format(rollout_id=rollout_id)``,
    radixark/miles ``miles/backends/megatron_utils/actor.py`` ``save_model``), so the iteration IS the rollout id."""
    try:
        args = shlex.split(entrypoint or "")
    except ValueError:
        return None
    template = flag_value(args, "--save-hf")
    if template is None:
        return None
    try:
        return template.format(rollout_id=iteration)
    except (KeyError, IndexError, ValueError):
        return None


def list_checkpoints_local(checkpoint_root: str, extra: list[str]) -> CheckpointListing:
    """The checkpoint dir as this machine sees it."""
    root = Path(checkpoint_root)
    exists, iterations, latest = root.is_dir(), [], None
    if exists:
        iterations = [int(p.name[5:]) for p in sorted(root.iterdir())
                      if p.name.startswith("iter_") and p.name[5:].isdigit() and p.is_dir()]
        tracker = root / "latest_checkpointed_iteration.txt"
        if tracker.is_file():
            latest = tracker.read_text().strip()
    return CheckpointListing(root=str(root), exists=exists, iterations=iterations, latest=latest,
                             where="this machine (local backend: the workers share its filesystem)",
                             paths={p: Path(p).is_dir() for p in extra},
                             details=checkpoint_files.describe_all(str(root), iterations))


def mark_registered(record: dict[str, Any], iteration: int, content: dict[str, Any], here: bool,
                    kube_context: str | None = None, kubeconfig: str | None = None) -> str | None:
    """Write the marker that keeps a registered checkpoint from the run's retention (its supervisor reads the
    checkpoint dir, not the registry; :data:`miles_ray.core.supervision.REGISTERED_MARKER`) and keep the version in
    the run's saved copy; why the marker could not be written (None: it was)."""
    checkpoint_files.add_registered(record["run"], {**content, "iteration": iteration})
    root = checkpoint_root(record)
    try:
        if here:
            checkpoint_files.write_registered(checkpoint_dir(root, iteration), content)
            return None
        probe = checkpoint_list_probe(root, record, [], probe_token(), mark=(iteration, json.dumps(content)))
        with open_head(record["address"], kube_context=kube_context or record.get("kube_context"),
                       kubeconfig=kubeconfig or record.get("kubeconfig")) as url:
            return run_probe(url, probe, payload_python(record["address"])).result.get("error")
    except (OSError, ClusterError) as e:
        return str(e).splitlines()[0]


def list_checkpoints_on_cluster(record: dict[str, Any], extra: list[str], timeout: float = 120,
                                kube_context: str | None = None, kubeconfig: str | None = None) -> CheckpointListing:
    """List the run's checkpoint dir through a probe job on the run's head (see module doc);
    ``kube_context``/``kubeconfig`` override what the record kept."""
    probe = checkpoint_list_probe(checkpoint_root(record), record, extra, probe_token(), timeout)
    try:
        with open_head(record["address"], kube_context=kube_context or record.get("kube_context"),
                       kubeconfig=kubeconfig or record.get("kubeconfig")) as url:
            # the head's own address (not a port-forward's 127.0.0.1) tells which python runs the payload
            return CheckpointListing(**run_probe(url, probe, payload_python(record["address"])).result)
    except ClusterError as e:
        raise type(e)(f"could not list the checkpoints of run {record['run']} on {record['address']}: {e.message}",
                      hint=e.hint or "is the cluster up? 'miles-ray status'", status=e.status) from None


def _check_request(run: str, iteration: int, version: str | None, tags: list[str], host: str | None) -> str:
    """Bad input, before anything is read: returns the version name."""
    if not host:
        raise ConfigError("the model registry is not enabled here: no Polyaxon host",
                          hint="pass --polyaxon-host, set polyaxon_host in miles-ray.yaml or POLYAXON_HOST")
    if iteration < 0:
        raise ConfigError(f"--checkpoint {iteration} is not an iteration number")
    version = version or f"{run}-iter-{iteration}"
    if not VERSION_NAME.fullmatch(version):
        raise ConfigError(f"version name {version!r} is not valid",
                          hint="lower-case letters, digits, '-', '_', '.', at most 63 characters")
    bad_tags = [t for t in tags if not TAG.fullmatch(t)]
    if bad_tags:
        raise ConfigError(f"tag(s) {', '.join(map(repr, bad_tags))} are not valid", hint="letters, digits, . _ : -")
    return version


def register(cfg: MilesRayConfig, run: str, iteration: int, *, version: str | None, hf_dir: str | None,
             tags: list[str], description: str | None, check_via: CheckVia = CheckVia.auto, force: bool = False,
             progress: Progress = None, kube_context: str | None = None,
             kubeconfig: str | None = None) -> RegisterResult:
    """Register checkpoint ``iteration`` of ``run`` as a model version in the Polyaxon registry ``cfg`` names (see
    the module doc); ``kube_context``/``kubeconfig`` override what the run's record kept."""
    typed = state.RunStore.load(run)
    record = typed.dump()
    ref = polyaxon_target(cfg, typed)
    owner, project = ref.owner, str(ref.project)
    version = _check_request(run, iteration, version, tags, ref.host or os.environ.get("POLYAXON_HOST"))
    api = polyaxon_where.client(ref)
    root = checkpoint_root(record)
    ckpt = checkpoint_dir(root, iteration)
    explicit_hf = hf_dir is not None
    hf = hf_dir or hf_dir_from_entrypoint(typed.entrypoint or "", iteration)

    # 1. the checkpoint must exist where the run wrote it -- nothing is registered otherwise
    via = CheckVia(check_via)
    if via is CheckVia.auto:
        via = CHECKPOINTS_SEEN_FROM.get(typed.backend, CheckVia.cluster)
    here = via is CheckVia.this_machine
    if progress:
        progress(f"looking for {ckpt} ({'on this machine' if here else 'through a Ray job on ' + typed.address})")
    extra = [hf] if hf else []
    listing = list_checkpoints_local(root, extra) if here else \
        list_checkpoints_on_cluster(record, extra, kube_context=kube_context, kubeconfig=kubeconfig)
    iterations = sorted(listing.iterations)
    if iteration not in iterations:
        have = ", ".join(str(i) for i in iterations) if iterations else "none"
        where = listing.where
        if not listing.exists:
            raise ConfigError(f"run {run}: no checkpoint dir {listing.root} ({where})",
                              hint="the run saved no checkpoint yet, or the volume is not mounted there")
        raise ConfigError(f"run {run}: checkpoint iteration {iteration} does not exist ({ckpt} not found, {where}); "
                          f"existing iterations: {have}",
                          hint="pick one of them with --checkpoint ITER")
    hf_found = bool(hf and listing.paths.get(hf))
    if explicit_hf and not hf_found:
        raise ConfigError(f"--hf-dir {hf} does not exist ({listing.where})",
                          hint="give the HF export Miles wrote (--save-hf), or leave --hf-dir out")

    # 2. the version must be new unless --force
    api.check_project(owner, project)
    registry = ModelRegistry(api, owner, project)
    existing = registry.get_version(version)
    if existing is not None and not force:
        raise ConfigError(f"model version {version} already exists in {owner}/{project}",
                          hint="choose another --version, or pass --force to update it")

    artifacts = [Artifact(name=f"checkpoint-iter_{iteration:07d}", kind="model", path=ckpt,
                          format="megatron torch_dist")]
    if hf_found:
        artifacts.append(Artifact(name=f"hf-iter_{iteration:07d}", kind="model", path=hf, format="huggingface"))
    checked = Checked(where=listing.where, iterations=iterations)
    # the run's provenance (its mode aside: a model version never kept it), its identity, where its checkpoints are
    provenance = {"run": typed.run, **{k: v for k, v in typed.provenance().items() if k != "mode"},
                  "submission_id": typed.submission_id, "address": typed.address, "checkpoint_dir": root,
                  "split": split_key(typed.split or {})}
    content = {"schema": "miles-ray/model-version/v1", "source_run": run, "checkpoint_iteration": iteration,
               "artifacts": [a.to_json() for a in artifacts], "provenance": provenance, "checked": checked.to_json(),
               "note": NOT_A_GATE}
    uuid = typed.polyaxon_run_uuid
    desc = description or (f"Miles checkpoint iter {iteration} of run {run} (recipe {typed.recipe}); "
                           + ("source: Polyaxon run " + uuid if uuid else "source: miles-ray run record " + run
                              + " (no Polyaxon run)") + ". A recorded selection, not a quality gate.")
    all_tags = list(dict.fromkeys(["miles", "miles-ray", str(typed.recipe or "").lower(), *tags]))
    all_tags = [t for t in all_tags if t]

    # 3. lineage on the Polyaxon run (when there is one), then the version
    lineage: list[str] = []
    if uuid:
        for art in artifacts:
            try:
                registry.log_model_lineage(uuid, art.to_json(), {"path": art.path, "format": art.format,
                                                                 "iteration": iteration})
            except NotFound:
                raise NotFound(f"Polyaxon run {uuid} (from run record {run}) not found in {owner}/{project}") from None
            lineage.append(art.name)
    if progress:
        progress(f"registering model version {version} in {owner}/{project}")
    registry.register_version(version, description=desc, tags=all_tags, content=content, run_uuid=uuid or None,
                              artifacts=lineage or None, force=force)
    back = registry.get_version(version)
    if back is None:
        raise ClusterError(f"model version {version} was registered but cannot be read back from {api.host}")
    unmarked = mark_registered(record, iteration, {"version": version, "project": f"{owner}/{project}",
                                                   "host": api.host}, here, kube_context, kubeconfig)
    if unmarked and progress:
        progress(f"warning: the checkpoint is registered, but its retention marker was not written ({unmarked}): "
                 "a retention of the run may prune it")
    return RegisterResult(
        version=version, project=f"{owner}/{project}", host=api.host, updated=existing is not None, run=run,
        polyaxon_run_uuid=uuid, checkpoint=ckpt, hf_dir=hf if hf_found else None,
        hf_dir_note=None if hf_found or explicit_hf else (
            f"HF dir {hf} not found: not registered" if hf else
            "the run did not pass --save-hf: no HF dir registered (give --hf-dir)"),
        artifacts=artifacts, lineage=lineage, tags=all_tags, checked=checked, registered=back, note=NOT_A_GATE,
        outputs=f"miles-ray runs outputs {run}")


def polyaxon_target(cfg: MilesRayConfig, record: RunRecord | None = None) -> PolyaxonRef:
    """The model registry's project: a run with a Polyaxon run of its own (on a Polyaxon-made cluster) registers in
    that run's project, on its host, so the version links to it; any other run: the configuration's, the host else
    $POLYAXON_HOST."""
    if record is not None and record.polyaxon_tracked and record.polyaxon_project:
        return polyaxon_where.resolve("registry", record.dump())
    return polyaxon_where.resolve("registry", None, cfg)
