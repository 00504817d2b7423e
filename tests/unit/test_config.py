"""Configuration: precedence flags > env > file > defaults, unknown keys refused, starter file valid."""

from __future__ import annotations

import pytest
import yaml

from miles_ray.core.config import STARTER, MilesRayConfig, load_config
from miles_ray.core.errors import ConfigError
from tests.conftest import REPO


def test_defaults_follow_the_polyaxon_miles_guide() -> None:
    """The defaults are the guide's single-node component: its connection, mount, dirs, GPUs and recipe."""
    guide = yaml.safe_load((REPO / "tests" / "data" / "polyaxon_miles_guide_single_node.yaml").read_text())
    run = guide["run"]
    args = run["container"]["args"]
    flag = {args[i]: args[i + 1] for i in range(0, len(args), 2)}
    cfg = load_config({}, environ={})
    assert run["connections"] == [cfg.connection] == ["miles-data"]
    assert cfg.mount_path == "/mnt/miles"
    assert (cfg.model_dir, cfg.data_dir) == (flag["--model-dir"], flag["--data-dir"])
    assert cfg.output_dir("{{ globals.uuid }}") == flag["--output-dir"]
    assert cfg.gpus_per_node == int(flag["--num-gpus-per-node"]) == 8
    assert cfg.recipe == flag["--model-name"] == "Qwen3-4B"
    assert cfg.miles_root == run["container"]["workingDir"]


def test_precedence(tmp_path) -> None:
    f = tmp_path / "c.yaml"
    f.write_text("nodes: 2\ngpus_per_node: 4\nname: from-file\nnamespace: ns-file\n")
    env = {"MILES_RAY_NODES": "3", "MILES_RAY_NAME": "from-env"}
    cfg = load_config({"nodes": 5}, str(f), env)
    assert cfg.nodes == 5            # flag beats env and file
    assert cfg.name == "from-env"    # env beats file
    assert cfg.gpus_per_node == 4    # file beats default
    assert cfg.namespace == "ns-file"
    assert cfg.head_cpus == 8        # default


def test_config_file_found_in_cwd_and_via_env(tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "miles-ray.yaml").write_text("nodes: 7\n")
    assert load_config({}, environ={}).nodes == 7
    other = tmp_path / "other.yaml"
    other.write_text("nodes: 9\n")
    assert load_config({}, environ={"MILES_RAY_CONFIG": str(other)}).nodes == 9


def test_env_complex_values_are_json() -> None:
    cfg = load_config({}, environ={"MILES_RAY_NODE_SELECTOR": '{"gpu": "h100"}'})
    assert cfg.node_selector == {"gpu": "h100"}
    with pytest.raises(ConfigError, match="MILES_RAY_ENV must be JSON"):
        load_config({}, environ={"MILES_RAY_ENV": "A=1"})


@pytest.mark.parametrize("text, match", [
    ("nodse: 2\n", "unknown key.*nodse.*did you mean 'nodes'"),
    ("- 1\n- 2\n", "must be a mapping"),
    ("nodes: [1\n", "not valid YAML"),
    ("nodes: 0\n", "nodes in .*must be at least 1"),
    ("nodes: lots\n", "nodes in .*must be a whole number"),
    ("a: &x [1]\nb: *x\n", "aliases"),
    ("mount_path: relative/path\n", "absolute path"),
    ("runs_dir: ../../etc\n", "relative path inside mount_path"),
    ("cpus_per_node: 8\n", "gpus_per_node 8 \\+ 1"),
    ("memory_per_node: lots\n", "Kubernetes quantity"),
    ("memory_per_node: \"2Gi\\n\"\n", "Kubernetes quantity"),
    ("cpu_request_per_node: 500x\n", "not a CPU quantity"),
    ("cpu_request_per_node: \"0\"\n", "not a CPU quantity"),
    ("cpu_request_per_node: \"65\"\n", "Kubernetes refuses a CPU request above the limit"),
    ("name: \"ok\\n\"\n", "DNS-1035"),
    ("name: Bad_Name\n", "DNS-1035"),
    ("name: " + "a" * 54 + "\n", "at most 53"),
    ("tolerations: [{keyy: x}]\n", "tolerations"),
])
def test_bad_files_are_one_clear_error(tmp_path, text: str, match: str) -> None:
    f = tmp_path / "c.yaml"
    f.write_text(text)
    with pytest.raises(ConfigError, match=match) as info:
        load_config({}, str(f), {})
    assert "\n" not in str(info.value)


def test_unknown_env_var_and_flag_source_named() -> None:
    with pytest.raises(ConfigError, match="unknown environment variable MILES_RAY_NODEZ"):
        load_config({}, environ={"MILES_RAY_NODEZ": "1"})
    with pytest.raises(ConfigError, match="^MILES_RAY_NODES: "):
        load_config({}, environ={"MILES_RAY_NODES": "x"})
    with pytest.raises(ConfigError, match="^--gpus-per-node: "):
        load_config({"gpus_per_node": 0}, environ={})


def test_oversized_file_refused(tmp_path) -> None:
    f = tmp_path / "big.yaml"
    f.write_text("# " + "x" * (1 << 20) + "\n")
    with pytest.raises(ConfigError, match="the limit is"):
        load_config({}, str(f), {})


def test_missing_file() -> None:
    with pytest.raises(ConfigError, match="does not exist"):
        load_config({}, "/nonexistent/miles-ray.yaml", {})


def test_starter_file_is_a_valid_config_with_the_defaults(tmp_path) -> None:
    f = tmp_path / "miles-ray.yaml"
    f.write_text(STARTER)
    cfg = load_config({}, str(f), {})
    assert cfg == MilesRayConfig()
    # every config key is documented in the starter file
    for key in MilesRayConfig.model_fields:
        assert key in STARTER or key in {"allow_unpinned", "recipe_file", "rollout_gpus", "worker_group"}, key
