"""'up' of a cluster that already runs: the same request again changes nothing; another one is refused (exit 2),
naming what differs and the verb that changes it, on every backend alike."""

from __future__ import annotations

from miles_ray.core.errors import ConfigError


def refuse_drift(what: str, diffs: list[str], *, live_nodes: int | None = None, live_gpus: object = None,
                 scale_to: int | None = None, rest_differs: bool = False) -> None:
    """Raise when ``diffs`` (how the running cluster ``what`` differs from this request) is not empty. The hint
    names the fix: ``scale --nodes`` (``scale_to``) for the number of GPU nodes (or the flags of the cluster as it is), ``down``
    then ``up`` for what 'scale' cannot change."""
    if not diffs:
        return
    fixes = []
    if scale_to is not None:
        fixes.append(f"'miles-ray scale --nodes {scale_to}' resizes it" if not rest_differs else
                     f"'miles-ray scale --nodes {scale_to}' changes the number of GPU nodes")
    if rest_differs:
        fixes.append("'miles-ray down' then 'up' changes the rest")
    as_is = " ".join(f for f in (f"--nodes {live_nodes}" if live_nodes is not None else "",
                                 f"--gpus-per-node {live_gpus}" if live_gpus is not None else "") if f)
    if as_is:
        fixes.append(f"{as_is} asks for it as it is")
    raise ConfigError(f"{what} is already running and differs from this request: " + "; ".join(diffs),
                      hint="; ".join(fixes))
