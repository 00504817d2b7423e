"""Options and printing shared by the verbs. Nothing heavy is imported here."""

from __future__ import annotations

import json
import sys
from enum import Enum
from typing import Annotated, Any, Callable, Optional

import typer
from rich.console import Console

# Piped output (CI logs, files) gets a wide page instead of Rich's 80 columns, so tables stay readable.
out = Console(highlight=False, soft_wrap=True, width=None if sys.stdout.isatty() else 200)
err = Console(stderr=True, highlight=False, soft_wrap=True)


class Output(str, Enum):
    table = "table"
    json = "json"
    yaml = "yaml"


class Layout(str, Enum):
    colocated = "colocated"
    disaggregated = "disaggregated"


# -- option types (Annotated so every verb spells them the same way) --------------------------------
ConfigOpt = Annotated[Optional[str], typer.Option("--config", "-c", help="config file (default: ./miles-ray.yaml or $MILES_RAY_CONFIG)", show_default=False)]
OutputOpt = Annotated[Output, typer.Option("--output", "-o", help="table for people, json/yaml for scripts")]
NameOpt = Annotated[Optional[str], typer.Option("--name", help="cluster name (DNS-1035, <= 53 chars)", show_default=False)]
NamespaceOpt = Annotated[Optional[str], typer.Option("--namespace", "-n", help="Kubernetes namespace", show_default=False)]
RecipeOpt = Annotated[Optional[str], typer.Option("--recipe", "-r", help="recipe name, see 'miles-ray recipes' [default: Qwen3-4B]", show_default=False)]
RecipeFileOpt = Annotated[Optional[str], typer.Option("--recipe-file", help="YAML file with extra recipes", show_default=False)]
NodesOpt = Annotated[Optional[int], typer.Option("--nodes", "-N", min=1, max=4096, help="GPU worker nodes [default: 1]", show_default=False)]
GpusOpt = Annotated[Optional[int], typer.Option("--gpus-per-node", "-G", min=1, max=64, help="GPUs per worker node [default: 8]", show_default=False)]
LayoutOpt = Annotated[Optional[Layout], typer.Option("--layout", help="colocated (trainer and rollout share GPUs) or disaggregated [default: the recipe's]", show_default=False)]
RolloutNodesOpt = Annotated[Optional[int], typer.Option("--rollout-nodes", min=0, help="disaggregated: whole nodes for SGLang rollout", show_default=False)]
RolloutGpusOpt = Annotated[Optional[int], typer.Option("--rollout-gpus", min=1, help="disaggregated: rollout GPUs (a partial last node is allowed)", show_default=False)]
ImageOpt = Annotated[Optional[str], typer.Option("--image", help="Miles image pinned by digest: repo[:tag]@sha256:<64 hex>", show_default=False)]
RayVersionOpt = Annotated[Optional[str], typer.Option("--ray-version", help="Ray version inside the image (rayVersion)", show_default=False)]
AllowUnpinnedOpt = Annotated[Optional[bool], typer.Option("--allow-unpinned/--require-pinned", help="accept a tag-only image (warns)", show_default=False)]


def config_flags(**kw: Any) -> dict[str, Any]:
    """Drop unset flags; turn enums into their values."""
    return {k: (v.value if isinstance(v, Enum) else v) for k, v in kw.items() if v is not None}


def dump(data: Any, output: Output) -> None:
    if output is Output.yaml:
        import yaml

        sys.stdout.write(yaml.safe_dump(data, sort_keys=False, default_flow_style=False))
    else:
        sys.stdout.write(json.dumps(data, indent=2, sort_keys=False) + "\n")


def emit(data: Any, output: Output, table: Callable[[], None]) -> None:
    if output is Output.table:
        table()
    else:
        dump(data, output)


def warn(message: str) -> None:
    err.print(f"[yellow]warning:[/] {message}")


class Backend(str, Enum):
    auto = "auto"
    local = "local"
    kubernetes = "kubernetes"


BackendOption = Annotated[Backend, typer.Option("--backend", "-b", help="auto: the local cluster of that name if one runs on this machine, else Kubernetes; local: the embedded Ray cluster; kubernetes: KubeRay/Polyaxon")]
ContextOpt = Annotated[Optional[str], typer.Option("--context", help="kubeconfig context (like kubectl)", show_default=False)]
KubeconfigOpt = Annotated[Optional[str], typer.Option("--kubeconfig", help="kubeconfig file (like kubectl)", show_default=False)]
TimeoutOpt = Annotated[float, typer.Option("--timeout", min=1, help="give up after this many seconds")]
YesOpt = Annotated[bool, typer.Option("--yes", "-y", help="do not ask for confirmation")]


class progress_display:
    """A live spinner on stderr (when it is a terminal) plus one line per step, so waits are never silent."""

    def __init__(self, title: str, quiet: bool = False) -> None:
        self.title = title
        self.quiet = quiet
        self._status = None

    def __enter__(self) -> "progress_display":
        if not self.quiet and err.is_terminal:
            self._status = err.status(self.title)
            self._status.__enter__()
        return self

    def __call__(self, message: str) -> None:
        if self.quiet:
            return
        if self._status is not None:
            self._status.update(f"{self.title}: {message}")
        err.print(f"[dim]·[/] {message}")

    def __exit__(self, *exc: object) -> None:
        if self._status is not None:
            self._status.__exit__(None, None, None)
