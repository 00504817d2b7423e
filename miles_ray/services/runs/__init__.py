"""The runs submitted from this machine and the jobs that run them, behind one seam.

A run's job is served by one backend (:class:`RunBackend`): a Ray job on its head (:mod:`.ray_job`), or, for
``submit --mode launcher`` on a Kubernetes head, a Polyaxon job (:mod:`.polyaxon_job`). :func:`backend_for` is
the one place that decides which, from the run record; status, logs, stop and the run list ask it and never
look at the kind of job themselves. Submitting is :mod:`.submit`.

A supervised run (``submit --max-restarts N``, N > 0; a record with a ``supervisor``) is served by
:class:`~.supervised.SupervisedRun`: its supervisor submits its attempts and carries it through failures.

A run record keeps the head its job started on (Ray's head node id; on Kubernetes the head pod and its UID) and
the run's ``attempts``. Whenever a verb reads a Ray job's state (status, logs, the run list, doctor RUN, submit of
an existing run) it compares that head with the head serving now: a job whose head is gone (another pod, another
Ray head node, a local head whose process died) and that runs on no ALIVE node was lost with it -- FAILED,
"head lost at ...", kept in its attempt -- whatever Ray's job table (GCS fault tolerance keeps it) still says.
Submit of such a run starts its next attempt (submission id ``<run's>-a<N>``), resuming from its checkpoints.
"""

from __future__ import annotations

from typing import Any, Callable, Iterator, Protocol

from miles_ray.adapters import state
from miles_ray.core.config import MilesRayConfig
from miles_ray.core.errors import ConfigError
from miles_ray.core.heads import parse_head
from miles_ray.core.records import Attempt, RunRecord, as_record
from miles_ray.core.runs import RunStatus, SavedCopySource, Stopped
from miles_ray.core.results import Result
from miles_ray.core.submission import SubmitJob
from miles_ray.services.runs import polyaxon_tracked
from miles_ray.services.runs.polyaxon_job import PolyaxonJob
from miles_ray.services.runs.ray_job import RayJob
from miles_ray.services.runs.supervised import SupervisedRun

__all__ = ["RunBackend", "backend_for", "list_runs", "live_status", "pick_run", "run_logs", "run_namespace",
           "run_status", "run_stop"]


class RunBackend(Protocol):
    """What serves a run's job: submits it, says its state, streams its logs, stops it."""

    def submit(self, job: SubmitJob) -> Result:
        """Create the job of a prepared run (and its run record)."""

    def state(self) -> RunStatus:
        """The job's state and facts (status RUN)."""

    def live_state(self) -> str:
        """The job's state in one word, never failing (``UNREACHABLE``, ``UNKNOWN``): the run list."""

    def logs(self, follow: bool, on_saved_copy: Callable[[SavedCopySource], None] | None = None) -> Iterator[str]:
        """The job's logs, in chunks as they come (followed until the job ends)."""

    def head_lost(self) -> Attempt | None:
        """The run's current attempt (from its record's ``attempts``) if its job was lost with the Ray head it
        started on, else None."""

    def stop(self, wait_timeout: float | None = 60) -> Stopped:
        """Stop the job (waiting up to ``wait_timeout`` seconds for it to end, where the backend can)."""


def _is_polyaxon_job(record: RunRecord) -> bool:
    """--mode launcher on a Kubernetes head runs as a Polyaxon job (see ``prepare_submit``): the launcher of a
    record whose head lives in a Kubernetes namespace; a launcher on any other head runs here, as a Ray job."""
    return record.mode == "launcher" and parse_head(record.address).namespace is not None


def backend_for(record: RunRecord | dict[str, Any], *, kube_context: str | None = None, kubeconfig: str | None = None,
                url: str | None = None, cfg: MilesRayConfig | None = None) -> RunBackend:
    """THE dispatch: the backend serving the job of ``record``. ``kube_context``/``kubeconfig``: how to reach a
    Ray head on Kubernetes (over what the record kept); ``url``: the Ray head already open; ``cfg``: the
    configuration a run is being submitted with."""
    record = as_record(record)
    if _is_polyaxon_job(record):
        return PolyaxonJob(record, cfg)
    if record.supervisor:
        return SupervisedRun(record, kube_context=kube_context, kubeconfig=kubeconfig, url=url)
    return RayJob(record, kube_context=kube_context, kubeconfig=kubeconfig, url=url)


def live_status(record: RunRecord | dict[str, Any], kube_context: str | None = None, kubeconfig: str | None = None) -> str:
    """The run's job state, ``UNREACHABLE`` when its head does not answer, ``UNKNOWN`` when it has no such job."""
    return backend_for(record, kube_context=kube_context, kubeconfig=kubeconfig).live_state()


def run_status(run: str, *, kube_context: str | None = None, kubeconfig: str | None = None) -> RunStatus:
    """The run's job info (from its head, Polyaxon, or the saved copy once the head is gone); a run with a Polyaxon
    run of its own (on a Polyaxon-made cluster) names it."""
    record = state.RunStore.load(run)
    got = backend_for(record, kube_context=kube_context, kubeconfig=kubeconfig).state()
    if got.polyaxon_uuid is None and record.polyaxon_run_uuid:
        got = got.model_copy(update={"polyaxon_uuid": record.polyaxon_run_uuid})
    return got


def run_logs(run: str, follow: bool, *, kube_context: str | None = None, kubeconfig: str | None = None,
             on_saved_copy: Callable[[SavedCopySource], None] | None = None) -> Iterator[str]:
    """The job's logs (followed until it ends); ``on_saved_copy`` is called when they come from the saved copy."""
    backend = backend_for(state.RunStore.load(run), kube_context=kube_context, kubeconfig=kubeconfig)
    return backend.logs(follow, on_saved_copy)


def run_stop(run: str, *, kube_context: str | None = None, kubeconfig: str | None = None,
             wait_timeout: float | None = 60) -> Stopped:
    """Stop the run's job; unless ``wait_timeout`` is None wait until it has ended (a Ray job). A run with a Polyaxon
    run of its own (on a Polyaxon-made cluster) has that stopped too."""
    record = state.RunStore.load(run)
    stopped = backend_for(record, kube_context=kube_context, kubeconfig=kubeconfig).stop(wait_timeout)
    polyaxon_tracked.stop(record)
    return stopped


def run_namespace(record: RunRecord | dict[str, Any]) -> str | None:
    """The Kubernetes namespace of a run's cluster (``k8s://NAMESPACE/NAME`` addresses), else None."""
    address = getattr(as_record(record), "address", None) or ""
    return address[len("k8s://"):].partition("/")[0] if address.startswith("k8s://") else None


def pick_run(run: str | None, namespace: str | None = None) -> str:
    """RUN as given (checked against --namespace), or the latest run (the latest in --namespace)."""
    if run:
        if namespace is not None:
            have = run_namespace(state.RunStore.load(run))
            if have != namespace:
                raise ConfigError(f"run {run!r} is not on a cluster in namespace {namespace!r} "
                                  f"({'namespace ' + repr(have) if have else 'not a Kubernetes run'})",
                                  hint="drop --namespace, or name a run of that namespace ('miles-ray runs')")
        return run
    recs = state.RunStore.all()
    if namespace is not None:
        recs = [r for r in recs if run_namespace(r) == namespace]
    if not recs:
        where = f" on a cluster in namespace {namespace!r}" if namespace is not None else ""
        raise ConfigError(f"no runs yet{where}", hint="submit one with 'miles-ray submit'")
    return recs[-1].run


def list_runs(*, namespace: str | None = None, live: bool = True, kube_context: str | None = None,
              kubeconfig: str | None = None) -> list[dict[str, Any]]:
    """The run records (those on clusters in ``namespace``), each with its job's live ``status`` if ``live``."""
    records = [r for r in state.RunStore.all() if namespace is None or run_namespace(r) == namespace]
    # each record as written (the run list's -o json), with its job's state
    return [{**r.dump(), **({"status": live_status(r, kube_context=kube_context, kubeconfig=kubeconfig)}
                            if live else {})} for r in records]
