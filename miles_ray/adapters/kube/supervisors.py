"""A run's supervisor on Kubernetes (the ConfigMap and Job of :mod:`miles_ray.core.supervisor_job`): created whole
or not at all, its event lines read from its pods' logs (every pod, every container run, in order), whether it
still runs, how it ended (the Job's conditions and its container's termination message), and deleted with its
pods (foreground propagation, waited for).

kubernetes is imported lazily inside the functions.
"""

from __future__ import annotations

import time
from typing import Any, Iterator

from miles_ray.adapters.kube.client import api_error, http_status, pod_log
from miles_ray.core import supervisor_job as sj
from miles_ray.core.errors import ClusterError, Conflict, TimedOut
from miles_ray.core.supervision import parse_events


def _names(namespace: str, run: str) -> tuple[str, str]:
    return namespace, sj.supervisor_name(run)


def create(api_client, configmap: dict[str, Any], job: dict[str, Any]) -> dict[str, Any]:
    """Create the ConfigMap, then the Job; if the Job is refused, the ConfigMap is deleted again (nothing
    half-made). Conflict when the run already has a supervisor Job. Returns the created Job."""
    from kubernetes import client

    core, batch = client.CoreV1Api(api_client), client.BatchV1Api(api_client)
    ns, name = configmap["metadata"]["namespace"], configmap["metadata"]["name"]
    try:
        core.create_namespaced_config_map(ns, configmap, field_validation="Strict")
    except Exception as e:  # noqa: BLE001
        if http_status(e) == 409:
            raise Conflict(f"a supervisor ConfigMap {ns}/{name} already exists",
                           hint=f"'miles-ray stop' of the run deletes it, or: kubectl -n {ns} delete configmap {name}") from None
        raise api_error(e, f"create the supervisor ConfigMap {ns}/{name}") from None
    try:
        created = batch.create_namespaced_job(ns, job, field_validation="Strict")
    except Exception as e:  # noqa: BLE001
        error = api_error(e, f"create the supervisor Job {ns}/{name}")
        try:
            core.delete_namespaced_config_map(name, ns)
        except Exception as cleanup:  # noqa: BLE001
            error = ClusterError(f"{error}; and deleting the ConfigMap it left failed too: "
                                 f"{api_error(cleanup, 'delete ConfigMap')}",
                                 hint=f"kubectl -n {ns} delete configmap {name}")
        raise error from None
    return api_client.sanitize_for_serialization(created)


def read_job(api_client, namespace: str, run: str) -> dict[str, Any] | None:
    """The run's supervisor Job as the API server has it, None when there is none."""
    from kubernetes import client

    ns, name = _names(namespace, run)
    try:
        job = client.BatchV1Api(api_client).read_namespaced_job(name, ns)
    except Exception as e:  # noqa: BLE001
        if http_status(e) == 404:
            return None
        raise api_error(e, f"read the supervisor Job {ns}/{name}") from None
    return api_client.sanitize_for_serialization(job)


def pods(api_client, namespace: str, run: str) -> list[Any]:
    """The supervisor Job's pods (``V1Pod``), oldest first."""
    from kubernetes import client

    try:
        items = client.CoreV1Api(api_client).list_namespaced_pod(namespace, label_selector=sj.selector(run)).items
    except Exception as e:  # noqa: BLE001
        raise api_error(e, f"list the supervisor pods of run {run} in {namespace}") from None
    return sorted(items, key=lambda p: (p.metadata.creation_timestamp, p.metadata.name))


def _container_logs(core, namespace: str, pod: Any) -> Iterator[str]:
    """The supervisor container's log of ``pod``: the run before its last restart first (the kubelet keeps one),
    then the current one."""
    status = next((c for c in pod.status.container_statuses or [] if c.name == sj.CONTAINER), None)
    runs = ([True] if status is not None and (status.restart_count or 0) > 0 else []) + [False]
    for previous in runs:
        try:
            yield pod_log(core, pod.metadata.name, namespace, container=sj.CONTAINER, previous=previous)
        except Exception as e:  # noqa: BLE001
            if http_status(e) in (400, 404):  # not started yet, or the previous run is gone
                continue
            raise api_error(e, f"read the log of supervisor pod {namespace}/{pod.metadata.name}") from None


def log_lines(api_client, namespace: str, run: str) -> list[str]:
    """Every line the run's supervisor printed, from every pod of its Job in order."""
    from kubernetes import client

    core = client.CoreV1Api(api_client)
    return [line for pod in pods(api_client, namespace, run) for text in _container_logs(core, namespace, pod)
            for line in (text or "").splitlines()]


def events(api_client, namespace: str, run: str) -> list[dict[str, Any]]:
    """The supervisor's events (its ``MILES_RAY_SUPERVISOR {json}`` lines), in the order it printed them."""
    return parse_events("\n".join(log_lines(api_client, namespace, run)))


def alive(api_client, namespace: str, run: str) -> bool:
    """Whether the run's supervisor Job exists and has not ended (it runs, or is being restarted)."""
    job = read_job(api_client, namespace, run)
    return job is not None and sj.job_final(job) is None and not job["metadata"].get("deletionTimestamp")


def delete(api_client, namespace: str, run: str, timeout: float = 120) -> bool:
    """Delete the run's supervisor Job (foreground propagation: its pods first) and ConfigMap, and wait until
    its pods are gone. False when there was no Job. TimedOut when pods are still there after ``timeout``."""
    from kubernetes import client

    core, batch = client.CoreV1Api(api_client), client.BatchV1Api(api_client)
    ns, name = _names(namespace, run)
    existed = True
    try:
        batch.delete_namespaced_job(name, ns, propagation_policy="Foreground", grace_period_seconds=5)
    except Exception as e:  # noqa: BLE001
        if http_status(e) != 404:
            raise api_error(e, f"delete the supervisor Job {ns}/{name}") from None
        existed = False
    try:
        core.delete_namespaced_config_map(name, ns)
    except Exception as e:  # noqa: BLE001
        if http_status(e) != 404:
            raise api_error(e, f"delete the supervisor ConfigMap {ns}/{name}") from None
    deadline = time.monotonic() + timeout
    while pods(api_client, namespace, run) or read_job(api_client, namespace, run) is not None:
        if time.monotonic() > deadline:
            raise TimedOut(f"the supervisor Job {ns}/{name} or its pods are still there {timeout:.0f}s after "
                           "deleting it", hint=f"kubectl -n {ns} get job,pods -l {sj.selector(run)}")
        time.sleep(1)
    return existed
