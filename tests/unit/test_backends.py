"""The cluster backend seam: which backend a cluster is on (the one dispatch) and the typed results' JSON (the
keys the dicts they replace had, in the same order)."""

from __future__ import annotations

import pytest

from miles_ray.adapters import state as st
from miles_ray.core.config import load_config
from miles_ray.services.backends import for_cluster
from miles_ray.services.backends.kuberay import KubeRayBackend
from miles_ray.services.backends.local import LocalBackend
from miles_ray.services.backends.polyaxon import PolyaxonBackend
from miles_ray.services.backends.results import KubeScale, KubeStatus, KubeUp, ParkResult, Preflight
from miles_ray.services.heads import pick_backend


@pytest.fixture
def cfg(monkeypatch, tmp_path):
    monkeypatch.setenv("MILES_RAY_STATE_DIR", str(tmp_path / "state"))
    return load_config({"name": "q4", "namespace": "ml"}, environ={})


def test_auto_is_the_local_cluster_running_or_parked_else_kubernetes(cfg):
    assert isinstance(for_cluster(cfg, "auto"), KubeRayBackend) and pick_backend("auto", cfg) == "kubernetes"
    st.write_parked_local(cfg.name, {"name": cfg.name, "nodes": 1, "gpus_per_node": 2, "cpus_per_node": 3})
    assert isinstance(for_cluster(cfg, "auto"), LocalBackend) and pick_backend("auto", cfg) == "local"
    assert isinstance(for_cluster(cfg, "kubernetes"), KubeRayBackend)  # an explicit choice wins
    st.remove_parked_local(cfg.name)
    assert isinstance(for_cluster(cfg, "local"), LocalBackend)


def test_on_kubernetes_the_record_says_which_backend_made_it(cfg):
    assert isinstance(for_cluster(cfg, "kubernetes"), KubeRayBackend)  # no record: a RayCluster of that name
    st.write_kube_cluster(cfg.kube_context, cfg.namespace, cfg.name,
                          {"name": cfg.name, "via": "polyaxon", "raycluster": "plx-operation-" + "a" * 32})
    assert isinstance(for_cluster(cfg, "auto"), PolyaxonBackend)
    assert isinstance(for_cluster(cfg, "auto", via="kuberay"), KubeRayBackend)  # 'up --via' decides
    st.remove_kube_cluster(cfg.kube_context, cfg.namespace, cfg.name)
    st.write_kube_down(cfg.kube_context, cfg.namespace, cfg.name, {"polyaxon_uuid": "a" * 32})
    assert isinstance(for_cluster(cfg, "auto"), PolyaxonBackend)  # only Polyaxon-made clusters leave that


def test_results_keep_the_order_their_keys_were_set():
    park = ParkResult(name="c", raycluster="c", namespace="ml", parked=True)
    park.already_parked = True
    assert list(park.to_json()) == ["name", "raycluster", "namespace", "parked", "already_parked"]
    local = ParkResult(name="c", backend="local", parked=True, kept={"nodes": 1})
    local.idle = None
    assert list(local.to_json()) == ["name", "backend", "parked", "kept", "idle"]
    up = KubeUp(name="c", namespace="ml", via="polyaxon", warnings=[], preflight=Preflight(skipped="no kubeconfig"),
                notices=["n"], kubernetes=False)
    assert list(up.to_json()) == ["name", "namespace", "via", "warnings", "preflight", "notices", "kubernetes"]


def test_a_scale_result_merges_the_status_after_its_own_keys():
    scale = KubeScale(**{"name": "c", "raycluster": "c", "from": 1, "to": 2, "adjusted": [], "gpus_per_worker": 8})
    assert scale.to_json() == {"name": "c", "raycluster": "c", "from": 1, "to": 2, "adjusted": [],
                               "gpus_per_worker": 8} and not scale.waited
    status = KubeStatus(name="c", backend="kubernetes", via="kuberay", raycluster="c", namespace="ml",
                        desired_workers=2, ready_workers=2, gpus_per_worker=8, desired_gpus=16, ready_gpus=16,
                        state="ready", conditions=[], generation=2, observed_generation=2, pods=[],
                        head_service="c-head-svc", dashboard_url="http://c-head-svc.ml.svc:8265", nodes=[],
                        gpu_node_count=2, total_gpus=16)
    status.ray = {"alive": 2}
    scale.with_status(status)
    keys = list(scale.to_json())
    assert keys[:6] == ["name", "raycluster", "from", "to", "adjusted", "gpus_per_worker"]
    assert keys[6:] == [k for k in status.to_json() if k not in keys[:6]] and scale.waited
