"""GCS fault tolerance (``up --gcs-ft redis://HOST:PORT``, issue 24 item 3): the address and the password Secret
parsed (hypothesis-generated garbage refused in one line, never echoing a password), KubeRay's
``spec.gcsFaultToleranceOptions`` rendered by reference to the Secret and known to the recorded KubeRay CRDs, the
Polyaxon path (and the local and single-node ones) refused with what to do instead, the drift 'up' names, the
probe pod preflight runs, and doctor's finding from the RayCluster's spec."""

from __future__ import annotations

import json

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from miles_ray.core.builders import REDIS_PROBE_SCRIPT, build_raycluster, redis_probe_pod
from miles_ray.core.config import load_config, parse_password_secret, parse_redis_address
from miles_ray.core.crd_fields import unknown_fields
from miles_ray.core.errors import EXIT_BAD_INPUT, ConfigError
from miles_ray.core.planner import plan_split
from miles_ray.core.recipes import BUILTIN
from tests.conftest import IMAGE
from tests.unit.test_crd_fields import current, v150

RAY = "2.60.0"
ADDRESS = "redis://redis.infra.svc.cluster.local:6379"
FT = ["--gcs-ft", ADDRESS, "--gcs-ft-password-secret", "redis-auth"]


def _cfg(**extra):
    return load_config({"recipe": "Qwen3-4B", "nodes": 2, "name": "ft", "image": IMAGE, "ray_version": RAY,
                        **extra}, environ={})


def _rc(**extra) -> dict:
    return build_raycluster(_cfg(**extra), plan_split(BUILTIN["Qwen3-4B"], 2, 8), IMAGE, RAY)


# -- the address and the Secret -------------------------------------------------------------------

@pytest.mark.parametrize("value,want", [
    ("redis://redis:6379", ("redis", 6379)),
    ("redis://Redis.NS.svc.cluster.local:6380", ("redis.ns.svc.cluster.local", 6380)),
    ("redis://10.0.0.7:1", ("10.0.0.7", 1)),
    ("redis://r:65535", ("r", 65535)),
])
def test_redis_addresses_that_parse(value: str, want: tuple[str, int]) -> None:
    assert parse_redis_address(value) == want


@pytest.mark.parametrize("value", [
    "", "redis", "redis.ns.svc:6379", "http://redis:6379", "rediss://redis:6379", "redis://redis", "redis://redis:",
    "redis://redis:0", "redis://redis:65536", "redis://redis:6379/0", "redis://:6379", "redis://re dis:6379",
    "redis://redis_1:6379", "redis://300.1.1.1:6379", "redis://[::1]:6379", "redis://redis:6379?x=1",
    "redis://-redis:6379", "redis://redis.:6379", " redis://redis:6379", "redis://rédis:6379",
])
def test_redis_addresses_that_are_refused(value: str) -> None:
    with pytest.raises(ValueError, match="redis://HOST:PORT"):
        parse_redis_address(value)


def test_a_password_in_the_url_is_refused_without_echoing_it() -> None:
    with pytest.raises(ValueError) as e:
        parse_redis_address("redis://user:s3cr3t-pw@redis:6379")
    assert "s3cr3t" not in str(e.value) and "--gcs-ft-password-secret" in str(e.value)


@settings(max_examples=300, deadline=None)
@given(st.one_of(st.text(max_size=80), st.text(max_size=60).map(lambda s: "redis://" + s),
                 st.from_regex(r"redis://[a-z0-9.\-]{1,20}:[0-9]{1,6}", fullmatch=True)))
def test_any_text_parses_to_a_round_trip_or_is_refused_with_the_form(value: str) -> None:
    try:
        host, port = parse_redis_address(value)
    except ValueError as e:
        assert "redis://HOST:PORT" in str(e) or "user or password" in str(e)
        assert "\n" not in str(e)  # one line, whatever was given
        return
    assert 1 <= port <= 65535 and host == host.lower()
    assert parse_redis_address(f"redis://{host}:{port}") == (host, port)


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=80))
def test_garbage_gcs_ft_is_one_config_error_line(value: str) -> None:
    try:
        cfg = _cfg(gcs_ft=value, gcs_ft_password_secret="none")
    except ConfigError as e:
        assert str(e).startswith("--gcs-ft: ") and "\n" not in str(e), str(e)
        assert e.exit_code == EXIT_BAD_INPUT
        return
    assert cfg.gcs_ft == "redis://{}:{}".format(*parse_redis_address(value))


def test_password_secret_forms() -> None:
    assert parse_password_secret("redis-auth") == ("redis-auth", "password")
    assert parse_password_secret("redis-auth:requirepass") == ("redis-auth", "requirepass")
    assert parse_password_secret("none") is None
    for bad in ("Redis", "redis auth", "redis:", "a:b:c", ":key", "x" * 254):
        if bad == "redis:":  # an empty key after ':' means the default key
            assert parse_password_secret(bad) == ("redis", "password")
            continue
        with pytest.raises(ValueError, match="NAME\\[:KEY\\]"):
            parse_password_secret(bad)


def test_gcs_ft_needs_the_password_secret_or_an_explicit_none() -> None:
    with pytest.raises(ConfigError, match="--gcs-ft-password-secret NAME\\[:KEY\\]"):
        _cfg(gcs_ft=ADDRESS)
    with pytest.raises(ConfigError, match="without gcs_ft"):
        _cfg(gcs_ft_password_secret="redis-auth")
    assert _cfg(gcs_ft=ADDRESS, gcs_ft_password_secret="none").gcs_ft_password is None


# -- what is rendered -----------------------------------------------------------------------------

def test_kuberay_renders_gcs_fault_tolerance_by_reference_to_the_secret() -> None:
    rc = _rc(gcs_ft=ADDRESS, gcs_ft_password_secret="redis-auth:pw")
    assert rc["spec"]["gcsFaultToleranceOptions"] == {
        "redisAddress": "redis.infra.svc.cluster.local:6379",
        "redisPassword": {"valueFrom": {"secretKeyRef": {"name": "redis-auth", "key": "pw"}}}}
    assert "gcsFaultToleranceOptions" not in _rc()["spec"]
    no_password = _rc(gcs_ft=ADDRESS, gcs_ft_password_secret="none")["spec"]["gcsFaultToleranceOptions"]
    assert no_password == {"redisAddress": "redis.infra.svc.cluster.local:6379"}


def test_the_rendered_options_are_known_to_the_recorded_operators() -> None:
    """The installed-CRD check of preflight (unknown_fields) accepts it: KubeRay has had it since v1.3."""
    rc = _rc(gcs_ft=ADDRESS, gcs_ft_password_secret="redis-auth")
    assert unknown_fields(rc, current()) == []
    assert not [p for p in unknown_fields(rc, v150()) if "gcsFaultTolerance" in p]


def test_render_kuberay_shows_it_and_warns_without_a_password(cli) -> None:
    code, out, err = cli("render", "-F", "kuberay", "--image", IMAGE, "--ray-version", RAY, *FT)
    assert code == 0, err
    spec = yaml.safe_load(out)["spec"]
    assert spec["gcsFaultToleranceOptions"]["redisPassword"]["valueFrom"]["secretKeyRef"] == {
        "name": "redis-auth", "key": "password"}
    code, out, err = cli("render", "-F", "kuberay", "--image", IMAGE, "--ray-version", RAY, "--gcs-ft", ADDRESS,
                         "--gcs-ft-password-secret", "none")
    assert code == 0 and "no password" in err, err


@pytest.mark.parametrize("fmt", ["polyaxon", "polyaxon-cr", "all"])
def test_polyaxon_cannot_carry_it_and_says_what_to_do(cli, fmt: str) -> None:
    code, out, err = cli("render", "-F", fmt, "--image", IMAGE, "--ray-version", RAY, *FT)
    assert code == EXIT_BAD_INPUT and out == ""
    [line] = err.strip().splitlines()
    assert "Polyaxon 2.18" in line and "--via kuberay" in line and "Traceback" not in err


def test_up_refuses_gcs_ft_where_it_cannot_be_rendered(cli, tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("MILES_RAY_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "no-kubeconfig"))
    common = ["--image", IMAGE, "--ray-version", RAY, *FT]
    for args in (["--via", "polyaxon", "--dry-run", "client"], ["--dry-run", "client"],  # polyaxon is the default
                 ["--via", "polyaxon"], ["--backend", "local"], ["--single-node"]):
        code, out, err = cli("up", *args, *common)
        assert code == EXIT_BAD_INPUT, (args, err)
        assert err.strip().splitlines()[-1].startswith("error: --gcs-ft "), (args, err)
        assert "Traceback" not in err
    assert not (tmp_path / "state").exists() or not any((tmp_path / "state").rglob("*.json"))
    code, out, err = cli("up", "--via", "kuberay", "--dry-run", "client", *common, "-o", "json")
    assert code == 0, err
    assert json.loads(out)["raycluster"]["spec"]["gcsFaultToleranceOptions"]["redisAddress"].endswith(":6379")


def test_up_again_with_another_gcs_ft_is_drift() -> None:
    from miles_ray.services.backends.kuberay import drift

    plain, ft = _rc(), _rc(gcs_ft=ADDRESS, gcs_ft_password_secret="redis-auth")
    assert drift(plain, ft) == ["GCS fault tolerance none != redis.infra.svc.cluster.local:6379"]
    assert drift(ft, ft) == []
    other = _rc(gcs_ft=ADDRESS, gcs_ft_password_secret="other")
    assert drift(ft, other) == ["GCS fault tolerance's Redis password Secret differs"]


# -- the probe pod ---------------------------------------------------------------------------------

def test_the_probe_pod_reads_the_password_by_reference_and_never_restarts() -> None:
    cfg = _cfg(gcs_ft=ADDRESS, gcs_ft_password_secret="redis-auth:pw", pod_security="restricted")
    pod = redis_probe_pod(cfg, IMAGE, "ft-redis-probe-1")
    spec = pod["spec"]
    assert spec["restartPolicy"] == "Never" and pod["metadata"]["namespace"] == cfg.namespace
    [c] = spec["containers"]
    assert c["image"] == IMAGE and c["command"][:2] == ["python3", "-c"]
    env = {e["name"]: e for e in c["env"]}
    assert env["PROBE_HOST"]["value"] == "redis.infra.svc.cluster.local" and env["PROBE_PORT"]["value"] == "6379"
    assert env["PROBE_PASSWORD"]["valueFrom"] == {"secretKeyRef": {"name": "redis-auth", "key": "pw"}}
    assert c["securityContext"]["runAsNonRoot"] is True and spec["securityContext"]["runAsUser"] == 1000
    compile(REDIS_PROBE_SCRIPT, "probe", "exec")  # the script the pod runs is valid Python
    no_password = redis_probe_pod(_cfg(gcs_ft=ADDRESS, gcs_ft_password_secret="none"), IMAGE, "p")
    assert "PROBE_PASSWORD" not in {e["name"] for e in no_password["spec"]["containers"][0]["env"]}


# -- doctor ----------------------------------------------------------------------------------------

def test_doctor_finding_from_the_spec() -> None:
    from miles_ray.services.doctor.kube_checks import check_gcs_ft

    with_ft = check_gcs_ft(_rc(gcs_ft=ADDRESS, gcs_ft_password_secret="redis-auth"), None, None)
    assert with_ft.status == "ok" and "redis.infra.svc.cluster.local:6379" in with_ft.summary
    without = check_gcs_ft(_rc(), None, "no head")
    assert without.status == "skipped" and "no GCS fault tolerance" in without.summary
    assert "--gcs-ft" in without.fix and without.checklist == "Training restarts from scratch"
