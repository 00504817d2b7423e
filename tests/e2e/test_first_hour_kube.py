"""The current cluster and 'miles-ray env' on a real Kubernetes API server with the real KubeRay operator
(issue 25, part A). Ray does not run in kwok pods, so Ray's own CLI through the port-forward is not run here:
what is checked is what 'env' prints (the port-forward to the head service, the token copied 0600 from the
head's Secret, never printed) and that every verb defaults to the cluster 'up' made, namespace included."""

from __future__ import annotations

import base64
import json
import shlex
from pathlib import Path

import pytest

from tests.conftest import IMAGE

pytestmark = pytest.mark.e2e

RAY = "2.60.0"
NAME = "fh-e2e"


def test_up_makes_the_kubernetes_cluster_current_and_env_gives_ray_tools_its_token(kube_env, cli, core_v1,
                                                                                   namespace, shared_volume):
    code, _, err = cli("up", "--via", "kuberay", "--nodes", "1", "--image", IMAGE, "--ray-version", RAY,
                       "--no-ray-check", "--timeout", "120", "--namespace", namespace, "--name", NAME)
    assert code == 0, err
    assert f'eval "$(miles-ray env {NAME})"' in err

    # no --name, no --namespace: the current cluster, in its namespace
    code, out, err = cli("status", "-o", "json")
    assert code == 0, err
    st = json.loads(out)
    assert (st["name"], st["namespace"]) == (NAME, namespace)

    code, out, err = cli("clusters", "-o", "json")
    assert code == 0, err
    [row] = json.loads(out)["clusters"]
    assert (row["name"], row["backend"], row["namespace"], row["state"], row["current"]) == \
        (NAME, "kuberay", namespace, "running", True)

    code, out, err = cli("env", "-o", "json")
    assert code == 0, err
    env = json.loads(out)
    assert env["port_forward"].endswith(f"-n {namespace} port-forward svc/{NAME}-head-svc 8265:8265 6379:6379")
    variables = env["variables"]
    assert variables["RAY_API_SERVER_ADDRESS"] == "http://127.0.0.1:8265"
    assert variables["RAY_AUTH_MODE"] == "token"
    token_file = Path(variables["RAY_AUTH_TOKEN_PATH"])
    assert token_file.stat().st_mode & 0o777 == 0o600
    secret = core_v1.read_namespaced_secret(NAME, namespace)
    token = base64.b64decode(secret.data["auth_token"]).decode()
    assert token_file.read_text() == token
    code, lines, err = cli("env")
    assert code == 0 and token not in lines + err
    assert f"export RAY_AUTH_TOKEN_PATH={shlex.quote(str(token_file))}" in lines
    assert f"kubectl -n {namespace} port-forward svc/{NAME}-head-svc" in lines

    # a name that does not exist: the error names the cluster that does
    code, _, err = cli("status", "--name", "typo", "--namespace", namespace, "--backend", "kubernetes")
    assert code != 0 and f"{NAME} (kuberay, {namespace}, running, current)" in err, err

    code, _, err = cli("down", "--yes")  # the current cluster
    assert code == 0, err
    code, out, _ = cli("clusters", "-o", "json")
    assert json.loads(out) == {"current": None, "clusters": []}
    assert not token_file.exists()  # down takes the copy of the token with the cluster
