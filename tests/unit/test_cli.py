"""The CLI: exit codes, one-line errors without tracebacks, nothing written on failure, JSON shape,
and a start-up that never imports ray, polyaxon or kubernetes."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.conftest import IMAGE, REPO

PLAN_KEYS = {"feasible", "layout", "actor_num_nodes", "actor_num_gpus_per_node", "rollout_num_gpus",
             "rollout_num_gpus_per_engine", "num_gpus_per_node", "miles_args", "errors"}


def test_plan_json(cli, clean_env) -> None:
    code, out, err = cli("plan", "--recipe", "Qwen3-4B", "--nodes", "4", "-o", "json")
    assert code == 0, err
    data = json.loads(out)
    assert PLAN_KEYS <= set(data)
    assert data["feasible"] is True and data["layout"] == "colocated" and data["errors"] == []
    assert data["miles_args"][:3] == ["--colocate", "--actor-num-nodes", "4"]


def test_plan_infeasible_json_and_table(cli, clean_env) -> None:
    code, out, err = cli("plan", "--nodes", "3", "-o", "json")
    assert code == 2
    data = json.loads(out)
    assert data["feasible"] is False
    assert [e["rule"] for e in data["errors"]] == ["gbs-divisible-by-dp"]
    assert all({"rule", "message"} <= set(e) for e in data["errors"])
    assert err.count("\n") == 1 and err.startswith("error: ")
    code, out, err = cli("plan", "--nodes", "3")
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and "gbs-divisible-by-dp" in err and "--nodes 4" in err


@pytest.mark.parametrize("args, fragment", [
    (["plan", "--recipe", "NoSuch"], "unknown recipe"),
    (["plan", "--nodes", "0"], "--nodes"),
    (["plan", "--nodes", "-3"], "--nodes"),
    (["plan", "--nodes", "four"], "--nodes"),
    (["plan", "--gpus-per-node", "0"], "--gpus-per-node"),
    (["plan", "--gpus-per-node", "x"], "--gpus-per-node"),
    (["plan", "--layout", "sideways"], "--layout"),
    (["plan", "--bogus"], "No such option"),
    (["render", "--image", "radixark/miles:latest", "--ray-version", "2.60.0"], "not pinned by digest"),
    (["render", "--image", "radixark/miles@sha256:abc", "--ray-version", "2.60.0"], "malformed digest"),
    (["render", "--image", IMAGE], "no Ray version"),
    (["render", "--ray-version", "2.60.0"], "no image"),
    (["render", "--image", IMAGE, "--ray-version", "2.60.0", "--name", "Bad_Name"], "DNS-1035"),
    (["render", "--image", IMAGE, "--ray-version", "2.60.0", "--name", "a" * 54], "at most 53"),
    (["render", "--image", IMAGE, "--ray-version", "2.60.0", "--nodes", "3"], "infeasible"),
    (["render", "--image", IMAGE, "--ray-version", "latest"], "Ray version"),
    (["nosuchcommand"], "No such command"),
])
def test_bad_input_one_line_exit_2_nothing_written(cli, clean_env, args, fragment) -> None:
    out_dir = clean_env / "out"
    extra = ["--out", str(out_dir)] if args[0] == "render" else []
    code, out, err = cli(*args, *extra)
    assert code == 2, (code, err)
    assert err.count("\n") == 1 and err.startswith("error: "), err
    assert fragment in err
    assert "Traceback" not in err + out
    assert not out_dir.exists()
    assert sorted(p.name for p in clean_env.iterdir()) == []


def test_bad_config_file_and_recipe_file(cli, clean_env) -> None:
    (clean_env / "miles-ray.yaml").write_text("nodes: 2\ncolour: red\n")
    code, _, err = cli("plan")
    assert code == 2 and "unknown key(s) colour" in err and err.count("\n") == 1
    (clean_env / "miles-ray.yaml").unlink()
    (clean_env / "r.yaml").write_text("recipes:\n  - name: x\n    tensor_parallel: two\n")
    code, _, err = cli("plan", "--recipe-file", str(clean_env / "r.yaml"))
    assert code == 2 and "recipe file" in err and err.count("\n") == 1


def test_render_all_to_dir(cli, clean_env) -> None:
    out_dir = clean_env / "out"
    code, out, err = cli("render", "-F", "all", "--nodes", "4", "--image", IMAGE, "--ray-version", "2.60.0",
                         "--name", "miles-q4", "--out", str(out_dir))
    assert code == 0, err
    names = sorted(p.name for p in out_dir.iterdir())
    assert names == ["miles-q4.polyaxon-cr.yaml", "miles-q4.polyaxon.yaml", "miles-q4.raycluster.yaml"]
    rc = yaml.safe_load((out_dir / "miles-q4.raycluster.yaml").read_text())
    assert rc["kind"] == "RayCluster" and rc["spec"]["workerGroupSpecs"][0]["replicas"] == 4
    op = yaml.safe_load((out_dir / "miles-q4.polyaxon.yaml").read_text())
    assert op["component"]["run"]["kind"] == "raycluster"


def test_render_stdout_and_unpinned_warning(cli, clean_env) -> None:
    code, out, err = cli("render", "-F", "kuberay", "--image", "radixark/miles:latest", "--allow-unpinned",
                         "--ray-version", "2.60.0")
    assert code == 0
    assert "warning" in err and "not pinned" in err
    [doc] = list(yaml.safe_load_all(out))
    assert doc["spec"]["headGroupSpec"]["template"]["spec"]["containers"][0]["image"] == "radixark/miles:latest"


def test_init_writes_a_loadable_file_and_refuses_overwrite(cli, clean_env) -> None:
    code, _, err = cli("init")
    assert code == 0
    assert (clean_env / "miles-ray.yaml").is_file()
    code, out, _ = cli("plan", "-o", "json")  # picks up ./miles-ray.yaml
    assert code == 0 and json.loads(out)["nodes"] == 1
    code, _, err = cli("init")
    assert code == 2 and "already exists" in err


def test_recipes_json(cli, clean_env) -> None:
    code, out, _ = cli("recipes", "-o", "json")
    assert code == 0
    names = {r["name"] for r in json.loads(out)}
    assert {"Qwen3-4B", "Qwen3-30B-A3B", "Qwen3-235B-A22B"} <= names


HEAVY = ("ray", "polyaxon", "kubernetes")


@pytest.mark.parametrize("argv", [["--help"], ["plan", "--nodes", "4"], ["plan", "--help"], ["recipes"]])
def test_startup_imports_no_heavy_library(argv) -> None:
    code = (
        "import sys\n"
        "from miles_ray.cli.app import main\n"
        f"rc = main({argv!r})\n"
        f"heavy = sorted(m for m in sys.modules if m.split('.')[0] in {HEAVY!r})\n"
        "print('HEAVY=' + ','.join(heavy))\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("MILES_RAY_")}
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=REPO, timeout=60)
    assert res.returncode == 0, res.stderr
    assert "HEAVY=\n" in res.stdout, res.stdout[-500:]


def test_console_script_runs() -> None:
    exe = os.path.join(os.path.dirname(sys.executable), "miles-ray")
    res = subprocess.run([exe, "plan", "--nodes", "2", "-o", "json"], capture_output=True, text=True, timeout=60)
    assert res.returncode == 0 and json.loads(res.stdout)["feasible"] is True


# --- generated inputs: whatever the arguments, the CLI answers with an exit code, never a traceback ----

_token = st.one_of(
    st.sampled_from(["--nodes", "--gpus-per-node", "--recipe", "--layout", "--rollout-nodes", "--rollout-gpus",
                     "--image", "--ray-version", "--name", "-o", "--format", "--namespace", "--allow-unpinned"]),
    st.text(max_size=20),
    st.integers(-5, 100).map(str),
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(cmd=st.sampled_from(["plan", "render", "recipes"]), rest=st.lists(_token, max_size=8))
def test_generated_arguments_never_traceback(cli, clean_env, cmd, rest) -> None:
    out_dir = clean_env / "gen-out"
    args = [cmd, *rest] + (["--out", str(out_dir)] if cmd == "render" else [])
    code, out, err = cli(*args)
    assert code in (0, 2), (args, code, err)
    assert "Traceback" not in out + err
    if code == 2:
        assert err.count("\n") == 1 and err.startswith("error: "), (args, err)
        assert not out_dir.exists()
