"""miles-ray check-data: are the model, data and checkpoints where the launcher looks, on EVERY node?"""

from __future__ import annotations

from typing import Annotated, Optional

import typer
from rich.table import Table

from miles_ray.cli.common import (BackendOption, Backend, ConfigOpt, NameOpt, Output, OutputOpt, RecipeFileOpt,
                                  RecipeOpt, checks_failed, config_flags, emit, out, progress_display)
from miles_ray.core.errors import ConfigError

AddressOpt = Annotated[Optional[str], typer.Option("--address", help="Ray dashboard / Jobs API URL (default: $RAY_ADDRESS, ray_address, or the cluster made by 'up')", show_default=False)]
ResumeOpt = Annotated[Optional[str], typer.Option("--resume-from", help="RUN or output DIR to resume: also require <dir>/checkpoints/latest_checkpointed_iteration.txt", show_default=False)]


def parse_test_mounts(items: list[str]) -> dict[str, str]:
    out_: dict[str, str] = {}
    for item in items:
        ip, sep, path = item.partition("=")
        if not sep or not ip or not path.startswith("/"):
            raise ConfigError(f"--test-mount-path-for-node {item!r} is not NODE_IP=/absolute/path")
        out_[ip] = path
    return out_


def python_for(cfg, address: str | None, backend: str) -> str | None:
    """The embedded cluster runs the payload with this interpreter (same machine, same venv)."""
    import os
    import sys

    if address or os.environ.get("RAY_ADDRESS") or cfg.ray_address:
        return None
    from miles_ray.services.clusters import pick_backend

    return sys.executable if pick_backend(backend, cfg) == "local" else None


def report_table(rep: dict) -> None:
    t = Table("node", "role", "mount", "same storage", "problems", title=f"check-data {rep['recipe']} on {rep['address']}",
              title_justify="left")
    for n in rep["nodes"]:
        mount = ("mount point" if n.get("mount_is_mountpoint") else "directory") if n.get("mount_exists") else "missing"
        if n.get("test_fake_mount"):
            mount += f" (test fake: {n['test_fake_mount']})"
        same = {True: "yes", False: "NO"}.get(n.get("same_storage"), "-")
        t.add_row(n["node_ip"] or "?", n["role"], mount, same, str(len(n.get("missing", []))) or "0")
    out.print(t)
    for line in rep["missing"]:
        out.print(f"[red]✗[/] {line}")
    if rep["ok"]:
        out.print(f"[green]✓[/] every node sees the model, data and output storage under {rep['mount_path']}"
                  + (f" and the checkpoint tracker in {rep['resume_output_dir']}" if rep.get("resume_output_dir") else ""))


def check_data_cmd(
    address: AddressOpt = None,
    backend: BackendOption = Backend.auto,
    name: NameOpt = None,
    recipe: RecipeOpt = None,
    recipe_file: RecipeFileOpt = None,
    resume_from: ResumeOpt = None,
    timeout: Annotated[float, typer.Option("--timeout", min=1, help="bound on each per-node round of checks (s)")] = 60.0,
    test_mount_path_for_node: Annotated[Optional[list[str]], typer.Option("--test-mount-path-for-node", hidden=True, help="TEST FAKE: NODE_IP=DIR makes that node read mount_path from DIR")] = None,
    config: ConfigOpt = None,
    output: OutputOpt = Output.table,
) -> None:
    """Check on the head and EVERY GPU worker that the launcher's paths exist, are readable, and that the
    output storage is writable and shared (a token written on one node is read on the others).

    Paths: <mount>/<models_dir>/<recipe HF dir> and <..._torch_dist>, the training and eval data, the output
    dir's parent; with --resume-from also <output dir>/checkpoints/latest_checkpointed_iteration.txt.
    Every missing path on every node is reported at once. Exit 0 all present, 4 anything missing.

    Example:

      miles-ray check-data --address http://127.0.0.1:8265 --recipe Qwen3-4B --resume-from q4-a
    """
    from miles_ray.core.config import load_config
    from miles_ray.core.recipes import get_recipe
    from miles_ray.services.datacheck import check_data, resume_dir
    from miles_ray.services.jobs import resolve_address

    cfg = load_config(config_flags(name=name, recipe=recipe, recipe_file=recipe_file), config)
    rec = get_recipe(cfg.recipe, cfg.recipe_file)
    fakes = parse_test_mounts(test_mount_path_for_node or [])
    python = python_for(cfg, address, backend.value)
    _, url = resolve_address(cfg, address, backend.value)
    with progress_display("checking data") as p:
        rep = check_data(cfg, url, rec, resume_dir(cfg, resume_from), timeout=timeout, python=python,
                         test_mount_paths=fakes or None, progress=p)
    emit(rep, output, lambda: report_table(rep))
    if not rep["ok"]:
        checks_failed("check-data", max(1, len(rep["missing"])))
