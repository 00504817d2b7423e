"""Secrets: refused as plain values everywhere they would be written; referenced from Kubernetes Secrets
(``secret_env`` -> ``env[].valueFrom.secretKeyRef``) in the RayCluster and in the Polyaxon operation;
and a canary scan over everything a suite-like run produces."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

from tests.conftest import IMAGE

# Canaries: shaped like the real thing so value detection must see them, unique so a scan finds any copy.
CANARY_HF = "hf_CanaryQx7Lm2Np9Rs4Tv6Wy8Za1Bc3De5"
CANARY_WANDB = "c4n4ry0wandb0key0a1b2c3d4e5f60718293a4b5"
CANARY_AWS_ID = "AKIACANARY0123456789"
CANARY_AWS_SECRET = "CanaryAwsSecret/Kq8mZ3xV7pL2nR5tW9yB4cF6hJ1"
CANARY_SK = "sk-canaryPq8Zr3Xv7Lm2Nn5Tw9Yb4"
CANARY_PASSWORD = "Canary-Passw0rd-Zq7!x"
CANARIES = [CANARY_HF, CANARY_WANDB, CANARY_AWS_ID, CANARY_AWS_SECRET, CANARY_SK, CANARY_PASSWORD]
CANARY_ENV = {"HF_TOKEN": CANARY_HF, "WANDB_API_KEY": CANARY_WANDB, "AWS_ACCESS_KEY_ID": CANARY_AWS_ID,
              "AWS_SECRET_ACCESS_KEY": CANARY_AWS_SECRET, "OPENAI_API_KEY": CANARY_SK,
              "PGPASSWORD": CANARY_PASSWORD}


# -- detection -------------------------------------------------------------------------------------

@pytest.mark.parametrize("value", [CANARY_HF, CANARY_SK, CANARY_AWS_ID, "ASIAQWERTYUIOPASDFGH",
                                   "ghp_" + "a1B2c3D4e5F6g7H8i9J0" * 2, "xoxb-1234567890-abcdefghij",
                                   "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.sig",
                                   "https://user:hunter2@example.com/x", "-----BEGIN RSA PRIVATE KEY-----",
                                   "Zx9Qw3Er5Ty7Ui9Op1As3Df5Gh7Jk9Lz2Xc4Vb6", "prefix " + CANARY_HF])
def test_secret_values_recognised(value):
    from miles_ray.core.secrets import secret_value

    assert secret_value(value)


@pytest.mark.parametrize("value", ["0", "1", "/mnt/miles/runs", "http://head-svc.ns.svc:8265", "Qwen3-4B",
                                   "3f" * 32, "abc123def4567890abc123def4567890abc123de", "INFO", "garbage-collection",
                                   "radixark/miles:latest@sha256:" + "3f" * 32, "--lr 1e-6", "my-secret-name/key",
                                   "/mnt/miles/models/Qwen3-4B-Instruct-2507/checkpoints",
                                   "mnt/miles/models/Qwen3-235B-A22B-Instruct-2507-FP8/iter_0000123",
                                   "plx-operation-0f8e7d6c5b4a39281706f5e4d3c2b1a0"])
def test_ordinary_values_pass(value):
    from miles_ray.core.secrets import secret_value

    assert secret_value(value) is None


@pytest.mark.parametrize("item", [f"HF_TOKEN={CANARY_HF}", f"MY_VAR={CANARY_HF}", f"X={CANARY_SK}",
                                  f"AWS={CANARY_AWS_ID}", f"DB_URL=postgres://u:{CANARY_PASSWORD}@db/x"])
def test_env_flag_refuses_secret_names_and_values_without_echoing_them(item):
    from miles_ray.core.errors import ConfigError
    from miles_ray.services.jobs import parse_env

    with pytest.raises(ConfigError) as info:
        parse_env([item])
    msg = str(info.value)
    assert "secret" in msg.lower() or "credential" in msg.lower()
    assert item.split("=", 1)[1] not in msg and CANARY_PASSWORD not in msg


@pytest.mark.parametrize("env", [{"HF_TOKEN": "x"}, {"MODEL_HOME": CANARY_HF}, {"A": CANARY_AWS_SECRET}])
def test_config_env_refuses_secrets_and_points_to_secret_env(cli, clean_env, env):
    (clean_env / "c.yaml").write_text(json.dumps({"env": env}))
    code, out, err = cli("render", "-c", "c.yaml", "-F", "kuberay", "--image", IMAGE, "--ray-version", "2.60.0")
    assert code == 2 and "secret_env" in err and err.count("\n") == 1
    for v in env.values():
        if len(v) > 3:
            assert v not in err + out


@pytest.mark.parametrize("ref", ["no-slash", "UPPER/key", "name/", "/key", "a/b/c d", CANARY_HF])
def test_secret_env_must_be_a_reference(cli, clean_env, ref):
    (clean_env / "c.yaml").write_text(json.dumps({"secret_env": {"HF_TOKEN": ref}}))
    code, _, err = cli("plan", "-c", "c.yaml")
    assert code == 2 and "secret-name/key" in err
    assert CANARY_HF not in err


def test_extra_args_with_a_credential_refused(cli, clean_env, monkeypatch):
    monkeypatch.setenv("MILES_RAY_STATE_DIR", str(clean_env / "state"))
    for extra in (f"--wandb-key {CANARY_WANDB}", f"--hf-token={CANARY_HF}", f"--note {CANARY_SK}"):
        code, out, err = cli("submit", "--run", "x", "--address", "http://127.0.0.1:9", "--extra-args", extra)
        assert code == 2 and "credential" in err or "looks like" in err, err
        assert not any(c in out + err for c in CANARIES)
    assert not (clean_env / "state" / "runs").exists()


# -- secret_env renders as references ----------------------------------------------------------------

def _cfg(**kw):
    from miles_ray.core.config import load_config

    return load_config({"nodes": 2, "secret_env": {"HF_TOKEN": "hf-token/token", "WANDB_API_KEY": "wandb/api-key"},
                        **kw}, environ={})


def test_secret_env_is_a_secret_key_ref_in_the_raycluster():
    from miles_ray.adapters.crd_schema import validate_raycluster
    from miles_ray.core.prepare import resolve_plan
    from miles_ray.core.builders import build_raycluster

    cfg = _cfg()
    _, plan = resolve_plan(cfg)
    rc = build_raycluster(cfg, plan, IMAGE, "2.60.0")
    validate_raycluster(rc)
    for tmpl in (rc["spec"]["headGroupSpec"]["template"], rc["spec"]["workerGroupSpecs"][0]["template"]):
        env = {e["name"]: e for e in tmpl["spec"]["containers"][0]["env"]}
        assert env["HF_TOKEN"] == {"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": "hf-token", "key": "token"}}}
        assert env["WANDB_API_KEY"]["valueFrom"]["secretKeyRef"] == {"name": "wandb", "key": "api-key"}
        assert "value" not in env["HF_TOKEN"]


def test_secret_env_is_accepted_by_polyaxon_and_reaches_its_custom_resource():
    from miles_ray.adapters.polyaxon_spec import to_custom_resource, validate_operation
    from miles_ray.core.prepare import resolve_plan
    from miles_ray.core.builders import build_operation

    cfg = _cfg()
    _, plan = resolve_plan(cfg)
    op = build_operation(cfg, plan, IMAGE, "2.60.0")
    validate_operation(op)  # Polyaxon's own schema accepts env[].valueFrom
    ref = {"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": "hf-token", "key": "token"}}}
    assert ref in op["component"]["run"]["head"]["container"]["env"]
    assert ref in op["component"]["run"]["workers"]["gpu"]["container"]["env"]
    cr = json.dumps(to_custom_resource(op, "default", "a" * 32, "miles", "miles"))
    assert json.dumps(ref["valueFrom"]) in cr


def test_secret_env_and_env_cannot_name_the_same_variable(cli, clean_env):
    (clean_env / "c.yaml").write_text(json.dumps({"env": {"HF_HOME": "/x"}, "secret_env": {"HF_HOME": "a/b"}}))
    code, _, err = cli("plan", "-c", "c.yaml")
    assert code == 2 and "both env and secret_env" in err


# -- the canary run ------------------------------------------------------------------------------------

def _scan(blobs: dict[str, str], canaries: list[str] = CANARIES) -> list[tuple[str, str]]:
    return [(where, c[:6] + "...") for where, text in blobs.items() for c in canaries if c in text]


def _files(root: Path) -> dict[str, str]:
    out = {}
    for p in root.rglob("*"):
        if p.is_file():
            try:
                out[str(p)] = p.read_text(errors="replace")
            except OSError:
                pass
    return out


@pytest.mark.e2e
@pytest.mark.ray
def test_canary_secrets_never_leak(fake_k8s, local_ray, core_v1, custom_objects, namespace, shared_volume, cli,
                                   monkeypatch, tmp_path, ledger):
    """Canary credentials in the process environment and in attempted flags, across render, up (kuberay on
    the real apiserver), submit (real Ray), runs, status, logs. Then every artifact is scanned -- for the
    canaries and for the Ray tokens of both clusters (the local one's file, the Secret KubeRay made for the
    RayCluster), which miles-ray sends on every call but must never write or print."""
    from kubernetes import client

    from miles_ray.adapters import ray_jobs

    event = ledger.record("leak_scan", "canary", canaries=len(CANARIES))
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    state = tmp_path / "state"
    monkeypatch.setenv("MILES_RAY_STATE_DIR", str(state))
    monkeypatch.setenv("KUBECONFIG", str(fake_k8s.kubeconfig))
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    for k, v in CANARY_ENV.items():
        monkeypatch.setenv(k, v)
    # the credential lives in a Kubernetes Secret; the config only names it
    core_v1.create_namespaced_secret(namespace, client.V1Secret(
        metadata=client.V1ObjectMeta(name="hf-token"), string_data={"token": CANARY_HF}))
    (work / "miles-ray.yaml").write_text(json.dumps({
        "secret_env": {"HF_TOKEN": "hf-token/token", "WANDB_API_KEY": "wandb/api-key"},
        "env": {"HF_HOME": "/mnt/miles/hf"}}))
    captured: dict[str, str] = {}

    def run(tag: str, *args: str, expect: tuple[int, ...] = (0,)) -> tuple[int, str, str]:
        code, out, err = cli(*args)
        captured[f"{tag}.stdout"], captured[f"{tag}.stderr"] = out, err
        assert code in expect, (tag, code, err)
        return code, out, err

    # attempted leaks through flags and config: all refused
    run("env-name", "submit", "--run", "leak1", "--address", local_ray.address, "--env", f"HF_TOKEN={CANARY_HF}",
        expect=(2,))
    run("env-value", "submit", "--run", "leak2", "--address", local_ray.address, "--env", f"X={CANARY_SK}", expect=(2,))
    run("extra", "submit", "--run", "leak3", "--address", local_ray.address, "--extra-args",
        f"--wandb-key {CANARY_WANDB}", expect=(2,))
    run("image", "render", "-F", "kuberay", "--image", f"{CANARY_HF}@sha256:{'3f' * 32}", "--ray-version",
        "2.60.0", expect=(2,))  # a token pasted into the wrong flag: the error line must not echo it
    inputs = tmp_path / "inputs"  # the attempted leaks themselves live outside what is scanned
    inputs.mkdir()
    (inputs / "bad.yaml").write_text(json.dumps({"env": {"TOKEN_HOLDER": CANARY_AWS_SECRET}}))
    run("cfg-env", "plan", "-c", str(inputs / "bad.yaml"), expect=(2,))
    (inputs / "bad2.yaml").write_text(json.dumps({"env": {"MODEL": CANARY_SK}}))
    run("cfg-env2", "plan", "-c", str(inputs / "bad2.yaml"), expect=(2,))

    # the real path
    run("render", "render", "-F", "all", "--nodes", "2", "--image", IMAGE, "--ray-version", "2.60.0", "--out",
        str(work / "rendered"))
    run("up", "up", "--via", "kuberay", "--nodes", "2", "--image", IMAGE, "--ray-version", "2.60.0", "--no-ray-check",
        "--timeout", "120", "--namespace", namespace, "--name", "canary")
    run("status-k8s", "status", "--backend", "kubernetes", "--namespace", namespace, "--name", "canary", "-o", "json")
    import base64

    from tests.infra.fixtures import poll

    secret = poll("the Ray token Secret KubeRay makes for RayCluster canary", lambda: next(
        (x for x in core_v1.list_namespaced_secret(namespace).items if x.metadata.name == "canary"), None), 60)
    ray_tokens = [base64.b64decode(secret.data["auth_token"]).decode(), local_ray.token_path.read_text().strip()]
    run("submit", "submit", "--run", "canary-run", "--nodes", "2", "--rehearse", "--address", local_ray.address,
        "--timeout", "60", "--no-follow", "-o", "json")
    job = ray_jobs.wait(local_ray.address, json.loads(captured["submit.stdout"])["submission_id"], timeout=120)
    run("runs", "runs", "-o", "json")
    run("status-run", "status", "canary-run", "-o", "json", expect=(0, 3, 5))
    run("logs", "logs", "canary-run")

    blobs: dict[str, str] = dict(captured)
    blobs.update(_files(work / "rendered"))
    blobs.update(_files(state))
    blobs.update(_files(work))
    [rc] = custom_objects.list_namespaced_custom_object("ray.io", "v1", namespace, "rayclusters")["items"]
    blobs["raycluster"] = json.dumps(rc)
    for p in core_v1.list_namespaced_pod(namespace).items:
        blobs[f"pod/{p.metadata.name}"] = json.dumps(client.ApiClient().sanitize_for_serialization(p))
    for cm in core_v1.list_namespaced_config_map(namespace).items:
        blobs[f"configmap/{cm.metadata.name}"] = json.dumps(cm.data or {})
    blobs["job"] = json.dumps({k: v for k, v in job.items()}, default=str)
    blobs["job-logs"] = ray_jobs.logs(local_ray.address, job["job_id"])
    blobs["jobs-api"] = json.dumps([_info for _info in _all_jobs(local_ray.address)], default=str)
    blobs.update(_files(local_ray.state_dir / "logs"))  # the local cluster's failure logs (if any)
    blobs["local-state"] = json.dumps(local_ray_state(local_ray))
    leaks = _scan(blobs, CANARIES + ray_tokens)
    event.update(artifacts=len(blobs), leaks=len(leaks))
    assert not leaks, leaks
    # and the reference is there: the pods get the credential from the Secret at start
    env = {e["name"]: e for e in rc["spec"]["headGroupSpec"]["template"]["spec"]["containers"][0]["env"]}
    assert env["HF_TOKEN"]["valueFrom"]["secretKeyRef"] == {"name": "hf-token", "key": "token"}
    assert len(blobs) > 20
    _ = (os, time)


def local_ray_state(local_ray) -> dict:
    from miles_ray.adapters import local_ray as lr

    return lr.read_state(local_ray.state_dir, local_ray.name)


def _all_jobs(address: str) -> list[dict]:
    from ray.job_submission import JobSubmissionClient

    out = []
    from miles_ray.adapters import ray_auth

    for j in JobSubmissionClient(address, headers=ray_auth.headers(address)).list_jobs():
        out.append({"id": j.submission_id, "entrypoint": j.entrypoint, "metadata": j.metadata,
                    "runtime_env": j.runtime_env, "message": j.message})
    return out


def test_error_lines_never_echo_a_credential(cli, clean_env):
    from miles_ray.core.errors import ClusterError
    from miles_ray.core.secrets import redact

    assert CANARY_HF not in str(ClusterError(f"bad thing {CANARY_HF}", hint=f"x {CANARY_SK}"))
    assert redact(f"image {CANARY_HF}@sha256:{'3f' * 32}") == f"image <redacted>@sha256:{'3f' * 32}"
    code, out, err = cli("plan", "--recipe", CANARY_HF)
    assert code == 2 and CANARY_HF not in out + err and "<redacted>" in err


@pytest.mark.parametrize("name, secret", [
    ("HF_TOKEN", True), ("HUGGING_FACE_HUB_TOKEN", True), ("WANDB_API_KEY", True), ("AWS_SECRET_ACCESS_KEY", True),
    ("AWS_ACCESS_KEY_ID", True), ("PGPASSWORD", True), ("OPENAI_APIKEY", True),
    ("TOKENIZERS_PARALLELISM", False), ("RAY_AUTH_TOKEN_PATH", False), ("AWS_SHARED_CREDENTIALS_FILE", False),
    ("KEYBOARD", False), ("MAX_TOKENS_PER_GPU", False), ("NCCL_NVLS_ENABLE", False),
])
def test_secret_names(name, secret):
    from miles_ray.core.secrets import secret_name

    assert secret_name(name) is secret
