"""Port-forwarding to a pod (the Ray head's dashboard / Jobs API) through the API server."""

from __future__ import annotations

import json
import socket
import threading
from contextlib import contextmanager
from typing import Iterator

from miles_ray.core.errors import ClusterError, Unreachable, from_http_status


def _handshake_failure(e: BaseException) -> tuple[int | None, str]:
    """(HTTP status, the API server's message) of a refused port-forward: the client library wraps the websocket
    handshake's answer (``WebSocketBadStatusException``: ``status_code``, ``resp_body`` -- a Kubernetes Status)
    in other exceptions, so the chain is searched for it. (None, the first line) when the server never answered."""
    cur: BaseException | None = e
    for _ in range(8):
        if cur is None:
            break
        status = getattr(cur, "status_code", None)
        if isinstance(status, int):
            message = getattr(cur, "status_message", None) or ""
            try:
                message = json.loads(getattr(cur, "resp_body", None) or "{}").get("message") or message
            except (ValueError, TypeError, AttributeError):
                pass
            return status, str(message)
        cur = cur.__cause__ or cur.__context__
    lines = str(e).strip().splitlines()
    return None, lines[0] if lines else type(e).__name__


def _open_tunnel(core, namespace: str, pod: str, remote_port: int):
    """One port-forward stream to ``pod:remote_port`` through the API server (a websocket). A refusal is typed by
    the API server's HTTP status (Forbidden when RBAC denies pods/portforward; Unreachable when the server cannot
    reach the pod's node) and names the pod."""
    from kubernetes.stream import portforward

    try:
        pf = portforward(core.connect_get_namespaced_pod_portforward, pod, namespace, ports=str(remote_port))
        return pf, pf.socket(remote_port)
    except Exception as e:  # noqa: BLE001 - typed below, from the handshake's status
        status, message = _handshake_failure(e)
        what = f"cannot port-forward to pod {namespace}/{pod} port {remote_port} through the Kubernetes API"
        hint = "is the pod running on a node the API server can reach? 'miles-ray status' shows the pods"
        if status is None:
            raise Unreachable(f"{what} ({message[:300]})", hint=hint) from None
        raise from_http_status(status, f"{what}: HTTP {status}: {message[:300]}", hint) from None


def port_refused(api_client, namespace: str, pod: str, port: int, wait: float = 5.0) -> bool:
    """Whether nothing listens on ``port`` in ``pod`` (on its loopback, where a port-forward connects).

    True only when the pod's node answered the port-forward with "connection refused" (the one signal the node
    gives, as text on the stream's error channel: containerd and CRI-O both pass the dial's error on). False when
    something accepted the connection, and on every other outcome (RBAC, a node the API server cannot reach, no
    answer within ``wait``): those say nothing about the port."""
    from kubernetes import client

    try:
        pf, sock = _open_tunnel(client.CoreV1Api(api_client), namespace, pod, port)
    except ClusterError:
        return False
    try:
        sock.settimeout(wait)
        try:
            if sock.recv(1):  # something listens and spoke first
                return False
        except OSError:  # timed out: the connection was accepted and waits for a request
            return False
        return "connection refused" in (pf.error(port) or "").lower()
    finally:
        try:
            pf.close()
        except Exception:  # noqa: BLE001 - closing a stream that already ended
            pass


@contextmanager
def port_forward(api_client, namespace: str, pod: str, remote_port: int = 8265) -> Iterator[str]:
    """Forward 127.0.0.1:<free port> to ``pod:remote_port`` through the API server; yields the URL.

    The first stream is opened before anything is yielded, so a pod the API server cannot forward to fails here
    with an Unreachable error naming the pod (instead of a connection reset on the first request)."""
    from kubernetes import client

    core = client.CoreV1Api(api_client)
    pending = [_open_tunnel(core, namespace, pod, remote_port)]  # the checked stream serves the first client
    server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    server.bind(("127.0.0.1", 0))
    server.listen(16)
    server.settimeout(0.5)
    stop = threading.Event()

    def pump(src, dst) -> None:
        try:
            while not stop.is_set():
                data = src.recv(65536)
                if not data:
                    break
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def serve() -> None:
        while not stop.is_set():
            try:
                conn, _ = server.accept()
            except socket.timeout:
                continue
            except OSError:
                return
            try:
                _, remote = pending.pop() if pending else _open_tunnel(core, namespace, pod, remote_port)
            except Unreachable:  # the client sees a closed connection
                conn.close()
                continue
            threading.Thread(target=pump, args=(conn, remote), daemon=True).start()
            threading.Thread(target=pump, args=(remote, conn), daemon=True).start()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.getsockname()[1]}"
    finally:
        stop.set()
        server.close()
        thread.join(timeout=2)
        for _, unused in pending:
            unused.close()
