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

from miles_ray.cli.common import (AllowUnpinnedOpt, ConfigOpt, GcsFtOpt, GcsFtPasswordOpt, GpusOpt, ImageOpt,
                                  LayoutOpt, NameOpt, NamespaceOpt, NoMemoryCheckOpt, NodesOpt, QueueOpt, RayAuthOpt, RayVersionOpt,
                                  RecipeFileOpt, RecipeOpt, RolloutGpusOpt, RolloutNodesOpt, SchedulerOpt, config_flags,
                                  err, warn)
from miles_ray.core.builders import NO_AUTH_WARNING
from miles_ray.core.config import MilesRayConfig, load_config
from miles_ray.core.errors import ConfigError
from miles_ray.core.prepare import ClusterDocuments, Document, check_pods_fit
from miles_ray.services.documents import prepare_documents


class Format(str, Enum):
    polyaxon = "polyaxon"
    polyaxon_cr = "polyaxon-cr"
    kuberay = "kuberay"
    all = "all"


# what each -F renders
FORMATS: dict[Format, tuple[Document, ...]] = {
    Format.polyaxon: (Document.operation,),
    Format.polyaxon_cr: (Document.operation_cr,),
    Format.kuberay: (Document.raycluster,),
    Format.all: (Document.operation, Document.operation_cr, Document.raycluster),
}


class DocOutput(str, Enum):
    yaml = "yaml"
    json = "json"


def render_warnings(cfg: MilesRayConfig, docs: ClusterDocuments) -> list[str]:
    """What render warns about: the image and builders (as up does), and for a cluster also the plan and, without
    Ray auth, that (up says the latter itself)."""
    if docs.plan is None:  # the single-node job: not planned, its launcher starts Ray in the pod
        return list(docs.warnings)
    return docs.warnings + docs.plan.warnings + ([NO_AUTH_WARNING] if cfg.ray_auth != "token" else [])


FILE_NAMES = {Document.operation: "{name}.polyaxon.yaml", Document.operation_cr: "{name}.polyaxon-cr.yaml",
              Document.raycluster: "{name}.raycluster.yaml", Document.single_node: "{name}.single-node.polyaxon.yaml"}


def write_documents(docs: dict[Document, dict[str, Any]], name: str, out_dir: Path) -> list[Path]:
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
    gcs_ft: GcsFtOpt = None,
    gcs_ft_password_secret: GcsFtPasswordOpt = None,
    recipe_file: RecipeFileOpt = None,
    no_memory_check: NoMemoryCheckOpt = False,
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
                                   queue=queue, scheduler=scheduler, ray_auth=ray_auth,
                                   gcs_ft=gcs_ft, gcs_ft_password_secret=gcs_ft_password_secret), config)
    kinds = FORMATS[format]
    if single_node:
        if kinds != (Document.operation,):  # the single-node job is rendered in place of the operation
            raise ConfigError(f"--single-node renders a Polyaxon job only, not -F {format.value}",
                              hint="drop -F (or use -F polyaxon) with --single-node")
        kinds = (Document.single_node,)
    elif cfg.image or cfg.ray_version:  # (neither: prepare says both are missing, in one line)
        for notice in check_pods_fit(cfg, no_memory_check):  # a named recipe's host memory vs memory_per_node
            warn(notice)
    prepared = prepare_documents(cfg, kinds)
    docs = prepared.documents(kinds)
    for w in render_warnings(cfg, prepared):
        warn(w)
    if out is None:
        ordered = list(docs.values())
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
