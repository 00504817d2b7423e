"""miles-ray resume: bring a parked cluster back."""

from __future__ import annotations

from typing import Annotated

import typer

from miles_ray.cli.common import (Backend, BackendOption, ConfigOpt, ContextOpt, KubeconfigOpt, NameOpt, NamespaceOpt,
                                  Output, OutputOpt, TimeoutOpt, config_flags, emit, err, progress_display)
from miles_ray.cli.views import kube_status_table, nodes_table
from miles_ray.core.config import load_config
from miles_ray.services import lifecycle


def resume_cmd(
    name: NameOpt = None,
    backend: BackendOption = Backend.auto,
    namespace: NamespaceOpt = None,
    context: ContextOpt = None,
    kubeconfig: KubeconfigOpt = None,
    wait: Annotated[bool, typer.Option("--wait/--no-wait", help="kubernetes: wait until the workers are back")] = True,
    ray_check: Annotated[bool, typer.Option("--ray-check/--no-ray-check", help="kubernetes: also wait until every GPU worker has joined Ray (as 'up')")] = True,
    timeout: TimeoutOpt = 600.0,
    config: ConfigOpt = None,
    output: OutputOpt = Output.table,
) -> None:
    """Resume a parked cluster and wait until every GPU worker has rejoined Ray.

    KubeRay: clears spec.suspend. Polyaxon: creates the run again from the operation kept by 'park'. Local
    backend: starts the same number of nodes again. A cluster that is not parked is only waited for.
    """
    cfg = load_config(config_flags(name=name, namespace=namespace, kube_context=context, kubeconfig=kubeconfig), config)
    chosen = lifecycle.pick_backend(backend.value, cfg)
    with progress_display(f"resuming cluster {cfg.name} ({chosen})",
                          timeout=timeout if chosen == "local" or wait else None) as p:
        result = lifecycle.resume(cfg, chosen, wait=wait, ray_check=ray_check, timeout=timeout, progress=p)

    def table() -> None:
        if chosen == "local":
            nodes_table(result)
        elif "status" in result:
            kube_status_table(result["status"])
        err.print(f"cluster {cfg.name!r} " + ("resumed" if result.get("resumed") else "was not parked"))

    emit(result, output, table)
