"""The option groups every verb that reaches a cluster or a run shares, spelled once (like kubectl's
persistent ConfigFlags): a verb declares one parameter ``cluster: ClusterFlags`` (or ``target: RunFlags``)
and :func:`cluster_options` (:func:`run_options`) puts the group's options in its place, in the same order,
with the same help on every verb.

    @cluster_options
    def down_cmd(cluster: ClusterFlags, yes: YesOpt = False, ...) -> None:
        cfg = cluster.config(config)
"""

from __future__ import annotations

import functools
import inspect
import typing
from dataclasses import dataclass, fields
from typing import Annotated, Any, Callable, Optional

import typer

from miles_ray.cli.common import (Backend, BackendOption, ConfigOpt, ContextOpt, KubeconfigOpt, NamespaceOpt,
                                  RunNamespaceOpt, config_flags)
from miles_ray.core.config import MilesRayConfig, load_config
from miles_ray.core.errors import MilesRayError
from miles_ray.services.known_clusters import CURRENT_FROM, load_with_current, naming_known

# --name of a verb that reaches a cluster: says where the default comes from (the current cluster)
ClusterNameOpt = Annotated[Optional[str], typer.Option(
    "--name", help=f"cluster name (DNS-1035, <= 53 chars) {CURRENT_FROM}", show_default=False)]


@dataclass(frozen=True)
class ClusterFlags:
    """Which cluster a verb means: its name, backend, and how to reach it on Kubernetes."""

    name: str | None = None
    backend: Backend = Backend.auto
    namespace: str | None = None
    context: str | None = None
    kubeconfig: str | None = None

    def config(self, config_file: str | None, **flags: Any) -> MilesRayConfig:
        """The configuration with these flags (and the verb's own ``flags``) over the file's values; where
        nothing names the cluster (no --name, MILES_RAY_NAME or config ``name``), the current cluster
        (:mod:`miles_ray.services.known_clusters`) with its namespace and context."""
        given = config_flags(name=self.name, namespace=self.namespace, kube_context=self.context,
                             kubeconfig=self.kubeconfig, **flags)
        return load_with_current(given, self.backend.value, config_file)


@dataclass(frozen=True)
class RunFlags:
    """How a run verb reaches the run's cluster: its record names the namespace; ``namespace`` only narrows
    which runs are meant (checked against the record, never pointing a run at another cluster)."""

    namespace: str | None = None
    context: str | None = None
    kubeconfig: str | None = None
    config: str | None = None

    def reach(self) -> dict[str, str | None]:
        """How to reach the run's head on Kubernetes, over what its record kept (``kube_context``/``kubeconfig``,
        None: the record's): --context/--kubeconfig, else those of the config file given with -c/--config (read
        and checked as every verb reads it: a bad file is bad input), else None. Without -c nothing is read."""
        context, kubeconfig = self.context, self.kubeconfig
        if self.config is not None:
            cfg = load_config({}, self.config)
            context, kubeconfig = context or cfg.kube_context, kubeconfig or cfg.kubeconfig
        return {"kube_context": context, "kubeconfig": kubeconfig}


_GROUPS: dict[type, dict[str, Any]] = {
    ClusterFlags: {"name": ClusterNameOpt, "backend": BackendOption, "namespace": NamespaceOpt, "context": ContextOpt,
                   "kubeconfig": KubeconfigOpt},
    RunFlags: {"namespace": RunNamespaceOpt, "context": ContextOpt, "kubeconfig": KubeconfigOpt, "config": ConfigOpt},
}


def _with_group(group: type, param: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    options = _GROUPS[group]
    defaults = {f.name: f.default for f in fields(group)}

    def decorate(func: Callable[..., Any]) -> Callable[..., Any]:
        hints = typing.get_type_hints(func, include_extras=True)
        params: list[inspect.Parameter] = []
        for p in inspect.signature(func).parameters.values():
            if p.name == param:
                params += [inspect.Parameter(n, inspect.Parameter.POSITIONAL_OR_KEYWORD, default=defaults[n],
                                             annotation=t) for n, t in options.items()]
            else:
                params.append(p.replace(annotation=hints.get(p.name, p.annotation)))
        if len(params) == len(inspect.signature(func).parameters):
            raise TypeError(f"{func.__name__} has no parameter {param!r} for its {group.__name__}")

        @functools.wraps(func)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            kwargs[param] = group(**{n: kwargs.pop(n) for n in options if n in kwargs})
            if group is not ClusterFlags:
                return func(*args, **kwargs)
            try:
                return func(*args, **kwargs)
            except MilesRayError as e:  # "no cluster named X": say which clusters there are
                raise naming_known(e)

        wrapper.__signature__ = inspect.Signature(params, return_annotation=None)  # type: ignore[attr-defined]
        wrapper.__annotations__ = {p.name: p.annotation for p in params}
        del wrapper.__wrapped__  # Typer reads the signature above, not the verb's own
        return wrapper

    return decorate


cluster_options = _with_group(ClusterFlags, "cluster")
"""Put the cluster options (--name, --backend, --namespace, --context, --kubeconfig) where the verb has
``cluster: ClusterFlags``."""

run_options = _with_group(RunFlags, "target")
"""Put the run options (--namespace, --context, --kubeconfig, -c/--config) where the verb has ``target: RunFlags``."""
