"""Ray token authentication as rendered (RayCluster authOptions, the Polyaxon operation's and the launcher job's
Secret references, --ray-auth none) and the client-side token plumbing that needs no cluster."""

from __future__ import annotations

import json
import os
import stat

import pytest

from tests.conftest import IMAGE

TOKEN_REF = {"name": "RAY_AUTH_TOKEN", "valueFrom": {"secretKeyRef": {"name": "miles", "key": "auth_token"}}}


def _cfg(**kw):
    from miles_ray.core.config import load_config

    return load_config({"nodes": 2, "image": IMAGE, "ray_version": "2.60.0", **kw}, environ={})


def _plan(cfg):
    from miles_ray.core.prepare import resolve_plan

    return resolve_plan(cfg)[1]


def _containers(doc):
    from tests.infra.documents import head_and_worker_containers

    return head_and_worker_containers(doc)


def test_the_raycluster_asks_kuberay_for_token_auth_by_default_and_passes_the_crd_schema():
    from miles_ray.adapters.crd_schema import validate_raycluster
    from miles_ray.core.builders import build_raycluster

    cfg = _cfg()
    rc = build_raycluster(cfg, _plan(cfg), IMAGE, "2.60.0")
    assert rc["spec"]["authOptions"] == {"mode": "token"}
    validate_raycluster(rc)  # the packaged CRD schema knows authOptions (KubeRay >= 1.6)
    for c in _containers(rc):  # KubeRay sets RAY_AUTH_MODE/RAY_AUTH_TOKEN itself: nothing of it here
        assert not {e["name"] for e in c["env"]} & {"RAY_AUTH_MODE", "RAY_AUTH_TOKEN"}


def test_a_named_secret_is_referenced_not_generated():
    from miles_ray.adapters.crd_schema import validate_raycluster
    from miles_ray.core.builders import build_raycluster

    cfg = _cfg(ray_auth_secret="team-ray-token")
    rc = build_raycluster(cfg, _plan(cfg), IMAGE, "2.60.0")
    assert rc["spec"]["authOptions"] == {"mode": "token", "secretName": "team-ray-token"}
    validate_raycluster(rc)


def test_ray_auth_none_renders_auth_disabled_explicitly_and_no_auth_options():
    from miles_ray.adapters.crd_schema import validate_raycluster
    from miles_ray.adapters.polyaxon_spec import validate_operation
    from miles_ray.core.builders import build_operation, build_raycluster

    cfg = _cfg(ray_auth="none")
    rc = build_raycluster(cfg, _plan(cfg), IMAGE, "2.60.0")
    op = build_operation(cfg, _plan(cfg), IMAGE, "2.60.0")
    validate_raycluster(rc)
    validate_operation(op)
    assert "authOptions" not in rc["spec"]  # so an operator older than 1.6 accepts it
    for c in [*_containers(rc), *_containers(op)]:
        auth = [e for e in c["env"] if e["name"].startswith("RAY_AUTH")]
        assert auth == [{"name": "RAY_AUTH_MODE", "value": "disabled"}]


def test_the_polyaxon_operation_gets_the_token_by_secret_reference_on_head_and_workers():
    from miles_ray.adapters.polyaxon_spec import validate_operation
    from miles_ray.core.builders import build_operation

    cfg = _cfg()
    op = build_operation(cfg, _plan(cfg), IMAGE, "2.60.0")
    validate_operation(op)  # Polyaxon's own schema accepts the env reference
    for c in _containers(op):
        assert {"name": "RAY_AUTH_MODE", "value": "token"} in c["env"]
        assert TOKEN_REF in c["env"]
    assert "auth_token\": \"" not in json.dumps(op)  # a reference, never a value


def test_the_polyaxon_custom_resource_keeps_the_reference(cli, clean_env):
    code, out, err = cli("render", "-F", "polyaxon-cr", "--nodes", "2", "--image", IMAGE, "--ray-version", "2.60.0",
                         "-o", "json")
    assert code == 0, err
    spec = json.loads(out)["rayClusterSpec"]
    replicas = [spec["head"], *(spec["workers"] if isinstance(spec["workers"], list) else [spec["workers"]])]
    for replica in replicas:
        assert TOKEN_REF in replica["template"]["spec"]["containers"][0]["env"]


def test_the_launcher_job_gets_the_token_by_secret_reference():
    from miles_ray.core.entrypoint import launcher_job_operation
    from miles_ray.core.recipes import get_recipe

    cfg = _cfg(name="q4", ray_auth_secret=None)
    op = launcher_job_operation(cfg, get_recipe("Qwen3-4B"), _plan(cfg), IMAGE, "r1", "/mnt/miles/runs/r1",
                                "http://q4-head-svc.default.svc:8265")
    env = op["component"]["run"]["container"]["env"]
    assert {"name": "RAY_AUTH_MODE", "value": "token"} in env
    assert {"name": "RAY_AUTH_TOKEN", "valueFrom": {"secretKeyRef": {"name": "q4", "key": "auth_token"}}} in env


@pytest.mark.parametrize("name, secret", [("miles", "miles"), ("a" * 53, "a" * 50),
                                          ("x" * 3 + "-" + "7" * 49, "r" + "7" * 49)])
def test_the_secret_kuberay_creates_is_named_as_kuberay_names_it(name, secret):
    from miles_ray.core.builders import kuberay_token_secret

    assert kuberay_token_secret(name) == secret


def test_render_ray_auth_none_warns_in_one_line(cli, clean_env):
    code, out, err = cli("render", "-F", "kuberay", "--ray-auth", "none", "--image", IMAGE, "--ray-version", "2.60.0")
    assert code == 0, err
    warnings = [ln for ln in err.splitlines() if ln.startswith("warning:")]
    assert len(warnings) == 1 and "without token authentication" in warnings[0]
    assert "authOptions" not in out and "value: disabled" in out


@pytest.mark.parametrize("flags, field", [({"ray_auth": "off"}, "ray_auth"),
                                          ({"ray_auth_secret": "Not_A_Name"}, "ray_auth_secret")])
def test_bad_ray_auth_config_is_one_clear_error(flags, field):
    from miles_ray.core.config import load_config
    from miles_ray.core.errors import ConfigError

    with pytest.raises(ConfigError) as info:
        load_config(flags, environ={})
    assert field.replace("_", "-") in str(info.value)


def test_bad_ray_auth_flag_exits_2(cli, clean_env):
    code, _, err = cli("render", "-F", "kuberay", "--ray-auth", "maybe", "--image", IMAGE, "--ray-version", "2.60.0")
    assert code == 2 and "--ray-auth" in err


# -- the client side -----------------------------------------------------------------------------------

def test_a_token_file_is_0600_from_its_creation(tmp_path):
    from miles_ray.adapters import ray_auth

    path = ray_auth.write_token_file(tmp_path / "d" / "c.token", ray_auth.new_token())
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert len(path.read_text()) == 64 and ray_auth.read_token_file(path) == path.read_text()
    assert sorted(p.name for p in path.parent.iterdir()) == ["c.token"]  # no temp file left


def test_which_token_goes_to_which_head(monkeypatch, tmp_path):
    from miles_ray.adapters import ray_auth
    from miles_ray.core.errors import ConfigError

    monkeypatch.delenv("RAY_AUTH_TOKEN", raising=False)
    monkeypatch.delenv("RAY_AUTH_TOKEN_PATH", raising=False)
    url = "http://127.0.0.1:47001"
    assert ray_auth.headers(url) == {}
    with ray_auth.using(url + "/", "t-forward"):
        assert ray_auth.headers(url) == {"Authorization": "Bearer t-forward"}
    assert ray_auth.headers(url) == {}  # a port-forward's token goes with it
    (tmp_path / "tok").write_text("t-file\n")
    monkeypatch.setenv("RAY_AUTH_TOKEN_PATH", str(tmp_path / "tok"))
    assert ray_auth.headers(url) == {"Authorization": "Bearer t-file"}
    monkeypatch.setenv("RAY_AUTH_TOKEN", "t-env")
    assert ray_auth.headers(url) == {"Authorization": "Bearer t-env"}
    ray_auth.remember("http://127.0.0.1:47002", "t-local")
    assert ray_auth.headers("127.0.0.1:47002") == {"Authorization": "Bearer t-local"}  # a known head's own wins
    monkeypatch.delenv("RAY_AUTH_TOKEN")
    monkeypatch.setenv("RAY_AUTH_TOKEN_PATH", str(tmp_path / "missing"))
    with pytest.raises(ConfigError) as info:
        ray_auth.headers(url)
    assert "RAY_AUTH_TOKEN_PATH" in str(info.value)


def test_head_auth_ref_reads_the_secret_name_from_the_pod_spec_only():
    from kubernetes import client

    from miles_ray.adapters.kube import head_auth_ref

    def pod(*env):
        return client.V1Pod(spec=client.V1PodSpec(containers=[client.V1Container(name="ray", env=list(env))]))

    ref = client.V1EnvVar(name="RAY_AUTH_TOKEN", value_from=client.V1EnvVarSource(
        secret_key_ref=client.V1SecretKeySelector(name="plx-team", key="auth_token")))
    assert head_auth_ref(pod(client.V1EnvVar(name="RAY_AUTH_MODE", value="token"), ref)) == ("token", "plx-team")
    assert head_auth_ref(pod(client.V1EnvVar(name="RAY_AUTH_MODE", value="disabled"))) == ("disabled", None)
    assert head_auth_ref(pod()) == ("disabled", None)
    literal = client.V1EnvVar(name="RAY_AUTH_TOKEN", value="x")
    assert head_auth_ref(pod(client.V1EnvVar(name="RAY_AUTH_MODE", value="token"), literal)) == ("token", None)


def test_token_secret_of_a_raycluster():
    from miles_ray.core.builders import token_secret_of

    cfg = _cfg(name="team")
    assert token_secret_of(cfg, "plx-operation-" + "a" * 32, "polyaxon") == "team"  # the one the operation names
    assert token_secret_of(cfg, "other", "kuberay") == "other"  # KubeRay's, named after the RayCluster
    assert token_secret_of(cfg, "other", "kuberay", recorded="mine") == "mine"
    assert token_secret_of(_cfg(name="team", ray_auth_secret="shared"), "other", "kuberay") == "shared"
