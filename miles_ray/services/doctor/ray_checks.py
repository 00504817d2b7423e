"""Doctor's Ray-side checks, on a head reached through :func:`miles_ray.adapters.ray_head.open_head` (the
local cluster, an address, or a KubeRay head through a port-forward): the Ray version, the local nodes, and a
run's data and checkpoints (check-data's probe; resume: the run record and the checkpoint tracker), and the Miles
commit in the image against the catalog's (the probe ``submit`` runs in direct mode)."""

from __future__ import annotations

from typing import Any

from miles_ray.adapters import ray_jobs, state
from miles_ray.core import miles_version
from miles_ray.core.config import MilesRayConfig
from miles_ray.core.errors import ClusterError
from miles_ray.core.probes import TRACKER_CHECK, missing_line
from miles_ray.core.recipes import get_recipe
from miles_ray.core.records import as_record
from miles_ray.core.runs import ResumeTarget, run_checkpoints
from miles_ray.services.check_data import check_data
from miles_ray.services.doctor.findings import OK, PROBLEM, SKIPPED, WARNING, Finding, finding
from miles_ray.services.miles_version import read_image_commit
from miles_ray.services.probes import payload_python
from miles_ray.core.progress import Progress

UNREACHED_FIX = ("'miles-ray status' shows the head; for a head elsewhere pass --address http://HEAD:8265 or "
                 "k8s://NAMESPACE/RAYCLUSTER, or run 'miles-ray check-data' there")


def check_ray_version(url: str, head: str, cfg: MilesRayConfig, expected: str | None) -> Finding:
    live = ray_jobs.ray_version(url)
    want = expected or cfg.ray_version
    ev = [f"head {head} runs Ray {live or 'unknown'}", f"expected {want or '(not configured)'}"]
    if live and want and live != want:
        return finding("ray_version", "drift", PROBLEM, f"the head runs Ray {live}, expected {want}", ev,
                       "head, workers and submitter must run one Ray version: fix --ray-version or the image")
    return finding("ray_version", "drift", OK, f"Ray {live or 'unknown'} on the head", ev)


def check_local_nodes(st: dict) -> Finding:
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


def resume_findings(record: dict[str, Any] | None) -> tuple[list[Finding], ResumeTarget | None]:
    """From the run records alone: where the run saves and loads checkpoints (its record: the --save / --load of
    its job) and, for a resumed run, whether it loads from where the run it resumes from saved. Returns the findings
    and what the data checks must find (the checkpoint tracker a resumed run loads; None for a fresh run)."""
    if record is None:
        return [], None
    rec = as_record(record)
    run, ck = rec.run, run_checkpoints(record)
    rev = [f"run {run} output dir {rec.output_dir}",
           f"saves checkpoints to {ck.save or '(nowhere known)'}, loads from {ck.load or '(no --load)'}: {ck.note}"]
    prev_name = rec.resumed_from
    if not prev_name:
        if not ck.save:
            return [finding("resume", "resume", WARNING, f"run {run} saves no checkpoints miles-ray knows of: it "
                            "cannot be continued with --resume-from", rev,
                            "give the job a checkpoint dir (--extra-args '--save DIR --save-interval N') to be able "
                            "to resume it")], None
        return [finding("resume", "resume", OK, f"run {run} is a fresh run (no --resume-from) saving checkpoints to "
                        f"{ck.save}; to continue it later: --resume-from {run}", rev)], None
    rev.append(f"resumed from run {prev_name}")
    problems: list[str] = []
    target = ResumeTarget(rec.output_dir, ck.load, prev_name) if ck.load else None
    prev = state.read_json(state.record_path(prev_name))
    if prev is None:
        problems.append(f"the run it resumes from ({prev_name}) has no record here")
    else:
        pck = run_checkpoints(prev)
        rev += [f"{prev_name} wrote to {as_record(prev).output_dir}",
                f"{prev_name} saved checkpoints to {pck.save or '(nowhere known)'}: {pck.note}"]
        if not pck.save:
            problems.append(f"{prev_name} saves no checkpoints miles-ray knows of ({pck.note})")
        else:
            target = ResumeTarget(rec.output_dir, pck.save, prev_name)
            if (ck.load or "").rstrip("/") != pck.save.rstrip("/"):
                problems.append(f"it loads from {ck.load or '(no --load)'}, not from {pck.save} where {prev_name} "
                                "saved its checkpoints: Miles will not continue them")
    if problems:
        return [finding("resume", "resume", PROBLEM, "; ".join(problems), rev,
                        f"resubmit with --resume-from {prev_name} in direct mode: it passes --load with the "
                        "checkpoint dir that run saved to")], target
    return [finding("resume", "resume", OK, f"the run loads the checkpoints {prev_name} saved "
                    f"({target.checkpoint_dir if target else '?'})", rev)], target


def data_findings(cfg: MilesRayConfig, url: str | None, head: str | None, record: dict[str, Any] | None,
                  resume: ResumeTarget | None, timeout: float, progress: Progress,
                  unreached: str | None = None) -> list[Finding]:
    """check-data's checks on the head at ``url`` (None: not reached, ``unreached`` says why)."""
    if url is None or head is None:
        return [finding("data", "data", SKIPPED, "no reachable Ray head to run the data checks from",
                        [unreached] if unreached else [], UNREACHED_FIX)]
    recipe = get_recipe(as_record(record).recipe if record else cfg.recipe, cfg.recipe_file)
    if progress:
        progress(f"running check-data on {head}")
    try:
        rep = check_data(cfg, url, recipe, resume, timeout=timeout, python=payload_python(head))
    except ClusterError as e:
        return [finding("data", "data", SKIPPED, f"the data checks could not run: {e}", [],
                        "check the head with 'miles-ray status'")]
    tracker = [missing_line(n.to_json(), m.to_json()) for n in rep.nodes for m in n.missing if m.what == TRACKER_CHECK]
    data = [missing_line(n.to_json(), m.to_json()) for n in rep.nodes for m in n.missing if m.what != TRACKER_CHECK]
    if not rep.nodes:
        data.append("no alive head or GPU worker node answered")
    findings = []
    ev = [f"{len(rep.nodes)} node(s) checked by job {rep.job}"]
    if data:
        findings.append(finding("data", "data", PROBLEM, f"{len(data)} missing or unusable path(s) across the nodes",
                                ev + data, f"prepare the model and data on the volume at {cfg.mount_path} (the "
                                           "layout of the Polyaxon-Miles guide: models/, datasets/, runs/) and mount "
                                           "it at the same path on the head and every worker"))
    else:
        findings.append(finding("data", "data", OK, "every node sees the model, data and shared output storage",
                                ev))
    if resume:
        if tracker:
            findings.append(finding("resume_tracker", "resume", PROBLEM,
                                    f"no checkpoint tracker in {resume.checkpoint_dir}: training restarts from "
                                    "scratch", tracker, "point --resume-from at the run that saved the "
                                                        "checkpoints, or wait for its first save (its --save-interval)"))
        else:
            its = sorted({c.iteration for n in rep.nodes for c in n.checks if c.what == TRACKER_CHECK and c.iteration})
            # Miles' numbering: checkpoint N holds rollout N trained; the job that loads it starts at rollout N + 1
            at = f"; Miles resumes at rollout {int(its[0]) + 1}" if len(its) == 1 and its[0].isdigit() else ""
            findings.append(finding("resume_tracker", "resume", OK, f"checkpoint tracker present (iteration "
                                    f"{', '.join(its) or '?'}{at})", [resume.checkpoint_dir]))
    return findings


def miles_findings(cfg: MilesRayConfig, url: str | None, head: str | None, record: dict[str, Any] | None,
                   progress: Progress, unreached: str | None = None) -> list[Finding]:
    """The Miles commit in the image (read on a GPU worker) against the catalog's and, for a run, the one it was
    submitted with. A drift is a problem (direct mode refuses it), except for a launcher-mode run (a warning)."""
    catalog = miles_version.catalog_commit()
    rec = as_record(record) if record else None
    recorded = rec.miles_commit if rec is not None else None
    if catalog is None and not recorded:
        return [finding("miles_version", "drift", SKIPPED, "the catalog records no Miles commit (and no run commit to "
                        "compare with): the image's Miles is not checked", [], "")]
    if url is None or head is None:
        return [finding("miles_version", "drift", SKIPPED, "no reachable Ray head to read the Miles commit in the image",
                        [unreached] if unreached else [], UNREACHED_FIX)]
    answer = read_image_commit(cfg, url, payload_python(head), progress)
    image = answer.commit
    ev = [f"the catalog mirrors radixark/miles {catalog or '(no commit recorded)'}",
          f"the image's checkout {cfg.miles_root}: {image or 'unknown'}"
          + (f" (read with {answer.source} on {answer.where})" if image else
             f" ({answer.problem or 'not readable'})")]
    if rec is not None:
        ev.append(f"run {rec.run} ({rec.mode}) was submitted with Miles {recorded or 'unknown'}")
    if image is None:
        return [finding("miles_version", "drift", WARNING, f"the Miles commit in the image could not be read at "
                        f"{cfg.miles_root}", ev, "set miles_root to the Miles checkout in the image (a git clone: the "
                        "Miles image has /root/miles); until then direct mode cannot compare it with the catalog")]
    launcher_run = rec is not None and rec.mode == "launcher"  # the image's own launcher: exact anyway
    changed = bool(recorded) and not image.startswith(recorded.lower())
    problems = []
    if catalog and image != catalog:
        problems.append(f"the image holds Miles {miles_version.short(image)}, the catalog mirrors "
                        f"{miles_version.short(catalog)}" + ("" if launcher_run else
                                                            ": direct-mode jobs are refused without --allow-miles-drift"))
    if changed:
        problems.append(f"the image's Miles changed since run {rec.run if rec else '?'} was submitted "
                        f"({miles_version.short(recorded)} then, {miles_version.short(image)} now)")
    if problems:
        status = PROBLEM if changed or not launcher_run else WARNING
        return [finding("miles_version", "drift", status, "; ".join(problems), ev, miles_version.LAUNCHER_HINT)]
    return [finding("miles_version", "drift", OK, f"the image holds Miles {miles_version.short(image)}"
                    + (", the catalog's" if catalog else ""), ev)]
