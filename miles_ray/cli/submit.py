"""miles-ray submit: run Miles on an existing Ray head with a validated trainer/rollout split."""

from __future__ import annotations

from enum import Enum
from typing import Annotated, Optional

import typer
from rich.markup import escape

from miles_ray.cli.common import (AllowUnpinnedOpt, ConfigOpt, GpuMemoryOpt, GpusOpt, ImageOpt, LayoutOpt,
                                  NoMemoryCheckOpt, NodesOpt, Output, OutputOpt, RayVersionOpt, RecipeFileOpt, RecipeOpt, RolloutGpusOpt, RolloutNodesOpt,
                                  checks_failed, dump, emit, err, job_state_exit, notices, out, progress_display,
                                  warn)
from miles_ray.cli.options import ClusterFlags, cluster_options
from miles_ray.cli.views import read_logs
from miles_ray.core.runs import DryRunView, LauncherExec
from miles_ray.core.errors import MemoryMisfit, PlanError
from miles_ray.core.submission import SubmitRequest, split_extra_args, validate_request
from miles_ray.services.runs.submit import exec_launcher, launcher_command, submit


class DryRun(str, Enum):
    client = "client"
    server = "server"


class Mode(str, Enum):
    direct = "direct"
    launcher = "launcher"


@cluster_options
def submit_cmd(
    run: Annotated[Optional[str], typer.Option("--run", help="run name; re-submitting the same run never starts a second job, and another request under it is refused [default: generated]", show_default=False)] = None,
    recipe: RecipeOpt = None,
    nodes: NodesOpt = None,
    gpus_per_node: GpusOpt = None,
    layout: LayoutOpt = None,
    rollout_nodes: RolloutNodesOpt = None,
    rollout_gpus: RolloutGpusOpt = None,
    mode: Annotated[Mode, typer.Option("--mode", help="direct: submit train.py as the Ray job; launcher: run the upstream launcher against the head (here, or on Kubernetes as a Polyaxon job in the cluster)")] = Mode.direct,
    dry_run: Annotated[Optional[DryRun], typer.Option("--dry-run", help="client: print the job (entrypoint, runtime env, submission id, run record, output dir) and contact nothing; server: also check the head's live topology against the plan. Nothing is recorded or submitted", show_default=False)] = None,
    hold: Annotated[float, typer.Option("--hold", min=0, max=86400, help="with --rehearse: keep the placed actors this many seconds after the checks (see the layout with 'ray status' after eval \"$(miles-ray env)\"); the run FAILS if one of them dies meanwhile (a node lost)")] = 0,
    rehearse: Annotated[bool, typer.Option("--rehearse", help="submit the rehearsal driver instead of Miles: proves the placement on (fake) GPUs")] = False,
    address: Annotated[Optional[str], typer.Option("--address", help="Ray dashboard / Jobs API URL [default: $RAY_ADDRESS, config, or the cluster made by up]", show_default=False)] = None,
    wait_for_nodes: Annotated[bool, typer.Option("--wait-for-nodes/--no-wait-for-nodes", help="wait (up to --timeout) until the GPU workers have joined Ray")] = False,
    timeout: Annotated[float, typer.Option("--timeout", min=1, help="seconds to wait for nodes; the rehearsal's placement timeout")] = 120.0,
    max_restarts: Annotated[Optional[int], typer.Option("--max-restarts", help="supervise the run: after a failure worth retrying (a lost node, pod or head, a collective timeout, an OOM kill) start it again from its last complete checkpoint, up to N times; 0: not supervised. The supervisor lives beside the cluster: closing this terminal changes nothing [default: 3 for --mode direct when the job saves checkpoints]", show_default=False)] = None,
    keep_checkpoints: Annotated[Optional[int], typer.Option("--keep-checkpoints", metavar="N", help="retention: the run's supervisor deletes complete checkpoints beyond the newest N (and the --keep-best one) after each new one; never the newest, one being written, one an attempt loads from, a registered one. Every deletion is an event 'runs outputs' shows [default: keep every checkpoint]", show_default=False)] = None,
    keep_best: Annotated[Optional[str], typer.Option("--keep-best", metavar="METRIC", help="retention: also keep the checkpoint with the best METRIC as logged for it (eval/aime: the highest; min:GROUP/NAME: the lowest, for a loss)", show_default=False)] = None,
    follow: Annotated[Optional[bool], typer.Option("--follow/--no-follow", "-f", help="stream the job's logs until it ends; the exit code tells its state [default: on for --rehearse]", show_default=False)] = None,
    env: Annotated[Optional[list[str]], typer.Option("--env", help="KEY=VALUE for the job (repeatable); no credentials", show_default=False)] = None,
    extra_args: Annotated[Optional[str], typer.Option("--extra-args", help="extra train.py flags, one shell-quoted string", show_default=False)] = None,
    num_rollout: Annotated[Optional[int], typer.Option("--num-rollout", min=1, help="override the recipe's rollout count", show_default=False)] = None,
    resume_from: Annotated[Optional[str], typer.Option("--resume-from", help="RUN or output DIR whose checkpoints to continue (recipe and split must match): the job loads from the checkpoint dir that run saved to (its record's checkpoint_dir)", show_default=False)] = None,
    force: Annotated[bool, typer.Option("--force", help="resume even if the recipe or split differ")] = False,
    check_data: Annotated[Optional[bool], typer.Option("--check-data/--no-check-data", help="verify the shared volume, model dirs, datasets and output dir on every node first [default: on for Kubernetes clusters]", show_default=False)] = None,
    miles_commit: Annotated[Optional[str], typer.Option("--miles-commit", help="the Miles commit in the image: recorded; direct mode reads it from the image and refuses a different one, and uses this one when it cannot be read", show_default=False)] = None,
    allow_miles_drift: Annotated[bool, typer.Option("--allow-miles-drift", help="direct mode: submit even when the Miles in the image is not the commit the catalog mirrors (recorded); --mode launcher is exact whatever the image holds")] = False,
    model_revision: Annotated[Optional[str], typer.Option("--model-revision", help="model revision (recorded)", show_default=False)] = None,
    dataset_revision: Annotated[Optional[str], typer.Option("--dataset-revision", help="dataset revision (recorded)", show_default=False)] = None,
    image: ImageOpt = None,
    ray_version: RayVersionOpt = None,
    allow_unpinned: AllowUnpinnedOpt = None,
    gpu_memory: GpuMemoryOpt = None,
    no_memory_check: NoMemoryCheckOpt = False,
    cluster: ClusterFlags = ClusterFlags(),
    recipe_file: RecipeFileOpt = None,
    config: ConfigOpt = None,
    output: OutputOpt = Output.table,
) -> None:
    """Submit Miles (or a rehearsal) to an existing Ray head with MILES_SCRIPT_EXTERNAL_RAY=1.

    Before anything runs: the split is planned and checked (without --nodes and --gpus-per-node, for the live
    cluster's GPU workers, said in one notice line), and the live cluster (alive GPU nodes, GPUs per node,
    spare CPU) is compared with the plan; what is missing is reported with numbers and the flag that fixes
    it. Direct mode reads the Miles commit in the image (a short job on a GPU worker) and refuses (exit 1) a
    job whose catalog mirrors another Miles, unless --allow-miles-drift; --mode launcher is exact by
    construction; it refuses (exit 2) a cluster without the trainer entry point (miles_root/train.py). Every
    submit writes a run record (image digest, recipe hash, split, revisions, output dir). The job id is
    derived from the run name, so re-submitting a run with the same request returns the existing job; another
    request under that name is refused (exit 2), naming what differs. A head on Kubernetes is
    reached through a port-forward (--context, --kubeconfig, --namespace). With --follow the exit code
    is the job's: 0 succeeded, 3 failed, 6 stopped; -o json/yaml then prints one document with the logs.

    Examples:

    \b
      miles-ray submit --rehearse --nodes 2
      miles-ray submit --nodes 4 --dry-run client -o json   # the exact job, no cluster needed
      miles-ray submit --run q4-try1 --nodes 4 --image radixark/miles@sha256:<64 hex>
      miles-ray submit --run q4-try2 --nodes 4 --resume-from q4-try1
    """
    cfg = cluster.config(config, recipe=recipe, nodes=nodes, gpus_per_node=gpus_per_node, layout=layout,
                         rollout_nodes=rollout_nodes, rollout_gpus=rollout_gpus, image=image, ray_version=ray_version,
                         allow_unpinned=allow_unpinned, recipe_file=recipe_file, gpu_memory=gpu_memory)
    request = SubmitRequest(run=run, mode=mode.value, rehearse=rehearse, env=list(env or []),
                            extra_args=split_extra_args(extra_args), resume_from=resume_from,
                            force=force, miles_commit=miles_commit, model_revision=model_revision,
                            dataset_revision=dataset_revision, num_rollout=num_rollout, timeout=timeout,
                            wait_for_nodes=wait_for_nodes, check_data=check_data, hold=hold,
                            shape_from_cluster=nodes is None and gpus_per_node is None, max_restarts=max_restarts,
                            no_memory_check=no_memory_check, keep_checkpoints=keep_checkpoints, keep_best=keep_best)
    if no_memory_check:
        warn("--no-memory-check: the job is submitted whatever its memory estimate says (kept in the run record)")

    try:
        validate_request(cfg, request)  # bad input fails here, before any progress line
    except PlanError as e:
        # without -N/-G the split is planned again for the live cluster's shape, and on Kubernetes a misfit is told
        # after what the GPU nodes' labels say, by the service
        if not (request.shape_from_cluster or isinstance(e, MemoryMisfit)) or dry_run is DryRun.client:
            raise

    def send(progress=None):
        return submit(cfg, request, address=address, backend=cluster.backend.value, progress=progress,
                      dry_run=dry_run.value if dry_run else None, allow_miles_drift=allow_miles_drift)

    if dry_run is DryRun.client:
        result = send()  # contacts nothing: no progress display
    else:
        with progress_display(f"submitting run {run}" if run else "submitting",
                              timeout=timeout if wait_for_nodes else None) as p:
            result = send(p)
    for w in result.warnings:
        warn(w)
    if isinstance(result, DryRunView):
        emit(result, output, lambda: _dry_run_summary(result))
        checks_failed("the server dry run", len(result.problems))
        return
    if isinstance(result, LauncherExec):
        command = launcher_command(cfg, result)
        err.print(f"run {result.run}: exec {' '.join(command.argv)} (MILES_SCRIPT_EXTERNAL_RAY=1, "
                  f"RAY_ADDRESS={result.address})")
        err.print("[yellow]note:[/] the upstream launcher pkill -9s processes named sglang, miles and redis on this host")
        exec_launcher(command)
        return
    if getattr(result, "miles_notice", None):
        err.print(f"[yellow]note:[/] {escape(result.miles_notice)}")
    notices(result.to_json())

    def summary() -> None:
        supervised = getattr(result, "max_restarts", None)
        out.print(f"run {result.run}: job {result.submission_id} "
                  + (f"supervised (up to {supervised} restart(s)); its supervisor submits it" if supervised else
                     "submitted" if result.created else "already exists (not submitted again)")
                  + f" on {result.address} [{result.status}]\n"
                  + f"output dir {result.output_dir}; follow with 'miles-ray logs {result.run} --follow'")

    if not (follow if follow is not None else rehearse):
        emit(result, output, summary)
        return
    if output is Output.table:
        summary()
    logs, final = read_logs(result.run, True, output, cluster.context, cluster.kubeconfig)
    if output is not Output.table:
        dump({**result.to_json(), "status": final, "logs": logs}, output)
    job_state_exit(result.run, final)


def _dry_run_summary(result: DryRunView) -> None:
    out.print(f"dry run ({result.dry_run}): run {result.run}, job {result.submission_id} on {result.address} "
              "(nothing recorded or submitted)")
    out.print(f"entrypoint: {result.entrypoint}")
    env_vars = (result.runtime_env or {}).get("env_vars") or {}
    out.print("runtime env: " + ", ".join(f"{k}={v}" for k, v in sorted(env_vars.items())))
    out.print(f"output dir {result.output_dir}")
    for problem in result.problems:
        err.print(f"[red]problem:[/] {escape(problem)}")
