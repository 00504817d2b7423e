"""Thin layer over a Ray head's HTTP APIs: the run controller's Ray client (:mod:`miles_ray.controller.ray_http`,
plain HTTP: a job's status, logs, stop, the job list, the state API's nodes -- ``ray status`` lags by seconds --,
the version, the drivers' activity) and, for what only Ray's SDK does (``ray.job_submission.JobSubmissionClient``:
a submit that uploads the job's ``working_dir``, a log stream), the SDK, imported lazily inside those functions
(``ray.job_submission`` costs ~0.2 s).

Every failure is one typed error (:mod:`miles_ray.core.errors`) naming the address: ``Unreachable`` when the
head does not answer (by exception type: connection errors, timeouts), else the type of the HTTP status the
head answered with (``NotFound`` for an unknown job, ...). Ray's SDK only puts that status into the text of a
``RuntimeError``; :class:`_TypedClient` takes it from the response instead, so nothing here reads error text.

Every request carries the head's Ray token when one is known for its address (:mod:`miles_ray.adapters.ray_auth`);
a head that refuses (401 without a token, 403 with a wrong one) is one ``Forbidden`` error saying so.
"""

from __future__ import annotations

import asyncio
import os
import time
import warnings
from collections.abc import Callable, Iterator
from typing import Any

from miles_ray.adapters import ray_auth
from miles_ray.adapters.ray_package import own_package
from miles_ray.controller import ray_http
from miles_ray.controller.rules import gpu_workers_ready, head_of
from miles_ray.core.errors import ClusterError, ConfigError, NotFound, TimedOut, Unreachable, from_http_status
from miles_ray.core.progress import Progress


TERMINAL = ("SUCCEEDED", "FAILED", "STOPPED")
FIX_HINT = "start a local cluster with `miles-ray up --backend local`, or pass --address http://<head>:8265"
RUNS_HINT = "'miles-ray runs' lists the runs and their jobs"
AUTH_HINT = ("the head requires its Ray token: miles-ray sends it for local:// and k8s:// heads (and runs recorded "
             "on them); for a head given by URL set RAY_AUTH_TOKEN or RAY_AUTH_TOKEN_PATH")


def normalize_address(address: str) -> str:
    address = (address or "").strip().rstrip("/")
    if not address:
        raise ConfigError("no Ray address given", hint=FIX_HINT)
    if address.startswith("ray://"):
        raise ConfigError(
            f"{address} is a Ray Client address; the Jobs API needs the dashboard URL", hint="use http://<head>:8265"
        )
    if "://" not in address:
        address = "http://" + address
    return address


def _unreachable(address: str, exc: BaseException | str) -> Unreachable:
    return Unreachable(f"cannot reach the Ray Jobs API at {address} ({exc})", hint=FIX_HINT)


_QUIET_LOGGERS = (
    "ray.dashboard.modules.job.sdk",  # "WebSocket closed for job ..." on every normal end of a log tail
    "ray.dashboard.modules.dashboard_sdk",  # "Uploading package ..."
    "ray._private.runtime_env.packaging",  # "Creating a file package ..."
)


class _HeadAnswered(Exception):
    """The head answered a Jobs API request with an error status (raised by :class:`_TypedClient`)."""

    def __init__(self, status: int, text: str) -> None:
        super().__init__(f"HTTP {status}: {text.strip()[:300]}")
        self.status = status


def _client(address: str):
    """A JobSubmissionClient whose failed requests raise :class:`_HeadAnswered` with the HTTP status."""
    address = normalize_address(address)
    import logging

    for name in _QUIET_LOGGERS:
        logging.getLogger(name).setLevel(logging.WARNING)
    try:
        from ray.job_submission import JobSubmissionClient
    except ImportError as exc:  # pragma: no cover - ray is a dependency
        raise ConfigError("ray is not installed", hint='pip install "ray[default]"') from exc

    class _TypedClient(JobSubmissionClient):
        # The SDK's one hook that turns a non-200 response into an error (a RuntimeError with the status in its
        # text): keep the status as data instead.
        def _raise_error(self, r) -> None:  # noqa: ANN001 - requests.Response
            raise _HeadAnswered(r.status_code, r.text or "")

    # Ray's SDK logs upload chatter (INFO/WARNING) on our stderr; miles-ray reports progress itself. Its modules
    # set their own levels, so quieten every ray logger that exists once the SDK is imported.
    for name in [n for n in logging.root.manager.loggerDict if n == "ray" or n.startswith("ray.")]:
        logging.getLogger(name).setLevel(logging.ERROR)
    try:
        return _TypedClient(address, headers=ray_auth.headers(address))
    except Exception as exc:  # ConnectionError, requests errors, version-check failures
        status = getattr(getattr(exc, "response", None), "status_code", None)  # requests.HTTPError of its version check
        if status in (401, 403):
            raise _refused(address, status, "the Jobs API client's version check") from exc
        raise _unreachable(address, _short(exc)) from exc


def _short(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return (text[0] if text else type(exc).__name__)[:300]


def _typed(address: str, what: str, exc: BaseException, not_found: str | None = None) -> ClusterError:
    """The typed error for a failed Jobs API call, by what was raised (never by its text)."""
    if isinstance(exc, ClusterError):
        return exc
    if isinstance(exc, _HeadAnswered):
        if exc.status == 404:
            return NotFound(not_found or f"{what}: no such job on {address}", hint=RUNS_HINT, status=404)
        if exc.status in (401, 403):
            return _refused(address, exc.status, what)
        return from_http_status(exc.status, f"{what} failed on {address}: {exc}")
    status = getattr(exc, "status", None)  # aiohttp's handshake and response errors carry the HTTP status
    if isinstance(status, int) and status >= 400:
        return _typed(address, what, _HeadAnswered(status, getattr(exc, "message", "") or ""), not_found)
    return _unreachable(address, _short(exc))


def _refused(address: str, status: int, what: str) -> ClusterError:
    """The head refused the request for want of (401) or with a wrong (403) Ray token. The token is never quoted."""
    why = "without a Ray token" if status == 401 else "with a Ray token it does not accept"
    return from_http_status(status, f"the Ray head at {address} refused {what} {why} (HTTP {status})", AUTH_HINT)


def _call(address: str, what: str, fn: Callable[[], Any]) -> Any:
    try:
        return fn()
    except Exception as exc:  # noqa: BLE001 - every failure becomes one typed error
        raise _typed(address, what, exc) from exc


# ------------------------------------------------------------------------------------------
# topology (plain HTTP, no ray import)
# ------------------------------------------------------------------------------------------


def _head(address: str, what: str, ask: Callable[[ray_http.RayHead], Any], job: bool = False) -> Any:
    """``ask(head)`` of the head at ``address`` (with its token), its failure as one typed error (``job``: a 404 is
    an unknown job)."""
    try:
        return ask(ray_http.RayHead(address, headers=ray_auth.headers(address)))
    except ray_http.Refused as exc:
        raise _refused(address, exc.status, what) from exc
    except ray_http.Answered as exc:
        if job and exc.status == 404:
            raise NotFound(f"{what}: no such job on {address}", hint=RUNS_HINT, status=404) from exc
        raise from_http_status(exc.status, f"{what} failed on the Ray head at {address}: HTTP {exc.status}",
                               hint="is this a Ray dashboard (http://HEAD:8265)?") from exc
    except ray_http.HeadError as exc:  # no answer, or not JSON: not a Ray dashboard
        raise _unreachable(address, exc) from exc


def cluster_topology(address: str, timeout: float = 5.0) -> dict:
    """ALIVE nodes with head flag, GPUs and CPUs, from the state API's nodes."""
    address = normalize_address(address)
    return _topology(address, _node_rows(address, timeout))


def _node_rows(address: str, timeout: float = 5.0, detail: bool = False) -> list[dict]:
    """Ray's node rows (the state API's; ``detail``: with their start times)."""
    return _head(address, "reading its nodes", lambda head: head.nodes(detail=detail, timeout=timeout))


def _topology(address: str, rows: list[dict]) -> dict:
    nodes = []
    for n in rows or []:
        if n.get("state") != "ALIVE":
            continue
        res = n.get("resources_total") or {}
        nodes.append(
            {
                "node_id": n.get("node_id"),
                "ip": n.get("node_ip"),
                "node_ip": n.get("node_ip"),
                "is_head": bool(n.get("is_head_node")),
                "gpus": float(res.get("GPU", 0)),
                "cpus": float(res.get("CPU", 0)),
                "resources": res,
                "labels": n.get("labels") or {},
            }
        )
    nodes.sort(key=lambda x: (not x["is_head"], x["ip"] or "", x["node_id"] or ""))
    gpu_nodes = [n for n in nodes if n["gpus"] > 0]
    return {
        "address": address,
        "nodes": nodes,
        "alive_count": len(nodes),
        "gpu_node_count": len(gpu_nodes),
        "gpus_per_node": sorted({n["gpus"] for n in gpu_nodes}),
        "total_gpus": sum(n["gpus"] for n in nodes),
        "total_cpus": sum(n["cpus"] for n in nodes),
        "head": next((n for n in nodes if n["is_head"]), None),
    }


def head_node(address: str, timeout: float = 5.0) -> dict:
    """The head now serving ``address`` as Ray knows it (:func:`miles_ray.controller.rules.head_of`): ``node_id``
    of the ALIVE head node (None if none is ALIVE), its ``start_time_ms`` and ``alive`` (the ids of every ALIVE
    node: a job whose driver node is not among them runs nowhere)."""
    address = normalize_address(address)
    head = head_of(_node_rows(address, timeout, detail=True))
    return {**head, "alive": sorted(head["alive"])}


def ray_version(address: str, timeout: float = 5.0) -> str | None:
    """The Ray version the head runs, or None if it does not say."""
    address = normalize_address(address)
    return _head(address, "reading its version", lambda head: head.version(timeout))


def wait_for_gpu_nodes(
    address: str,
    n_nodes: int,
    gpus_per_node: int,
    timeout: float = 600,
    progress: Progress = None,
    poll: float = 2.0,
    among: Callable[[], set[str] | dict[str, float | None]] | None = None,
) -> dict:
    """Block until at least ``n_nodes`` ALIVE nodes each advertise >= ``gpus_per_node`` GPUs, counted by the rule
    of every wait for GPU workers (:func:`miles_ray.controller.rules.gpu_workers_ready`, the supervisor's too).

    ``among``, read again at each poll, gives the pods that may count (on Kubernetes: the worker pods that
    exist now, by IP, or IP -> creation time in ms): a node whose pod was deleted a moment ago stays ALIVE in Ray
    until its health check fails and must not stand in for its replacement."""
    address = normalize_address(address)
    deadline = time.monotonic() + timeout
    last = None
    while True:
        rows = _node_rows(address, detail=True)
        topo = _topology(address, rows)
        gpu_nodes = [n for n in topo["nodes"] if n["gpus"] >= gpus_per_node]
        allowed = among() if among is not None else None
        ready = gpu_workers_ready(rows, gpus_per_node, pods=allowed)
        if len(ready) >= n_nodes:
            return topo
        msg = f"waiting for {n_nodes} nodes with {gpus_per_node} GPUs: {len(ready)} ready"
        if len(gpu_nodes) > len(ready):
            msg += f" ({len(gpu_nodes) - len(ready)} more still ALIVE in Ray from pods that are gone)"
        if progress is not None and msg != last:
            progress(msg)
            last = msg
        if time.monotonic() >= deadline:
            have = ", ".join(f"{n['ip']}={n['gpus']:g}" for n in topo["nodes"]) or "none"
            raise TimedOut(
                f"only {len(ready)} of {n_nodes} nodes with {gpus_per_node} GPUs joined {topo['address']} "
                f"within {timeout:.0f}s (alive nodes and GPUs: {have})",
                hint="scale the cluster up or ask for fewer nodes",
            )
        time.sleep(poll)


# ------------------------------------------------------------------------------------------
# jobs
# ------------------------------------------------------------------------------------------


JOB_FIELDS = ("message", "entrypoint", "metadata", "start_time", "end_time", "driver_exit_code", "runtime_env",
              "driver_node_id")  # what a job's info says besides its ids and status, as the Jobs API names it


def _info_dict(info: dict) -> dict:
    """A job as the Jobs API gives it (``GET /api/jobs/<id>``), in our keys."""
    sid, ray_id = (info.get(k) for k in ("submission_id", "job_id"))
    fields = {k: info.get(k) for k in JOB_FIELDS}
    fields["metadata"] = dict(fields["metadata"] or {})
    return {"job_id": sid or ray_id, "ray_job_id": ray_id,
            "status": str(info["status"]) if info.get("status") is not None else None, **fields}


def _job(address: str, job_id: str) -> dict:
    what = f"status of job {job_id}"
    info = _head(address, what, lambda head: head.job(job_id), job=True)
    if info is None:
        raise NotFound(f"{what}: no such job on {address}", hint=RUNS_HINT, status=404)
    return _info_dict(info)


def _existing(address: str, client: Any, submission_id: str) -> Any | None:
    """The job's info, or None when the head has no job of that id."""
    try:
        return _call(address, f"looking up job {submission_id}", lambda: client.get_job_info(submission_id))
    except NotFound:
        return None


def upload_working_dir(address: str, runtime_env: dict | None, submission_id: str | None) -> dict | None:
    """The runtime env with its local ``working_dir`` uploaded to the head (a ``gcs://`` package, as Ray's SDK
    does before it submits), for a job another process submits through the Jobs API alone (a run's supervisor,
    which cannot read this machine's files); unchanged without a local ``working_dir``. The head keeps an
    uploaded package unreferenced for minutes (Ray's temporary reference), long enough for that submit."""
    wd = (runtime_env or {}).get("working_dir")
    if not wd or not os.path.isdir(wd):
        return runtime_env
    address = normalize_address(address)
    client = _client(address)
    with own_package(runtime_env, submission_id) as env:
        uploaded = dict(env or {})
        _call(address, "uploading the job's working dir", lambda: client._upload_working_dir_if_needed(uploaded))
    return uploaded


def submit(
    address: str,
    entrypoint: str,
    runtime_env: dict | None = None,
    submission_id: str | None = None,
    metadata: dict[str, str] | None = None,
) -> tuple[str, bool]:
    """Submit a job; return ``(job_id, created)``.

    With a ``submission_id`` that already exists, the existing job is returned (``created`` False)
    and nothing new is submitted -- also when a concurrent submit wins the race.
    """
    address = normalize_address(address)
    client = _client(address)
    if submission_id and _existing(address, client, submission_id) is not None:
        return submission_id, False
    kwargs: dict[str, Any] = {"entrypoint": entrypoint}
    if runtime_env:
        kwargs["runtime_env"] = runtime_env
    if submission_id:
        kwargs["submission_id"] = submission_id
    if metadata:
        kwargs["metadata"] = {str(k): str(v) for k, v in metadata.items()}
    try:
        with own_package(kwargs.get("runtime_env"), submission_id) as env:
            if env is not None:
                kwargs["runtime_env"] = env
            job_id = client.submit_job(**kwargs)
    except Exception as exc:  # noqa: BLE001 - typed below
        error = _typed(address, "submitting the job", exc)
        # The head answered with an error (a concurrent submit of the same id makes it answer 400 or 500): if the
        # job exists now, this submit lost that race and the job is the same one.
        if submission_id and isinstance(exc, _HeadAnswered) and _existing(address, client, submission_id):
            return submission_id, False
        if not isinstance(exc, _HeadAnswered):
            raise error from exc
        raise type(error)(f"Ray refused the job on {address}: {_short(exc)}", error.hint, error.status) from exc
    return job_id, True


def status(address: str, job_id: str) -> dict:
    return _job(normalize_address(address), job_id)


def wait(
    address: str,
    job_id: str,
    timeout: float | None = None,
    until: tuple[str, ...] = TERMINAL,
    poll: float = 0.5,
) -> dict:
    """Poll until the job's status is in ``until`` (default: terminal); ``TimedOut`` after ``timeout`` seconds."""
    address = normalize_address(address)
    deadline = None if timeout is None else time.monotonic() + timeout
    while True:
        info = _job(address, job_id)
        if info["status"] in until or info["status"] in TERMINAL:
            return info
        if deadline is not None and time.monotonic() >= deadline:
            raise TimedOut(f"job {job_id} is still {info['status']} after {timeout:.0f}s on {address}")
        time.sleep(poll)


def logs(address: str, job_id: str) -> str:
    address = normalize_address(address)
    return _head(address, f"logs of job {job_id}", lambda head: head.logs(job_id), job=True)


def follow_logs(address: str, job_id: str) -> Iterator[str]:
    """Yield log chunks as the job writes them; ends when the job ends.

    Wraps the async ``tail_job_logs`` in a private event loop. An unknown job is ``NotFound``; if the head goes
    away (or the stream stops while the job is not finished), ``Unreachable`` says so.
    """
    address = normalize_address(address)
    client = _client(address)
    loop = asyncio.new_event_loop()
    agen = client.tail_job_logs(job_id)
    lost = ("check the cluster with `miles-ray status`; the job may still be running")
    try:
        while True:
            try:
                with warnings.catch_warnings():  # aiohttp's "ssl=None is deprecated" from Ray's SDK
                    warnings.simplefilter("ignore", DeprecationWarning)
                    chunk = loop.run_until_complete(agen.__anext__())
            except StopAsyncIteration:
                break
            except Exception as exc:  # noqa: BLE001 - typed below
                error = _typed(address, f"logs of job {job_id}", exc, not_found=f"no job {job_id} on {address}")
                if isinstance(error, NotFound):
                    raise error from exc
                raise Unreachable(f"lost the log stream of job {job_id}: the Ray head at {address} went away "
                                  f"({_short(exc)})", hint=lost) from exc
            yield chunk
    finally:
        try:
            loop.run_until_complete(agen.aclose())
        except Exception:  # noqa: BLE001
            pass
        loop.close()
    # The websocket also closes normally when the head shuts down: make sure the job really ended.
    try:
        final = client.get_job_status(job_id)
    except Exception as exc:  # noqa: BLE001
        raise Unreachable(f"lost the log stream of job {job_id}: the Ray head at {address} went away "
                          f"({_short(exc)})", hint="check the cluster with `miles-ray status`") from exc
    value = str(getattr(final, "value", final))
    if value not in TERMINAL:
        raise Unreachable(f"the log stream of job {job_id} on {address} ended while the job is still {value}",
                          hint=lost)


def stop(address: str, job_id: str) -> bool:
    """Ask Ray to stop the job; True if a stop was issued (False if it had already ended)."""
    address = normalize_address(address)
    return _head(address, f"stopping job {job_id}", lambda head: head.stop(job_id), job=True)


def list_jobs(address: str) -> list[dict]:
    address = normalize_address(address)
    jobs = _head(address, "listing jobs", lambda head: head.jobs())
    return sorted((_info_dict(j) for j in jobs), key=lambda j: j.get("start_time") or 0)


# ------------------------------------------------------------------------------------------
# activity (plain HTTP): is anything running, and since when has nothing run
# ------------------------------------------------------------------------------------------


def activity(address: str, timeout: float = 10.0) -> dict:
    """What the dashboard's activity API says about drivers (``is_active`` ACTIVE/INACTIVE/ERROR,
    ``last_activity_at`` = the latest job end, seconds since the epoch), plus when the head node started (its
    node row, for a cluster that has never run a job)."""
    address = normalize_address(address)
    driver = _head(address, "reading its activity", lambda head: head.driver_activity(timeout))
    started_ms = head_node(address, timeout).get("start_time_ms")
    return {"status": driver.get("is_active"), "reason": driver.get("reason"),
            "observed_at": driver.get("timestamp"), "last_activity_at": driver.get("last_activity_at"),
            "head_started_at": started_ms / 1000 if started_ms else None}
