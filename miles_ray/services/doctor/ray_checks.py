"""Doctor's Ray-side checks, on a head reached through :func:`miles_ray.adapters.ray_head.open_head` (the
local cluster, an address, or a KubeRay head through a port-forward): the Ray version, the local nodes, and a
run's data and checkpoints (check-data's probe; resume: the run record and the checkpoint tracker), and the Miles
commit in the image against the catalog's (the probe ``submit`` runs in direct mode)."""

from __future__ import annotations

from typing import Any, Callable

from miles_ray.adapters import ray_jobs, state
from miles_ray.core import miles_version
from miles_ray.core.config import MilesRayConfig
from miles_ray.core.errors import ClusterError
from miles_ray.core.probes import TRACKER_CHECK, missing_line
from miles_ray.core.recipes import get_recipe
from miles_ray.services.datacheck import check_data
from miles_ray.services.doctor.findings import OK, PROBLEM, SKIPPED, WARNING, finding
from miles_ray.services.milesversion import read_image_commit
from miles_ray.services.probes import payload_python

Progress = Callable[[str], None] | None
UNREACHED_FIX = ("'miles-ray status' shows the head; for a head elsewhere pass --address http://HEAD:8265 or "
                 "k8s://NAMESPACE/RAYCLUSTER, or run 'miles-ray check-data' there")


def check_ray_version(url: str, head: str, cfg: MilesRayConfig, expected: str | None) -> dict[str, Any]:
    live = ray_jobs.ray_version(url)
    want = expected or cfg.ray_version
    ev = [f"head {head} runs Ray {live or 'unknown'}", f"expected {want or '(not configured)'}"]
    if live and want and live != want:
        return finding("ray_version", "drift", PROBLEM, f"the head runs Ray {live}, expected {want}", ev,
                       "head, workers and submitter must run one Ray version: fix --ray-version or the image")
    return finding("ray_version", "drift", OK, f"Ray {live or 'unknown'} on the head", ev)


def check_local_nodes(st: dict) -> dict[str, Any]:
    ev = [f"{n['ip']}: {'head' if n['is_head'] else 'gpu worker'} {n['state']}, {n['gpus']:g} GPUs" +
          ("" if n.get("process_alive", True) else " (process gone)") for n in st["nodes"]]
    ev += [f"{n['ip']}: {n['state']}" for n in st.get("dead_nodes", [])]
    gone = [n for n in st["nodes"] if n.get("process_alive") is False]
    if st.get("dead_count") or gone:
        return finding("container_failures", "startup", PROBLEM,
                       f"{st.get('dead_count', 0)} dead node(s), {len(gone)} worker process(es) gone", ev,
                       "'miles-ray down --backend local' and 'up' again; the raylet logs are under the temp dir "
                       f"{st.get('temp_dir')}")
    return finding("container_failures", "startup", OK, f"{st['alive_count']} node(s) alive, "
                   f"{st['gpu_node_count']} GPU worker(s)", ev)


def resume_findings(record: dict[str, Any] | None) -> tuple[list[dict[str, Any]], str | None]:
    """From the run record alone: does the run continue the run it resumes from? Returns the findings and the
    output dir whose checkpoint tracker the data checks must find (None for a fresh run)."""
    if record is None:
        return [], None
    rev, problems, resume_dir = [f"run {record['run']} output dir {record['output_dir']}"], [], None
    if record.get("resumed_from"):
        rev.append(f"resumed from run {record['resumed_from']}")
        prev = state.read_json(state.record_path(record["resumed_from"]))
        if prev is None:
            problems.append(f"the run it resumes from ({record['resumed_from']}) has no record here")
        else:
            rev.append(f"{record['resumed_from']} wrote to {prev['output_dir']}")
            if prev["output_dir"].rstrip("/") != record["output_dir"].rstrip("/"):
                problems.append(f"it writes to {record['output_dir']}, not to {prev['output_dir']} where the "
                                "previous checkpoints are")
        resume_dir = record["output_dir"]
    load = f"--load {record['output_dir']}/checkpoints"
    if record.get("mode") == "direct" and load not in record.get("entrypoint", ""):
        problems.append(f"its entrypoint lacks '{load}': Miles will not load the checkpoints")
    if not record.get("resumed_from"):
        return [finding("resume", "resume", OK, f"run {record['run']} is a fresh run (no --resume-from); "
                        f"to continue it later: --resume-from {record['run']}", rev)], resume_dir
    if problems:
        return [finding("resume", "resume", PROBLEM, "; ".join(problems), rev,
                        f"resubmit with --resume-from {record['resumed_from']} so the run reuses its "
                        "output dir (a new output dir starts from scratch)")], resume_dir
    return [finding("resume", "resume", OK, "the run points at the previous output dir", rev)], resume_dir


def data_findings(cfg: MilesRayConfig, url: str | None, head: str | None, record: dict[str, Any] | None,
                  resume_dir: str | None, timeout: float, progress: Progress,
                  unreached: str | None = None) -> list[dict[str, Any]]:
    """check-data's checks on the head at ``url`` (None: not reached, ``unreached`` says why)."""
    if url is None or head is None:
        return [finding("data", "data", SKIPPED, "no reachable Ray head to run the data checks from",
                        [unreached] if unreached else [], UNREACHED_FIX)]
    recipe = get_recipe(record["recipe"] if record else cfg.recipe, cfg.recipe_file)
    if progress:
        progress(f"running check-data on {head}")
    try:
        rep = check_data(cfg, url, recipe, resume_dir, timeout=timeout, python=payload_python(head))
    except ClusterError as e:
        return [finding("data", "data", SKIPPED, f"the data checks could not run: {e}", [],
                        "check the head with 'miles-ray status'")]
    tracker = [missing_line(n, m) for n in rep["nodes"] for m in n.get("missing", []) if m["what"] == TRACKER_CHECK]
    data = [missing_line(n, m) for n in rep["nodes"] for m in n.get("missing", []) if m["what"] != TRACKER_CHECK]
    if not rep["nodes"]:
        data.append("no alive head or GPU worker node answered")
    findings = []
    ev = [f"{len(rep['nodes'])} node(s) checked by job {rep['job']}"]
    if data:
        findings.append(finding("data", "data", PROBLEM, f"{len(data)} missing or unusable path(s) across the nodes",
                                ev + data, f"prepare the model and data on the volume at {cfg.mount_path} (the "
                                           "layout of the Polyaxon-Miles guide: models/, datasets/, runs/) and mount "
                                           "it at the same path on the head and every worker"))
    else:
        findings.append(finding("data", "data", OK, "every node sees the model, data and shared output storage",
                                ev))
    if resume_dir:
        if tracker:
            findings.append(finding("resume_tracker", "resume", PROBLEM,
                                    f"no checkpoint tracker in {resume_dir}/checkpoints: training restarts from "
                                    "scratch", tracker, "point --resume-from at the run whose output dir holds the "
                                                        "checkpoints, or wait for its first save (every 20 rollouts)"))
        else:
            its = sorted({c.get("iteration") for n in rep["nodes"] for c in n.get("checks", [])
                          if c["what"] == TRACKER_CHECK and c.get("iteration")})
            findings.append(finding("resume_tracker", "resume", OK, f"checkpoint tracker present (iteration "
                                    f"{', '.join(its) or '?'})", [f"{resume_dir}/checkpoints"]))
    return findings


def miles_findings(cfg: MilesRayConfig, url: str | None, head: str | None, record: dict[str, Any] | None,
                   progress: Progress, unreached: str | None = None) -> list[dict[str, Any]]:
    """The Miles commit in the image (read on a GPU worker) against the catalog's and, for a run, the one it was
    submitted with. A drift is a problem (direct mode refuses it), except for a launcher-mode run (a warning)."""
    catalog = miles_version.catalog_commit()
    recorded = (record or {}).get("miles_commit")
    if catalog is None and not recorded:
        return [finding("miles_version", "drift", SKIPPED, "the catalog records no Miles commit (and no run commit to "
                        "compare with): the image's Miles is not checked", [], "")]
    if url is None or head is None:
        return [finding("miles_version", "drift", SKIPPED, "no reachable Ray head to read the Miles commit in the image",
                        [unreached] if unreached else [], UNREACHED_FIX)]
    answer = read_image_commit(cfg, url, payload_python(head), progress)
    image = answer.get("commit")
    ev = [f"the catalog mirrors radixark/miles {catalog or '(no commit recorded)'}",
          f"the image's checkout {cfg.miles_root}: {image or 'unknown'}"
          + (f" (read with {answer['source']} on {answer.get('where')})" if image else
             f" ({answer.get('problem') or 'not readable'})")]
    if record:
        ev.append(f"run {record['run']} ({record.get('mode')}) was submitted with Miles {recorded or 'unknown'}")
    if image is None:
        return [finding("miles_version", "drift", WARNING, f"the Miles commit in the image could not be read at "
                        f"{cfg.miles_root}", ev, "set miles_root to the Miles checkout in the image (a git clone: the "
                        "Miles image has /root/miles); until then direct mode cannot compare it with the catalog")]
    launcher_run = bool(record) and record.get("mode") == "launcher"  # the image's own launcher: exact anyway
    changed = bool(recorded) and not image.startswith(recorded.lower())
    problems = []
    if catalog and image != catalog:
        problems.append(f"the image holds Miles {miles_version.short(image)}, the catalog mirrors "
                        f"{miles_version.short(catalog)}" + ("" if launcher_run else
                                                            ": direct-mode jobs are refused without --allow-miles-drift"))
    if changed:
        problems.append(f"the image's Miles changed since run {record['run']} was submitted "
                        f"({miles_version.short(recorded)} then, {miles_version.short(image)} now)")
    if problems:
        status = PROBLEM if changed or not launcher_run else WARNING
        return [finding("miles_version", "drift", status, "; ".join(problems), ev, miles_version.LAUNCHER_HINT)]
    return [finding("miles_version", "drift", OK, f"the image holds Miles {miles_version.short(image)}"
                    + (", the catalog's" if catalog else ""), ev)]
