"""A real Redis in a namespace of the real-pod cluster (tests/infra/realpods.py), for GCS fault tolerance.

``start_redis(rp, namespace)`` creates, in an existing namespace: a Secret ``<name>-password`` (key ``password``,
a fresh random value), a Pod running Debian's ``redis-server`` from the real-pod image (the package is in
cluster/versions.env's IMAGE_PACKAGES) with ``requirepass`` from that Secret (by reference: ``$(REDIS_PASSWORD)``
expanded by the kubelet, never in the spec), and a headless Service ``<name>`` (the pods' DNS stub answers
``<name>.<namespace>.svc.cluster.local`` from its EndpointSlice; there is no kube-proxy for a ClusterIP). It
returns once the Redis answers AUTH + PING through a port-forward (from this process, as the pods would).
``Redis.stop()`` deletes the three objects and waits until the pod is gone.

Redis keeps everything in memory here (no ``save``, no AOF): the Ray state it holds is lost with the pod, which is
what a test of the head's loss needs (the Redis itself is never lost there).
"""

from __future__ import annotations

import secrets
import socket
import time
from dataclasses import dataclass
from typing import Any

from tests.infra.fixtures import poll

REDIS_PORT = 6379
PASSWORD_KEY = "password"


@dataclass
class Redis:
    api: Any  # kubernetes ApiClient
    namespace: str
    name: str
    secret: str
    password: str
    pod: str
    started_s: float

    @property
    def host(self) -> str:
        return f"{self.name}.{self.namespace}.svc.cluster.local"

    @property
    def address(self) -> str:
        """What ``up --gcs-ft`` takes."""
        return f"redis://{self.host}:{REDIS_PORT}"

    def ping(self, password: str | None = None) -> str:
        """AUTH (this Redis's password unless another is given) + PING through a port-forward to the pod; the
        second reply line (``+PONG`` when it answers)."""
        from miles_ray.adapters.kube import port_forward

        with port_forward(self.api, self.namespace, self.pod, REDIS_PORT) as url:
            port = int(url.rsplit(":", 1)[1].rstrip("/"))
            return resp_ping(port, self.password if password is None else password)

    def keys(self) -> int:
        """How many keys the Redis holds now (DBSIZE), through a port-forward."""
        from miles_ray.adapters.kube import port_forward

        with port_forward(self.api, self.namespace, self.pod, REDIS_PORT) as url:
            port = int(url.rsplit(":", 1)[1].rstrip("/"))
            with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
                f = s.makefile("rb")
                s.sendall(_cmd("AUTH", self.password) + _cmd("DBSIZE"))
                f.readline()
                return int(f.readline().decode().strip().lstrip(":"))

    def stop(self) -> None:
        from kubernetes import client

        core = client.CoreV1Api(self.api)
        for delete, name in ((core.delete_namespaced_service, self.name), (core.delete_namespaced_pod, self.pod),
                             (core.delete_namespaced_secret, self.secret)):
            try:
                delete(name, self.namespace)
            except client.ApiException as e:
                if e.status != 404:
                    raise
        poll(f"Redis pod {self.namespace}/{self.pod} to be gone",
             lambda: not [p for p in core.list_namespaced_pod(self.namespace, label_selector=f"app={self.name}").items],
             120)


def _cmd(*args: str) -> bytes:
    return b"*%d\r\n" % len(args) + b"".join(b"$%d\r\n%s\r\n" % (len(a), a) for a in (x.encode() for x in args))


def resp_ping(port: int, password: str | None) -> str:
    """AUTH + PING against 127.0.0.1:``port``; the reply to PING (or to AUTH when that fails)."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.settimeout(10)
        f = s.makefile("rb")
        if password:
            s.sendall(_cmd("AUTH", password))
            got = f.readline().decode(errors="replace").strip()
            if not got.startswith("+OK"):
                return got
        s.sendall(_cmd("PING"))
        return f.readline().decode(errors="replace").strip()


def start_redis(rp: Any, namespace: str, name: str = "redis", timeout: float = 240) -> Redis:
    """Secret + Pod + headless Service of a password-protected Redis in ``namespace`` of the real-pod cluster
    ``rp`` (tests/infra/realpods.py RealPods); returns once it answers AUTH + PING."""
    from kubernetes import client

    t = time.monotonic()
    api = rp.api_client()
    core = client.CoreV1Api(api)
    password = secrets.token_hex(16)
    secret = f"{name}-password"
    labels = {"app": name, "app.kubernetes.io/part-of": "miles-ray-tests"}
    core.create_namespaced_secret(namespace, client.V1Secret(
        metadata=client.V1ObjectMeta(name=secret, labels=labels), string_data={PASSWORD_KEY: password}))
    pod = client.V1Pod(
        metadata=client.V1ObjectMeta(name=name, labels=labels),
        spec=client.V1PodSpec(
            restart_policy="Always",
            termination_grace_period_seconds=0,
            automount_service_account_token=False,
            # any real node: the GPU nodes' taint is tolerated (the Redis asks for no GPU)
            tolerations=[client.V1Toleration(key="nvidia.com/gpu", operator="Exists", effect="NoSchedule")],
            containers=[client.V1Container(
                name="redis", image=rp.image, image_pull_policy="Never",
                command=["redis-server"],
                args=["--port", str(REDIS_PORT), "--bind", "0.0.0.0", "--protected-mode", "no", "--save", "",
                      "--appendonly", "no", "--requirepass", "$(REDIS_PASSWORD)"],
                env=[client.V1EnvVar(name="REDIS_PASSWORD", value_from=client.V1EnvVarSource(
                    secret_key_ref=client.V1SecretKeySelector(name=secret, key=PASSWORD_KEY)))],
                ports=[client.V1ContainerPort(container_port=REDIS_PORT, name="redis")],
                readiness_probe=client.V1Probe(
                    tcp_socket=client.V1TCPSocketAction(port=REDIS_PORT), period_seconds=1, failure_threshold=3),
                resources=client.V1ResourceRequirements(requests={"cpu": "50m", "memory": "64Mi"},
                                                        limits={"memory": "256Mi"}))]))
    core.create_namespaced_pod(namespace, pod)
    core.create_namespaced_service(namespace, client.V1Service(
        metadata=client.V1ObjectMeta(name=name, labels=labels),
        spec=client.V1ServiceSpec(cluster_ip="None", selector={"app": name},
                                  ports=[client.V1ServicePort(port=REDIS_PORT, target_port=REDIS_PORT, name="redis")])))
    redis = Redis(api=api, namespace=namespace, name=name, secret=secret, password=password, pod=name, started_s=0.0)

    def ready() -> bool:
        p = core.read_namespaced_pod(name, namespace)
        return any(c.type == "Ready" and c.status == "True" for c in p.status.conditions or [])

    poll(f"Redis pod {namespace}/{name} to be Ready", ready, timeout,
         explain=lambda: str(core.read_namespaced_pod(name, namespace).status))

    def answers() -> bool:
        try:
            return redis.ping() == "+PONG"
        except Exception:  # noqa: BLE001 -- a port-forward to a pod that just started: not yet
            return False

    poll(f"Redis {namespace}/{name} to answer AUTH + PING", answers, 60)
    redis.started_s = round(time.monotonic() - t, 1)
    return redis
