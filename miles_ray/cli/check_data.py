"""miles-ray check-data: are the model, data and checkpoints where the launcher looks, on EVERY node?"""

from __future__ import annotations

from typing import Annotated, Optional

import typer

from miles_ray.cli.common import (Col, ConfigOpt, Output, OutputOpt, RecipeFileOpt, RecipeOpt, checks_failed, emit, fit_table,
                                  out, print_table, progress_display)
from miles_ray.cli.options import ClusterFlags, cluster_options
from miles_ray.core.probes import check_data_bound
from miles_ray.core.recipes import get_recipe
from miles_ray.services.check_data import CheckDataReport, check_data_at, resume_of

AddressOpt = Annotated[Optional[str], typer.Option("--address", help="the Ray head: dashboard / Jobs API URL, k8s://NAMESPACE/RAYCLUSTER (a port-forward) or local://NAME (default: $RAY_ADDRESS, ray_address, or the cluster made by 'up')", show_default=False)]
ResumeOpt = Annotated[Optional[str], typer.Option("--resume-from", help="RUN or output DIR to resume: also require latest_checkpointed_iteration.txt in the checkpoint dir it saved to (its recorded --save)", show_default=False)]


def report_table(rep: CheckDataReport) -> None:
    rows = []
    for n in rep.nodes:
        mount = ("mount point" if n.mount_is_mountpoint else "directory") if n.mount_exists else "missing"
        same = {True: "yes", False: "NO"}.get(n.same_storage, "-")
        rows.append([n.node_ip or "?", n.role, mount, same, str(len(n.missing)) or "0"])
    print_table(fit_table([Col("node", key=True), Col("role", keep=2), Col("mount", keep=3),
                           Col("same storage", keep=4), Col("problems", keep=5)], rows,
                          title=f"check-data {rep.recipe} on {rep.address}", title_justify="left"))
    for line in rep.missing:
        out.print(f"[red]✗[/] {line}")
    if rep.ok:
        out.print(f"[green]✓[/] every node sees the model, data and output storage under {rep.mount_path}"
                  + (f" and the checkpoint tracker in {rep.resume_checkpoint_dir}" if rep.resume_checkpoint_dir else ""))


@cluster_options
def check_data_cmd(
    address: AddressOpt = None,
    cluster: ClusterFlags = ClusterFlags(),
    recipe: RecipeOpt = None,
    recipe_file: RecipeFileOpt = None,
    resume_from: ResumeOpt = None,
    timeout: Annotated[float, typer.Option("--timeout", min=1, help="bound on each per-node round of checks (s)")] = 60.0,
    config: ConfigOpt = None,
    output: OutputOpt = Output.table,
) -> None:
    """Check on the head and EVERY GPU worker that the launcher's paths exist, are readable, and that the
    output storage is writable and shared (a token written on one node is read on the others).

    Paths: <mount>/<models_dir>/<recipe HF dir> and <..._torch_dist>, the training and eval data, the output
    dir's parent; with --resume-from also latest_checkpointed_iteration.txt in the checkpoint dir that run saved
    to (the --save of its job, from its run record; a record from before miles-ray kept it: <output dir>/checkpoints;
    an output DIR no record names: where the recipe's job saves for it). A run that saves no checkpoints is refused.
    Every missing path on every node is reported at once. Exit 0 all present, 4 anything missing.

    Example:

      miles-ray check-data --address http://127.0.0.1:8265 --recipe Qwen3-4B --resume-from q4-a
    """
    cfg = cluster.config(config, recipe=recipe, recipe_file=recipe_file)
    rec = get_recipe(cfg.recipe, cfg.recipe_file)
    resume = resume_of(cfg, rec, resume_from)  # bad input before anything is looked up
    with progress_display("checking data", timeout=check_data_bound(timeout)) as p:
        rep = check_data_at(cfg, rec, address=address, backend=cluster.backend.value, resume=resume,
                            timeout=timeout, progress=p)
    emit(rep, output, lambda: report_table(rep))
    if not rep.ok:
        checks_failed("check-data", max(1, len(rep.missing)))
