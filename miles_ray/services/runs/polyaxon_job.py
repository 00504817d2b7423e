"""A run whose job is a Polyaxon job: ``submit --mode launcher`` on a Kubernetes head runs the upstream launcher
as a Polyaxon job in the cluster (same image and connection, against the head service). Created, read, followed
and stopped through Polyaxon's API on the host it was created on, which its run record keeps (no kubeconfig
needed)."""

from __future__ import annotations

import time
from typing import Any, Callable, Iterator

from miles_ray.adapters import polyaxon_api, polyaxon_spec, state
from miles_ray.core.config import MilesRayConfig
from miles_ray.core.errors import ClusterError, ConfigError, NotFound
from miles_ray.core.records import Attempt, RunRecord, as_record
from miles_ray.core.runs import LauncherJobCreated, RunStatus, SavedCopySource, Stopped
from miles_ray.core.submission import SubmitJob
from miles_ray.services import polyaxon_where

# Polyaxon run statuses as Ray job states (what status/logs/stop report for a launcher job)
_PX_STATES = {"succeeded": "SUCCEEDED", "done": "SUCCEEDED", "failed": "FAILED", "upstream_failed": "FAILED",
              "stopped": "STOPPED", "skipped": "STOPPED", "running": "RUNNING"}
LOGS_POLL = 2.0


def _state(run: dict[str, Any]) -> str:
    return _PX_STATES.get(run.get("status") or "", "PENDING")


def launcher_as_polyaxon_job(cfg: MilesRayConfig, record: dict[str, Any],
                             operation: dict[str, Any]) -> LauncherJobCreated:
    """--mode launcher on a Kubernetes cluster: the upstream launcher runs as a Polyaxon job in the same image and
    connection, inside the cluster, against the head service (never nested in a Ray job, never next to us).
    ``operation`` is the prepared job (:func:`miles_ray.core.entrypoint.launcher_job_operation`). The run record
    keeps the Polyaxon host, owner and project, so status/logs/stop reach the job again on that host."""
    polyaxon_spec.validate_operation(operation)
    ref = polyaxon_where.resolve("launcher-job", None, cfg)
    client = polyaxon_where.client(ref)
    rec = as_record(record).model_copy(update={"polyaxon_owner": ref.owner, "polyaxon_project": ref.project,
                                               "polyaxon_host": client.host})
    state.create_record(rec)
    try:
        uuid = client.create_operation(
            ref.owner, ref.project, operation, name=operation["name"], tags=operation["tags"],
            meta={"miles_ray_run": rec.run, "recipe_hash": rec.recipe_hash})
    except BaseException:
        state.record_path(rec.run).unlink(missing_ok=True)
        raise
    rec.polyaxon_run_uuid = uuid
    state.save_record(rec)
    return LauncherJobCreated(run=rec.run, polyaxon_uuid=uuid, created=True, address=rec.address,
                              record=str(state.record_path(rec.run)), output_dir=rec.output_dir,
                              submission_id=f"polyaxon:{uuid}", status="CREATED", launcher_job=True)


class PolyaxonJob:
    """The Polyaxon job of ``record`` (a launcher run); ``cfg``: the configuration it is submitted with (only
    when submitting: afterwards the record says where the job is)."""

    def __init__(self, record: RunRecord | dict[str, Any], cfg: MilesRayConfig | None = None) -> None:
        self.record = as_record(record)
        self.cfg = cfg

    def submit(self, job: SubmitJob) -> LauncherJobCreated:
        if self.cfg is None:
            raise ConfigError(f"run {job.run}: a Polyaxon job is created with the configuration it is submitted with")
        return launcher_as_polyaxon_job(self.cfg, job.record, job.operation or {})

    def _where(self):
        """(client, owner, project, uuid) of the job, on the host its record keeps; a record made before the host
        was kept: ``POLYAXON_HOST``."""
        rec = self.record
        ref = rec.polyaxon("launcher-job")
        uuid = ref.uuid
        if not uuid:
            raise ConfigError(f"run {rec.run!r}: its record names no Polyaxon job (it was not created)",
                              hint="submit the run again ('miles-ray submit --mode launcher --run "
                                   f"{rec.run} ...')")
        if not ref.project:
            raise ConfigError(f"run {rec.run!r}: its record does not say which Polyaxon project holds job {uuid}",
                              hint="read it with 'polyaxon ops logs --uid " + uuid + "'")
        try:
            client = polyaxon_where.client(ref)
        except ConfigError:
            raise ConfigError(f"run {rec.run!r}: its record (made before miles-ray kept the Polyaxon host) does not "
                              f"say which Polyaxon API host holds its job {uuid}",
                              hint="set POLYAXON_HOST=http://HOST:PORT to the host it was submitted to") from None
        return client, ref.owner, ref.project, uuid

    def state(self) -> RunStatus:
        """Polyaxon says how the job is doing (its status as a Ray job state, and Polyaxon's own)."""
        rec = self.record
        client, owner, project, uuid = self._where()
        info = client.get_run(owner, project, uuid, with_conditions=True)
        last = (info.get("conditions") or [{}])[-1]
        return RunStatus(run=rec.run, submission_id=f"polyaxon:{uuid}", address=rec.address,
                         status=_state(info), polyaxon_status=info.get("status"), polyaxon_uuid=uuid,
                         message=" ".join((last.get("message") or "").split()) or None,
                         output_dir=rec.output_dir, recipe=rec.recipe, mode=rec.mode)

    def live_state(self) -> str:
        """The job's state, ``UNREACHABLE`` when Polyaxon does not answer, ``UNKNOWN`` when it has no such job."""
        try:
            client, owner, project, uuid = self._where()
            return _state(client.get_run(owner, project, uuid, with_conditions=False))
        except NotFound:
            return "UNKNOWN"
        except (ClusterError, ConfigError):
            return "UNREACHABLE"

    def logs(self, follow: bool, on_saved_copy: Callable[[SavedCopySource], None] | None = None) -> Iterator[str]:
        """The job's logs through Polyaxon; following, new lines until the run has ended (then one last read, so
        nothing archived at the end is missed)."""
        client, owner, project, uuid = self._where()
        seen = 0
        while True:
            ended = follow and client.get_run(owner, project, uuid, with_conditions=False).get("status") in \
                polyaxon_api.FINAL_STATUSES
            lines = [str(x.get("value", "")) for x in client.get_logs(owner, project, uuid)]
            if len(lines) > seen:
                yield "".join(line + "\n" for line in lines[seen:])
                seen = len(lines)
            if not follow or ended:
                return
            time.sleep(LOGS_POLL)

    def head_lost(self) -> Attempt | None:
        """A Polyaxon job is not tied to the Ray head it submits to: never lost with it (see RayJob.head_lost)."""
        return None

    def stop(self, wait_timeout: float | None = 60) -> Stopped:
        """Ask Polyaxon to stop the job (its agent deletes the pod); the state right after asking."""
        rec = self.record
        client, owner, project, uuid = self._where()
        client.stop_run(owner, project, uuid)
        return Stopped(run=rec.run, submission_id=rec.submission_id, stopped=True,
                       status=_state(client.get_run(owner, project, uuid, with_conditions=False)))
