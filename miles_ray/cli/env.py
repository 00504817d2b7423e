"""miles-ray env: the shell lines that let Ray's own tools reach a cluster."""

from __future__ import annotations

import dataclasses
import shlex
import threading
from enum import Enum
from typing import Annotated, Optional

import typer

from miles_ray.cli.common import ConfigOpt, Output, OutputOpt, dump, err
from miles_ray.cli.options import ClusterFlags, cluster_options
from miles_ray.core.errors import ConfigError
from miles_ray.services import clusters
from miles_ray.services.ray_env import RayEnv, forwarded_env, kube_env, local_env


class Shell(str, Enum):
    sh = "sh"
    fish = "fish"


def shell_lines(env: RayEnv, shell: Shell) -> str:
    if shell is Shell.fish:
        return "\n".join(f"set -gx {k} {shlex.quote(v)};" for k, v in env.variables.items())
    return "\n".join(f"export {k}={shlex.quote(v)}" for k, v in env.variables.items())


def _print(env: RayEnv, shell: Shell, output: Output) -> None:
    if output is not Output.table:
        dump(env, output)
        return
    print(shell_lines(env, shell), flush=True)
    if env.port_forward:
        print(f"# reach the head first, in another shell: {env.port_forward}", flush=True)
        print(f"#   (or without kubectl: miles-ray env {env.name} --port-forward)", flush=True)
    eval_line = "miles-ray env --shell fish | source" if shell is Shell.fish else 'eval "$(miles-ray env)"'
    print(f"# {eval_line}; then: ray job list; ray status", flush=True)


@cluster_options
def env_cmd(
    cluster_name: Annotated[Optional[str], typer.Argument(metavar="NAME", help="the cluster [default: the current cluster, as --name]", show_default=False)] = None,
    cluster: ClusterFlags = ClusterFlags(),
    shell: Annotated[Shell, typer.Option("--shell", help="the shell the lines are for")] = Shell.sh,
    port_forward: Annotated[bool, typer.Option("--port-forward", help="kubernetes: forward the head's dashboard and GCS ports from this machine and keep them until Ctrl-C (prints the lines to eval in another shell)")] = False,
    config: ConfigOpt = None,
    output: OutputOpt = Output.table,
) -> None:
    """Print the shell lines that let Ray's own tools (ray job list, ray status) reach a cluster.

    RAY_API_SERVER_ADDRESS is the dashboard / Jobs API URL (Ray's job CLI and miles-ray read it first),
    RAY_ADDRESS the GCS address ('ray status'), and on a cluster with token auth RAY_AUTH_MODE=token with
    RAY_AUTH_TOKEN_PATH pointing at a 0600 file holding the token (the token itself is never printed). On
    Kubernetes the token is copied from the cluster's Secret to a 0600 file in miles-ray's state dir, and
    the head must be reached through a port-forward: the printed kubectl line, or --port-forward.

    \b
      eval "$(miles-ray env)"; ray job list; ray status
      miles-ray env big --port-forward      # Kubernetes, no kubectl: keep it open, eval its lines elsewhere
    """
    if cluster_name and cluster.name and cluster_name != cluster.name:
        raise ConfigError(f"NAME {cluster_name!r} and --name {cluster.name!r} differ", hint="give the cluster once")
    cluster = dataclasses.replace(cluster, name=cluster_name or cluster.name)
    cfg = cluster.config(config)
    chosen = clusters.backend_for(cfg, cluster.backend.value)
    if chosen.on_this_machine:
        if port_forward:
            raise ConfigError("--port-forward applies to a cluster on Kubernetes",
                              hint=f"cluster {cfg.name!r} runs on this machine: its lines need no forward")
        _print(local_env(cfg), shell, output)
        return
    if not port_forward:
        _print(kube_env(cfg, chosen.name), shell, output)
        return
    with forwarded_env(cfg, chosen.name) as env:
        _print(env, shell, output)
        err.print(f"forwarding to the head of cluster {cfg.name!r}; eval the lines above in another shell; "
                  "Ctrl-C stops", soft_wrap=True)
        try:
            threading.Event().wait()
        except KeyboardInterrupt:
            err.print("port-forward stopped")
