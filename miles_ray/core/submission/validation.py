"""Submit's request and its validation from the configuration and the flags alone, before any I/O (even before the
head address is looked up): :func:`validate_request`."""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, field
from typing import Any, Literal

from miles_ray.core.config import MilesRayConfig
from miles_ray.core.entrypoint import RUN_NAME
from miles_ray.core.errors import ConfigError
from miles_ray.core.images import ImageRef, check_image
from miles_ray.core.memory import LabelledGpu, check_fit
from miles_ray.core.planner import Plan
from miles_ray.core.prepare import require_feasible, resolve_plan
from miles_ray.core.recipes import Recipe
from miles_ray.core.secrets import HINT as SECRET_HINT, secret_name, secret_value
from miles_ray.core.supervision import DEFAULT_MAX_RESTARTS, MAX_RESTARTS_LIMIT, Retention, SpecError


_CREDENTIAL_FLAG = re.compile(r"(key|token|secret|password|passwd|credentials?)$", re.I)


def parse_env(items: list[str]) -> dict[str, str]:
    """--env KEY=VALUE pairs. A secret-looking name or value is refused: it would land in plain text
    in the job's runtime env, metadata and run record. The refusal never repeats the value."""
    out: dict[str, str] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not re.fullmatch(r"^[A-Za-z_][A-Za-z0-9_]*$", key):
            raise ConfigError(f"--env {item!r} is not KEY=VALUE with a valid variable name")
        if secret_name(key):
            raise ConfigError(
                f"--env {key}=... looks like a credential; miles-ray does not put secrets in plain text into job "
                "specs or run records", hint="supply it through a Kubernetes Secret or a scoped Polyaxon connection")
        what = secret_value(value)
        if what:
            raise ConfigError(f"--env {key}=... looks like {what}; miles-ray does not put secrets in plain text into "
                              "job specs or run records", hint=SECRET_HINT)
        out[key] = value
    return out


def split_extra_args(text: str | None) -> list[str]:
    """--extra-args as the shell would split it; an unbalanced quote is bad input (exit 2), said in one line."""
    if not text:
        return []
    try:
        return shlex.split(text)
    except ValueError as e:  # shlex: "No closing quotation", "No escaped character"
        raise ConfigError(f"--extra-args {text!r} cannot be split into arguments ({str(e).lower()})",
                          hint="balance its quotes, e.g. --extra-args '--lr 1e-6 --note \"two words\"'") from None


def check_extra_args(extra_args: list[str]) -> None:
    """Refuse credentials in --extra-args: they would be stored in the run record and the job's entrypoint."""
    for arg in extra_args:
        flag = arg.split("=", 1)[0]
        if flag.startswith("--") and _CREDENTIAL_FLAG.search(flag):
            raise ConfigError(f"--extra-args passes {flag}: a credential on the job's command line would be stored "
                              "in the run record and the job's entrypoint", hint=SECRET_HINT)
        what = secret_value(arg)
        if what:
            raise ConfigError(f"--extra-args contains what looks like {what}; it would be stored in the run record "
                              "and the job's entrypoint", hint=SECRET_HINT)


@dataclass(frozen=True)
class SubmitRequest:
    """What the user asked ``submit`` for (flags other than the configuration's)."""

    run: str | None = None
    mode: Literal["direct", "launcher"] = "direct"
    rehearse: bool = False
    env: list[str] = field(default_factory=list)  # KEY=VALUE, as given
    extra_args: list[str] = field(default_factory=list)
    resume_from: str | None = None
    force: bool = False
    miles_commit: str | None = None
    model_revision: str | None = None
    dataset_revision: str | None = None
    num_rollout: int | None = None
    timeout: float = 120.0  # waiting for nodes; the rehearsal's placement timeout
    wait_for_nodes: bool = False
    check_data: bool | None = None  # None: on for Kubernetes clusters
    hold: float = 0  # rehearsal: seconds to keep the placed actors, failing if one dies
    # neither --nodes nor --gpus-per-node given: plan for the live cluster's GPU workers (not in a client dry run)
    shape_from_cluster: bool = False
    # restarts of a supervised run (None: the default, 3 where a supervisor can run and the job saves checkpoints;
    # 0: not supervised)
    max_restarts: int | None = None
    # do not refuse a job whose memory estimate does not fit (miles_ray.core.memory); kept in the run record
    no_memory_check: bool = False
    # retention by the run's supervisor (miles_ray.core.supervision.Retention): None, None: keep every checkpoint
    keep_checkpoints: int | None = None
    keep_best: str | None = None


@dataclass(frozen=True)
class ValidRequest:
    """A request that passed every check that needs no cluster: its recipe, plan, pinned image and env."""

    request: SubmitRequest
    recipe: Recipe
    plan: Plan
    image: ImageRef | None
    env: dict[str, str]


def validate_request(cfg: MilesRayConfig, request: SubmitRequest, labelled: LabelledGpu | None = None) -> ValidRequest:
    """Every check of config and flags alone (exit 2 on bad input): the split is feasible, the mode fits it,
    the image is pinned, the run name is valid, no credential in --env or --extra-args. ``labelled``: one GPU's
    memory as the live cluster's GPU nodes' labels say it (the memory check holds the job against it)."""
    recipe, plan = resolve_plan(cfg)
    require_feasible(plan)
    # it fits the GPUs, the pods and the claim (where they are known): refused before anything is recorded. Not
    # for a rehearsal: it places Miles' actors and loads no model, on whatever pods (fake GPUs, a CI runner's)
    if not request.rehearse:
        check_fit(cfg, recipe, plan, request.extra_args, request.num_rollout, no_check=request.no_memory_check,
                  labelled=labelled, **retention_kept(request))
    if request.mode == "launcher":
        check_launcher_layout(recipe, plan)
        if recipe.launcher_max_nodes and plan.nodes > recipe.launcher_max_nodes:
            raise ConfigError(f"the upstream launcher {recipe.launcher} supports at most {recipe.launcher_max_nodes} "
                              f"node(s)", hint="use --mode direct")
        if recipe.launcher_min_nodes and plan.nodes < recipe.launcher_min_nodes:
            raise ConfigError(f"the upstream launcher {recipe.launcher} submits this recipe's layout from "
                              f"{recipe.launcher_min_nodes} nodes on (on fewer it refuses, runs a debug layout or asks for its own node count)",
                              hint="use --mode direct")
    if request.mode == "direct" and not request.rehearse and not recipe.train_args:
        raise ConfigError(f"recipe {recipe.name!r} has no train_args: direct mode builds train.py's command line from "
                          "them", hint="add model_args and train_args to the recipe (docs/recipes.md), or use "
                                       "--mode launcher")
    image = check_image(cfg.image, cfg.allow_unpinned)[0] if cfg.image else None
    if request.run is not None and not RUN_NAME.fullmatch(request.run):
        raise ConfigError(f"run name {request.run!r} is not valid",
                          hint="use lower-case letters, digits and '-', at most 40 characters")
    check_extra_args(request.extra_args)
    if request.hold and not request.rehearse:
        raise ConfigError("--hold keeps a rehearsal's actors in place; it applies to --rehearse only",
                          hint="add --rehearse, or drop --hold")
    check_max_restarts(request)
    check_retention(request)
    return ValidRequest(request=request, recipe=recipe, plan=plan, image=image, env=parse_env(request.env))


def retention_kept(request: SubmitRequest) -> dict[str, Any]:
    """The retention the fit check counts in the storage part (--keep-checkpoints N, --keep-best): a bad one is
    not counted here (:func:`check_retention` refuses it in one line)."""
    try:
        policy = Retention.of(request.keep_checkpoints, request.keep_best)
    except SpecError:
        return {}
    return {"keep_checkpoints": policy.keep_last, "keep_best": policy.metric is not None}


def check_retention(request: SubmitRequest) -> None:
    """--keep-checkpoints N (>= 1) / --keep-best METRIC: the run's supervisor deletes checkpoints, so a run that has
    one (--mode direct, --max-restarts not 0)."""
    if request.keep_checkpoints is None and request.keep_best is None:
        return
    try:
        Retention.of(request.keep_checkpoints, request.keep_best)
    except SpecError as e:
        raise ConfigError(str(e)) from None
    flag = "--keep-checkpoints" if request.keep_checkpoints is not None else "--keep-best"
    if request.rehearse or request.mode != "direct" or request.max_restarts == 0:
        why = ("a rehearsal writes no checkpoints" if request.rehearse else "--max-restarts 0: the run has no "
               "supervisor" if request.mode == "direct" else "the upstream launcher's run has no supervisor")
        raise ConfigError(f"{flag}: checkpoints are pruned by the run's supervisor ({why})",
                          hint="submit with --mode direct and a supervisor (--max-restarts >= 1), or drop " + flag)


def check_max_restarts(request: SubmitRequest) -> None:
    """--max-restarts: 0..MAX_RESTARTS_LIMIT, for a direct-mode run (a rehearsal writes no checkpoints to resume
    from; the upstream launcher decides where it loads from)."""
    n = request.max_restarts
    if n is None:
        return
    if n < 0 or n > MAX_RESTARTS_LIMIT:
        raise ConfigError(f"--max-restarts {n} is out of range", hint=f"give 0 (not supervised) to "
                                                                      f"{MAX_RESTARTS_LIMIT}; the default is "
                                                                      f"{DEFAULT_MAX_RESTARTS}")
    if request.rehearse:
        raise ConfigError("--max-restarts means nothing with --rehearse (a rehearsal is never restarted)",
                          hint="drop --max-restarts")
    if request.mode == "launcher" and n > 0:
        raise ConfigError("--max-restarts applies to --mode direct: the upstream launcher decides where it loads "
                          "checkpoints from, so a supervisor cannot resume it", hint="use --mode direct, or drop "
                                                                                     "--max-restarts")


def check_launcher_layout(recipe: Recipe, plan: Plan) -> None:
    """--mode launcher runs the recipe's upstream launcher, which submits its own layout: the recipe's
    ``default_layout`` (the catalog's are checked against the captures of the launchers), and a disaggregated
    launcher its own split (``default_actor_nodes`` trainer nodes, ``default_rollout_gpus`` rollout GPUs) whatever
    --num-nodes says. A plan of another layout or split is refused: the launcher would not run it."""
    want = recipe.default_layout
    if plan.layout != want:
        raise ConfigError(f"--mode launcher runs the upstream launcher {recipe.launcher}, which runs recipe "
                          f"{recipe.name} {want}; this plan is {plan.layout}",
                          hint=f"use --mode direct for a {plan.layout} split, or plan --layout {want}")
    if want == "disaggregated" and (plan.actor_num_nodes, plan.rollout_num_gpus) != (
            recipe.default_actor_nodes, recipe.default_rollout_gpus):
        need = (recipe.default_actor_nodes or 0) + -(-(recipe.default_rollout_gpus or 0) // plan.gpus_per_node)
        raise ConfigError(f"--mode launcher runs the upstream launcher {recipe.launcher}, which runs recipe "
                          f"{recipe.name} disaggregated on its own split ({recipe.default_actor_nodes} trainer "
                          f"node(s), {recipe.default_rollout_gpus} rollout GPUs) whatever --num-nodes says; this "
                          f"plan is {plan.actor_num_nodes} trainer node(s), {plan.rollout_num_gpus} rollout GPUs",
                          hint=f"use --mode direct for this split, or plan the launcher's: --nodes {need} --layout "
                               f"disaggregated --rollout-gpus {recipe.default_rollout_gpus}")
