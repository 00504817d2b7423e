"""Probes: small Ray jobs that check something on a live cluster -- the data and checkpoint preflight
(``launchers/check_data.py``), the all-reduce across GPU workers (``launchers/comm_check.py``), the listing of
a run's checkpoints (``launchers/list_checkpoints.py``) and the Miles commit in the image
(``launchers/miles_commit.py``). Pure: this module says exactly what job each probe is
and how to read its answer; ``miles_ray.services.probes.run_probe`` runs it.

Every payload is a file in ``launchers/`` (shipped as the job's working_dir; it imports only ray and the standard
library) and prints its answer as one line ``MILES_RAY_PROBE_RESULT {json}``.
"""

from __future__ import annotations

import json
import shlex
from dataclasses import dataclass, field
from pathlib import PurePosixPath
from typing import Any

from miles_ray.core.config import MilesRayConfig
from miles_ray.core.errors import ConfigError
from miles_ray.core.recipes import Recipe
from miles_ray.core.runs import ResumeTarget

RESULT_PREFIX = "MILES_RAY_PROBE_RESULT "
CHECK_DATA_SPEC_ENV = "CHECK_DATA_SPEC"
MAX_COMM_SIZE_MB = 4096


@dataclass(frozen=True)
class Probe:
    """One probe job: ``payload`` (a file in launchers/) run with ``args`` and ``env``, bounded by ``timeout``
    seconds from submission to its end (the runner stops it after that)."""

    kind: str
    payload: str
    submission_id: str
    timeout: float
    args: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    metadata: dict[str, str] = field(default_factory=dict)

    def entrypoint(self, python: str) -> str:
        return shlex.join([python, self.payload, *self.args])


def probe_id(kind: str, cluster: str, token: str) -> str:
    """A fresh submission id for one probe run (``token``: a time stamp or random hex the caller picks)."""
    return f"miles-ray-{kind}-{cluster}-{token}"


def parse_result(log_text: str) -> dict[str, Any] | None:
    """The payload's answer: the last ``MILES_RAY_PROBE_RESULT {json}`` line of its log, or None.

    Text that another thread of the driver wrote on the same line after the JSON object (Ray prints the
    workers' log lines to the driver's stdout) is ignored; a line whose JSON is cut short does not hide an
    earlier complete one."""
    decoder = json.JSONDecoder()
    for line in reversed((log_text or "").splitlines()):
        idx = line.rfind(RESULT_PREFIX)
        if idx < 0:
            continue
        try:
            value, _ = decoder.raw_decode(line, idx + len(RESULT_PREFIX))
        except ValueError:
            continue
        if isinstance(value, dict):
            return value
    return None


# -- check-data -------------------------------------------------------------------------------------

def check_data_spec(cfg: MilesRayConfig, recipe: Recipe, resume: ResumeTarget | None = None,
                    timeout: float = 60) -> dict[str, Any]:
    """The payload's spec: every path it checks, as the launcher will see them (``resume``: a resumed run's output
    dir and the checkpoint dir it loads from, where the tracker must be)."""
    model_dir, data_dir = PurePosixPath(cfg.model_dir), PurePosixPath(cfg.data_dir)
    inputs = [
        ("HF model (SGLang, tokenizer)", str(model_dir / recipe.hf_dir)),
        ("training data", str(data_dir / recipe.train_data)),
    ]
    if recipe.megatron_dir:
        inputs.insert(1, ("Megatron checkpoint (--ref-load)", str(model_dir / recipe.megatron_dir)))
    if recipe.eval_data:
        inputs.append(("evaluation data", str(data_dir / recipe.eval_data)))
    output_parent = str(PurePosixPath(cfg.mount_path) / cfg.runs_dir)
    tracker = None
    if resume:
        tracker = str(PurePosixPath(resume.checkpoint_dir) / "latest_checkpointed_iteration.txt")
        output_parent = str(PurePosixPath(resume.output_dir).parent)
    return {"mount_path": cfg.mount_path, "inputs": inputs, "output_parent": output_parent, "tracker": tracker,
            "timeout": timeout}


def check_data_bound(timeout: float) -> float:
    """The whole check-data job's bound: four per-node rounds of ``timeout`` plus job start-up."""
    return 4 * timeout + 120


def comm_check_bound(timeout: float) -> float:
    """The whole comm-check job's bound: placement, actor start and the ring, plus job start-up."""
    return 3 * timeout + 60


def check_data_probe(cfg: MilesRayConfig, recipe: Recipe, resume: ResumeTarget | None, timeout: float,
                     token: str) -> Probe:
    """The preflight job: four bounded rounds of per-node tasks, plus job start-up (runtime env upload, driver
    start)."""
    spec = check_data_spec(cfg, recipe, resume, timeout)
    return Probe(kind="check-data", payload="check_data.py", submission_id=probe_id("check-data", cfg.name, token),
                 timeout=check_data_bound(timeout), env={CHECK_DATA_SPEC_ENV: json.dumps(spec)},
                 metadata={"miles_ray": "check-data", "cluster": cfg.name})


TRACKER_CHECK = "resume checkpoint tracker"  # the payload's name of the --resume-from check


def missing_line(node: dict[str, Any], missing: dict[str, Any]) -> str:
    """One problem of one node, as a line: ``IP (role): what path: problem``."""
    return f"{node['node_ip']} ({node['role']}): {missing['what']} {missing['path']}: {missing['problem']}".replace(
        " : ", ": ")


def check_data_report(result: dict[str, Any], cfg: MilesRayConfig, recipe: Recipe,
                      resume: ResumeTarget | None) -> dict[str, Any]:
    """The payload's answer as check-data's report: ``ok``, ``nodes`` (per node: checks with evidence,
    ``missing``), ``missing`` (every problem, one line each, per node), ``same_storage``, and for a resume the
    output dir and the checkpoint dir whose tracker was checked."""
    missing = [missing_line(n, m) for n in result["nodes"] for m in n.get("missing", [])]
    if not result["nodes"]:
        missing.append("no alive head or GPU worker node answered")
    return {"recipe": recipe.name, "mount_path": cfg.mount_path,
            "resume_output_dir": resume.output_dir if resume else None,
            "resume_checkpoint_dir": resume.checkpoint_dir if resume else None,
            "ok": bool(result["ok"]) and not missing, "missing": missing, "nodes": result["nodes"],
            "same_storage": result["same_storage"], "seconds": result.get("seconds")}


# -- comm-check -------------------------------------------------------------------------------------

def comm_check_probe(cfg: MilesRayConfig, size_mb: float, timeout: float, token: str) -> Probe:
    """The all-reduce job: placement, actor start and the ring are each bounded by ``timeout`` inside it."""
    if size_mb <= 0 or size_mb > MAX_COMM_SIZE_MB:
        raise ConfigError(f"--size-mb {size_mb:g} is out of range", hint=f"use 0 < size <= {MAX_COMM_SIZE_MB} MiB")
    return Probe(kind="comm-check", payload="comm_check.py", submission_id=probe_id("comm-check", cfg.name, token),
                 timeout=comm_check_bound(timeout), args=["--size-mb", f"{size_mb:g}", "--timeout", f"{timeout:g}"],
                 env={"PYTHONUNBUFFERED": "1"}, metadata={"miles_ray": "comm-check", "cluster": cfg.name})


# -- a run's checkpoints ----------------------------------------------------------------------------

def checkpoint_list_probe(root: str, record: dict[str, Any], extra_paths: list[str], token: str,
                          timeout: float = 120, mark: tuple[int, str] | None = None) -> Probe:
    """List the run's checkpoint dir ``root`` (``iter_*`` dirs, the tracker; see
    :func:`miles_ray.core.runs.run_checkpoints`) on a GPU worker of the run's cluster, and whether each of
    ``extra_paths`` is a directory there. ``mark``: (iteration, JSON) instead: write ``register``'s marker there."""
    marking = ["--mark", str(mark[0]), mark[1]] if mark else []
    return Probe(kind="ckpt", payload="list_checkpoints.py", submission_id=probe_id("ckpt", record["cluster"], token),
                 timeout=timeout, args=[*marking, root, *extra_paths],
                 env={"PYTHONUNBUFFERED": "1"}, metadata={"miles_ray": "checkpoint-list", "run": record["run"]})


# -- the Miles commit in the image ------------------------------------------------------------------

MILES_COMMIT_TIMEOUT = 30.0


def miles_commit_probe(cfg: MilesRayConfig, token: str, timeout: float = MILES_COMMIT_TIMEOUT) -> Probe:
    """Read the commit of the Miles checkout at ``cfg.miles_root`` on a GPU worker (the driver when none answers
    within ``timeout``); the whole job is bounded by twice that plus job start-up."""
    return Probe(kind="miles-commit", payload="miles_commit.py", submission_id=probe_id("miles-commit", cfg.name, token),
                 timeout=2 * timeout + 60, args=[cfg.miles_root, "--timeout", f"{timeout:g}"],
                 env={"PYTHONUNBUFFERED": "1"}, metadata={"miles_ray": "miles-commit", "cluster": cfg.name})
