"""Where ``runs pull`` reads a checkpoint's files: the two transports behind one verify/resume path
(:mod:`miles_ray.services.pull`). Each gives the manifest (per file its size and sha256, computed where the files are)
and copies the files DIR still needs through :func:`miles_ray.adapters.pull_files.copy_verified` (written beside its
place, verified against the manifest, renamed into place only when whole):

* :class:`HereSource` -- the checkpoint dir is on this machine (the embedded cluster): read from the disk;
* :func:`kube_source` -- a run on a Kubernetes cluster (KubeRay, or a Polyaxon-made RayCluster: the same pod path, as
  long as the checkpoints are on the claim the cluster mounts): a short-lived pod that mounts that claim read-only in
  the cluster's pinned image (:mod:`miles_ray.core.pull_pod`) computes the manifest and streams the files as a tar
  through exec; it is deleted at the end whatever happens.
"""

from __future__ import annotations

import contextlib
import io
import os
import tarfile
import time
from typing import Callable, Iterator, Protocol

from miles_ray.adapters import kube, pull_files
from miles_ray.adapters.kube.pull_pod import delete_ended, pull_pod
from miles_ray.core.errors import ConfigError, TransferFailed
from miles_ray.core.heads import parse_head
from miles_ray.core.progress import Progress, say
from miles_ray.core.pull import ManifestEntry
from miles_ray.core.pull_pod import pull_pod as pull_pod_spec
from miles_ray.core.pull_pod import pull_pod_name, run_selector, tar_batches

OnBytes = Callable[[int], None] | None
OnDone = Callable[[ManifestEntry], None]


class Source(Protocol):
    where: str

    def manifest(self) -> list[ManifestEntry]: ...

    def copy(self, entries: list[ManifestEntry], to: str, on_bytes: OnBytes, on_done: OnDone) -> None: ...


def _inside(entry: ManifestEntry) -> str:
    return entry.path.split("/", 1)[1]  # iter_<N:07d>/<rel>


class HereSource:
    """The checkpoint dir ``root`` on this machine, its files named ``prefix/<rel>`` in DIR."""

    def __init__(self, root: str, prefix: str) -> None:
        self.root, self.prefix, self.where = root, prefix, root

    def manifest(self) -> list[ManifestEntry]:
        return pull_files.source_manifest(self.root, self.prefix)

    def copy(self, entries: list[ManifestEntry], to: str, on_bytes: OnBytes, on_done: OnDone) -> None:
        for e in entries:
            pull_files.copy_verified(os.path.join(self.root, *_inside(e).split("/")), to, e, on_bytes)
            on_done(e)


class PodSource:
    """The checkpoint dir ``root`` read through a running pull pod."""

    def __init__(self, pod, root: str, prefix: str, where: str) -> None:  # noqa: ANN001 -- adapters' PullPod
        self.pod, self.root, self.prefix, self.where = pod, root, prefix, where

    def manifest(self) -> list[ManifestEntry]:
        return [ManifestEntry(path=f"{self.prefix}/{e['path']}", bytes=e["bytes"], sha256=e["sha256"])
                for e in self.pod.manifest(self.root)]

    def copy(self, entries: list[ManifestEntry], to: str, on_bytes: OnBytes, on_done: OnDone) -> None:
        by_rel = {_inside(e): e for e in entries}
        for batch in tar_batches([_inside(e) for e in entries]):
            with self.pod.tar(self.root, batch) as stream:
                got = 0
                with tarfile.open(fileobj=io.BufferedReader(stream, 1 << 20), mode="r|", bufsize=1 << 20) as tar:
                    for member in tar:
                        if got >= len(batch) or member.name != batch[got] or not member.isfile():
                            raise TransferFailed(f"the tar from the pull pod holds {member.name!r} where "
                                                 f"{batch[got] if got < len(batch) else 'its end'} was expected")
                        entry = by_rel[member.name]
                        reader = tar.extractfile(member)
                        assert reader is not None  # a regular file (checked above)
                        pull_files.copy_verified(reader, to, entry, on_bytes)
                        on_done(entry)
                        got += 1
                while stream.read(1 << 20):  # to its end: the command's exit status is checked there
                    pass
            if got != len(batch):
                raise TransferFailed(f"the tar from the pull pod ended after {got} of {len(batch)} file(s)")


def kube_head(record: dict) -> tuple[str, str] | None:
    """(namespace, RayCluster) of a run on a Kubernetes cluster, else None."""
    head = parse_head(str(record.get("address") or ""))
    return (head.namespace, head.name) if head.namespace and head.name else None


@contextlib.contextmanager
def kube_source(record: dict, root: str, prefix: str, *, kube_context: str | None, kubeconfig: str | None,
                progress: Progress, timeout: float = 300) -> Iterator[PodSource]:
    """A pull pod for ``root`` of the run of ``record`` (see the module doc): made from the run's RayCluster as it
    is now, deleted when the block ends. Bad input (one line, nothing created): the RayCluster is gone, or its pods
    mount no volume holding ``root``."""
    where = kube_head(record)
    assert where is not None
    namespace, raycluster = where
    run = record["run"]
    api = kube.load_client(kubeconfig or record.get("kubeconfig"), kube_context or record.get("kube_context"))
    rc = kube.RayClusters(api).get(namespace, raycluster)
    if rc is None:
        raise ConfigError(f"RayCluster {namespace}/{raycluster} of run {run} is gone: the pull pod takes its image "
                          "and claim from it", hint="bring the cluster up again with the same claim ('miles-ray "
                                                    "up'), then pull: the checkpoints stay on the claim")
    name = pull_pod_name(run, f"{time.time_ns() % 100000:05d}")
    spec = pull_pod_spec(rc, root, name, run)
    for gone in delete_ended(api, namespace, run_selector(run)):
        say(progress, f"deleted the ended pull pod {gone} (left by a pull killed outright)")
    say(progress, f"starting the pull pod {namespace}/{name} (the claim of RayCluster {raycluster}, read-only)")
    with pull_pod(api, spec, timeout, lambda why: say(progress, f"pull pod {name}: {why}")) as pod:
        yield PodSource(pod, root, prefix, f"{root} (RayCluster {namespace}/{raycluster}'s claim, through pod "
                                           f"{name})")

