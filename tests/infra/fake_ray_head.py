"""A FAKE Ray head for unit tests (a real Ray head runs in the integration tier): the one stand-in every unit test
of the run controller uses, plus the shipped supervisor program imported from its own directory.

- :func:`node`: one of Ray's node rows (``/api/v0/nodes``), as the state API gives it with ``detail=true``;
- :class:`FakeRayHead`: a real HTTP server on loopback answering the paths the controller's client asks for (the
  Jobs API: list, info, logs, submit, stop; the state API's nodes) from ``rows``/``jobs``, or with ``status`` when
  it is not 200. Like Ray's state API
  it leaves the detail fields (``start_time_ms``) out of node rows unless asked ``detail=true``;
- :func:`shipped_program`: ``supervise.py`` with the modules it ships with, written to a directory and imported
  from there (as the supervisor's pod or process has them).
"""

from __future__ import annotations

import contextlib
import http.server
import importlib.util
import json
import sys
import threading
import urllib.parse
from pathlib import Path
from types import ModuleType
from typing import Any, Iterator

from miles_ray.controller.program import program_files

DETAIL_FIELDS = ("start_time_ms", "end_time_ms")  # what Ray's state API gives only with detail=true


def node(node_id: str, ip: str = "10.0.0.1", *, gpus: float = 8, state: str = "ALIVE", head: bool = False,
         started: int = 0) -> dict:
    return {"node_id": node_id, "node_ip": ip, "state": state, "is_head_node": head,
            "resources_total": {"GPU": gpus, "CPU": 9} if gpus else {"CPU": 2}, "start_time_ms": started}


class FakeRayHead:
    """A FAKE Ray dashboard on loopback: ``rows`` (node rows), ``jobs`` (submission id -> job info), ``status`` (the
    HTTP status of every answer when not 200). ``asked`` lists the paths (with their query) it was asked."""

    def __init__(self, port: int = 0, status: int = 200, rows: list[dict] | None = None,
                 jobs: dict[str, dict] | None = None) -> None:
        outer = self
        self.status, self.rows, self.jobs = status, list(rows or []), dict(jobs or {})
        self.asked: list[str] = []

        class Handler(http.server.BaseHTTPRequestHandler):
            def _answer(self, code: int, payload: Any) -> None:
                body = json.dumps(payload).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_GET(self):  # noqa: N802
                outer.asked.append(self.path)
                url = urllib.parse.urlsplit(self.path)
                if outer.status != 200:
                    return self._answer(outer.status, {"error": "fake"})
                if url.path == "/api/v0/nodes":
                    detail = urllib.parse.parse_qs(url.query).get("detail") == ["true"]
                    rows = [r if detail else {k: v for k, v in r.items() if k not in DETAIL_FIELDS}
                            for r in outer.rows]
                    return self._answer(200, {"data": {"result": {"result": rows}}})
                if url.path == "/api/jobs/":
                    return self._answer(200, list(outer.jobs.values()))
                sid = urllib.parse.unquote(url.path[len("/api/jobs/"):]) if url.path.startswith("/api/jobs/") else ""
                if sid.endswith("/logs") and sid[:-5] in outer.jobs:
                    return self._answer(200, {"logs": outer.jobs[sid[:-5]].get("logs", "")})
                if sid in outer.jobs:
                    return self._answer(200, outer.jobs[sid])
                return self._answer(404, {"error": "not found"})

            def do_POST(self):  # noqa: N802
                outer.asked.append(f"POST {self.path}")
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"{}")
                if outer.status != 200:
                    return self._answer(outer.status, {"error": "fake"})
                if self.path == "/api/jobs/":
                    sid = body["submission_id"]
                    if sid in outer.jobs:
                        return self._answer(400, {"error": f"job {sid} exists"})
                    outer.jobs[sid] = {"submission_id": sid, "status": "PENDING", "entrypoint": body["entrypoint"],
                                       "metadata": body.get("metadata") or {}}
                    return self._answer(200, {"submission_id": sid})
                sid = urllib.parse.unquote(self.path[len("/api/jobs/"):-len("/stop")])
                if not self.path.endswith("/stop") or sid not in outer.jobs:
                    return self._answer(404, {"error": "not found"})
                job = outer.jobs[sid]
                stopped = job["status"] in ("PENDING", "RUNNING")
                job["status"] = "STOPPED" if stopped else job["status"]
                return self._answer(200, {"stopped": stopped})

            def log_message(self, *a):
                pass

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", port), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()

    def __enter__(self) -> "FakeRayHead":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


@contextlib.contextmanager
def shipped_program(directory: Path, name: str) -> Iterator[ModuleType]:
    """``supervise.py`` and the files it ships with, written to ``directory`` and imported from there as module
    ``name`` (the modules it imported from its directory are forgotten afterwards)."""
    for file, text in program_files().items():
        (directory / file).write_text(text)
    spec = importlib.util.spec_from_file_location(name, directory / "supervise.py")
    mod = importlib.util.module_from_spec(spec)
    before = set(sys.modules)
    try:
        spec.loader.exec_module(mod)
        yield mod
    finally:
        for gone in set(sys.modules) - before:
            sys.modules.pop(gone, None)
        sys.path[:] = [p for p in sys.path if p != str(directory)]
