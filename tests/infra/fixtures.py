"""The real components every tier shares, ONE of each per pytest run (a pytest plugin, loaded by
tests/conftest.py): whichever tiers a run selects -- unit, integration, e2e, reliability -- they get the
same control plane, the same local Ray cluster and the same Polyaxon server. Every session fixture is
lazy: a run whose tests ask for none of them starts nothing; each is stopped right after the last test of the run
that uses it (not at the end of the run), and the tiers run in TIER_ORDER, the real-pod tier last.

``fake_k8s``         etcd, kube-apiserver, kube-controller-manager, kube-scheduler, kwok and the KubeRay
                     operator (cluster/fakegpu.py) from binaries cached by cluster/build.sh (built first if
                     needed: many minutes cold), in a temporary directory; stopped by PID afterwards.
``polyaxon_server``  the real Polyaxon API server (``haupt sandbox``, tests/infra/haupt.py) in its own venv,
                     on 127.0.0.1 and a free port, with the ``miles-data`` connection registered.
``kueue``            (module-scoped, only for the modules that ask) Kueue's controller manager, CRDs and
                     webhooks beside the session's control plane (cluster/kueue.py, built by cluster/build.sh
                     kueue); stopped by PID and its webhooks, CRDs and namespace removed after the module.
``local_ray``        a real Ray cluster of separate ``ray start`` processes: a head with 0 GPUs and 4 worker
                     raylets x 8 fake GPUs (miles_ray.adapters.local_ray); stopped by PID, never ``ray stop``.
                     It runs with Ray token authentication, the product default: its token file is exported as
                     ``RAY_AUTH_TOKEN_PATH`` for the session, as a user of a head given by URL would export it.

A test that uses one of them carries its marker (``e2e``, ``ray``, ``polyaxon``), so ``-m`` selects by
what tests need. Per test: ``namespace`` (a fresh namespace, its pods gone afterwards), ``kube_env`` (the CLI pointed at
the control plane, with this test's own state dir and cwd), ``shared_volume`` (a bound ReadWriteMany
claim ``miles-data``), ``wait_for``. A component that cannot be had here skips its tests loudly, or
fails them under ``MILESRAY_TEST_STRICT=1`` (tests/infra/knobs.py, which also lists the other knobs).
"""

from __future__ import annotations

import os
import sys
import time
import urllib.error
import urllib.request
import uuid
from pathlib import Path
from typing import Any, Callable, Iterator

import pytest

from tests.infra import haupt, knobs
from tests.infra.scripts import load_script

REPO = Path(__file__).resolve().parents[2]
FAKEGPU_PY = REPO / "cluster" / "fakegpu.py"

fakegpu = load_script("cluster/fakegpu.py", "miles_ray_fakegpu")

LOCAL_RAY_NODES = 4
LOCAL_RAY_GPUS = 8


# The marker of each real component: a test that uses one carries its marker, whether or not its module
# says so, so ``-m ray`` / ``-m "not e2e"`` select exactly by what a test needs.
COMPONENT_MARKERS = {"fake_k8s": "e2e", "local_ray": "ray", "polyaxon_server": "polyaxon"}


# Tier order of a run (pytest collects them alphabetically): the tiers that share a component run next to each
# other, so each shared component lives only as long as its users (below) and does not load the 2 cores while other
# tiers run: integration and reliability (the local Ray cluster), reliability and e2e (the control plane); the
# real-pod tier goes last, when none of them is left.
TIER_ORDER = ("integration", "reliability", "e2e", "unit", "realpods")
RETIRE_AFTER_LAST_USE = tuple(COMPONENT_MARKERS)
_RETIRE = pytest.StashKey[list]()


def _tier(item: pytest.Item) -> int:
    tier = knobs.tier_of(item.nodeid)
    return TIER_ORDER.index(tier) if tier in TIER_ORDER else len(TIER_ORDER)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        for fixture, marker in COMPONENT_MARKERS.items():
            if fixture in getattr(item, "fixturenames", ()):
                item.add_marker(marker)
    items.sort(key=_tier)  # stable: within a tier, the collected order
    last: dict[str, pytest.Item] = {}
    for item in items:
        for fixture in RETIRE_AFTER_LAST_USE:
            if fixture in getattr(item, "fixturenames", ()):
                last[fixture] = item
    for fixture, item in last.items():
        item.stash.setdefault(_RETIRE, []).append(fixture)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    """After the last test of the run that uses a shared component, stop it (its fixture's own tear-down, with
    its checks) instead of at the end of the run. A test that asks for it later would just start a new one."""
    yield
    if nextitem is None:
        return  # the end of the run stops everything anyway
    for fixture in item.stash.get(_RETIRE, []):
        for fixturedef in item._fixtureinfo.name2fixturedefs.get(fixture, ()):  # noqa: SLF001 - pytest's own record
            fixturedef.finish(item._request)  # noqa: SLF001 - runs the fixture's tear-down, then forgets its value


def http_status(url: str, token: str | None = None, timeout: float = 20) -> int:
    """The HTTP status of GET url, sending ``token`` as Ray's bearer token when given."""
    headers = {"Authorization": f"Bearer {token}"} if token is not None else {}
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=timeout) as resp:
            return resp.status
    except urllib.error.HTTPError as e:
        return e.code


def poll(what: str, fn: Callable[[], Any], timeout: float = 60, interval: float = 0.25,
         explain: Callable[[], str] | None = None) -> Any:
    """Call ``fn`` until it returns something truthy and return that; fail naming ``what`` and the last
    value after ``timeout`` seconds (plus what ``explain()`` says, when given)."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        last = fn()
        if last:
            return last
        time.sleep(interval)
    pytest.fail(f"timed out after {timeout:.0f}s waiting for {what}; last value: {last!r}"
                + (f"\n{explain()}" if explain else ""))


@pytest.fixture
def wait_for() -> Callable[..., Any]:
    """``wait_for(what, fn, timeout=60)``: poll until ``fn()`` is truthy, return it; fail on timeout."""
    return poll


# --------------------------------------------------------------------------------------------
# The fake-GPU Kubernetes control plane


@pytest.fixture(scope="session")
def fake_k8s(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """A running control plane (``fakegpu.Cluster``): ``.kubeconfig``, ``.nodes``, ``.gpu_nodes``,
    ``.cpu_nodes``, ``.gpus_per_node``, ``.server``, ``.dir``, ``.pids``."""
    try:
        import kubernetes  # noqa: F401
    except ImportError as e:  # the project depends on it; only a broken venv gets here
        knobs.unavailable("control plane", f"python package 'kubernetes' is not importable: {e}")

    if not fakegpu.all_cached() and fakegpu.find_go() is None:
        knobs.unavailable(
            "control plane",
            f"the control plane binaries are not cached in {fakegpu.cache_dir()} and no Go toolchain is "
            "installed to build them (install Go >= 1.26 or put it on PATH / $GO, then run cluster/build.sh)",
        )

    nodes = int(os.environ.get(knobs.E2E_NODES, "6"))
    gpus = int(os.environ.get(knobs.E2E_GPUS, "8"))
    keep = knobs.flag(knobs.E2E_KEEP)
    d = tmp_path_factory.mktemp("fakegpu")
    try:
        # die_with_parent: if this pytest process is killed, the control plane goes with it.
        cluster = fakegpu.up(d, nodes=nodes, gpus=gpus, die_with_parent=not keep)
    except fakegpu.ToolchainMissing as e:
        knobs.unavailable("control plane", str(e))
    try:
        yield cluster
    finally:
        if keep:
            print(f"\nfake_k8s left running: python {FAKEGPU_PY} down --dir {d}", file=sys.stderr)
        else:
            fakegpu.down(d)


@pytest.fixture(scope="session")
def k8s_api(fake_k8s: Any) -> Any:
    from kubernetes import config

    return config.new_client_from_config(config_file=str(fake_k8s.kubeconfig))


@pytest.fixture(scope="session")
def core_v1(k8s_api: Any) -> Any:
    from kubernetes import client

    return client.CoreV1Api(k8s_api)


@pytest.fixture(scope="session")
def custom_objects(k8s_api: Any) -> Any:
    from kubernetes import client

    return client.CustomObjectsApi(k8s_api)


@pytest.fixture
def namespace(core_v1: Any, custom_objects: Any) -> Iterator[str]:
    """A fresh namespace with its ``default`` ServiceAccount in place; its pods are gone afterwards."""
    from kubernetes import client
    from kubernetes.client.rest import ApiException

    name = f"e2e-{uuid.uuid4().hex[:8]}"
    core_v1.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=name)))

    def sa_ready() -> bool:
        try:
            core_v1.read_namespaced_service_account("default", name)
            return True
        except ApiException as e:
            if e.status == 404:
                return False
            raise

    poll(f"ServiceAccount {name}/default", sa_ready, timeout=60)
    try:
        yield name
    finally:
        # Free its GPUs before the next test: delete the RayClusters (the operator stops making
        # pods), then the pods at once, and wait until kwok has completed their deletion. The
        # namespace itself is left to the namespace controller (that takes ~10 s; no need to wait).
        try:
            custom_objects.delete_collection_namespaced_custom_object("ray.io", "v1", name, "rayclusters")
        except ApiException:
            pass

        def no_pods() -> bool:
            pods = core_v1.list_namespaced_pod(name).items
            if pods:
                core_v1.delete_collection_namespaced_pod(name, grace_period_seconds=0)
            return not pods

        poll(f"pods of namespace {name} deleted", no_pods, timeout=60, interval=0.5)
        try:
            core_v1.delete_namespace(name)
        except ApiException:
            pass


@pytest.fixture
def kube_env(fake_k8s: Any, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Any:
    """The in-process CLI pointed at the control plane (KUBECONFIG), with this test's own state dir and
    cwd and no config file or RAY_ADDRESS from the developer's shell; returns ``fake_k8s``."""
    monkeypatch.setenv("KUBECONFIG", str(fake_k8s.kubeconfig))
    monkeypatch.setenv("MILES_RAY_STATE_DIR", str(tmp_path / "state"))
    for key in ("MILES_RAY_CONFIG", "RAY_ADDRESS"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.chdir(tmp_path)
    return fake_k8s


@pytest.fixture
def shared_volume(core_v1: Any, namespace: str) -> Iterator[str]:
    """A bound ReadWriteMany claim named miles-data (static PV; nothing is mounted on kwok nodes)."""
    from kubernetes import client
    from kubernetes.client.rest import ApiException

    pv = f"miles-data-{namespace}"
    core_v1.create_persistent_volume(client.V1PersistentVolume(
        metadata=client.V1ObjectMeta(name=pv),
        spec=client.V1PersistentVolumeSpec(capacity={"storage": "1Ti"}, access_modes=["ReadWriteMany"],
                                           storage_class_name="",
                                           nfs=client.V1NFSVolumeSource(server="127.0.0.1", path="/miles"))))
    core_v1.create_namespaced_persistent_volume_claim(namespace, client.V1PersistentVolumeClaim(
        metadata=client.V1ObjectMeta(name="miles-data"),
        spec=client.V1PersistentVolumeClaimSpec(
            access_modes=["ReadWriteMany"], storage_class_name="", volume_name=pv,
            resources=client.V1VolumeResourceRequirements(requests={"storage": "1Ti"}))))
    # bound before any test uses it: on a busy machine the PV controller can take a while, and a pod of a claim
    # still unbound is Unschedulable ("unbound immediate PersistentVolumeClaims"), which up rightly reports
    poll("the claim miles-data to be Bound", lambda: core_v1.read_namespaced_persistent_volume_claim(
        "miles-data", namespace).status.phase == "Bound", 120)
    yield "miles-data"
    try:
        core_v1.delete_persistent_volume(pv)
    except ApiException:
        pass


def ray_token_secret(core_v1: Any, namespace: str, name: str, token: str | None = None,
                     key: str = "auth_token") -> str:
    """Create the Ray token Secret a Polyaxon-path cluster's pods read (``kubectl create secret generic NAME
    --from-literal=auth_token=...``, as docs/security.md tells users); returns the token."""
    import secrets

    from kubernetes import client

    token = token or secrets.token_hex(32)
    core_v1.create_namespaced_secret(namespace, client.V1Secret(metadata=client.V1ObjectMeta(name=name),
                                                                string_data={key: token}))
    return token


@pytest.fixture(scope="module")
def kueue(fake_k8s: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """Kueue's manager running beside ``fake_k8s`` for one test module (``kueue.Kueue``: ``.pid``, ``.log``,
    ``.ports``, ``.timings``); its log stays in the module's tmp dir. A warm run builds nothing."""
    kq = load_script("cluster/kueue.py", "miles_ray_kueue")
    d = tmp_path_factory.mktemp("kueue")
    try:
        running = kq.up(fake_k8s.dir, d, die_with_parent=True)
    except kq.KueueUnavailable as e:
        knobs.unavailable("Kueue", str(e))
    try:
        yield running
    finally:
        stopped = kq.down(d)
        bad = {k: v for k, v in stopped.items() if not v.startswith(("deleted", "stopped", "killed"))}
        assert not bad, f"Kueue not cleaned up: {bad} (log: {running.log})"


# --------------------------------------------------------------------------------------------
# The Polyaxon API server


@pytest.fixture(scope="session")
def polyaxon_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[haupt.HauptServer]:
    """A running haupt sandbox: ``.host`` (http://127.0.0.1:PORT), ``.pid``, ``.start_seconds``,
    ``.rss_bytes()``, ``.connections``, ``.log_path``, ``.create_project(name)``."""
    try:
        venv = haupt.ensure_venv()
        server = haupt.start(venv, tmp_path_factory.mktemp("haupt"))
    except haupt.HauptUnavailable as e:
        knobs.unavailable("Polyaxon server", str(e))
    try:
        yield server
    finally:
        server.stop()


# --------------------------------------------------------------------------------------------
# The local Ray cluster


class LocalRayCluster:
    """Handle on the session's local Ray cluster (``miles_ray.adapters.local_ray``). ``state_root`` is what
    ``MILES_RAY_STATE_DIR`` names for the CLI to find it as ``local://NAME`` (its state is ``state_root/local``);
    ``token_path`` its Ray token file."""

    def __init__(self, state_dir: Path, name: str, info: dict) -> None:
        from miles_ray.adapters import local_ray

        self.state_dir = state_dir
        self.state_root = state_dir.parent
        self.name = name
        self.info = info
        self.address: str = info["dashboard_url"]
        self.token_path = Path(local_ray.read_state(state_dir, name)["token_path"])

    def headers(self) -> dict[str, str]:
        """The ``Authorization`` header a request to this cluster needs."""
        return {"Authorization": f"Bearer {self.token_path.read_text().strip()}"}

    def status(self) -> dict:
        from miles_ray.adapters import local_ray

        return local_ray.status(self.state_dir, self.name)

    def pids(self) -> list[int]:
        from miles_ray.adapters import local_ray

        return local_ray.cluster_pids(self.state_dir, self.name)


@pytest.fixture(scope="session")
def local_ray(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalRayCluster]:
    """Head (0 GPUs) + 4 worker raylets x 8 fake GPUs, each its own ``ray start`` process;
    stopped at the end by PID (never ``ray stop``), with a check that nothing is left."""
    from miles_ray.adapters import local_ray as lr

    state_dir = tmp_path_factory.mktemp("local-ray-state") / "local"
    name = f"pytest-{os.getpid()}"
    info = lr.up(state_dir, name, LOCAL_RAY_NODES, LOCAL_RAY_GPUS, LOCAL_RAY_GPUS, timeout=240)
    cluster = LocalRayCluster(state_dir, name, info)
    exported = os.environ.get("RAY_AUTH_TOKEN_PATH")
    os.environ["RAY_AUTH_TOKEN_PATH"] = str(cluster.token_path)
    try:
        yield cluster
    finally:
        if exported is None:
            os.environ.pop("RAY_AUTH_TOKEN_PATH", None)
        else:
            os.environ["RAY_AUTH_TOKEN_PATH"] = exported
        state = lr.read_state(state_dir, name)
        if state is not None:
            procs = lr.processes_of(state)
            try:
                lr.down(state_dir, name)
            finally:
                left = sorted({pid for p in procs for pid in lr.session_members(p)})
                assert not left, f"local Ray processes left after down: {left}"
                assert not Path(state["temp_dir"]).exists(), "local Ray temp dir left after down"
