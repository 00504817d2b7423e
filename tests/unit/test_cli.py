"""The CLI: exit codes, one-line errors without tracebacks, nothing written on failure, JSON shape,
and a start-up that never imports ray, polyaxon or kubernetes."""

from __future__ import annotations

import functools
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

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
    data = json.loads(out)
    names = {r["name"] for r in data["recipes"]}
    assert {"Qwen3-4B", "Qwen3-30B-A3B", "Qwen3-235B-A22B"} <= names
    from miles_ray.core.recipes import UPSTREAM_MILES_COMMIT

    assert data["upstream_miles_commit"] == UPSTREAM_MILES_COMMIT and len(UPSTREAM_MILES_COMMIT) == 40
    code, text, _ = cli("recipes")
    assert code == 0 and UPSTREAM_MILES_COMMIT in text


def test_recipes_fits_lists_what_a_shape_can_run(cli, clean_env) -> None:
    from miles_ray.core.planner import plan_split
    from miles_ray.core.recipes import catalog

    code, out, _ = cli("recipes", "--fits", "1x2", "-o", "json")
    assert code == 0
    data = json.loads(out)
    names = [r["name"] for r in data["recipes"]]
    assert data["fits"] == "1x2" and "Qwen3-4B" in names and "Qwen3-32B" not in names
    assert names == [r.name for r in catalog(None).values()
                     if r.plannable and plan_split(r, 1, 2, with_suggestions=False).feasible]
    code, text, _ = cli("recipes", "--fits", "1x2")
    assert code == 0 and "fits 1x2" in text and "Qwen3-4B" in text
    code, _, err = cli("recipes", "--fits", "two")
    assert code == 2 and "--fits 'two' is not NODESxGPUS" in err
    assert "fits" not in json.loads(cli("recipes", "-o", "json")[1])  # the JSON without --fits is as before


@pytest.mark.parametrize("how", [["--via", "kuberay"], ["--via", "polyaxon"], ["--single-node"]])
def test_up_dry_run_client_contacts_nothing(cli, clean_env, monkeypatch, how) -> None:
    """Like kubectl --dry-run=client: no kubeconfig, no Polyaxon server (port 9: nothing listens), and the
    client dry run still renders and validates what would be created; the server dry run is where the checks are."""
    monkeypatch.setenv("KUBECONFIG", str(clean_env / "no-kubeconfig"))
    monkeypatch.setenv("MILES_RAY_STATE_DIR", str(clean_env / "state"))
    monkeypatch.setenv("POLYAXON_HOST", "http://127.0.0.1:9")
    base = ["up", "--backend", "kubernetes", *how, "--name", "dry", "--image", IMAGE, "--ray-version", "2.60.0"]
    code, out, err = cli(*base, "--dry-run", "client", "-o", "json")
    assert code == 0, err
    result = json.loads(out)
    assert result["dry_run"] == "client" and result["created"] is False
    assert result["raycluster"] if how == ["--via", "kuberay"] else result["operation"]
    assert any("nothing contacted" in n for n in result["notices"])
    assert not list((clean_env / "state").rglob("dry*.json"))  # nothing recorded either
    code, _, err = cli(*base, "--dry-run", "server")
    assert code != 0 and "Traceback" not in err  # the server dry run does reach out (and there is nothing)


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


# --- generated inputs: the exit code is the one the arguments call for, and never a traceback -------------
#
# Arguments are drawn as segments whose meaning is known (an option with a value, a flag, a stray word, an
# unknown option, an option left without its value at the end), so the expected outcome is worked out from
# the CLI's documented surface (`--help`: options, value ranges and choices), Kubernetes naming rules, the
# image pinning policy and the independent split oracle -- not from the command code.

INT_RANGES = {"--nodes": (1, 4096), "--gpus-per-node": (1, 64), "--rollout-nodes": (0, 4096),
              "--rollout-gpus": (1, 1 << 20)}
CHOICES = {"--layout": {"colocated", "disaggregated"}, "-o": {"table", "json", "yaml"},
           "--format": {"polyaxon", "polyaxon-cr", "kuberay", "all"}}
PLAN_OPTIONS = {"--recipe", "--layout", "-o", *INT_RANGES}
VALUE_OPTIONS = {
    "plan": PLAN_OPTIONS,
    "render": PLAN_OPTIONS - {"-o"} | {"--image", "--ray-version", "--name", "--namespace", "--format"},
    "recipes": {"-o"},
}
FLAGS = {"plan": set(), "render": {"--allow-unpinned"}, "recipes": set()}
IMAGES = {IMAGE: "pinned", "radixark/miles:latest": "tag only", "radixark/miles@sha256:abc": "malformed",
          "": "empty"}
RAY_VERSIONS = {"2.60.0": True, "2.9.3": True, "latest": False, "2.60": False, "": False}
_name_text = st.text(alphabet="abcz09-_.A ", max_size=66)
_VALUES = {
    **{opt: st.integers(1, 16).map(str) | st.integers(-5, 100).map(str) | st.text(max_size=6)
       for opt in INT_RANGES},
    "--recipe": st.sampled_from(["Qwen3-4B", "Qwen3-32B", "Qwen3-30B-A3B", "Qwen3-235B-A22B", "qwen3-4b",
                                 "QWEN3.5-9B", "NoSuch"]) | st.text(max_size=12),
    **{opt: st.sampled_from(sorted(choices)) | st.sampled_from(["Colocated", "JSON", "raycluster"])
       | st.text(max_size=8) for opt, choices in CHOICES.items()},
    "--image": st.sampled_from(sorted(IMAGES)),
    "--ray-version": st.sampled_from(sorted(RAY_VERSIONS)),
    "--name": st.sampled_from(["miles-x", "Bad_Name", "a" * 53, "a" * 54]) | _name_text,
    "--namespace": st.sampled_from(["default", "team-a", "Team_A", "a" * 63, "a" * 64]) | _name_text,
}
ALL_VALUE_OPTIONS = sorted(set().union(*VALUE_OPTIONS.values()))
# what `render` needs to succeed at all; most generated render command lines start from it
RENDER_BASE = [("option", "--image", IMAGE), ("option", "--ray-version", "2.60.0")]


@functools.lru_cache(maxsize=1)
def _known_option_names() -> frozenset[str]:
    """Every option name the three commands declare (their --help surface), to draw unknown ones."""
    import typer

    from miles_ray.cli.app import app

    group = typer.main.get_command(app)
    return frozenset({name for cmd in VALUE_OPTIONS for p in group.commands[cmd].params
                      for name in [*p.opts, *p.secondary_opts]} | {"--help", "-h"})


def _option(options: list[str]):
    return st.sampled_from(options).flatmap(lambda opt: _VALUES[opt].map(lambda v: ("option", opt, v)))


_defect = st.one_of(
    _option(ALL_VALUE_OPTIONS),  # possibly an option of another command
    st.just(("flag", "--allow-unpinned", None)),
    st.text(max_size=10).filter(lambda t: not t.startswith("-")).map(lambda t: ("word", t, None)),
    st.from_regex(r"--[a-z][a-z-]{1,12}", fullmatch=True).filter(lambda t: t not in _known_option_names())
    .map(lambda t: ("unknown option", t, None)),
)


@st.composite
def command_lines(draw) -> tuple[str, list[tuple], str | None]:
    """(command, segments, an option left without its value at the end or None). Mostly the command's own
    options (with valid and invalid values), sometimes a defect; render mostly starts from RENDER_BASE."""
    cmd = draw(st.sampled_from(["plan", "render", "recipes"]))
    own = _option(sorted(VALUE_OPTIONS[cmd]))
    flags = [st.just(("flag", f, None)) for f in sorted(FLAGS[cmd])]
    segment = st.integers(0, 9).flatmap(lambda k: st.one_of(own, *flags) if k < 8 else _defect)
    base = RENDER_BASE if cmd == "render" and draw(st.integers(0, 4)) else []
    segments = base + draw(st.lists(segment, max_size=6))
    dangling = draw(st.sampled_from(ALL_VALUE_OPTIONS)) if draw(st.integers(0, 9)) == 0 else None
    return cmd, segments, dangling


def _int(text: str, opt: str) -> int | None:
    """The option's value as the CLI reads an integer (pydantic's lax int), or None when out of its range."""
    from pydantic import TypeAdapter, ValidationError

    try:
        value = TypeAdapter(int).validate_python(text)
    except ValidationError:
        return None
    low, high = INT_RANGES[opt]
    return value if low <= value <= high else None


def _pods_fit(recipe, nodes: int, g: int, layout: str, rollout_nodes: int | None, rollout_gpus: int | None) -> bool:
    from miles_ray.core.errors import ConfigError
    from miles_ray.core.memory import GIB, estimate
    from miles_ray.core.planner import plan_split

    disaggregated = layout == "disaggregated"
    plan = plan_split(recipe, nodes, g, layout, rollout_nodes if disaggregated else None,
                      rollout_gpus if disaggregated else None, with_suggestions=False)
    try:
        return estimate(recipe, plan, memory_per_node=512 * GIB).fits
    except ConfigError:
        return True


def expected_outcome(cmd: str, segments: list[tuple], dangling: str | None) -> tuple[int, int]:
    """(exit code, warning lines printed before the one error line) for these arguments."""
    from miles_ray.core.recipes import BUILTIN
    from tests.unit.planner_oracle import oracle

    values: dict[str, str] = {}
    allow_unpinned = False
    for kind, token, value in segments:
        if kind in ("word", "unknown option") or (kind == "flag" and token not in FLAGS[cmd]):
            return 2, 0  # an extra argument or an option this command does not have
        if kind == "option" and token not in VALUE_OPTIONS[cmd]:
            return 2, 0
        if kind == "flag":
            allow_unpinned = True
        else:
            values[token] = value  # a repeated option: the last value counts
    if dangling is not None:
        return 2, 0  # an option without its value
    ints = {opt: _int(values[opt], opt) for opt in INT_RANGES if opt in values}
    if None in ints.values() or any(values[o] not in CHOICES[o] for o in CHOICES if o in values):
        return 2, 0
    if cmd == "recipes":
        return 0, 0
    g = ints.get("--gpus-per-node", 8)
    lowered = {name.lower(): name for name in BUILTIN}
    recipe_name = values.get("--recipe", "Qwen3-4B")
    if g + 1 > 64 or recipe_name.lower() not in lowered:
        return 2, 0  # default cpus_per_node 64 must be >= GPUs + 1; an unknown recipe
    if cmd == "render":
        name, namespace = values.get("--name", "miles"), values.get("--namespace", "default")
        if not (re.fullmatch(r"[a-z]([-a-z0-9]*[a-z0-9])?", name) and len(name) <= 53):
            return 2, 0  # a RayCluster name is a DNS-1035 label of at most 53 characters
        if not (re.fullmatch(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?", namespace) and len(namespace) <= 63):
            return 2, 0  # a namespace is a DNS-1123 label
        image = IMAGES.get(values.get("--image", ""), "empty")
        if image in ("empty", "malformed") or (image == "tag only" and not allow_unpinned):
            return 2, 0
        if not RAY_VERSIONS.get(values.get("--ray-version", ""), False):
            return 2, 0
    recipe = BUILTIN[lowered[recipe_name.lower()]]
    layout = values.get("--layout", recipe.default_layout)
    rollout_nodes, rollout_gpus = ints.get("--rollout-nodes"), ints.get("--rollout-gpus")
    broken = oracle(recipe, ints.get("--nodes", 1), g, layout,
                    *((rollout_nodes, rollout_gpus) if layout == "disaggregated" else (None, None)))
    if not broken:
        # render of a named recipe: refused when its host memory does not fit the default 512Gi pods (the estimate
        # itself is held by tests/unit/test_memory_fit.py; here only that render refuses what it says)
        if cmd == "render" and "--recipe" in values and not _pods_fit(recipe, ints.get("--nodes", 1), g, layout,
                                                                       rollout_nodes, rollout_gpus):
            return 2, 0
        return 0, 0
    if cmd == "render":
        return 2, 0
    # plan prints the plan's warnings before refusing: TP wider than a node, rollout sizes ignored when colocated,
    # a node count outside the upstream launcher's own layouts
    nodes = ints.get("--nodes", 1)
    warnings = (int(recipe.tensor_parallel > g) + int(layout == "colocated" and bool(rollout_nodes or rollout_gpus))
                + int(bool(recipe.launcher_max_nodes) and nodes > recipe.launcher_max_nodes)
                + int(bool(recipe.launcher_min_nodes) and nodes < recipe.launcher_min_nodes))
    return 2, warnings


def _argv(segments: list[tuple], dangling: str | None) -> list[str]:
    args = [t for kind, token, value in segments for t in ((token, value) if kind == "option" else (token,))]
    return args + ([dangling] if dangling else [])


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(command_line=command_lines())
def test_generated_arguments_get_their_exact_exit_code(cli, clean_env, command_line) -> None:
    cmd, segments, dangling = command_line
    out_dir = Path(tempfile.mkdtemp(dir=clean_env)) / "out"
    args = [cmd, *(["--out", str(out_dir)] if cmd == "render" else []), *_argv(segments, dangling)]
    want, warnings = expected_outcome(cmd, segments, dangling)
    code, out, err = cli(*args)
    assert code == want, (args, code, err)
    assert "Traceback" not in out + err
    if code == 2:
        lines = err.splitlines()
        assert len(lines) == warnings + 1 and lines[-1].startswith("error: "), (args, err)
        assert all(line.startswith("warning: ") for line in lines[:-1]), (args, err)
        assert not out_dir.exists()
    else:
        assert "error:" not in err, (args, err)
        if cmd == "render":
            formats = [value for kind, token, value in segments if token == "--format"]
            files = sorted(p.name for p in out_dir.iterdir())
            assert len(files) == (3 if formats[-1:] == ["all"] else 1) and all(f.endswith(".yaml") for f in files)


def test_a_warning_is_one_line_with_square_brackets_as_written(capsys):
    """A warning's text is not Rich markup: the planner's '[rule] message' and a user's path with brackets print as
    they are (before, Rich took '[colocated-fit]' for a style tag and dropped it)."""
    from miles_ray.cli.common import warn

    message = "[colocated-fit] needs 8 GPUs; --save /data/[run]/ckpt " + "and a long tail " * 20
    warn(message)
    assert capsys.readouterr().err == f"warning: {message}\n"  # one line, however long


# -- the first hour (issue 25, part C): tables, names, errors in the tool's own words ----------------------------

LONG_RUNS = ("qwen3-4b-grpo-dapo-math-17k-try1", "qwen3-30b-a3b-disaggregated-try12")


@pytest.fixture
def long_runs(clean_env, monkeypatch):
    from miles_ray.adapters import state

    monkeypatch.setenv("MILES_RAY_STATE_DIR", str(clean_env / "state"))
    for i, run in enumerate(LONG_RUNS):
        state.create_record({"run": run, "address": "http://127.0.0.1:9", "created": f"2026-01-0{i + 1}T00:00:00+00:00",
                             "submission_id": f"job-{run}", "recipe": "Qwen3-30B-A3B", "mode": "direct",
                             "cluster": "miles-h100-pool-a", "split": {"nodes": 4, "gpus_per_node": 8,
                                                                     "layout": "disaggregated"},
                             "output_dir": f"/mnt/miles/runs/{run}/with/a/long/path"})
    return LONG_RUNS


@pytest.mark.parametrize("columns", ["80", "60"])
def test_runs_table_never_cuts_the_run_name(cli, long_runs, monkeypatch, columns) -> None:
    monkeypatch.setenv("COLUMNS", columns)
    code, out, err = cli("runs", "--no-live")
    assert code == 0, err
    for run in long_runs:
        assert run in out  # whole, on one line: 'logs RUN' can be copied from it
    assert max(len(line) for line in out.splitlines()) <= int(columns)
    code, wide, _ = cli("runs", "--no-live", "-o", "wide")  # every column, however long the lines
    assert code == 0 and "output dir" in wide and "/with/a/long/path" in wide
    assert all(run in wide for run in long_runs)
    code, js, _ = cli("runs", "--no-live", "-o", "json")
    assert code == 0 and [r["run"] for r in json.loads(js)] == list(long_runs)


@pytest.mark.parametrize("columns", ["80", "60"])
def test_recipes_table_never_cuts_the_recipe_name(cli, clean_env, monkeypatch, columns) -> None:
    from miles_ray.services.recipes import list_recipes

    monkeypatch.setenv("COLUMNS", columns)
    code, out, err = cli("recipes")
    assert code == 0, err
    rows = [line for line in out.splitlines() if line.startswith("│")]
    names = [r.name for r in list_recipes(None).recipes]
    firsts = [row.split("│")[1].strip() for row in rows if row.split("│")[1].strip()]  # not a folded line
    assert firsts == names  # each row's first cell is a whole recipe name, never 'Qwen3-…'
    assert max(len(line) for line in out.splitlines() if line[:1] in "┏┃┡│└") <= int(columns)


def test_status_pods_table_never_cuts_the_pod_name(cli, clean_env, monkeypatch) -> None:
    from miles_ray.services.backends.results import KubeStatus

    pods = [{"name": f"miles-h100-pool-a-gpu-group-worker-{s}", "role": "worker", "phase": "Pending", "ready": False,
             "node": "gke-gpu-pool-a-1234567890-abcd", "reason": "Unschedulable",
             "message": "0/12 nodes are available: 12 Insufficient nvidia.com/gpu"} for s in ("x7k2p", "q9r4t")]
    status = KubeStatus.model_construct(
        name="miles-h100-pool-a", backend="kubernetes", via="kuberay", raycluster="miles-h100-pool-a", namespace="ml",
        desired_workers=2, ready_workers=0, gpus_per_worker=8, desired_gpus=16, ready_gpus=0, state=None, pods=pods,
        ray_nodes_alive=None, polyaxon_uuid=None, queue={}, idle=None)
    monkeypatch.setattr("miles_ray.services.clusters.status", lambda *a, **k: status)
    monkeypatch.setattr("miles_ray.services.clusters.backend_for", lambda *a, **k: None)
    for columns in ("80", "60"):
        monkeypatch.setenv("COLUMNS", columns)
        code, out, err = cli("status", "--name", "miles-h100-pool-a")
        assert code == 0, err
        assert all(p["name"] in out for p in pods), out
        assert max(len(line) for line in out.splitlines() if line[:1] in "┏┃┡│└") <= int(columns)


def test_runs_with_no_records_says_how_to_make_one(cli, clean_env, monkeypatch) -> None:
    monkeypatch.setenv("MILES_RAY_STATE_DIR", str(clean_env / "state"))
    code, out, err = cli("runs")
    assert code == 0 and "no runs yet" in out and "miles-ray submit" in out and "┃" not in out
    code, out, _ = cli("runs", "-o", "json")
    assert code == 0 and json.loads(out) == []


def test_doctor_takes_the_cluster_as_name_like_every_cluster_verb(cli, clean_env) -> None:
    from miles_ray.cli.app import verb_command

    opts = {o for p in verb_command("doctor").params for o in p.opts}
    assert "--name" in opts
    code, out, err = cli("doctor", "miles-a", "--name", "miles-b")
    assert code == 2 and out == "" and err.count("\n") == 1
    assert "'miles-a'" in err and "--name 'miles-b'" in err


def test_runs_compare_names_its_arguments_in_the_tools_words(cli, clean_env) -> None:
    code, _, err = cli("runs", "compare", "a")
    assert code == 2 and err.count("\n") == 1
    assert "missing RUN_B (the second run to compare)" in err and "run_b" not in err
    assert "see 'miles-ray runs compare --help'" in err


@pytest.mark.parametrize("args, verb", [
    (["plan", "--nodes"], "plan"), (["submit", "--run"], "submit"), (["status", "--name"], "status"),
    (["plan", "-N"], "plan"),
])
def test_usage_errors_point_at_the_verbs_own_help(cli, clean_env, args, verb) -> None:
    code, _, err = cli(*args)
    assert code == 2 and err.count("\n") == 1
    assert f"see 'miles-ray {verb} --help'" in err and "requires an argument" not in err and "needs a value" in err


def test_not_found_is_one_exit_code_for_runs_and_clusters(cli, clean_env, monkeypatch) -> None:
    from miles_ray.core.errors import EXIT_CODES, EXIT_SERVICE

    monkeypatch.setenv("MILES_RAY_STATE_DIR", str(clean_env / "state"))
    code_run, _, err_run = cli("logs", "nope")
    assert "no run named 'nope'" in err_run
    code_cluster, _, err_cluster = cli("status", "--name", "nope", "--backend", "local")
    assert "no local cluster named nope" in err_cluster
    assert code_run == code_cluster == EXIT_SERVICE and "not found" in EXIT_CODES[EXIT_SERVICE]


@pytest.mark.parametrize("args, fragments", [
    (["plan", "--layout", "xml"], ["--layout", "'colocated'", "'disaggregated'", "'xml'"]),
    (["plan", "-o", "xml"], ["--output", "'table'", "'json'", "'yaml'"]),
    (["plan", "--nodes", "0"], ["--nodes must be at least 1"]),
    (["plan", "--nodes", "four"], ["--nodes must be a whole number"]),
])
def test_flag_errors_in_the_tools_words(cli, clean_env, args, fragments) -> None:
    code, _, err = cli(*args)
    assert code == 2 and err.count("\n") == 1
    assert all(f in err for f in fragments), err
    assert "Value error" not in err and "Input should" not in err and "Invalid value for" not in err


@pytest.mark.parametrize("text, fragment", [
    ("nodes: 0\n", "nodes in miles-ray.yaml: must be at least 1"),
    ("scheduler: xml\n", "scheduler in miles-ray.yaml: must be 'default' or 'volcano'"),
    ("tolerations: 3\n", "tolerations in miles-ray.yaml: must be a list"),
])
def test_config_errors_in_the_tools_words(cli, clean_env, text, fragment) -> None:
    (clean_env / "miles-ray.yaml").write_text(text)
    code, _, err = cli("plan")
    assert code == 2 and err.count("\n") == 1 and fragment in err, err
    assert "Input should" not in err


def test_unbalanced_extra_args_is_bad_input(cli, clean_env) -> None:
    code, out, err = cli("submit", "--extra-args", '"unbalanced', "--dry-run", "client")
    assert code == 2 and out == "" and err.count("\n") == 1
    assert "--extra-args" in err and "unexpected" not in err


def test_every_missing_input_in_one_line_before_any_progress(cli, clean_env) -> None:
    code, out, err = cli("up", "--backend", "kubernetes")
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and err.startswith("error: "), err  # no '[0s, 599s left] starting ...' first
    assert "no image" in err and "Ray version" in err and "--image" in err and "--ray-version" in err
    code, _, err = cli("up", "--backend", "kubernetes", "--image", IMAGE, "--ray-version", "2.60.0", "--nodes", "3")
    assert code == 2 and err.count("\n") == 1 and "infeasible" in err, err
    code, _, err = cli("up", "--single-node")
    assert code == 2 and err.count("\n") == 1 and "no image" in err, err
    code, _, err = cli("submit", "--run", "BAD")
    assert code == 2 and err.count("\n") == 1 and err.startswith("error: run name 'BAD'"), err


def test_doctor_refuses_a_bad_target_before_any_progress(cli, clean_env, monkeypatch) -> None:
    monkeypatch.setenv("MILES_RAY_STATE_DIR", str(clean_env / "state"))
    code, out, err = cli("doctor", "Bad_Name")
    assert code == 2 and out == "" and err.count("\n") == 1 and err.startswith("error: doctor Bad_Name"), err


def test_runs_compare_never_cuts_the_run_names(cli, long_runs, monkeypatch) -> None:
    monkeypatch.setenv("COLUMNS", "80")
    code, out, err = cli("runs", "compare", *long_runs)
    assert code == 0, err
    assert f"A: {long_runs[0]}\nB: {long_runs[1]}\n" in out  # too long for headers: named once, whole
    table_lines = [line for line in out.splitlines() if line[:1] in "┏┃┡│└"]
    assert "…" not in "".join(table_lines) and max(map(len, table_lines)) <= 80
    assert "/with/a/long/path" in "".join(line.split("│")[2].strip() for line in table_lines if line.count("│") > 3)
