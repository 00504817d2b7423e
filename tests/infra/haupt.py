"""The real Polyaxon API server (haupt 2.18 sandbox) for tests, in its OWN virtual environment.

    venv = ensure_venv()                      # scripts/haupt-venv.sh: created once, then reused
    server = start(venv, workdir)             # 127.0.0.1, free port, sqlite under workdir
    ... server.host ...                       # e.g. http://127.0.0.1:41234
    server.stop()                             # by PID (its own session/process group)

The server runs with HOME pointed into ``workdir`` because ``haupt sandbox start --path`` rewrites
``~/.polyaxon/.home``; the developer's real ~/.polyaxon is never touched.
``POLYAXON_AGENT_CONNECTIONS`` registers the connections runs may name (default: ``miles-data``,
a volume_claim ``miles-data`` mounted at ``/mnt/miles``). The sandbox compiles and queues runs; it
has no agent that executes them.

Create test projects with ``server.create_project(name)``, not with one bare POST: the sandbox
sometimes answers a POST with ``405 Method Not Allowed`` while another POST is being served (see
``create_project``), and its own cron thread POSTs ``/api/v1/orgs/default/agents/cron`` every ~2 s.

Command line (manual use, from the repository root):  python -m tests.infra.haupt [--port N] [--dir DIR]
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from tests.infra.procs import default_signals

REPO = Path(__file__).resolve().parents[2]
VENV_SCRIPT = REPO / "scripts" / "haupt-venv.sh"
HAUPT_VERSION = "2.18.0"

DEFAULT_CONNECTIONS: list[dict] = [
    {
        "name": "miles-data",
        "kind": "volume_claim",
        "schema": {"volumeClaim": "miles-data", "mountPath": "/mnt/miles"},
    }
]


#: What a Polyaxon admin grants the service account the runs' pods use (measured on real pods: Polyaxon's sidecar
#: reads these through the in-cluster API; without pods/status it loops on ApiException and never syncs).
RUNS_RBAC_RULES: list[dict] = [
    {"apiGroups": [""], "resources": ["pods", "pods/status", "pods/log", "services", "events"],
     "verbs": ["get", "list", "watch"]},
]
RUNS_RBAC_NAME = "polyaxon-runs"


def grant_runs_rbac(api_client, namespace: str, service_account: str = "default") -> None:
    """The admin's step of the Polyaxon path: a Role with :data:`RUNS_RBAC_RULES` bound to the runs' service
    account in ``namespace`` (what ``up --via polyaxon`` checks before creating anything)."""
    from kubernetes import client

    rbac = client.RbacAuthorizationV1Api(api_client)
    rbac.create_namespaced_role(namespace, {
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
        "metadata": {"name": RUNS_RBAC_NAME}, "rules": RUNS_RBAC_RULES})
    rbac.create_namespaced_role_binding(namespace, {
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
        "metadata": {"name": RUNS_RBAC_NAME},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": RUNS_RBAC_NAME},
        "subjects": [{"kind": "ServiceAccount", "name": service_account, "namespace": namespace}]})


class HauptUnavailable(RuntimeError):
    """The sandbox venv cannot be created or the server cannot be started."""


def cache_dir() -> Path:
    return Path(os.environ.get("MILESRAY_TEST_CACHE") or Path.home() / ".cache" / "miles-ray")


def venv_dir() -> Path:
    return Path(os.environ.get("HAUPT_VENV") or cache_dir() / "haupt-venv")


def ensure_venv(timeout: float = 1200) -> Path:
    """Create the haupt venv once (idempotent script) and return its path."""
    venv = venv_dir()
    stamp = venv / ".miles-ray-stamp"
    if stamp.is_file() and (venv / "bin" / "haupt").exists():
        return venv
    if shutil.which("bash") is None:
        raise HauptUnavailable("bash is needed to run scripts/haupt-venv.sh")
    try:
        proc = subprocess.run(
            ["bash", str(VENV_SCRIPT)],
            capture_output=True, text=True, timeout=timeout,
            env={**os.environ, "HAUPT_VENV": str(venv)},
        )
    except subprocess.TimeoutExpired:
        raise HauptUnavailable(f"creating the haupt venv took more than {timeout:.0f}s") from None
    if proc.returncode != 0 or not (venv / "bin" / "haupt").exists():
        tail = "\n".join((proc.stderr or proc.stdout).strip().splitlines()[-5:])
        raise HauptUnavailable(f"scripts/haupt-venv.sh failed (exit {proc.returncode}): {tail}")
    return venv


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _rss_bytes(pid: int) -> int | None:
    """Resident memory of pid and its descendants (Linux /proc)."""
    total = 0
    seen = False
    pids = [pid]
    try:
        children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
        pids += [int(c) for c in children]
    except OSError:
        pass
    for p in pids:
        try:
            for line in Path(f"/proc/{p}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1]) * 1024
                    seen = True
        except OSError:
            continue
    return total if seen else None


@dataclass
class HauptServer:
    host: str
    port: int
    pid: int
    path: Path
    log_path: Path
    start_seconds: float
    connections: list[dict] = field(default_factory=list)
    _proc: subprocess.Popen | None = field(default=None, repr=False)

    def alive(self) -> bool:
        if self._proc is not None:
            return self._proc.poll() is None
        try:
            os.kill(self.pid, 0)
            return True
        except OSError:
            return False

    def rss_bytes(self) -> int | None:
        return _rss_bytes(self.pid)

    def log_tail(self, lines: int = 20) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def stop(self, timeout: float = 15) -> None:
        """SIGTERM the server's own process group (its pgid is its PID), then SIGKILL."""
        if not self.alive():
            self._reap()
            return
        for sig, wait in ((signal.SIGTERM, timeout), (signal.SIGKILL, 5)):
            try:
                os.killpg(self.pid, sig)
            except ProcessLookupError:
                break
            except PermissionError:
                os.kill(self.pid, sig)
            deadline = time.monotonic() + wait
            while time.monotonic() < deadline:
                if not self.alive():
                    self._reap()
                    return
                time.sleep(0.1)
        self._reap()

    def _reap(self) -> None:
        if self._proc is not None:
            try:
                self._proc.wait(timeout=1)
            except subprocess.TimeoutExpired:
                pass

    def create_project(self, name: str, owner: str = "default", attempts: int = 8) -> dict:
        """Create the project ``owner/name`` (or find it) and return it as the API does.

        The sandbox (haupt 2.18, one uvicorn worker) sometimes fails to route a POST that arrives while
        another POST is being served: the request falls through to its 404 handler, a GET-only view, so
        the answer is ``405 Method Not Allowed`` (``Allow: GET, HEAD, OPTIONS``; server log
        ``Method Not Allowed (POST): /api/v1/default/projects/create``) and nothing is created. Seen
        here with 3-6 concurrent creates, right after start-up and minutes later alike (7 of 38 answered
        405 on a quiet machine, 22 of 40 on a loaded one). The only other POSTer is the sandbox's own
        cron thread (every ~2 s, forever), so there is no state to wait for: a 405 is retried, with a
        bounded backoff (0.1 s doubling to 1.6 s, ~6 s in all)."""
        body = json.dumps({"name": name}).encode()
        status, text = 0, ""
        for attempt in range(attempts):
            req = urllib.request.Request(f"{self.host}/api/v1/{owner}/projects/create", data=body, method="POST",
                                         headers={"Content-Type": "application/json"})
            try:
                with urllib.request.urlopen(req, timeout=10) as r:
                    return json.loads(r.read())
            except urllib.error.HTTPError as e:
                status, text = e.code, e.read().decode(errors="replace")[:300]
            if status != 405 or attempt + 1 == attempts:
                break
            time.sleep(min(0.1 * 2**attempt, 1.6))
        try:  # e.g. it exists already (400): then it is what was asked for
            with urllib.request.urlopen(f"{self.host}/api/v1/{owner}/{name}", timeout=10) as r:
                return json.loads(r.read())
        except urllib.error.HTTPError:
            pass
        raise HauptUnavailable(f"could not create project {owner}/{name} on {self.host}: HTTP {status} {text}\n"
                               f"{self.log_tail(5)}")


def _ready(host: str) -> bool:
    """Health endpoint up AND a database-backed API endpoint answering (migrations done)."""
    try:
        with urllib.request.urlopen(host + "/healthz", timeout=1) as r:
            if r.status != 200:
                return False
        with urllib.request.urlopen(host + "/api/v1/default/projects/list", timeout=2) as r:
            return r.status == 200
    except (OSError, ValueError):
        return False


def start(
    venv: Path,
    workdir: Path,
    connections: list[dict] | None = None,
    port: int | None = None,
    timeout: float = 90,
    artifacts_store: dict | None = None,
) -> HauptServer:
    """Start ``haupt sandbox start`` on 127.0.0.1 and wait until it answers (or raise)."""
    workdir = Path(workdir)
    root = workdir / "sandbox"
    home = workdir / "home"
    root.mkdir(parents=True, exist_ok=True)
    home.mkdir(parents=True, exist_ok=True)
    conns = DEFAULT_CONNECTIONS if connections is None else connections
    env = {
        k: v for k, v in os.environ.items()
        if not k.startswith(("POLYAXON_", "DJANGO_", "VIRTUAL_ENV", "PYTHONPATH", "PYTHONHOME"))
    }
    env.update(
        HOME=str(home),
        PATH=f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}",
        POLYAXON_AGENT_CONNECTIONS=json.dumps(conns),
    )
    if artifacts_store is not None:
        # the store the agent's runs write to, under the same name: the server then serves runs' logs and outputs
        # from its path, and what it asks the agent to do with a run (e.g. clean it) names a store the agent knows
        env["POLYAXON_AGENT_ARTIFACTS_STORE"] = json.dumps(artifacts_store)
    last_error = ""
    for _ in range(3):  # a free port can be taken between probing and binding: retry on another
        p = port or free_port()
        host = f"http://127.0.0.1:{p}"
        log_path = workdir / f"haupt-{p}.log"
        log = open(log_path, "wb")
        t0 = time.monotonic()
        proc = subprocess.Popen(
            [str(venv / "bin" / "haupt"), "sandbox", "start", "--host", "127.0.0.1",
             "--port", str(p), "--workers", "1", "--path", str(root)],
            stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            env=env, cwd=str(workdir), start_new_session=True, preexec_fn=default_signals,
        )
        log.close()
        server = HauptServer(host=host, port=p, pid=proc.pid, path=root, log_path=log_path,
                             start_seconds=0.0, connections=conns, _proc=proc)
        deadline = t0 + timeout
        while time.monotonic() < deadline and proc.poll() is None:
            if _ready(host):
                server.start_seconds = time.monotonic() - t0
                return server
            time.sleep(0.2)
        last_error = server.log_tail()
        exited = proc.poll() is not None
        server.stop()
        if not exited:
            raise HauptUnavailable(f"haupt sandbox not ready on {host} after {timeout:.0f}s:\n{last_error}")
        if port or "address already in use" not in last_error.lower():
            break
    raise HauptUnavailable(f"haupt sandbox exited during start-up:\n{last_error}")


def main(argv: list[str] | None = None) -> int:
    import argparse
    import tempfile

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--port", type=int)
    ap.add_argument("--dir", type=Path)
    args = ap.parse_args(argv)
    venv = ensure_venv()
    workdir = args.dir or Path(tempfile.mkdtemp(prefix="haupt-"))
    server = start(venv, workdir, port=args.port)
    rss = server.rss_bytes() or 0
    print(f"{server.host} pid={server.pid} started in {server.start_seconds:.1f}s rss={rss / 2**20:.0f}MiB")
    print(f"stop with: kill -TERM -{server.pid}   (log: {server.log_path})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
