"""The run supervisor's Polyaxon reporter: keeps a Miles run's Polyaxon run current, from where the supervisor
runs (on the cluster), through Polyaxon's own client.

The Polyaxon run was created by ``miles-ray submit`` as a NON-MANAGED run (``is_managed=False``: a record that a
client keeps up to date through the API; no agent, no pod). The Miles image has no ``polyaxon`` package, so the
Miles job itself logs nothing to Polyaxon: this reporter runs in the supervisor (``launchers/supervise.py``), which
runs where ``polyaxon`` is importable (Polyaxon's sidecar image on Kubernetes, the venv's python on the embedded
cluster), and reports what the supervisor sees:

* status: ``running`` when an attempt starts (its number and Ray submission id in the message), ``retrying``
  between attempts, and at the end ``succeeded`` / ``failed`` / ``stopped`` (``RunClient.log_status``);
* the job's driver logs, line by line, as the run's logs (traceml's ``LogsFileWriter``, uploaded to the run's
  artifacts through the streams API, which is where Polyaxon serves a run's logs from);
* the ``step`` / ``rollout`` / ``eval`` / ``perf`` lines Miles prints, read by the parser ``miles-ray runs compare``
  uses (``metrics.py``, shipped beside the supervisor), as Polyaxon metrics (``tracking`` ``Run.log_metrics``, the
  step being the line's id), and their last values as the run's outputs (what Polyaxon's comparison table shows);
* the checkpoint directory as an output lineage artifact (``log_artifact_ref``, kind ``dir``), and each complete
  checkpoint in it as one (kind ``model``, named as its ``iter_<N>`` dir): the lineage lists the checkpoints the run
  keeps -- one its retention deleted is deleted from the lineage (:meth:`PolyaxonReporter.sync_checkpoints`);
* a diverged loss (a NaN/inf value of a ``train/*loss`` metric: the ``nan_loss`` finding of ``miles-ray status RUN``),
  told once as the run's output ``nan_loss`` (what happened, at which rollout), at the next upload. Told, never
  acted on: the run goes on. (A stall is a silence, which a reporter fed by the log does not see: ``miles-ray
  status RUN`` and ``doctor RUN`` say it.)

And the other way: a Polyaxon run stopped in Polyaxon (its UI, ``polyaxon ops stop``) has the current attempt's Ray
job stopped (checked at each upload, i.e. while the job prints), as ``miles-ray stop`` does; the supervisor never
starts another attempt of a stopped run.

Its spec (the supervisor spec's ``polyaxon`` section): ``host``, ``owner``, ``project``, ``run_uuid``; optional
``token_file`` (a Polyaxon API token, else ``$POLYAXON_AUTH_TOKEN``), ``checkpoint_dir``, ``work_dir`` (where the
event and log files are written before upload; default ``polyaxon/`` in the supervisor's working directory),
``upload_seconds`` (default 10).
A failing Polyaxon call never stops the run: the reporter says so on stderr and carries on.

Standard library + ``polyaxon`` only (imports nothing of miles_ray).
"""

from __future__ import annotations

import atexit
import datetime as _dt
import functools
import importlib
import json
import math
import os
import re
import sys
import time
from typing import Any, Mapping



def _shipped(names: tuple[str, ...], *attrs: str) -> Any:
    """A module of ours shipped beside the supervisor (the first name), else the installed package's (the embedded
    cluster's venv): the one that has ``attrs``."""
    for name in names:
        try:
            module = importlib.import_module(name)
        except ImportError:
            continue
        if all(hasattr(module, a) for a in attrs):
            return module
    return None


PARSER = _shipped(("metrics", "miles_ray.core.metrics"), "METRIC_LINE", "parse_dict")  # the parser runs compare uses
RAY_HTTP = _shipped(("ray_http", "miles_ray.controller.ray_http"), "RayHead")  # the run controller's Ray client
CKPT = _shipped(("checkpoint_dirs", "miles_ray.controller.checkpoint_dirs"), "iteration_dirs", "size")  # the retention's
JOURNAL = _shipped(("polyaxon_journal", "miles_ray.launchers.polyaxon_journal"), "restore", "read_journal")

REQUIRED = ("host", "owner", "project", "run_uuid")
PX_STATUS = {"SUCCEEDED": "succeeded", "FAILED": "failed", "STOPPED": "stopped"}
REASON = "MilesRaySupervisor"
WRITE_ATTEMPTS = 6  # 1 + 5 retries, 1+2+4+8+16 s apart


def _warn(message: str) -> None:
    print(f"polyaxon reporter: {message}", file=sys.stderr, flush=True)


class PolyaxonReporter:
    """What the supervisor calls (``launchers/supervise.py``'s hook): :meth:`attempt_started`, :meth:`log_chunk`
    with each new piece of an attempt's driver log, :meth:`attempt_ended`, :meth:`finished`."""

    def __init__(self, section: Mapping[str, Any]) -> None:
        missing = [k for k in REQUIRED if not section.get(k)]
        if missing:
            raise ValueError(f"the spec's polyaxon section lacks {', '.join(missing)}")
        from polyaxon._constants.globals import NO_AUTH
        from polyaxon._schemas.client import ClientConfig
        from polyaxon.client import PolyaxonClient, RunClient
        from polyaxon import tracking

        self.uuid = str(section["run_uuid"])
        self.checkpoint_dir = section.get("checkpoint_dir") or None
        self.head_url = str(section.get("head_url") or "").rstrip("/") or None
        self.token_file = section.get("token_file") or None
        self.current_job: str | None = None  # the Ray job of the attempt running now
        self.stop_asked = False
        self.upload_seconds = float(section.get("upload_seconds") or 10)
        token = os.environ.get("POLYAXON_AUTH_TOKEN")
        if section.get("token_file"):
            with open(section["token_file"]) as fh:
                token = fh.read().strip()
        config = ClientConfig(host=str(section["host"]).rstrip("/"), token=token, timeout=20)
        client = PolyaxonClient(config=config, token=token or NO_AUTH)
        owner, project = str(section["owner"]), str(section["project"])
        self.rc = RunClient(owner=owner, project=project, run_uuid=self.uuid, client=client,
                            manual_exceptions_handling=True)
        self.path = JOURNAL.work_dir(section.get("work_dir"), self.uuid)
        # What an earlier reporter of this run committed (a supervisor started again re-reads each attempt's log
        # from its start): the characters of each attempt's log it wrote, and the size of each file then. Its
        # files are cut back to those sizes, so the files and the offsets agree whenever it was killed.
        self.offsets_path = self.path + ".offsets.json"
        self.written, committed = JOURNAL.read_journal(self.offsets_path)
        if committed is not None:
            JOURNAL.restore(self.path, committed)
        # Polyaxon's tracking client on the existing (non-managed) run, no code/env/log capture of this process
        # (the logs are the Miles job's, given to logs()). Its metric events and the log lines go through
        # traceml's SYNCHRONOUS writers: the files change only when this reporter commits (its default writers
        # append from a thread of their own at any moment, so a reporter killed between two commits would leave
        # lines in its files that the offsets do not count, and a reporter started again would log them twice).
        self.run = tracking.init(owner=owner, project=project, run_uuid=self.uuid, client=client, track_code=False,
                                 track_env=False, track_logs=False, artifacts_path=self.path,
                                 collect_artifacts=False, collect_resources=False)
        from traceml.serialization.base import EventWriter, LogWriter

        self.run._event_logger = JOURNAL.Synchronous(EventWriter(self.path, backend=EventWriter.EVENTS_BACKEND))
        self.log_writer = JOURNAL.Synchronous(LogWriter(self.path))
        self.last: dict[str, float] = {}
        self.partial: dict[int, str] = {}
        self.seen: dict[int, int] = {}  # characters of each attempt's log given so far
        self.next_upload = time.monotonic() + self.upload_seconds
        self.closed = False
        self.final: str | None = None
        self.diverged: str | None = None  # what a NaN/inf loss line said (the first one), told once as nan_loss
        self.told = False
        self.synced_for: str | None = None  # the tracker's text when the checkpoint lineage was last made current
        atexit.register(self.close)  # a supervisor ended by a signal (stop RUN) still ships what it has written

    # -- the supervisor's events ----------------------------------------------------------------------------

    def attempt_started(self, ev: Mapping[str, Any]) -> None:
        self.event(ev)

    def attempt_ended(self, ev: Mapping[str, Any]) -> None:
        self.event(ev)

    def finished(self, ev: Mapping[str, Any]) -> None:
        self.event(ev)

    def checkpoint_deleted(self, ev: Mapping[str, Any]) -> None:
        self.event(ev)

    def log_chunk(self, attempt: int, text: str) -> None:
        start = self.seen.get(attempt, 0)
        self.seen[attempt] = start + len(text)
        done = self.written.get(attempt, 0)
        if start < done:  # written by the reporter before this one (its files are still here)
            for line in text[:done - start].split("\n"):
                self._metrics(line, log=False)  # (their last values are still the run's outputs)
            text = text[done - start:]
        self.logs(text, attempt)

    def event(self, ev: Mapping[str, Any]) -> None:
        kind = ev.get("event")
        try:
            if kind == "attempt_started":
                self.current_job = ev.get("submission_id") or self.current_job
                message = (f"attempt {ev.get('attempt')} (Ray job {ev.get('submission_id')})"
                           + (f", resuming from {ev['resumed_from']}" if ev.get("resumed_from") else ""))
                self._retried("log the status running", lambda: self._status("running", message))
                self._retried("log the attempt number", lambda: self.rc.log_outputs(
                    async_req=False, attempts=int(ev.get("attempt") or 1)))
            elif kind == "attempt_ended" and ev.get("retry"):
                message = f"attempt {ev.get('attempt')} ended {ev.get('status')}: {ev.get('reason')}; {ev.get('why')}"
                self._retried("log the status retrying", lambda: self._status("retrying", message))
            elif kind == "finished":
                self.finish(str(ev.get("status") or "FAILED"), ev.get("reason") or ev.get("why"))
            if kind in ("attempt_ended", "checkpoint_deleted"):
                self.sync_checkpoints()
        except Exception as e:  # noqa: BLE001 - Polyaxon being unwell never stops the run
            _warn(f"could not report {kind}: {e}")

    def _status(self, status: str, message: str | None) -> None:
        pending = self.rc.log_status(status, reason=REASON, message=(message or "")[:1000] or None)
        if hasattr(pending, "get"):  # the client sends a status in the background: wait for its answer
            pending.get(timeout=60)

    # -- the driver's logs ----------------------------------------------------------------------------------

    def logs(self, text: str, attempt: int = 1, node: str | None = None) -> None:
        """New text of an attempt's driver log: its complete lines become Polyaxon log lines, and the metric lines
        among them Polyaxon metrics (an incomplete last line waits for the rest)."""
        if self.closed or not text:
            return
        text = self.partial.pop(attempt, "") + text
        lines = text.split("\n")
        if lines[-1]:
            self.partial[attempt] = lines[-1]
        self._lines(lines[:-1], attempt, node)
        self.commit()
        if time.monotonic() >= self.next_upload:
            self.upload()

    def _lines(self, lines: list[str], attempt: int, node: str | None) -> None:
        from traceml.logging import V1Log

        now = _dt.datetime.now(_dt.timezone.utc)
        for line in lines:
            if line.strip():
                # the time given, so Polyaxon keeps the line as printed (it would cut a time out of the text)
                self.log_writer.add_event(V1Log.process_log_line(value=line.rstrip("\r"), timestamp=now, node=node,
                                                                 pod=None, container=f"attempt-{attempt}"))
            self._metrics(line)

    def _metrics(self, line: str, log: bool = True) -> None:
        if PARSER is None or ": {" not in line:
            return
        m = PARSER.METRIC_LINE.search(line)
        if not m:
            return
        values = PARSER.parse_dict(m.group(3))
        if not values:
            return
        if log:
            self.run.log_metrics(step=int(m.group(2)), **values)
        self.last.update(values)
        if self.diverged is None:  # (also from lines an earlier reporter sent: telling it again changes nothing)
            self.diverged = _diverged(int(m.group(2)), values)

    # -- shipping and the end -------------------------------------------------------------------------------

    def upload(self) -> None:
        """Write what is pending and upload the run's event and log files to its artifacts (the streams API)."""
        self.next_upload = time.monotonic() + self.upload_seconds
        try:
            self.commit()
            self.run.upload_artifacts_dir(dirpath=self.path, path="", overwrite=True, relative_to=self.path)
            self._follow_a_stop()
        except Exception as e:  # noqa: BLE001
            _warn(f"could not upload logs and metrics: {e}")
        self._tell()
        if self.checkpoint_dir and _latest_iteration(self.checkpoint_dir) != self.synced_for:
            try:
                self.sync_checkpoints()  # a new complete checkpoint
            except Exception as e:  # noqa: BLE001
                _warn(f"could not list the kept checkpoints as lineage: {e}")

    def _tell(self) -> None:
        """A diverged loss seen and not told yet: the run's output ``nan_loss`` says it (one try per upload, so a
        refused write never holds the log up; the next upload tries again)."""
        if self.diverged is None or self.told:
            return
        try:
            self.rc.log_outputs(async_req=False, nan_loss=self.diverged)
            self.told = True
            _warn(f"told the Polyaxon run: {self.diverged}")
        except Exception as e:  # noqa: BLE001
            _warn(f"could not tell the Polyaxon run that {self.diverged}: {e}")

    def commit(self) -> None:
        """Write the pending lines and metric points to the run's files, then record -- in one atomic replace --
        how much of each attempt's log those files now hold and each file's size. What Polyaxon holds is what
        these files hold (each upload overwrites its copies), so a reporter started again from this record
        (``polyaxon_journal.restore``) sends each line and point exactly once, wherever the one before it was killed."""
        if not self.closed:
            self.log_writer.flush()
            self.run._event_logger.flush()
        attempts = {a: max(n - len(self.partial.get(a, "")), self.written.get(a, 0)) for a, n in self.seen.items()}
        journal = {"version": 2, "attempts": {str(a): n for a, n in sorted({**self.written, **attempts}.items())},
                   "files": JOURNAL.sizes(self.path)}
        tmp = f"{self.offsets_path}.{os.getpid()}.tmp"
        with open(tmp, "w") as fh:
            json.dump(journal, fh)
        os.replace(tmp, self.offsets_path)

    def _follow_a_stop(self) -> None:
        """The Polyaxon run was stopped in Polyaxon (its UI, ``polyaxon ops stop``) while the run goes on: stop the
        current attempt's Ray job, as ``miles-ray stop`` does; the supervisor then sees it STOPPED and never starts
        another attempt."""
        if self.final is not None or self.stop_asked or not (self.head_url and self.current_job):
            return
        self.rc.refresh_data()
        status = str(getattr(self.rc.run_data.status, "value", self.rc.run_data.status) or "")
        if status not in ("stopping", "stopped"):
            return
        RAY_HTTP.RayHead(self.head_url, token_file=self.token_file).stop(self.current_job, timeout=30)
        self.stop_asked = True
        _warn(f"the Polyaxon run was {status} in Polyaxon: stopped Ray job {self.current_job}")

    def finish(self, status: str, message: str | None = None) -> None:
        """The run ended (``status``: SUCCEEDED, FAILED or STOPPED): the rest of its logs and metrics, its final
        metric values as outputs, its checkpoint lineage, then its final status."""
        if self.final is not None:
            return
        self.final = status
        for attempt, rest in sorted(self.partial.items()):
            self._lines([rest], attempt, None)
        self.partial.clear()
        self.close()
        from polyaxon._utils.fqn_utils import to_fqn_name
        from polyaxon.schemas import V1ArtifactKind

        outputs = {to_fqn_name(k): v for k, v in self.last.items()}
        if self.diverged is not None and not self.told:  # (its last upload could not tell it)
            outputs["nan_loss"] = self.diverged
        if outputs:
            self._retried("log the final metric values as outputs",
                          lambda: self.rc.log_outputs(async_req=False, **outputs))
        if self.checkpoint_dir:
            summary = {"checkpoint_dir": self.checkpoint_dir, "latest_iteration": _latest_iteration(self.checkpoint_dir)}
            self._retried("log the checkpoint lineage", lambda: self._lineage_ref(
                path=self.checkpoint_dir, kind=V1ArtifactKind.DIR, name="checkpoints", summary=summary,
                is_input=False, skip_hash_calculation=True))
            self.sync_checkpoints()
        # The final status is what keeps Polyaxon's run from showing "running" forever
        self._retried(f"log the final status {status}", lambda: self._status(PX_STATUS.get(status, "failed"), message))

    def _lineage_ref(self, **ref: Any) -> None:
        """``RunClient.log_artifact_ref(**ref)`` with its lineage request made in this thread: the client sends it
        asynchronously (``log_artifact_lineage(async_req=True)``), where a refusal is lost and cannot be retried."""
        send = self.rc.log_artifact_lineage
        self.rc.log_artifact_lineage = functools.partial(send, async_req=False)
        try:
            self.rc.log_artifact_ref(**ref)
        finally:
            del self.rc.log_artifact_lineage  # the class's own method again

    def sync_checkpoints(self) -> None:
        """Make the run's lineage list the checkpoints it keeps: each complete checkpoint of the checkpoint dir (an
        ``iter_<N>`` dir at or below Megatron's tracker) not listed yet is logged as an output artifact of kind
        ``model`` named as its dir (``summary``: iteration, bytes, checkpoint_dir), all in one request; a listed one
        that is no longer there (the run's retention deleted it) is deleted from the lineage. What is listed is read
        from Polyaxon, so a supervisor started again carries on. Never fails the run."""
        if not self.checkpoint_dir:
            return
        from polyaxon.schemas import V1ArtifactKind, V1RunArtifact

        latest = _latest_iteration(self.checkpoint_dir)
        kept = _complete_checkpoints(self.checkpoint_dir, latest)
        try:
            listed = {a.name for a in getattr(self.rc.get_artifacts_lineage(limit=1000), "results", None) or []
                      if _CHECKPOINT_NAME.fullmatch(a.name or "") and (a.summary or {}).get("checkpoint_dir")
                      == self.checkpoint_dir}
        except Exception as e:  # noqa: BLE001
            _warn(f"could not read the run's lineage: {e}")
            return
        new = [V1RunArtifact(name=name, kind=V1ArtifactKind.MODEL, path=path, is_input=False,
                             summary={"iteration": it, "bytes": size, "checkpoint_dir": self.checkpoint_dir})
               for name, (it, path, size) in sorted(kept.items()) if name not in listed]
        if new:
            self._retried("log the kept checkpoints as lineage",
                          lambda: self.rc.log_artifact_lineage(body=new, async_req=False))
        for name in sorted(listed - set(kept)):
            self._retried(f"delete the lineage of deleted checkpoint {name}",
                          lambda: self.rc.client.runs_v1.delete_run_artifact_lineage(
                              self.rc.owner, self.rc.project, self.uuid, name))
        self.synced_for = latest

    @staticmethod
    def _retried(what: str, call: Any) -> None:
        """``call()``, tried again (up to WRITE_ATTEMPTS in all, 1..16 s apart) when Polyaxon did not handle it: a
        connection error, a 5xx, a 429, or the 405 its sandbox answers to a write that comes while it serves another
        (seen under load on the outputs and the statuses of a run). Every status, the outputs and the lineage go
        through here: a run left "created" while it trains, or "running" after it ended, misleads whoever looks. A
        request Polyaxon refused (another 4xx) is not repeated; one warning if it never went through."""
        for attempt in range(WRITE_ATTEMPTS):
            try:
                call()
                return
            except Exception as e:  # noqa: BLE001
                status = getattr(e, "status", None)
                again = status is None or status in (405, 429) or (isinstance(status, int) and status >= 500)
                if not again or attempt + 1 == WRITE_ATTEMPTS:
                    _warn(f"could not {what} ({attempt + 1} attempt(s)): {e}")
                    return
                time.sleep(2.0 ** attempt)

    def close(self) -> None:
        if self.closed:
            return
        try:
            self.log_writer.close()
            self.run._event_logger.close()
        except Exception as e:  # noqa: BLE001
            _warn(f"could not write the last logs and metrics: {e}")
        self.closed = True
        self.upload()


def _diverged(step: int, values: Mapping[str, Any]) -> str | None:
    """What a metric line with a NaN/inf ``train/*loss`` says (None: its losses are finite)."""
    for name, value in sorted(values.items()):
        if (name.startswith("train/") and name.endswith("loss") and isinstance(value, float)
                and not math.isfinite(value)):
            return (f"{name} is {value} at rollout {step}: the loss diverged (the run is not stopped; 'miles-ray "
                    "status RUN' and 'miles-ray logs RUN' say more)")
    return None


_CHECKPOINT_NAME = re.compile(r"iter_\d+")


def _complete_checkpoints(checkpoint_dir: str, latest: str | None) -> dict[str, tuple[int, str, int]]:
    """The complete checkpoints in ``checkpoint_dir`` (the retention's ``iter_<N>`` dirs, N at or below the tracker's
    ``latest``; one above it is being written, or a dead attempt's partial one): name -> (N, path, bytes)."""
    top = int(latest) if latest is not None and latest.isdigit() else None
    if top is None:
        return {}
    return {os.path.basename(path): (n, path, CKPT.size(path))
            for n, path in CKPT.iteration_dirs(checkpoint_dir).items() if n <= top}


def _latest_iteration(checkpoint_dir: str) -> str | None:
    """Megatron's ``latest_checkpointed_iteration.txt`` where this process can read it (None elsewhere)."""
    try:
        with open(os.path.join(checkpoint_dir, "latest_checkpointed_iteration.txt")) as fh:
            return fh.read().strip() or None
    except OSError:
        return None


def make_reporter(spec: Any) -> PolyaxonReporter:
    """The reporter of a supervisor spec (its ``polyaxon`` section; the run's checkpoint dir when the section does
    not name one; the Ray head and its token file, to stop the run's job when its Polyaxon run is stopped): what
    the supervisor loads."""
    section = dict(spec if isinstance(spec, Mapping) else spec.polyaxon or {})
    for key in ("checkpoint_dir", "head_url", "token_file"):
        if not section.get(key) and getattr(spec, key, None):
            section[key] = getattr(spec, key)
    return PolyaxonReporter(section)
