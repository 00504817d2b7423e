"""Hostile and generated input: fuzzed CLI arguments, config and recipe files; YAML bombs and oversized
files; paths that try to escape; generated Kubernetes names. No cluster: everything must be refused
before any network (the fuzz points every service at nothing; see fuzzing.py)."""

from __future__ import annotations

import os
import re
import socket
import time
from pathlib import Path, PurePosixPath

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.conftest import IMAGE
from tests.reliability.fuzzing import Tally, classify, closed_port, make_property, sandbox

DNS1035 = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
DNS1123 = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
LABEL_KEY = re.compile(r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"
                       r"[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$")


def test_generated_cli_arguments_config_and_recipe_files_never_traceback(ledger):
    """Every command's flags (read from the live app), hostile values, generated config and recipe files."""
    event = ledger.record("fuzz", "cli+config+recipe")
    tally = make_property(Tally(), max_examples=240, seed=1)()
    event.update(tried=tally.tried, tracebacks=tally.traceback, bad_exit=tally.bad_exit, unreachable=tally.unreachable)
    assert tally.tried >= 360
    assert tally.traceback == 0, tally.examples
    assert tally.bad_exit == 0, tally.examples
    assert tally.refused > tally.tried // 2  # most generated input is bad and is refused with exit 2


def test_exit_1_is_allowed_only_for_the_sandboxs_own_dead_endpoints():
    """The fuzz accepts exit 1 ("a service failed") only when the error names an endpoint the sandbox made dead
    on purpose; exit 1 for anything else (bad input worded like a missing thing) is a bad exit."""
    with sandbox():
        dead = os.environ["RAY_ADDRESS"]
        assert classify(1, "", f"error: cannot reach the Ray Jobs API at {dead} (refused)\n", None) == "unreachable"
        for line in ("error: run 'x' does not exist", "error: connection refused by 10.0.0.1:6379",
                     "error: no local cluster named x is running"):
            assert classify(1, "", line + "\n", None) == "bad_exit", line
        assert classify(2, "", "error: run 'x' does not exist\n", None) == "refused"
        # a loopback address the command line gave counts only while nothing listens on it
        given = f"http://127.0.0.1:{closed_port()}"
        line = f"error: cannot reach the Ray Jobs API at {given} (refused)\n"
        assert classify(1, "", line, None, ["comm-check", "--address", given]) == "unreachable"
        assert classify(1, "", line, None, ["comm-check"]) == "bad_exit"
        with socket.socket() as listening:
            listening.bind(("127.0.0.1", 0))
            listening.listen()
            alive = f"http://127.0.0.1:{listening.getsockname()[1]}"
            line = f"error: cannot reach the Ray Jobs API at {alive} (refused)\n"
            assert classify(1, "", line, None, ["comm-check", "--address", alive]) == "bad_exit"
        # not found (exit 1) is a true answer only for the run the command line named, absent from the sandbox state
        missing = "error: no run named 'x' ('miles-ray runs' lists the runs this machine submitted)\n"
        assert classify(1, "", missing, None, ["status", "x"]) == "not_found"
        assert classify(1, "", missing, None, ["status", "y"]) == "bad_exit"
        assert classify(1, "", missing, None) == "bad_exit"
        runs = Path(os.environ["MILES_RAY_STATE_DIR"]) / "runs"
        runs.mkdir(parents=True)
        (runs / "x.json").write_text("{}")
        assert classify(1, "", missing, None, ["status", "x"]) == "bad_exit"


# -- YAML bombs, oversized and odd files ----------------------------------------------------------

BILLION_LAUGHS = """\
a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]
b: &b [*a,*a,*a,*a,*a,*a,*a,*a,*a]
c: &c [*b,*b,*b,*b,*b,*b,*b,*b,*b]
d: &d [*c,*c,*c,*c,*c,*c,*c,*c,*c]
e: &e [*d,*d,*d,*d,*d,*d,*d,*d,*d]
f: &f [*e,*e,*e,*e,*e,*e,*e,*e,*e]
g: &g [*f,*f,*f,*f,*f,*f,*f,*f,*f]
h: &h [*g,*g,*g,*g,*g,*g,*g,*g,*g]
i: &i [*h,*h,*h,*h,*h,*h,*h,*h,*h]
"""


@pytest.mark.parametrize("flag", ["--config", "--recipe-file"])
def test_yaml_bomb_refused_fast(cli, clean_env, flag):
    (clean_env / "bomb.yaml").write_text(BILLION_LAUGHS if flag == "--config" else "recipes:\n" + "".join(
        "  " + line + "\n" for line in BILLION_LAUGHS.splitlines()))
    t0 = time.monotonic()
    code, out, err = cli("plan", flag, "bomb.yaml", "-o", "json")
    assert time.monotonic() - t0 < 5
    assert code == 2 and "aliases" in err and "YAML bombs" in err
    assert err.count("\n") == 1 and out == ""


@pytest.mark.parametrize("flag", ["--config", "--recipe-file"])
def test_oversized_and_unreadable_files_refused(cli, clean_env, flag):
    from miles_ray.core.safe_yaml import MAX_BYTES

    (clean_env / "big.yaml").write_text("# " + "x" * (MAX_BYTES + 10) + "\n")
    code, _, err = cli("plan", flag, "big.yaml")
    assert code == 2 and "limit" in err and err.count("\n") == 1
    for bad in ("a" * 5000, "/dev/zero", str(clean_env), "no\x00such", "/proc/self/mem"):
        code, out, err = cli("plan", flag, bad)
        assert code == 2, (bad, err)
        assert err.startswith("error: ") and err.count("\n") == 1 and "Traceback" not in err


def test_yaml_tags_that_would_run_code_are_refused(cli, clean_env):
    (clean_env / "evil.yaml").write_text("name: !!python/object/apply:os.system ['touch pwned']\n")
    code, _, err = cli("plan", "--config", "evil.yaml")
    assert code == 2 and "not valid YAML" in err
    assert not (clean_env / "pwned").exists()


# -- paths cannot escape ----------------------------------------------------------------------------

@pytest.mark.parametrize("text, fragment", [
    ("models_dir: ../../etc\n", "models_dir"),
    ("runs_dir: /etc\n", "runs_dir"),
    ("datasets_dir: a/../../b\n", "datasets_dir"),
    ("mount_path: /mnt/../../etc\n", "mount_path"),
    ("mount_path: relative/path\n", "mount_path"),
    ("miles_root: /root/../../etc\n", "miles_root"),
])
def test_config_paths_cannot_escape(cli, clean_env, text, fragment):
    (clean_env / "c.yaml").write_text(text)
    code, _, err = cli("plan", "--config", "c.yaml")
    assert code == 2 and fragment in err and err.count("\n") == 1


@pytest.mark.parametrize("field", ["hf_dir", "megatron_dir", "train_data", "eval_data"])
@pytest.mark.parametrize("value", ["../../etc/passwd", "/etc/passwd", "a/../../../b", "..\\..\\x"])
def test_recipe_paths_cannot_escape(cli, clean_env, field, value):
    import yaml

    from miles_ray.core.recipes import get_recipe

    base = get_recipe("Qwen3-4B").model_dump(mode="json")
    base.update({"name": "Evil-4B", field: value})
    (clean_env / "r.yaml").write_text(yaml.safe_dump({"recipes": [base]}))
    code, _, err = cli("plan", "--recipe-file", "r.yaml", "--recipe", "Evil-4B")
    assert code == 2 and field in err and err.count("\n") == 1


@settings(max_examples=200, deadline=None)
@given(run=st.from_regex(r"[a-z0-9]([-a-z0-9]{0,38}[a-z0-9])?", fullmatch=True),
       other=st.from_regex(r"[a-z0-9]([-a-z0-9]{0,38}[a-z0-9])?", fullmatch=True))
def test_run_output_dirs_stay_inside_and_never_collide(run, other):
    from miles_ray.core.config import load_config

    cfg = load_config({}, environ={})
    base = PurePosixPath(cfg.mount_path) / cfg.runs_dir
    out = PurePosixPath(cfg.output_dir(run))
    assert out.parent == base and ".." not in out.parts
    assert (cfg.output_dir(run) == cfg.output_dir(other)) == (run == other)


# -- generated names are valid Kubernetes names -------------------------------------------------------

def _feasible_shapes() -> list[tuple[str, int]]:
    """(recipe, nodes) pairs of 8-GPU nodes whose default split is feasible: only those are generated, so that
    every example renders a RayCluster and asserts on it (a name check needs a cluster, not a refusal)."""
    from miles_ray.core.planner import plan_split
    from miles_ray.core.recipes import catalog, get_recipe

    pairs = [(r, n) for r in sorted(catalog()) for n in (1, 2, 4, 8)
             if plan_split(get_recipe(r), n, 8, with_suggestions=False).feasible]
    assert len({r for r, _ in pairs}) >= 10, "the catalog has few recipes feasible on 1-8 nodes"
    return pairs


@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
@given(name=st.from_regex(r"[a-z]([-a-z0-9]{0,51}[a-z0-9])?", fullmatch=True),
       group=st.from_regex(r"[a-z0-9]([-a-z0-9]{0,20}[a-z0-9])?", fullmatch=True),
       shape=st.sampled_from(_feasible_shapes()))
def test_rendered_rayclusters_have_valid_names_and_labels(name, group, shape):
    """Every accepted name yields a RayCluster, pods and services Kubernetes accepts (kubernetes-validate
    on the pods KubeRay would make; the head service name KubeRay derives fits 63 characters)."""
    import kubernetes_validate

    from miles_ray.core.builders import build_raycluster
    from miles_ray.core.config import load_config
    from miles_ray.core.planner import plan_split
    from miles_ray.core.recipes import get_recipe

    recipe, nodes = shape
    cfg = load_config({"name": name, "worker_group": group, "recipe": recipe, "nodes": nodes}, environ={})
    plan = plan_split(get_recipe(cfg.recipe), cfg.nodes, cfg.gpus_per_node)
    assert plan.feasible, (recipe, nodes)  # every generated shape renders: no example passes without asserting
    rc = build_raycluster(cfg, plan, IMAGE, "2.60.0")
    meta = rc["metadata"]
    assert DNS1035.match(meta["name"]) and len(meta["name"]) <= 53
    assert DNS1123.match(meta["namespace"])
    assert DNS1035.match(f"{meta['name']}-head-svc") and len(f"{meta['name']}-head-svc") <= 63
    for k, v in meta["labels"].items():
        assert LABEL_KEY.match(k) and len(k.split("/")[-1]) <= 63, k
        assert LABEL_VALUE.match(v) and len(v) <= 63, (k, v)
    spec = rc["spec"]
    for tmpl, pod_name in ((spec["headGroupSpec"]["template"], f"{name}-head-abcde"),
                           (spec["workerGroupSpecs"][0]["template"], f"{name}-{group}-worker-abcde")):
        pod = {"apiVersion": "v1", "kind": "Pod",
               "metadata": {"name": pod_name[:253], "namespace": meta["namespace"], **tmpl["metadata"]},
               "spec": tmpl["spec"]}
        kubernetes_validate.validate(pod, "1.33", strict=True)
