"""The in-cluster launcher job (submit --mode launcher on a Kubernetes head) references the Secret that holds the
token of the head it targets -- not one named after the configured cluster name.

On the real API server with the real KubeRay operator: ``up --via kuberay`` makes RayCluster tok-head with token
auth; KubeRay creates the token Secret and gives the head pod RAY_AUTH_TOKEN from it. A submit that names ANOTHER
cluster (--name other) but targets that head (--address k8s://NS/tok-head) renders a launcher job whose
RAY_AUTH_TOKEN comes from the Secret the head pod itself reads (what miles-ray finds in the pod spec with a
kubeconfig, and derives from this machine's record without one). Ray does not run in kwok pods, so the submit is
a client dry run (the job as it would be created); the live read of the head pod is checked separately."""

from __future__ import annotations

import json

import pytest

from tests.conftest import IMAGE
from tests.e2e.test_kube_cli import up_args

pytestmark = pytest.mark.e2e


def test_the_launcher_job_reads_the_token_secret_of_the_head_it_targets(kube_env, cli, core_v1, namespace,
                                                                        shared_volume, monkeypatch):
    from miles_ray.adapters.ray_head import kube_head_auth
    from miles_ray.core.config import load_config
    from miles_ray.services.heads import recorded_head_auth

    code, out, err = cli(*up_args(namespace, 1, "tok-head"))
    assert code == 0, err
    address = f"k8s://{namespace}/tok-head"
    # what the head pod KubeRay made runs with: token auth, RAY_AUTH_TOKEN from the Secret KubeRay made
    mode, secret = kube_head_auth(address)
    assert (mode, secret) == ("token", "tok-head")
    assert core_v1.read_namespaced_secret(secret, namespace).data["auth_token"]
    # without reading the cluster, this machine's record of 'up' names the same Secret, whatever --name says
    other = load_config({"name": "other", "namespace": namespace}, environ={})
    assert recorded_head_auth(other, address) == ("token", "tok-head")

    code, out, err = cli("submit", "--mode", "launcher", "--run", "tok-1", "--nodes", "1", "--image", IMAGE,
                         "--address", address, "--name", "other", "--namespace", namespace,
                         "--dry-run", "client", "-o", "json")
    assert code == 0, err
    env = json.loads(out)["operation"]["component"]["run"]["container"]["env"]
    auth = {e["name"]: e for e in env if e["name"].startswith("RAY_AUTH")}
    assert auth["RAY_AUTH_MODE"]["value"] == "token"
    assert auth["RAY_AUTH_TOKEN"]["valueFrom"]["secretKeyRef"] == {"name": "tok-head", "key": "auth_token"}

    # a head in another namespace: the job's pod could not read its Secret -- refused before anything is made
    code, out, err = cli("submit", "--mode", "launcher", "--run", "tok-2", "--nodes", "1", "--image", IMAGE,
                         "--address", address, "--name", "other", "--namespace", "elsewhere")
    assert code == 2 and "a pod can only read Secrets of its own namespace" in err, err
