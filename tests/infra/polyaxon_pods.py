"""The Polyaxon path on real pods: the real Polyaxon API server and the real agent beside the real-pod cluster of
tests/infra/realpods.py, placed so that everything Polyaxon's pods need answers.

    px = start_polyaxon_pods(real_pods, workdir, namespace)   # or the module fixture ``polyaxon_pods``
    px.host            # the API server as the machine (tests, miles-ray, the agent) reaches it: http://127.0.0.1:P
    px.host_for_pods   # the same server as a POD reaches it: http://198.18.0.3:P (a relay in the cluster's
                       # network namespace to the machine's loopback, that port only)
    px.grant_pods_rbac()   # what a Polyaxon admin grants the runs' service account (see below)
    px.stop()

Where each piece runs and why:
- the API server (haupt sandbox, tests/infra/haupt.py) on the machine's 127.0.0.1; pods reach it at
  ``host_for_pods`` (realnodes.relay_out). Server and agent share ONE artifacts store ``artifacts-store``: the
  claim ``polyaxon-artifacts``, a hostPath volume of the sandbox directory, mounted in every pod Polyaxon makes
  at that same path, the path the server reads: what the pods' sidecars write (``<run uuid>/plxlogs/<pod>.jsonl``) is what
  the API serves as the run's logs (``GET /streams/v1/<ns>/<owner>/<project>/runs/<uuid>/logs``).
- the agent (cluster/polyaxon_stack.py ``polyaxon agent start``) on the machine against the cluster's kubeconfig
  (the relay into the namespace), polling ``host``; it creates the ``polyaxon.com/v1 Cluster`` objects.
- FAKE: the stand-in for mloperator (tests/fakes/mloperator_standin.py), the one step that cannot run here (the
  registry refuses its Go module); a thread of the test process. Everything after it is real: KubeRay, kubelets,
  containerd, Polyaxon's init and sidecar code in the pods (their image: cluster/image/build_image.py polyaxon,
  in the nodes' containerd template), the in-cluster API the sidecar uses (10.96.0.1:443, relayed to the
  apiserver by cluster/nsrelay.py).

Nothing here grants the pods' service account anything: ``up --via polyaxon`` checks it (and says what to
grant); ``grant_pods_rbac()`` is the admin's step, done by the test where it wants it.
"""

from __future__ import annotations

import json
import time
import urllib.parse
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

import pytest

from tests.fakes.mloperator_standin import MloperatorStandIn
from tests.infra import haupt
from tests.infra.fixtures import poll
from tests.infra.knobs import unavailable
from tests.infra.realpods import RealPods, realnodes
from tests.infra.scripts import load_script

pstack = load_script("cluster/polyaxon_stack.py", "miles_ray_polyaxon_stack")

OWNER = "default"
PROJECT = "miles-pods"
ARTIFACTS_CLAIM = pstack.DEFAULT_ARTIFACTS_STORE["schema"]["volumeClaim"]


@dataclass
class PolyaxonPods:
    real_pods: RealPods
    namespace: str
    server: Any  # haupt.HauptServer
    stack: Any  # polyaxon_stack.Stack
    standin: MloperatorStandIn
    host_for_pods: str
    artifacts: Path  # the artifacts store = the sandbox's directory = the claim's volume
    data: Path  # the claim miles-data's directory
    owner: str = OWNER
    project: str = PROJECT
    figures: dict[str, float] = field(default_factory=dict)
    _relay: dict[str, Any] | None = None
    _pvs: list[str] = field(default_factory=list)

    @property
    def host(self) -> str:
        return self.server.host

    @property
    def api_client(self) -> Any:
        return self.real_pods.api_client()

    def grant_pods_rbac(self, service_account: str = "default") -> None:
        """The admin's step: :func:`tests.infra.haupt.grant_runs_rbac` in this namespace."""
        haupt.grant_runs_rbac(self.api_client, self.namespace, service_account)

    def run_logs(self, uuid: str) -> list[dict]:
        """The run's logs as Polyaxon's API serves them (its streams endpoint: the archived pod logs, one file per
        answer, paged with ``last_file``), every page."""
        base = f"{self.host}/streams/v1/{self.namespace}/{self.owner}/{self.project}/runs/{uuid}/logs?force=true"
        out: list[dict] = []
        last = None
        for _ in range(100):
            url = base + (f"&last_file={urllib.parse.quote(last)}" if last else "")
            with urllib.request.urlopen(url, timeout=30) as r:
                page = json.loads(r.read())
            if not page.get("logs") or not page.get("last_file") or page["last_file"] == last:
                out += page.get("logs") or []
                break
            out += page["logs"]
            last = page["last_file"]
        return out

    def stop(self) -> dict[str, str]:
        """Stand-in, agent, relay, API server (by PID); the PersistentVolumes. Idempotent."""
        out: dict[str, str] = {}
        self.standin.stop()
        out.update(self.stack.stop())
        if self._relay:
            realnodes.stop_relay_out(self._relay)
            self._relay = None
            out["relay"] = "stopped"
        self.server.stop()
        out["haupt"] = "stopped"
        from kubernetes import client
        from kubernetes.client.rest import ApiException

        core = client.CoreV1Api(self.api_client)
        for pv in self._pvs:
            try:
                core.delete_persistent_volume(pv)
            except ApiException:
                pass
        self._pvs = []
        return out


def _claim_on(core: Any, namespace: str, claim: str, path: Path) -> str:
    """Claim ``claim`` bound to a hostPath PersistentVolume of directory ``path`` (the same on every node)."""
    from kubernetes import client

    pv = f"{namespace}-{claim}"
    core.create_persistent_volume(client.V1PersistentVolume(
        metadata=client.V1ObjectMeta(name=pv),
        spec=client.V1PersistentVolumeSpec(
            capacity={"storage": "1Gi"}, access_modes=["ReadWriteMany"], storage_class_name="",
            persistent_volume_reclaim_policy="Retain",
            host_path=client.V1HostPathVolumeSource(path=str(path), type="Directory"))))
    core.create_namespaced_persistent_volume_claim(namespace, client.V1PersistentVolumeClaim(
        metadata=client.V1ObjectMeta(name=claim),
        spec=client.V1PersistentVolumeClaimSpec(
            access_modes=["ReadWriteMany"], storage_class_name="", volume_name=pv,
            resources=client.V1VolumeResourceRequirements(requests={"storage": "1Gi"}))))
    return pv


def start_polyaxon_pods(rp: RealPods, workdir: Path, namespace: str) -> PolyaxonPods:
    """The API server, its relay for pods, the namespace with its claims, the agent and the stand-in."""
    from kubernetes import client

    figures: dict[str, float] = {}
    try:
        venv = haupt.ensure_venv()
    except haupt.HauptUnavailable as e:
        unavailable("Polyaxon API server", str(e))
        raise  # unreachable
    # ONE artifacts store for the server and the agent, by the same name and path: the claim's volume is this
    # directory of the machine, mounted in every pod at the same path the server reads it at (the server would
    # otherwise serve no pod's logs, and the agent fail on the server's clean-up requests for a store it does
    # not know: seen on real pods, 'KeyError: artifacts_store' then the agent exits).
    artifacts = workdir / "haupt" / "sandbox"
    artifacts.mkdir(parents=True, exist_ok=True)
    store = {**pstack.DEFAULT_ARTIFACTS_STORE,
             "schema": {"volumeClaim": ARTIFACTS_CLAIM, "mountPath": str(artifacts)}}
    t0 = time.monotonic()
    server = haupt.start(venv, workdir / "haupt", artifacts_store=store)
    figures["haupt_start_s"] = round(time.monotonic() - t0, 1)
    px = None
    try:
        hostport, relay = realnodes.relay_out(rp.real_state, server.port, workdir / "logs")
        core = client.CoreV1Api(rp.api_client())
        core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=namespace)))
        poll(f"ServiceAccount {namespace}/default", lambda: any(
            s.metadata.name == "default" for s in core.list_namespaced_service_account(namespace).items), 60)
        data = rp.dir / "volumes" / f"{namespace}-miles-data"
        data.mkdir(parents=True, exist_ok=True)
        pvs = [_claim_on(core, namespace, "miles-data", data),
               _claim_on(core, namespace, ARTIFACTS_CLAIM, artifacts)]
        t = time.monotonic()
        stack = pstack.up(workdir / "stack", rp.kubeconfig, server.host, namespace, with_mloperator=False,
                          artifacts_store=store, die_with_parent=True)
        figures["agent_start_s"] = round(time.monotonic() - t, 1)
        standin = MloperatorStandIn(client.CustomObjectsApi(rp.api_client()), namespace).start()
        px = PolyaxonPods(real_pods=rp, namespace=namespace, server=server, stack=stack, standin=standin,
                          host_for_pods=f"http://{hostport}", artifacts=artifacts, data=data, figures=figures,
                          _relay=relay, _pvs=pvs)
        server.create_project(PROJECT, OWNER)
        return px
    except BaseException:
        if px is not None:
            px.stop()
        else:
            server.stop()
        raise


@pytest.fixture(scope="module")
def polyaxon_pods(real_pods: RealPods, tmp_path_factory: pytest.TempPathFactory) -> Iterator[PolyaxonPods]:
    """:func:`start_polyaxon_pods` in namespace ``miles-px`` for one test module; stopped after it (before the
    tier's teardown checks that nothing is left)."""
    px = start_polyaxon_pods(real_pods, tmp_path_factory.mktemp("pxpods"), "miles-px")
    try:
        yield px
    finally:
        px.stop()
