"""miles-ray render: the Polyaxon operation and/or KubeRay RayCluster, validated, to stdout or files."""

from __future__ import annotations

import json
import os
import sys
import tempfile
from enum import Enum
from pathlib import Path
from typing import Annotated, Any, Optional

import typer

from miles_ray.cli.common import (AllowUnpinnedOpt, ConfigOpt, GpusOpt, ImageOpt, LayoutOpt, NameOpt, NamespaceOpt,
                                  NodesOpt, QueueOpt, RayAuthOpt, RayVersionOpt, RecipeFileOpt, RecipeOpt,
                                  RolloutGpusOpt, RolloutNodesOpt, SchedulerOpt, config_flags, err, warn)
from miles_ray.cli.plan import require_feasible, resolve_plan
from miles_ray.core.errors import ConfigError
from miles_ray.adapters.crd_schema import validate_raycluster
from miles_ray.adapters.polyaxon_spec import to_custom_resource, validate_operation
from miles_ray.core.builders import NO_AUTH_WARNING, build_operation, build_raycluster
from miles_ray.core.config import load_config
from miles_ray.core.images import check_image
from miles_ray.core.queues import apply_to_operation, apply_to_raycluster
from miles_ray.core.recipes import get_recipe
from miles_ray.core.single_node import build_single_node


class Format(str, Enum):
    polyaxon = "polyaxon"
    polyaxon_cr = "polyaxon-cr"
    kuberay = "kuberay"
    all = "all"


class DocOutput(str, Enum):
    yaml = "yaml"
    json = "json"


def build_documents(cfg, formats: set[str]) -> tuple[dict[str, dict[str, Any]], list[str], Any]:
    """Validate config, plan and image, then build and validate each requested document."""
    if not cfg.image:
        raise ConfigError("no image given", hint="pass --image repo[:tag]@sha256:<64 hex> or set 'image' in miles-ray.yaml")
    image, warnings = check_image(cfg.image, cfg.allow_unpinned)
    if not cfg.ray_version:
        raise ConfigError(
            "no Ray version given",
            hint="pass --ray-version with the version installed in the image "
                 "(docker run IMAGE python -c 'import ray; print(ray.__version__)'); it is written to rayVersion",
        )
    _, plan = resolve_plan(cfg)
    require_feasible(plan)
    warnings += plan.warnings
    if cfg.ray_auth != "token":
        warnings.append(NO_AUTH_WARNING)
    docs: dict[str, dict[str, Any]] = {}
    if formats & {"polyaxon", "polyaxon-cr"}:
        op = apply_to_operation(build_operation(cfg, plan, str(image), cfg.ray_version), cfg, plan.ray.gpu_workers)
        validate_operation(op)
        if "polyaxon" in formats:
            docs["polyaxon"] = op
        if "polyaxon-cr" in formats:
            connections = [{"name": cfg.connection, "kind": "volume_claim",
                            "schema": {"volumeClaim": cfg.claim, "mountPath": cfg.mount_path}}]
            docs["polyaxon-cr"] = to_custom_resource(op, namespace=cfg.namespace, run_uuid="0" * 32,
                                                     run_name=cfg.name, project=cfg.polyaxon_project,
                                                     owner=cfg.polyaxon_owner, connections=connections,
                                                     polyaxon_host=cfg.polyaxon_host or "http://localhost:8000")
    if "kuberay" in formats:
        rc = apply_to_raycluster(build_raycluster(cfg, plan, str(image), cfg.ray_version), cfg)
        validate_raycluster(rc)
        docs["kuberay"] = rc
    return docs, warnings, plan


def build_single_node_document(cfg) -> tuple[dict[str, Any], list[str]]:
    """The single-node Polyaxon job to start with (the upstream launcher in one pod), validated by Polyaxon."""
    if not cfg.image:
        raise ConfigError("no image given", hint="pass --image repo[:tag]@sha256:<64 hex> or set 'image' in miles-ray.yaml")
    image, warnings = check_image(cfg.image, cfg.allow_unpinned)
    op, more = build_single_node(cfg, get_recipe(cfg.recipe, cfg.recipe_file), str(image))
    validate_operation(op)
    return op, warnings + more


FILE_NAMES = {"polyaxon": "{name}.polyaxon.yaml", "polyaxon-cr": "{name}.polyaxon-cr.yaml",
              "kuberay": "{name}.raycluster.yaml", "single-node": "{name}.single-node.polyaxon.yaml"}


def write_documents(docs: dict[str, dict[str, Any]], name: str, out_dir: Path) -> list[Path]:
    """Write all documents or none: each goes to a temp file first, then is renamed into place."""
    import yaml

    if out_dir.exists() and not out_dir.is_dir():
        raise ConfigError(f"--out {out_dir} exists and is not a directory")
    created_dir = not out_dir.exists()
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise ConfigError(f"cannot create --out {out_dir}: {e.strerror}") from None
    staged: list[tuple[str, Path]] = []
    try:
        for kind, doc in docs.items():
            fd, tmp = tempfile.mkstemp(prefix=".render-", dir=out_dir)
            with os.fdopen(fd, "w") as fh:
                yaml.safe_dump(doc, fh, sort_keys=False)
            staged.append((tmp, out_dir / FILE_NAMES[kind].format(name=name)))
    except OSError as e:
        for tmp, _ in staged:
            Path(tmp).unlink(missing_ok=True)
        if created_dir:
            out_dir.rmdir()
        raise ConfigError(f"cannot write to {out_dir}: {e.strerror}") from None
    for tmp, final in staged:
        os.replace(tmp, final)
    return [final for _, final in staged]


def render_cmd(
    format: Annotated[Format, typer.Option("--format", "-F", help="what to render")] = Format.polyaxon,
    out: Annotated[Optional[Path], typer.Option("--out", help="write YAML files into this directory instead of stdout", show_default=False)] = None,
    name: NameOpt = None,
    namespace: NamespaceOpt = None,
    recipe: RecipeOpt = None,
    nodes: NodesOpt = None,
    gpus_per_node: GpusOpt = None,
    layout: LayoutOpt = None,
    rollout_nodes: RolloutNodesOpt = None,
    rollout_gpus: RolloutGpusOpt = None,
    image: ImageOpt = None,
    ray_version: RayVersionOpt = None,
    allow_unpinned: AllowUnpinnedOpt = None,
    queue: QueueOpt = None,
    scheduler: SchedulerOpt = None,
    ray_auth: RayAuthOpt = None,
    recipe_file: RecipeFileOpt = None,
    config: ConfigOpt = None,
    single_node: Annotated[bool, typer.Option("--single-node", help="start with one single-node job: one Polyaxon job running the upstream Miles launcher in one pod (no KubeRay, no --ray-version)")] = False,
    output: Annotated[DocOutput, typer.Option("--output", "-o", help="the documents on stdout as YAML (one per '---') or JSON (one object, or a list); with --out, json lists the files written")] = DocOutput.yaml,
) -> None:
    """Render what 'up' would create, validated, without touching a cluster.

    Head and workers come from one container spec: same image, env and mounts. -F (--format) is one of:

    \b
      polyaxon     a Polyaxon operation (run.kind raycluster), checked with Polyaxon's own schema
      polyaxon-cr  the Kubernetes custom resource Polyaxon's agent would create from it (its converter)
      kuberay      a plain KubeRay ray.io/v1 RayCluster, checked against the RayCluster CRD schema
      all          the three

    Example:

    \b
      miles-ray render -F all --nodes 4 --image radixark/miles:latest@sha256:<64 hex> --ray-version 2.60.0 --out manifests/
    """
    import yaml

    cfg = load_config(config_flags(name=name, namespace=namespace, recipe=recipe, nodes=nodes,
                                   gpus_per_node=gpus_per_node, layout=layout, rollout_nodes=rollout_nodes,
                                   rollout_gpus=rollout_gpus, image=image, ray_version=ray_version,
                                   allow_unpinned=allow_unpinned, recipe_file=recipe_file,
                                   queue=queue, scheduler=scheduler, ray_auth=ray_auth), config)
    if single_node:
        if format is not Format.polyaxon:
            raise ConfigError(f"--single-node renders a Polyaxon job only, not -F {format.value}",
                              hint="drop -F (or use -F polyaxon) with --single-node")
        op, warnings = build_single_node_document(cfg)
        docs = {"single-node": op}
    else:
        formats = {"polyaxon", "polyaxon-cr", "kuberay"} if format is Format.all else {format.value}
        docs, warnings, _ = build_documents(cfg, formats)
    for w in warnings:
        warn(w)
    if out is None:
        ordered = [docs[k] for k in FILE_NAMES if k in docs]
        if output is DocOutput.json:
            sys.stdout.write(json.dumps(ordered[0] if len(ordered) == 1 else ordered, indent=2) + "\n")
        else:
            sys.stdout.write(yaml.safe_dump_all(ordered, sort_keys=False))
        return
    written = write_documents(docs, cfg.name, out)
    for path in written:
        err.print(f"wrote {path}")
    if output is DocOutput.json:
        sys.stdout.write(json.dumps({"written": [str(p) for p in written]}, indent=2) + "\n")
