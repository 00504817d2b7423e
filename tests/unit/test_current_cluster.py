"""The current cluster (issue 25, part A): 'up' makes it current, every cluster verb defaults to it below
--name, MILES_RAY_NAME and the config file's name; 'down' clears it; 'clusters' lists what this machine knows
(offline); an error naming a missing cluster names the ones that exist. No cluster is started here (the
embedded-cluster tier is tests/integration/test_first_hour.py)."""

from __future__ import annotations

import json

import pytest

from miles_ray.adapters import state
from miles_ray.cli.common import Backend
from miles_ray.cli.options import ClusterFlags
from miles_ray.core.config import MilesRayConfig
from miles_ray.core.errors import NotFound
from miles_ray.services import known_clusters as kc


@pytest.fixture
def home(clean_env, monkeypatch):
    monkeypatch.setenv("MILES_RAY_STATE_DIR", str(clean_env / "state"))
    return clean_env


def local_cluster(name: str) -> None:
    """What 'up --backend local' leaves in the state dir, as far as listing is concerned."""
    state.atomic_write_json(state.local_clusters_dir() / f"{name}.json", {"name": name})


def test_without_a_current_cluster_the_default_name_is_miles(home):
    assert kc.current() is None
    assert ClusterFlags().config(None).name == "miles"


def test_up_makes_the_cluster_current_and_verbs_default_to_it(home):
    kc.make_current(MilesRayConfig(name="ux"), "local", True)
    assert json.loads(state.current_cluster_path().read_text())["name"] == "ux"
    assert ClusterFlags().config(None).name == "ux"
    assert ClusterFlags(backend=Backend.local).config(None).name == "ux"
    # a backend choice the current cluster is not on: the built-in default
    assert ClusterFlags(backend=Backend.kubernetes).config(None).name == "miles"


def test_a_kubernetes_current_cluster_brings_its_namespace_and_context(home):
    kc.make_current(MilesRayConfig(name="big", namespace="ml", kube_context="prod"), "kuberay", False)
    cfg = ClusterFlags().config(None)
    assert (cfg.name, cfg.namespace, cfg.kube_context) == ("big", "ml", "prod")
    cfg = ClusterFlags(namespace="other").config(None)
    assert (cfg.name, cfg.namespace, cfg.kube_context) == ("big", "other", "prod")


def test_flags_env_and_config_file_name_win_over_the_current_cluster(home, monkeypatch):
    kc.make_current(MilesRayConfig(name="ux"), "local", True)
    assert ClusterFlags(name="other").config(None).name == "other"
    monkeypatch.setenv("MILES_RAY_NAME", "fromenv")
    assert ClusterFlags().config(None).name == "fromenv"
    monkeypatch.delenv("MILES_RAY_NAME")
    (home / "miles-ray.yaml").write_text("name: fromfile\n")
    assert ClusterFlags().config(None).name == "fromfile"
    (home / "miles-ray.yaml").write_text("recipe: Qwen3-4B\n")  # a file without a name: the current one
    assert ClusterFlags().config(None).name == "ux"


def test_down_of_the_current_cluster_clears_it_and_of_another_does_not(home):
    kc.make_current(MilesRayConfig(name="ux"), "local", True)
    kc.forget(MilesRayConfig(name="other"), True)
    kc.forget(MilesRayConfig(name="ux"), False)  # a Kubernetes cluster of that name: not it
    assert kc.current().name == "ux"
    kc.forget(MilesRayConfig(name="ux"), True)
    assert kc.current() is None and not state.current_cluster_path().exists()


def test_an_unreadable_current_file_is_no_current_cluster(home):
    state.current_cluster_path().parent.mkdir(parents=True)
    state.current_cluster_path().write_text("{not json")
    assert kc.current() is None
    assert ClusterFlags().config(None).name == "miles"


def test_clusters_lists_local_and_kubernetes_clusters_offline(home, cli):
    local_cluster("ux")
    state.write_parked_local("sleepy", {"nodes": 1})
    state.write_kube_cluster(None, "ml", "big", {"name": "big", "via": "kuberay", "raycluster": "big"})
    state.write_kube_cluster("prod", "team", "plx", {"name": "plx", "via": "polyaxon", "raycluster": "plx-operation-1",
                                                     "parked": True})
    state.write_kube_down(None, "ml", "gone", {"polyaxon_uuid": "1"})
    kc.make_current(MilesRayConfig(name="ux"), "local", True)
    code, out, err = cli("clusters", "-o", "json")
    assert code == 0, err
    data = json.loads(out)
    assert data["current"] == "ux"
    rows = {(c["name"], c["backend"]): c for c in data["clusters"]}
    assert rows[("ux", "local")]["current"] is True and rows[("ux", "local")]["state"] == "running"
    assert rows[("sleepy", "local")]["state"] == "parked"
    assert rows[("big", "kuberay")]["namespace"] == "ml" and rows[("big", "kuberay")]["state"] == "running"
    assert rows[("plx", "polyaxon")]["context"] == "prod" and rows[("plx", "polyaxon")]["state"] == "parked"
    assert rows[("gone", "polyaxon")]["state"] == "down"
    assert data["clusters"][0]["name"] == "ux"  # the current one first
    assert sum(c["current"] for c in data["clusters"]) == 1


def test_clusters_table_marks_the_current_one_and_never_cuts_the_name(home, cli, monkeypatch):
    from miles_ray.cli import common

    monkeypatch.setattr(common.out, "_width", 40)
    long = "a-very-long-cluster-name-that-does-not-fit-in-40"
    local_cluster(long)
    kc.make_current(MilesRayConfig(name=long), "local", True)
    code, out, _ = cli("clusters")
    assert code == 0
    assert long in out.replace("\n", "") and long in out  # whole, on one line
    assert out.splitlines()[1].startswith("*")


def test_clusters_with_none_says_how_to_make_one(home, cli):
    code, out, _ = cli("clusters")
    assert code == 0 and "miles-ray up --backend local" in out


def test_an_error_naming_a_missing_cluster_names_the_known_ones(home, cli):
    local_cluster("ux")
    kc.make_current(MilesRayConfig(name="ux"), "local", True)
    e = kc.naming_known(NotFound("no local cluster named typo is running", hint="start one"))
    assert "ux (local, running, current)" in e.hint and e.hint.startswith("start one; ")
    other = NotFound("no run named x")
    assert kc.naming_known(other).hint is None
    code, _, err = cli("env", "typo", "--backend", "local")
    assert code != 0 and "no local cluster named typo" in err and "ux (local" in err


def test_env_of_a_kubernetes_cluster_without_a_kubeconfig_is_one_error_line(home, cli, monkeypatch):
    monkeypatch.setenv("KUBECONFIG", str(home / "missing"))
    code, out, err = cli("env", "big", "--backend", "kubernetes")
    assert code != 0 and out == "" and err.count("error:") == 1


def test_env_port_forward_is_for_kubernetes_only(home, cli):
    local_cluster("ux")
    state.atomic_write_json(state.local_clusters_dir() / "ux.json",
                            {"name": "ux", "dashboard_url": "http://127.0.0.1:1", "gcs_address": "127.0.0.1:2"})
    code, _, err = cli("env", "ux", "--port-forward")
    assert code == 2 and "--port-forward applies to a cluster on Kubernetes" in err


def test_env_prints_shell_lines_and_never_the_token(home, cli):
    token = state.local_clusters_dir() / "ux.token"
    token.parent.mkdir(parents=True)
    token.write_text("s3cret-token-value")
    state.atomic_write_json(state.local_clusters_dir() / "ux.json",
                            {"name": "ux", "dashboard_url": "http://127.0.0.1:8265", "gcs_address": "127.0.0.1:6379",
                             "auth": "token", "token_path": str(token)})
    kc.make_current(MilesRayConfig(name="ux"), "local", True)
    code, out, _ = cli("env")
    assert code == 0
    assert "export RAY_API_SERVER_ADDRESS=http://127.0.0.1:8265" in out
    assert "export RAY_ADDRESS=127.0.0.1:6379" in out
    assert "export RAY_AUTH_MODE=token" in out and f"export RAY_AUTH_TOKEN_PATH={token}" in out
    assert "s3cret" not in out
    code, out, _ = cli("env", "--shell", "fish")
    assert "set -gx RAY_AUTH_MODE token;" in out
    code, out, _ = cli("env", "-o", "json")
    assert json.loads(out)["variables"]["RAY_AUTH_TOKEN_PATH"] == str(token)


def test_env_of_a_cluster_without_auth_has_no_auth_lines(home, cli):
    state.atomic_write_json(state.local_clusters_dir() / "open.json",
                            {"name": "open", "dashboard_url": "http://127.0.0.1:8265", "gcs_address": "127.0.0.1:6379",
                             "auth": "none"})
    code, out, _ = cli("env", "open")
    assert code == 0 and "RAY_ADDRESS" in out and "RAY_AUTH" not in out


def test_ray_api_server_address_wins_over_ray_address(home, monkeypatch):
    from miles_ray.services.heads import resolve_address

    monkeypatch.setenv("RAY_ADDRESS", "127.0.0.1:6379")  # the GCS address 'miles-ray env' gives 'ray status'
    monkeypatch.setenv("RAY_API_SERVER_ADDRESS", "http://127.0.0.1:8265")
    assert resolve_address(MilesRayConfig(), None) == ("address", "http://127.0.0.1:8265")
