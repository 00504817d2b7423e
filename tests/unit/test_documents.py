"""One document pipeline: what `render` prints is what `up` creates, because both come from
services.documents.prepare_documents. The RayCluster `render -F kuberay` prints equals the one `up --via kuberay`
creates (its dry runs return it; tests/e2e/test_kube_cli.py runs that `up` against a real API server); the Polyaxon
operation `render -F polyaxon` prints equals the one `up --via polyaxon` sends, here through the real Polyaxon API
server (no kubeconfig: the Kubernetes preflight is skipped, the Polyaxon one is not); the same for the single-node
job."""

from __future__ import annotations

import json

import pytest

from tests.conftest import IMAGE

RAY = "2.60.0"
CONFIGS = {  # render/up flags -> the same settings as config keys
    "colocated": (["--nodes", "4"], {"nodes": 4}),
    "disaggregated": (["--nodes", "4", "--layout", "disaggregated", "--rollout-nodes", "2"],
                      {"nodes": 4, "layout": "disaggregated", "rollout_nodes": 2}),
    "kueue-queue": (["--nodes", "2", "--queue", "team-a"], {"nodes": 2, "queue": "team-a"}),
    "volcano-no-auth": (["--nodes", "1", "--scheduler", "volcano", "--queue", "q", "--ray-auth", "none"],
                        {"nodes": 1, "scheduler": "volcano", "queue": "q", "ray_auth": "none"}),
}


def rendered(cli, fmt: str, flags: list[str], *extra: str) -> dict:
    code, out, err = cli("render", "-F", fmt, *flags, "--image", IMAGE, "--ray-version", RAY, "--name", "docs",
                         *extra, "-o", "json")
    assert code == 0, err
    return json.loads(out)


def config(settings: dict):
    from miles_ray.core.config import load_config

    return load_config({**settings, "image": IMAGE, "ray_version": RAY, "name": "docs"}, environ={})


@pytest.mark.parametrize("case", list(CONFIGS))
def test_render_kuberay_is_what_up_via_kuberay_creates(cli, clean_env, case):
    from miles_ray.services import documents

    flags, settings = CONFIGS[case]
    # k8s_clusters.up creates (and its dry runs return) exactly what this returns
    assert rendered(cli, "kuberay", flags) == documents.prepare_cluster(config(settings), "kuberay").raycluster


@pytest.mark.parametrize("case", list(CONFIGS))
def test_render_polyaxon_is_what_up_via_polyaxon_sends(cli, clean_env, case):
    from miles_ray.services import documents

    flags, settings = CONFIGS[case]
    assert rendered(cli, "polyaxon", flags) == documents.prepare_cluster(config(settings), "polyaxon").operation


def test_render_all_is_each_format(cli, clean_env):
    flags, _ = CONFIGS["disaggregated"]
    assert rendered(cli, "all", flags) == [rendered(cli, f, flags) for f in ("polyaxon", "polyaxon-cr", "kuberay")]


def test_the_single_node_job_is_prepared_alone():
    from miles_ray.core.prepare import Document, prepare

    with pytest.raises(ValueError, match="prepared alone"):
        prepare(config({}), [Document.single_node, Document.raycluster])


# -- through the real Polyaxon API server ------------------------------------------------------------------------

PROJECT = "miles-documents"


@pytest.fixture
def px(polyaxon_server, monkeypatch, tmp_path):
    """The real Polyaxon API server, and no Kubernetes at all (the Kubernetes preflight is skipped)."""
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "no-such-dir" / "kubeconfig"))
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    monkeypatch.setenv("MILES_RAY_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.setenv("POLYAXON_HOST", polyaxon_server.host)
    monkeypatch.setenv("POLYAXON_AGENT_CONNECTIONS", json.dumps(polyaxon_server.connections))
    for key in ("MILES_RAY_CONFIG", "RAY_ADDRESS"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.chdir(tmp_path)
    polyaxon_server.create_project(PROJECT)
    (tmp_path / "px.yaml").write_text(f"polyaxon_project: {PROJECT}\n")
    return polyaxon_server


@pytest.mark.polyaxon
@pytest.mark.parametrize("case", ["colocated", "volcano-no-auth"])
def test_up_via_polyaxon_dry_run_sends_what_render_prints(px, cli, case):
    flags, _ = CONFIGS[case]
    code, out, err = cli("up", "--via", "polyaxon", *flags, "--image", IMAGE, "--ray-version", RAY, "--name", "docs",
                         "-c", "px.yaml", "--dry-run", "client", "-o", "json")
    assert code == 0, err
    result = json.loads(out)
    assert result["created"] is False
    assert result["operation"] == rendered(cli, "polyaxon", flags, "-c", "px.yaml")


@pytest.mark.polyaxon
def test_up_single_node_dry_run_sends_what_render_prints(px, cli):
    code, out, err = cli("up", "--single-node", "--image", IMAGE, "--name", "docs-single", "-c", "px.yaml",
                         "--dry-run", "client", "-o", "json")
    assert code == 0, err
    result = json.loads(out)
    assert list(result) == ["name", "kind", "project", "warnings", "notices", "dry_run", "created", "operation"]
    assert result["created"] is False and result["dry_run"] == "client"
    code, out, err = cli("render", "--single-node", "--image", IMAGE, "--name", "docs-single", "-c", "px.yaml",
                         "-o", "json")
    assert code == 0, err
    assert result["operation"] == json.loads(out)
