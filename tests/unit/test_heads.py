"""One way to reach a head: the address grammar (miles_ray.core.heads), which head a verb picks
(miles_ray.services.heads) and how open_head reaches each kind (miles_ray.adapters.ray_head). The port-forward
itself runs against the real Kubernetes API in tests/e2e/test_k8s_probe.py; here every path that needs no
cluster runs for real (a missing kubeconfig and a missing local cluster are real failures of the real code)."""

from __future__ import annotations

import sys

import pytest

from miles_ray.adapters.ray_head import open_head
from miles_ray.core.config import load_config
from miles_ray.core.errors import ClusterError, ConfigError
from miles_ray.core.heads import HeadAddress, in_cluster_url, k8s_address, parse_head, service_url
from miles_ray.services.heads import dashboard_address, resolve_address
from miles_ray.services.probes import payload_python


def test_the_address_grammar():
    assert parse_head("http://10.0.0.5:8265/") == HeadAddress("url", "http://10.0.0.5:8265", url="http://10.0.0.5:8265")
    assert parse_head("https://ray.example.com") == HeadAddress("url", "https://ray.example.com",
                                                                 url="https://ray.example.com")
    assert parse_head("k8s://ml/q4") == HeadAddress("kubernetes", "k8s://ml/q4", namespace="ml", name="q4")
    assert parse_head("http://q4-head-svc.ml.svc:8265") == HeadAddress(
        "kubernetes", "http://q4-head-svc.ml.svc:8265", url="http://q4-head-svc.ml.svc:8265", namespace="ml",
        name="q4")
    assert parse_head("http://plx-operation-ab12-head-svc.ml.svc.cluster.local:8265").name == "plx-operation-ab12"
    assert parse_head("local://miles") == HeadAddress("local", "local://miles", name="miles")
    assert k8s_address("ml", "q4") == "k8s://ml/q4" and service_url("ml", "q4") == "http://q4-head-svc.ml.svc:8265"


@pytest.mark.parametrize("bad", ["head:6379", "ray://head:10001", "k8s://ml", "k8s://ml/", "k8s://ML/q4",
                                 "k8s://ml/q4/x", "local://", "local://Bad Name", "", "ftp://x"])
def test_what_is_not_a_head_address(bad):
    with pytest.raises(ConfigError, match="--address") as info:
        parse_head(bad, "--address")
    assert "k8s://NAMESPACE/RAYCLUSTER" in (info.value.hint or "")


def test_where_the_job_sees_the_head_and_which_python_runs_payloads():
    assert in_cluster_url("k8s://ml/q4") == "http://q4-head-svc.ml.svc:8265"
    assert in_cluster_url("http://q4-head-svc.ml.svc:8265") == "http://q4-head-svc.ml.svc:8265"
    assert in_cluster_url("http://10.0.0.5:8265") == "http://10.0.0.5:8265"
    for here in ("http://127.0.0.1:8265", "http://127.0.0.2:1234", "http://localhost:8265", "local://miles"):
        assert parse_head(here).on_this_machine and payload_python(here) == sys.executable
    for elsewhere in ("http://10.0.0.5:8265", "k8s://ml/q4", "http://q4-head-svc.ml.svc:8265"):
        assert not parse_head(elsewhere).on_this_machine and payload_python(elsewhere) == "python3"


@pytest.fixture
def state(monkeypatch, tmp_path):
    monkeypatch.setenv("MILES_RAY_STATE_DIR", str(tmp_path / "state"))
    for key in ("RAY_ADDRESS", "KUBERNETES_SERVICE_HOST"):
        monkeypatch.delenv(key, raising=False)
    return tmp_path / "state"


def test_which_head_a_verb_picks(state, monkeypatch):
    cfg = load_config({"name": "q4", "namespace": "ml"}, environ={})
    assert resolve_address(cfg, "k8s://ml/q4") == ("kuberay", "k8s://ml/q4")
    assert resolve_address(cfg, "http://q4-head-svc.ml.svc:8265") == ("kuberay", "http://q4-head-svc.ml.svc:8265")
    assert resolve_address(cfg, "http://10.0.0.5:8265/") == ("address", "http://10.0.0.5:8265")
    monkeypatch.setenv("RAY_ADDRESS", "k8s://ml/other")
    assert resolve_address(cfg, None) == ("kuberay", "k8s://ml/other")
    monkeypatch.delenv("RAY_ADDRESS")
    # the cluster made by 'up' on Kubernetes: a port-forward from outside, the service inside
    assert resolve_address(cfg, None, "kubernetes") == ("kuberay", "k8s://ml/q4")
    assert dashboard_address(cfg, "auto") == ("kuberay", "k8s://ml/q4")  # no local cluster of that name
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "10.96.0.1")
    assert dashboard_address(cfg, "kubernetes") == ("kuberay", "http://q4-head-svc.ml.svc:8265")
    with pytest.raises(ClusterError, match="no local cluster named nope"):
        resolve_address(cfg, "local://nope")


def test_open_head_reaches_each_kind(state, monkeypatch, tmp_path):
    with open_head("http://10.0.0.5:8265/") as url:
        assert url == "http://10.0.0.5:8265"
    # inside the cluster the head service resolves: used as is, no port-forward
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "10.96.0.1")
    with open_head("http://q4-head-svc.ml.svc:8265") as url:
        assert url == "http://q4-head-svc.ml.svc:8265"
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST")
    # outside: through the Kubernetes API with the given kubeconfig (here: one that does not exist)
    missing = tmp_path / "no-kubeconfig"
    for address in ("k8s://ml/q4", "http://q4-head-svc.ml.svc:8265"):
        with pytest.raises(ConfigError, match=f"kubeconfig {missing} does not exist"):
            with open_head(address, kubeconfig=str(missing)):
                pytest.fail("reached a head without a Kubernetes API")
    with pytest.raises(ClusterError, match="no local cluster named nope"):
        with open_head("local://nope"):
            pytest.fail("reached a local cluster that does not exist")
