"""check-data and comm-check reach a head given as ``k8s://NAMESPACE/RAYCLUSTER`` (or found through the cluster
made by ``up``) the same way as submit/logs/status: through a port-forward to the head pod via the Kubernetes API.

What is real here: the Kubernetes API server, the KubeRay operator that makes the head pod and its service, kwok
(which runs the fake nodes and marks their pods Running), miles-ray's whole path -- address parsing, the
kubeconfig/context/namespace flags, finding the running head pod, opening the port-forward stream (a websocket
upgrade of pods/portforward) through the API server -- and the error the user sees. What is not: kwok nodes have no
kubelet to forward to and run no containers, so the API server answers the upgrade with HTTP 500 "error dialing
backend" and no Ray head could answer anyway; the verbs must end in one typed, clear error naming the head pod and
the API server's reason (never "unknown url type: k8s", never a traceback). A Ray head answering through the
forward needs real pods (kubelet + containerd), which this control plane does not have."""

from __future__ import annotations

import json

import pytest

from tests.e2e.test_kube_cli import kube_args, up_args

pytestmark = pytest.mark.e2e


def head_pod(core_v1, namespace: str) -> str:
    [pod] = core_v1.list_namespaced_pod(namespace, label_selector="ray.io/cluster=miles-e2e,ray.io/node-type=head").items
    return pod.metadata.name


def context_of(kubeconfig) -> str:
    import yaml

    return yaml.safe_load(open(kubeconfig))["current-context"]


def one_error(code: int, err: str) -> str:
    """The single error line of a failed verb."""
    lines = [line for line in err.splitlines() if line.startswith("error:")]
    assert code == 1 and len(lines) == 1 and "Traceback" not in err, err
    assert "unknown url type" not in err
    return lines[0]


@pytest.fixture
def cluster(kube_env, cli, core_v1, namespace, shared_volume, wait_for):
    code, _, err = cli(*up_args(namespace, 1))
    assert code == 0, err
    return {"namespace": namespace, "pod": head_pod(core_v1, namespace), "kubeconfig": str(kube_env.kubeconfig),
            "context": context_of(kube_env.kubeconfig)}


@pytest.mark.parametrize("verb", ["check-data", "comm-check"])
def test_k8s_address_goes_through_the_port_forward_and_names_the_pod(cluster, cli, verb):
    ns, pod = cluster["namespace"], cluster["pod"]
    code, _, err = cli(verb, "--address", f"k8s://{ns}/miles-e2e", "--kubeconfig", cluster["kubeconfig"],
                       "--context", cluster["context"], "--timeout", "10")
    line = one_error(code, err)
    assert f"cannot port-forward to pod {ns}/{pod} port 8265 through the Kubernetes API: HTTP 500" in line
    assert "error dialing backend" in line  # the API server's own words: it tried to reach the pod's node


@pytest.mark.parametrize("verb", ["check-data", "comm-check"])
def test_the_cluster_made_by_up_is_reached_the_same_way(cluster, cli, verb):
    """No --address: the cluster recorded by 'up' (k8s://NAMESPACE/RAYCLUSTER from outside the cluster)."""
    ns, pod = cluster["namespace"], cluster["pod"]
    code, _, err = cli(verb, "--backend", "kubernetes", *kube_args(ns), "--timeout", "10")
    line = one_error(code, err)
    assert f"{ns}/{pod}" in line and "port-forward" in line


def test_the_head_service_url_is_forwarded_from_outside_the_cluster(cluster, cli):
    ns, pod = cluster["namespace"], cluster["pod"]
    code, _, err = cli("check-data", "--address", f"http://miles-e2e-head-svc.{ns}.svc:8265", "--timeout", "10")
    line = one_error(code, err)
    assert f"{ns}/{pod}" in line and "port-forward" in line


def test_what_cannot_be_reached_is_said_plainly(cluster, cli):
    ns = cluster["namespace"]
    code, _, err = cli("check-data", "--address", f"k8s://{ns}/nothing-here")
    line = one_error(code, err)
    assert f"RayCluster {ns}/nothing-here has no head pod" in line
    code, _, err = cli("comm-check", "--address", f"k8s://{ns}/miles-e2e", "--context", "no-such-ctx")
    assert code == 2 and "context 'no-such-ctx'" in err and "Traceback" not in err


def test_doctor_reports_the_forward_that_got_no_answer(cluster, cli):
    """doctor on a KubeRay cluster tries the Ray side through the same port-forward; here it cannot answer, so
    the data checks are skipped with the reason (which names the head pod), not reported as a problem."""
    ns, pod = cluster["namespace"], cluster["pod"]
    code, out, err = cli("doctor", "miles-e2e", "--backend", "kubernetes", "--namespace", ns, "-o", "json")
    rep = json.loads(out)
    data = {f["check"]: f for f in rep["findings"]}["data"]
    assert data["status"] == "skipped" and rep["address"] == f"k8s://{ns}/miles-e2e"
    assert any(f"{ns}/{pod}" in e for e in data["evidence"]), data
