"""The pull pod of ``runs pull`` on Kubernetes (its spec and program: :mod:`miles_ray.core.pull_pod`): created, waited
for until it runs, asked through exec (the API server's websocket, as ``kubectl exec``) for the manifest of a
checkpoint dir and for a streamed tar of its files, and deleted whatever happens (:func:`pull_pod` is a context
manager; SIGTERM is taken as Ctrl-C while it lives, so ``kill`` deletes it too).

The tar arrives as a file-like object (:class:`ExecStream`): stdout's bytes as the frames come, the command's exit
status checked at its end (a tar cut short, or a command that failed, raises)."""

from __future__ import annotations

import contextlib
import io
import json
import signal
import threading
import time
from typing import Any, Callable, Iterator

from miles_ray.adapters.kube.client import api_error, http_status
from miles_ray.adapters.kube.pods import waiting_why
from miles_ray.core.errors import ClusterError, TimedOut, TransferFailed
from miles_ray.core.pull_pod import END_PREFIX, POD_SCRIPT

STDOUT, STDERR, ERROR = 1, 2, 3  # the exec channels (stdin 0 unused)


def _exec_socket(core: Any, name: str, namespace: str, argv: list[str]) -> Any:
    """The websocket of ``argv`` exec'd in the pull pod (stdout and stderr, no stdin, no tty). Its frames are read
    from its socket by :class:`ExecStream` (the client's own buffering, which would keep a copy of all, is not used)."""
    from kubernetes.stream import stream

    try:
        return stream(core.connect_get_namespaced_pod_exec, name, namespace, container="pull", command=argv,
                      stderr=True, stdin=False, stdout=True, tty=False, _preload_content=False, binary=True)
    except Exception as e:  # noqa: BLE001
        raise api_error(e, f"exec in pod {namespace}/{name}") from None


class ExecStream(io.RawIOBase):
    """stdout of a command exec'd in a pod, read as its websocket frames arrive (no copy of the whole); stderr is
    kept (the first 4 KiB). At the end of stdout the command's status is read: not success raises TransferFailed."""

    def __init__(self, ws: Any, what: str) -> None:
        self.ws, self.what = ws, what
        self.sock = ws.sock
        self.pending = memoryview(b"")
        self.stderr = b""
        self.status: dict[str, Any] | None = None
        self.ended = False

    def readable(self) -> bool:
        return True

    def _frame(self) -> bool:
        """Read one frame; False once the stream has ended."""
        from websocket import ABNF

        try:
            op, frame = self.sock.recv_data_frame(True)
        except Exception as e:  # noqa: BLE001 -- a connection lost mid-stream (or closed after the status)
            if self.status is not None:
                self.ended = True
                return False
            raise TransferFailed(f"{self.what}: the stream from the pod broke ({type(e).__name__}: "
                                 f"{str(e)[:200]})", hint="run the same command again: it copies only what is "
                                                          "missing") from None
        if op == ABNF.OPCODE_CLOSE:
            self.ended = True
            return False
        if op not in (ABNF.OPCODE_BINARY, ABNF.OPCODE_TEXT):
            return True  # ping/pong: websocket-client answers them
        data = frame.data
        if not data:
            return True
        channel, data = data[0], data[1:]
        if channel == STDOUT:
            self.pending = memoryview(data)
        elif channel == STDERR and len(self.stderr) < 4096:
            self.stderr += bytes(data[:4096])
        elif channel == ERROR:
            try:
                self.status = json.loads(bytes(data).decode("utf-8", "replace"))
            except ValueError:
                self.status = {"status": "Failure", "message": bytes(data[:300]).decode("utf-8", "replace")}
        return True

    def readinto(self, buffer: Any) -> int:
        while not self.pending:
            if self.ended or not self._frame():
                self._check()
                return 0
        n = min(len(buffer), len(self.pending))
        buffer[:n] = self.pending[:n]
        self.pending = self.pending[n:]
        return n

    def _check(self) -> None:
        if self.status is None or self.status.get("status") == "Success":
            if self.status is None and not self.ended:
                raise TransferFailed(f"{self.what}: the stream ended without the command's status")
            return
        why = self.stderr.decode("utf-8", "replace").strip() or self.status.get("message") or "failed"
        raise TransferFailed(f"{self.what} failed in the pull pod: {why.splitlines()[-1][:300]}",
                             hint="run the same command again: it copies only what is missing")

    def close(self) -> None:
        try:
            self.ws.close()
        except Exception:  # noqa: BLE001 -- closing a broken socket
            pass
        super().close()


class PullPod:
    """A running pull pod: :meth:`manifest` and :meth:`tar` exec its program."""

    def __init__(self, core: Any, namespace: str, name: str) -> None:
        self.core, self.namespace, self.name = core, namespace, name

    def manifest(self, root: str) -> list[dict[str, Any]]:
        """Each regular file under ``root`` (relative path, bytes, sha256), computed in the pod."""
        stream = ExecStream(_exec_socket(self.core, self.name, self.namespace,
                                         ["python3", "-c", POD_SCRIPT, "manifest", root]), f"listing {root}")
        with stream:
            text = stream.read().decode("utf-8", "replace")
        lines = text.splitlines()
        if not lines or not lines[-1].startswith(END_PREFIX + " "):
            raise TransferFailed(f"listing {root} in the pull pod ended early (no end line)")
        entries = [json.loads(line) for line in lines[:-1]]
        if len(entries) != int(lines[-1].split()[1]):
            raise TransferFailed(f"listing {root} in the pull pod is incomplete")
        return entries

    def tar(self, root: str, paths: list[str]) -> ExecStream:
        """A streamed tar of ``paths`` (relative to ``root``), in that order."""
        return ExecStream(_exec_socket(self.core, self.name, self.namespace,
                                       ["python3", "-c", POD_SCRIPT, "tar", root, *paths]), f"the tar of {root}")


def _wait_running(core: Any, namespace: str, name: str, timeout: float, on_wait: Callable[[str], None] | None) -> None:
    deadline, last = time.monotonic() + timeout, ""
    while True:
        try:
            p = core.read_namespaced_pod(name, namespace)
        except Exception as e:  # noqa: BLE001
            raise api_error(e, f"read pod {namespace}/{name}") from None
        phase = p.status.phase or "Pending"
        if phase == "Running":
            return
        why, fatal = waiting_why(p)
        if fatal:
            raise ClusterError(f"the pull pod {namespace}/{name} cannot start: {why[:300]}",
                               hint="'kubectl describe pod' shows why; it is deleted")
        if phase in ("Succeeded", "Failed"):
            raise ClusterError(f"the pull pod {namespace}/{name} ended {phase} before it was used")
        if why != last and on_wait is not None:
            on_wait(why)
        last = why
        if time.monotonic() > deadline:
            raise TimedOut(f"the pull pod {namespace}/{name} did not start within {timeout:.0f}s ({last})",
                           hint="'kubectl describe pod' shows why; it is deleted")
        time.sleep(0.5)


def delete_ended(api_client: Any, namespace: str, selector: str) -> list[str]:
    """Delete the pull pods of ``selector`` that have ended (left by a client killed outright: their program ends
    once idle); the names."""
    from kubernetes import client

    core = client.CoreV1Api(api_client)
    try:
        pods = core.list_namespaced_pod(namespace, label_selector=selector).items
    except Exception as e:  # noqa: BLE001
        raise api_error(e, f"list pods in {namespace} ({selector})") from None
    gone = []
    for p in pods:
        if p.status.phase in ("Succeeded", "Failed") and p.metadata.deletion_timestamp is None:
            with contextlib.suppress(Exception):
                core.delete_namespaced_pod(p.metadata.name, namespace, grace_period_seconds=0)
                gone.append(p.metadata.name)
    return gone


@contextlib.contextmanager
def _sigterm_as_interrupt() -> Iterator[None]:
    """While the pod lives: SIGTERM (``kill``) raises KeyboardInterrupt as Ctrl-C does, so the pod is deleted."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def interrupt(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt

    before = signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, before)


@contextlib.contextmanager
def pull_pod(api_client: Any, pod: dict[str, Any], timeout: float = 300,
             on_wait: Callable[[str], None] | None = None) -> Iterator[PullPod]:
    """Create ``pod``, wait until it runs (bounded by ``timeout``), yield it; delete it at the end, always (an
    error, Ctrl-C, SIGTERM)."""
    from kubernetes import client

    core = client.CoreV1Api(api_client)
    namespace, name = pod["metadata"]["namespace"], pod["metadata"]["name"]
    with _sigterm_as_interrupt():
        try:
            core.create_namespaced_pod(namespace, pod)
        except Exception as e:  # noqa: BLE001
            raise api_error(e, f"create pod {namespace}/{name}") from None
        try:
            _wait_running(core, namespace, name, timeout, on_wait)
            yield PullPod(core, namespace, name)
        finally:
            try:
                core.delete_namespaced_pod(name, namespace, grace_period_seconds=0)
            except Exception as e:  # noqa: BLE001 -- already gone is fine; anything else is said
                if http_status(e) != 404:
                    raise api_error(e, f"delete pod {namespace}/{name}") from None
