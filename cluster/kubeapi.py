"""A minimal Kubernetes API client (stdlib): only what bootstrapping needs, and the bounded waits of ``up``."""

from __future__ import annotations

import json
import ssl
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any, Callable

from procs import is_ours_and_alive, tail
from testbed import FakeGPUError

class Api:
    def __init__(self, server: str, pki: Path, user: str = "admin"):
        self.server = server.rstrip("/")
        ctx = ssl.create_default_context(cafile=str(pki / "ca.crt"))
        ctx.load_cert_chain(str(pki / f"{user}.crt"), str(pki / f"{user}.key"))
        self.ctx = ctx

    def request(
        self,
        method: str,
        path: str,
        body: bytes | dict | None = None,
        content_type: str = "application/json",
        timeout: float = 30,
    ) -> tuple[int, Any]:
        data = json.dumps(body).encode() if isinstance(body, dict) else body
        req = urllib.request.Request(self.server + path, data=data, method=method)
        req.add_header("Accept", "application/json")
        if data is not None:
            req.add_header("Content-Type", content_type)
        try:
            with urllib.request.urlopen(req, context=self.ctx, timeout=timeout) as resp:
                raw = resp.read()
                code = resp.status
        except urllib.error.HTTPError as e:
            raw = e.read()
            code = e.code
        try:
            return code, json.loads(raw) if raw else None
        except ValueError:
            return code, raw.decode(errors="replace")


def http_ok(url: str, insecure: bool = True, timeout: float = 2) -> bool:
    ctx = ssl._create_unverified_context() if url.startswith("https") and insecure else None
    try:
        with urllib.request.urlopen(url, context=ctx, timeout=timeout) as resp:
            return resp.status == 200
    except (urllib.error.URLError, OSError, ValueError):
        return False


DEADLINE: list[float] = [float("inf")]  # overall deadline of the running `up` (its --timeout)


def wait(what: str, pred: Callable[[], bool], timeout: float, procs: dict[str, Any], watch: str | None) -> None:
    deadline = min(time.monotonic() + timeout, DEADLINE[0])
    timeout = max(0.0, deadline - time.monotonic())
    while time.monotonic() < deadline:
        if pred():
            return
        if watch and not is_ours_and_alive(procs[watch]):
            raise FakeGPUError(f"{watch} exited while waiting for {what}:\n{tail(procs[watch]['log'])}")
        time.sleep(0.2)
    extra = f"\n--- {watch} log tail ---\n{tail(procs[watch]['log'])}" if watch else ""
    raise FakeGPUError(f"timed out after {timeout:.0f}s waiting for {what}{extra}")
