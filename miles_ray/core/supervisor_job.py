"""The run supervisor on a KubeRay cluster as Kubernetes objects: a ConfigMap holding the supervisor program
(``launchers/supervise.py`` and the standard-library modules it imports from its own directory:
:func:`miles_ray.controller.program.program_files`) and its spec, and a ``batch/v1`` Job
``<run>-supervisor`` that runs it in the cluster's own pinned image. Pure: dicts in, dicts out.

Why a Job and not KubeRay's RayJob with ``clusterSelector``: a RayJob's submitter (K8sJobMode) submits ONE
entrypoint and follows it; it cannot wait for the GPU workers to be back in Ray, resubmit with ``--load`` under a
new submission id, or judge progress between attempts, and a RayJob's ``backoffLimit`` retries mean a new cluster
or the same entrypoint again. The Job runs the one supervisor program of every kind of cluster; it owns nothing
but its own pod, needs no Kubernetes API access (no service-account token is mounted), and talks only to the Ray
head's dashboard through the head Service name. What it did is in its log lines (``MILES_RAY_SUPERVISOR {json}``)
and its container's termination message, which miles-ray reads through the Kubernetes API.

Everything of the pod is taken from the RayCluster it supervises a run on (the live object): the image (the
cluster's pinned digest), the volumes and mounts (so it reads the run's checkpoint dir as the trainers write it),
the pod and container security contexts, and the Secret holding the Ray token (mounted as a file). The Job is
owned by the RayCluster: deleting the cluster (``down``) deletes it.
"""

from __future__ import annotations

import copy
import hashlib
import json
from typing import Any

from miles_ray.core.builders import MANAGED_BY, RAY_TOKEN_KEY, kuberay_token_secret
from miles_ray.core.names import label_safe

ROOT = "/opt/miles-ray"  # where the program, its modules and the spec are mounted
PROGRAM = "supervise.py"
SPEC = "spec.json"
TOKEN_DIR = "/var/run/miles-ray/ray-token"
TOKEN_FILE = f"{TOKEN_DIR}/{RAY_TOKEN_KEY}"
CONTAINER = "supervisor"
COMPONENT = "run-supervisor"
# The supervisor polls one HTTP API every few seconds: a tenth of a CPU and 256 MiB are plenty (measured RSS is a
# figure of the real-pod tier). Memory limit = request (the pod is never killed for memory a node lent it).
REQUESTS = {"cpu": "100m", "memory": "256Mi"}
LIMITS = {"cpu": "500m", "memory": "256Mi"}
# The program adopts the attempt it finds running after its own restart, so a crashed supervisor container is
# restarted in place (restartPolicy OnFailure) a few times; beyond that the Job fails and says so. It exits 0 once
# the run's end is decided (a FAILED run included: a restart would only say it again and cost the earlier log).
BACKOFF_LIMIT = 4
NAME_MAX = 63
DASHBOARD_PORT = 8265
LABEL_RUN = "miles-ray/run"
LABEL_CLUSTER = "miles-ray/cluster"


def supervisor_name(run: str) -> str:
    """``<run>-supervisor`` (the Job and its ConfigMap), shortened with a hash when it would pass 63 characters
    (a Job's name is also its pods' ``job-name`` label value)."""
    name = f"{run}-supervisor"
    if len(name) <= NAME_MAX:
        return name
    digest = hashlib.sha256(run.encode()).hexdigest()[:8]
    return f"{run[:NAME_MAX - len('-supervisor') - 9].rstrip('-')}-{digest}-supervisor"


def head_dashboard_url(raycluster: dict[str, Any]) -> str:
    """The head's dashboard (Jobs API) through KubeRay's head Service, by name: the cluster DNS resolves it to
    the head pod (the Service is headless), so the supervisor pod needs no ClusterIP routing."""
    meta = raycluster["metadata"]
    return f"http://{meta['name']}-head-svc.{meta['namespace']}.svc.cluster.local:{DASHBOARD_PORT}"


def _head_pod_spec(raycluster: dict[str, Any]) -> dict[str, Any]:
    return raycluster["spec"]["headGroupSpec"]["template"]["spec"]


def token_secret(raycluster: dict[str, Any]) -> str | None:
    """The Secret holding the cluster's Ray token under ``auth_token``, None without token auth: KubeRay's
    ``authOptions`` (its ``secretName``, else the Secret KubeRay makes, named after the RayCluster), or a Ray
    container whose ``RAY_AUTH_MODE=token`` takes ``RAY_AUTH_TOKEN`` from a Secret."""
    options = raycluster["spec"].get("authOptions") or {}
    if options.get("mode") == "token":
        return options.get("secretName") or kuberay_token_secret(raycluster["metadata"]["name"])
    container = _head_pod_spec(raycluster)["containers"][0]
    env = {e["name"]: e for e in container.get("env") or []}
    if (env.get("RAY_AUTH_MODE") or {}).get("value", "").lower() != "token":
        return None
    ref = ((env.get("RAY_AUTH_TOKEN") or {}).get("valueFrom") or {}).get("secretKeyRef") or {}
    return ref.get("name")


def module_key(path: str) -> str:
    """A ConfigMap key for a file path (keys allow no '/'): ``miles_ray/core/x.py`` -> ``miles_ray.core.x.py``."""
    return path.replace("/", ".")


def labels(run: str, cluster: str) -> dict[str, str]:
    return {"app.kubernetes.io/managed-by": MANAGED_BY, "app.kubernetes.io/name": "miles",
            "app.kubernetes.io/component": COMPONENT, LABEL_RUN: label_safe(run), LABEL_CLUSTER: label_safe(cluster)}


def selector(run: str) -> str:
    """The label selector of a run's supervisor objects and pods."""
    return f"app.kubernetes.io/component={COMPONENT},{LABEL_RUN}={label_safe(run)}"


def _owner(raycluster: dict[str, Any]) -> dict[str, Any]:
    meta = raycluster["metadata"]
    return {"apiVersion": raycluster.get("apiVersion", "ray.io/v1"), "kind": "RayCluster", "name": meta["name"],
            "uid": meta["uid"], "blockOwnerDeletion": True}


def build_configmap(raycluster: dict[str, Any], run: str, program: dict[str, str],
                    spec: dict[str, Any]) -> dict[str, Any]:
    """The ConfigMap of the run's supervisor: every file of ``program`` (path under :data:`ROOT` -> text; the
    program itself is ``supervise.py``) and ``spec.json``."""
    if PROGRAM not in program:
        raise ValueError(f"the supervisor program {PROGRAM} is not among the files {sorted(program)}")
    meta = raycluster["metadata"]
    data = {module_key(path): text for path, text in sorted(program.items())}
    data[SPEC] = json.dumps(spec, sort_keys=True, indent=1)
    return {"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": supervisor_name(run), "namespace": meta["namespace"],
                         "labels": labels(run, meta["name"]), "ownerReferences": [_owner(raycluster)]},
            "data": data}


def build_job(raycluster: dict[str, Any], run: str, program: dict[str, str],
              image: str | None = None) -> dict[str, Any]:
    """The ``batch/v1`` Job running the supervisor of ``run`` on ``raycluster`` (the live object: its ``uid``
    owns the Job). ``program``: the files the ConfigMap holds (their paths lay the modules out under ROOT).
    ``image``: another image than the cluster's (a run with a Polyaxon run of its own: Polyaxon's sidecar image,
    python3 + polyaxon, which every pod of a Polyaxon-made cluster already runs, so its nodes have it; the
    reporter cannot load in the Ray image), pulled IfNotPresent; its HOME is /tmp (the client's config dir)."""
    meta = raycluster["metadata"]
    name = supervisor_name(run)
    head = _head_pod_spec(raycluster)
    ray = head["containers"][0]
    lbl = labels(run, meta["name"])
    files = [{"key": module_key(p), "path": p} for p in sorted(program)] + [{"key": SPEC, "path": SPEC}]
    # the cluster's own volumes and mounts (the claim with the run's checkpoints), not the memory-backed /dev/shm
    volumes = [copy.deepcopy(v) for v in head.get("volumes") or [] if "emptyDir" not in v]
    keep = {v["name"] for v in volumes}
    mounts = [copy.deepcopy(m) for m in ray.get("volumeMounts") or [] if m["name"] in keep]
    volumes.append({"name": "supervisor", "configMap": {"name": name, "items": files}})
    mounts.append({"name": "supervisor", "mountPath": ROOT, "readOnly": True})
    env = [{"name": "PYTHONUNBUFFERED", "value": "1"}, {"name": "PYTHONDONTWRITEBYTECODE", "value": "1"}]
    if image:
        env.append({"name": "HOME", "value": "/tmp"})
    secret = token_secret(raycluster)
    if secret:
        volumes.append({"name": "ray-token", "secret": {"secretName": secret, "defaultMode": 0o440,
                                                        "items": [{"key": RAY_TOKEN_KEY, "path": RAY_TOKEN_KEY}]}})
        mounts.append({"name": "ray-token", "mountPath": TOKEN_DIR, "readOnly": True})
    container: dict[str, Any] = {
        "name": CONTAINER, "image": image or ray["image"],
        "imagePullPolicy": "IfNotPresent" if image else ray.get("imagePullPolicy", "IfNotPresent"),
        "command": ["python3", f"{ROOT}/{PROGRAM}", "--spec", f"{ROOT}/{SPEC}"],
        "env": env, "volumeMounts": mounts,
        "resources": {"requests": dict(REQUESTS), "limits": dict(LIMITS)},
        "terminationMessagePolicy": "FallbackToLogsOnError",
    }
    if ray.get("securityContext"):
        container["securityContext"] = copy.deepcopy(ray["securityContext"])
    pod: dict[str, Any] = {"restartPolicy": "OnFailure", "automountServiceAccountToken": False,
                           "enableServiceLinks": False, "containers": [container], "volumes": volumes}
    if head.get("securityContext"):
        pod["securityContext"] = copy.deepcopy(head["securityContext"])
    for key in ("nodeSelector", "tolerations", "imagePullSecrets"):
        if head.get(key):
            pod[key] = copy.deepcopy(head[key])
    return {"apiVersion": "batch/v1", "kind": "Job",
            "metadata": {"name": name, "namespace": meta["namespace"], "labels": lbl,
                         "ownerReferences": [_owner(raycluster)]},
            "spec": {"completions": 1, "parallelism": 1, "backoffLimit": BACKOFF_LIMIT,
                     "template": {"metadata": {"labels": dict(lbl)}, "spec": pod}}}


def job_final(job: dict[str, Any] | None) -> str | None:
    """``Complete`` or ``Failed`` once the Job's conditions say it ended, else None (running or gone)."""
    for cond in ((job or {}).get("status") or {}).get("conditions") or []:
        if cond.get("type") in ("Complete", "Failed") and cond.get("status") == "True":
            return cond["type"]
    return None
