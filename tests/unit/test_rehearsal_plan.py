"""The rehearsal's plan (``launchers/rehearse.py``: what it will place, before any Ray) against the independent
expectation written from upstream Miles's rules (tests/infra/upstream_placement.py), over a grid of splits, and the
flag combinations Miles refuses. The placement itself, on real Ray with fake GPUs: tests/integration/test_local_ray.py
(``-k rehears``)."""

from __future__ import annotations

import itertools

import pytest

from miles_ray.launchers import rehearse
from tests.infra.upstream_placement import expected


def _plan(argv: list[str]):
    args, unknown = rehearse.parse_args(argv)
    return rehearse.plan(args), unknown


def _argv(**kw) -> list[str]:
    argv = ["--actor-num-nodes", str(kw["actor_nodes"]), "--actor-num-gpus-per-node", str(kw["actor_gpus_per_node"]),
            "--num-gpus-per-node", str(kw["gpus_per_node"]), "--rollout-num-gpus-per-engine", str(kw["gpus_per_engine"])]
    if kw.get("rollout_gpus") is not None:
        argv += ["--rollout-num-gpus", str(kw["rollout_gpus"])]
    if kw.get("eval_gpus"):
        argv += ["--eval-num-gpus", str(kw["eval_gpus"]), "--eval-num-gpus-per-engine", str(kw["eval_gpus_per_engine"])]
    for flag in ("colocate", "debug_train_only", "debug_rollout_only", "rollout_external"):
        if kw.get(flag):
            argv.append("--" + flag.replace("_", "-"))
    if kw.get("ppo"):
        argv += ["--advantage-estimator", "ppo"]
    return argv


def _cases():
    for g, nodes, e, mode in itertools.product((4, 8), (1, 2, 3), (1, 2, 4, 8, 16, 32), ("colocate", "disagg", "eval",
                                                                                        "train-only", "rollout-only",
                                                                                        "external", "ppo")):
        kw = dict(actor_nodes=nodes, actor_gpus_per_node=g, gpus_per_node=g, gpus_per_engine=e)
        if mode in ("colocate", "train-only", "external", "ppo"):
            kw["colocate"] = True
        else:
            kw["rollout_gpus"] = max(e, 2 * g)
        kw.update({"eval": dict(eval_gpus=2 * g, eval_gpus_per_engine=min(e, 2 * g)), "train-only": dict(debug_train_only=True),
                   "rollout-only": dict(debug_rollout_only=True), "external": dict(rollout_external=True),
                   "ppo": dict(ppo=True)}.get(mode, {}))
        r = kw.get("rollout_gpus", nodes * g)
        if r % e or (e <= g and g % e) or (e > g and e % g):
            continue  # a split the engine rules refuse (tested below)
        if kw.get("eval_gpus") and kw["eval_gpus"] % kw["eval_gpus_per_engine"]:
            continue
        yield pytest.param(kw, id=f"G{g}-n{nodes}-E{e}-{mode}")


@pytest.mark.parametrize("kw", list(_cases()))
def test_the_rehearsal_plans_what_upstream_places(kw):
    (layout, placement, errors), _ = _plan(_argv(**kw))
    assert errors == []
    exp = expected(**kw)
    assert layout["bundles"] == exp.bundles
    assert placement["trainer"] == exp.trainer and placement["critic"] == exp.critic
    got = sorted((a["group"], a["engine"], a["node_of_engine"], a["first"]) for a in placement["engine_actors"])
    assert got == sorted(exp.engines)


def test_an_engine_wider_than_a_node_is_one_actor_per_node_of_the_engine():
    (layout, placement, _), _ = _plan(["--colocate", "--actor-num-nodes", "4", "--actor-num-gpus-per-node", "8",
                                       "--num-gpus-per-node", "8", "--rollout-num-gpus-per-engine", "16"])
    assert layout["engines"] == 2 and layout["engine_actors_planned"] == 4
    assert [(a["engine"], a["node_of_engine"], a["first"], len(a["bundles"])) for a in placement["engine_actors"]] == [
        (0, 0, 0, 8), (0, 1, 8, 8), (1, 0, 16, 8), (1, 1, 24, 8)]


@pytest.mark.parametrize(("argv", "message"), [
    (["--colocate", "--eval-num-gpus", "8"], "--eval-num-gpus 8 needs the disaggregated layout"),
    (["--rollout-num-gpus", "8", "--eval-num-gpus", "8", "--debug-train-only"], "needs the disaggregated layout"),
    (["--rollout-num-gpus", "8", "--eval-num-gpus", "6", "--eval-num-gpus-per-engine", "4"],
     "eval GPUs 6 are not a multiple of --eval-num-gpus-per-engine 4"),
    (["--colocate", "--debug-train-only", "--debug-rollout-only"], "cannot be set at the same time"),
    (["--debug-rollout-only"], "--debug-rollout-only without --colocate needs --rollout-num-gpus"),
    ([], "disaggregated (no --colocate) needs --rollout-num-gpus"),
    (["--colocate", "--actor-num-nodes", "3", "--rollout-num-gpus-per-engine", "12"], "> 8 GPUs per node must be a multiple of it"),
    (["--colocate", "--rollout-num-gpus-per-engine", "3"], "not a multiple of --rollout-num-gpus-per-engine 3"),
])
def test_splits_miles_refuses_fail_before_anything_is_placed(argv, message):
    (_, placement, errors), _ = _plan(argv)
    assert any(message in e for e in errors), errors
    assert placement["engine_actors"] == [] and placement["trainer"] == []


def test_the_debug_and_external_modes_change_what_is_placed():
    (lay, pl, _), _ = _plan(["--colocate", "--load-debug-rollout-data", "/d/{rollout_id}.pt"])
    assert lay["mode"] == "debug-train-only" and lay["bundles"] == 8 and pl["engine_actors"] == []
    (lay, pl, _), _ = _plan(["--actor-num-nodes", "4", "--rollout-num-gpus", "12", "--debug-rollout-only",
                             "--num-gpus-per-node", "8"])
    assert (lay["actor_num_nodes"], lay["actor_num_gpus_per_node"], lay["bundles"]) == (1, 8, 12)  # min(8, R) a node
    assert len(pl["trainer"]) == 8 and len(pl["engine_actors"]) == 12
    (lay, pl, _), _ = _plan(["--colocate", "--rollout-external", "--debug-rollout-only"])
    assert lay["bundles"] == 0 and pl["trainer"] == [] and pl["engine_actors"] == []
    (lay, pl, _), unknown = _plan(["--colocate", "--rollout-external", "--rollout-external-engine-addrs", "a:1", "b:2",
                                   "--some-miles-flag", "1"])
    assert lay["external_engines"] == 2 and lay["bundles"] == 8 and pl["rollout"] == [] and unknown
