"""``runs pull`` on Kubernetes: the short-lived pod the bytes come through. Pure (no I/O): the run's RayCluster (as
the API returns it) comes in; the pod that mounts the run's checkpoint storage read-only, in the cluster's own image
(the image of its head's Ray container: the pinned one), goes out -- and the program it runs (:data:`POD_SCRIPT`).

The pod takes, from the RayCluster's head template: the Ray container's image and pull policy, the volume whose mount
holds the checkpoint dir (the claim at ``mount_path``: the same volume and path as the head and workers, so the paths of
the run record are the paths in the pod), the pod and container security contexts (a namespace enforcing the
restricted Pod Security Standard admits it), image pull secrets and tolerations. Small requests, no CPU limit (hashing
and tar are CPU bound), no service account token, no restarts.

What it runs, ``python3 -c POD_SCRIPT``:

* ``keep IDLE`` (the pod's command): waits while something touches its heartbeat file; after ``IDLE`` seconds
  without one it exits, so a pod left by a client killed with SIGKILL ends by itself (its client deletes it
  otherwise, always);
* ``manifest ROOT`` (exec): one JSON line per regular file under ``ROOT`` (symlinks not followed), ``{"path",
  "bytes", "sha256"}`` -- the size and sha256 computed on the cluster's side --, then ``MILES_RAY_PULL_END N``;
* ``tar ROOT PATH...`` (exec): those files, in that order, as an uncompressed tar on stdout (a streamed tar, as
  ``kubectl cp`` reads one); a file that cannot be read ends the stream with a message on stderr and exit 1.
"""

from __future__ import annotations

import copy
import posixpath
from typing import Any

from miles_ray.core.builders import MANAGED_BY
from miles_ray.core.errors import ConfigError
from miles_ray.core.names import label_safe

PULL_POD_NAME = "miles-ray-pull"  # app.kubernetes.io/name of every pull pod
RUN_LABEL = "miles-ray/run"
WORK_DIR = "/miles-ray-pull"  # an emptyDir: the heartbeat file (the root filesystem may be read-only)
IDLE_SECONDS = 120  # a pull pod with no client for this long ends by itself
END_PREFIX = "MILES_RAY_PULL_END"
ARGV_BUDGET = 256 * 1024  # bytes of paths per tar exec (argv stays far below the kernel's limits)

POD_SCRIPT = r"""
import hashlib, json, os, stat, sys, tarfile, threading, time
HEART = "/miles-ray-pull/alive"
def beat():
    while True:
        try:
            os.utime(HEART)
        except OSError:
            pass
        time.sleep(5)
def beating():
    threading.Thread(target=beat, daemon=True).start()
def files(root):
    for where, dirs, names in os.walk(root):
        dirs.sort()
        for name in sorted(names):
            full = os.path.join(where, name)
            try:
                st = os.lstat(full)
            except OSError:
                continue
            if stat.S_ISREG(st.st_mode):
                yield os.path.relpath(full, root), full
cmd = sys.argv[1]
if cmd == "keep":
    idle = float(sys.argv[2])
    open(HEART, "a").close()
    while time.time() - os.stat(HEART).st_mtime < idle:
        time.sleep(2)
elif cmd == "manifest":
    beating()
    n = 0
    for rel, full in files(sys.argv[2]):
        h, size = hashlib.sha256(), 0
        with open(full, "rb") as fh:
            for block in iter(lambda: fh.read(4 << 20), b""):
                h.update(block)
                size += len(block)
        sys.stdout.write(json.dumps({"path": rel, "bytes": size, "sha256": h.hexdigest()}) + "\n")
        n += 1
    sys.stdout.write("MILES_RAY_PULL_END %d\n" % n)
    sys.stdout.flush()
elif cmd == "tar":
    beating()
    root = sys.argv[2]
    out = os.fdopen(1, "wb", buffering=1 << 20)
    with tarfile.open(fileobj=out, mode="w|", format=tarfile.GNU_FORMAT, bufsize=1 << 20) as tar:
        for rel in sys.argv[3:]:
            full = os.path.join(root, rel)
            try:
                fh = open(full, "rb")
                st = os.fstat(fh.fileno())
            except OSError as e:
                sys.stderr.write("cannot read %s: %s\n" % (rel, e))
                sys.exit(1)
            with fh:
                info = tarfile.TarInfo(rel)
                info.size, info.mtime, info.mode = st.st_size, int(st.st_mtime), 0o644
                tar.addfile(info, fh)
    out.flush()
"""


def pull_pod_name(run: str, suffix: str) -> str:
    """``miles-ray-pull-<run>-<suffix>``, a valid pod name (63 characters at most)."""
    base = label_safe(run).lower().replace("_", "-").replace(".", "-").strip("-")[:40].strip("-") or "run"
    return f"{PULL_POD_NAME}-{base}-{suffix}"[:63].rstrip("-")


def run_selector(run: str) -> str:
    """The label selector of the pull pods of ``run``."""
    return f"app.kubernetes.io/name={PULL_POD_NAME},{RUN_LABEL}={label_safe(run)}"


def _ray_container(spec: dict[str, Any]) -> dict[str, Any]:
    containers = spec.get("containers") or []
    return next((c for c in containers if c.get("name") == "ray"), containers[0] if containers else {})


def _within(path: str, mount: str) -> bool:
    path, mount = posixpath.normpath(path), posixpath.normpath(mount)
    return path == mount or path.startswith(mount.rstrip("/") + "/")


def pull_pod(raycluster: dict[str, Any], root: str, name: str, run: str) -> dict[str, Any]:
    """The pull pod for the checkpoint dir ``root`` of ``run`` on ``raycluster`` (see the module doc). Bad input
    (ConfigError, one line): a head template without an image, or no volume of it holding ``root`` (the checkpoints
    would be on the head's own disk, which no other pod can read)."""
    meta = raycluster.get("metadata") or {}
    namespace, cluster = meta.get("namespace"), meta.get("name")
    spec = (((raycluster.get("spec") or {}).get("headGroupSpec") or {}).get("template") or {}).get("spec") or {}
    ray = _ray_container(spec)
    if not ray.get("image"):
        raise ConfigError(f"RayCluster {namespace}/{cluster} names no image for its head: there is no pinned image "
                          "to read run " + f"{run}'s checkpoints with", hint="'miles-ray doctor' checks the cluster")
    mounts = [m for m in ray.get("volumeMounts") or [] if m.get("mountPath") and _within(root, m["mountPath"])]
    volumes = {v.get("name"): v for v in spec.get("volumes") or []}
    mounts = [m for m in mounts if m.get("name") in volumes and "emptyDir" not in volumes[m["name"]]]
    if not mounts:
        raise ConfigError(f"run {run}'s checkpoint dir {root} is on no volume of RayCluster {namespace}/{cluster}'s "
                          "pods (no shared claim mounted there): nothing outside its pods can read it",
                          hint="save checkpoints under the claim's mount_path (the default output dir is there)")
    mount = max(mounts, key=lambda m: len(m["mountPath"]))
    volume = copy.deepcopy(volumes[mount["name"]])
    claim_mount = {"name": mount["name"], "mountPath": mount["mountPath"], "readOnly": True}
    if mount.get("subPath"):
        claim_mount["subPath"] = mount["subPath"]
    small = {"cpu": "100m", "memory": "128Mi"}
    container: dict[str, Any] = {
        "name": "pull", "image": ray["image"], "imagePullPolicy": ray.get("imagePullPolicy") or "IfNotPresent",
        "command": ["python3", "-c", POD_SCRIPT, "keep", str(IDLE_SECONDS)],
        "resources": {"requests": dict(small), "limits": {"memory": "512Mi"}},
        "volumeMounts": [claim_mount, {"name": "pull-work", "mountPath": WORK_DIR}],
    }
    if ray.get("securityContext"):
        container["securityContext"] = copy.deepcopy(ray["securityContext"])
    pod_spec: dict[str, Any] = {
        "restartPolicy": "Never", "terminationGracePeriodSeconds": 0, "automountServiceAccountToken": False,
        "containers": [container],
        "volumes": [volume, {"name": "pull-work", "emptyDir": {"sizeLimit": "1Mi"}}],
    }
    for key in ("securityContext", "imagePullSecrets", "tolerations"):
        if spec.get(key):
            pod_spec[key] = copy.deepcopy(spec[key])
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": namespace,
                         "labels": {"app.kubernetes.io/managed-by": MANAGED_BY,
                                    "app.kubernetes.io/name": PULL_POD_NAME, RUN_LABEL: label_safe(run),
                                    "miles-ray/cluster": label_safe(cluster or "")}},
            "spec": pod_spec}


def tar_batches(paths: list[str], budget: int | None = None) -> list[list[str]]:
    """``paths`` in order, cut into batches whose argv stays within ``budget`` bytes (:data:`ARGV_BUDGET`; one tar
    exec each)."""
    budget = ARGV_BUDGET if budget is None else budget
    batches: list[list[str]] = []
    size = budget + 1
    for p in paths:
        if size + len(p) + 1 > budget:
            batches.append([])
            size = 0
        batches[-1].append(p)
        size += len(p) + 1
    return batches
