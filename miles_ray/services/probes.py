"""The one probe runner: submit a small Ray job (a payload file in launchers/, described by
:class:`miles_ray.core.probes.Probe`), wait for it with a bound, STOP it when the bound runs out, and read its
answer. check-data, comm-check, doctor's data checks and register's checkpoint listing all go through here."""

from __future__ import annotations

import datetime as _dt
import secrets
import sys
import threading
from importlib import resources
from pathlib import Path
from typing import Any, Callable

from miles_ray.adapters import ray_jobs
from miles_ray.core.errors import ClusterError, TimedOut
from miles_ray.core.heads import HeadAddress, parse_head
from miles_ray.core.probes import Probe, parse_result
from miles_ray.core.progress import Progress
from miles_ray.core.results import Result


class ProbeRun(Result):
    """A probe job that ended with an answer: its id, its final status and the payload's answer (the JSON of its
    ``MILES_RAY_PROBE_RESULT`` line, read into each probe's own result by the service that ran it)."""

    job: str
    status: str
    result: dict[str, Any]


def launchers_dir() -> Path:
    """The payload directory (``launchers/``, installed as the ``miles_ray.launchers`` package): shipped as the
    working_dir of probe jobs and rehearsals."""
    return Path(str(resources.files("miles_ray.launchers")))


def payload_python(head: HeadAddress | str) -> str:
    """The interpreter a payload's job driver runs with: this very one when the head runs on this machine (the
    local cluster, a loopback address: same venv), else the image's ``python3``."""
    head = head if isinstance(head, HeadAddress) else parse_head(head)
    return sys.executable if head.on_this_machine else "python3"


def probe_token() -> str:
    """A fresh, sortable token for a probe's submission id (UTC time to the microsecond, plus randomness)."""
    return _dt.datetime.now(_dt.timezone.utc).strftime("%Y%m%d%H%M%S%f") + secrets.token_hex(2)


def run_probe(url: str, probe: Probe, python: str, progress: Progress = None) -> ProbeRun:
    """Run ``probe`` on the head at ``url`` (an http URL: see ``miles_ray.adapters.ray_head.open_head``).

    Returns the job's id, its final status and the payload's answer. Raises ``TimedOut``
    when the job has not ended within ``probe.timeout`` (the job is stopped first, so nothing is left running),
    and ``ClusterError`` when it ended without an answer (the last lines of its log say why)."""
    runtime_env: dict[str, Any] = {"working_dir": str(launchers_dir())}
    if probe.env:
        runtime_env["env_vars"] = dict(probe.env)
    if progress:
        progress(f"submitting {probe.kind} job {probe.submission_id} to {url} (bounded by {probe.timeout:.0f}s)")
    job_id, _ = ray_jobs.submit(url, probe.entrypoint(python), runtime_env, probe.submission_id, probe.metadata)
    try:
        info = ray_jobs.wait(url, job_id, timeout=probe.timeout)
    except TimedOut:
        ray_jobs.stop(url, job_id)
        raise TimedOut(f"the {probe.kind} job {job_id} did not finish within {probe.timeout:.0f}s on {url}; "
                       "it was stopped", hint="is a node stuck or busy? 'miles-ray status' shows the cluster") from None
    text = ray_jobs.logs(url, job_id)
    result = parse_result(text)
    if result is None:
        tail = " | ".join(line for line in text.strip().splitlines()[-3:]) if text else "no output"
        raise ClusterError(f"the {probe.kind} job {job_id} ended {info['status']} without a result ({tail[:400]})",
                           hint="the payload could not run on the head: check the image's python and ray")
    return ProbeRun(job=job_id, status=info["status"], result=result)


def side_by_side(*calls: Callable[[], Any] | None) -> list[Any]:
    """Run the given calls (None: not wanted, its result None) at the same time, each in a thread of its own: two
    probe jobs (submit's Miles-commit probe and its data preflight; doctor's data checks and Miles commit) cost the
    time of the longer one, not the sum. Returns the results in order. When calls raised, the first of them in
    order is raised, once every call has ended (the same error the calls made one after the other would raise
    first). The threads are daemons: Ctrl-C ends the command at once; the probe jobs end on their own bound."""
    wanted = [(i, call) for i, call in enumerate(calls) if call is not None]
    results: list[Any] = [None] * len(calls)
    if len(wanted) == 1:  # nothing to overlap: in this thread
        i, call = wanted[0]
        results[i] = call()
        return results
    errors: list[BaseException | None] = [None] * len(calls)

    def run(i: int, call: Callable[[], Any]) -> None:
        try:
            results[i] = call()
        except BaseException as e:  # noqa: BLE001 - handed to the caller below
            errors[i] = e

    threads = [threading.Thread(target=run, args=(i, call), name=f"miles-ray-probe-{i}", daemon=True)
               for i, call in wanted]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for e in errors:
        if e is not None:
            raise e
    return results
