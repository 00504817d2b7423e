#!/usr/bin/env python3
"""The Polyaxon side of the fake-GPU control plane: Polyaxon's CRDs, the Polyaxon agent and
Polyaxon's operator (mloperator), run as local processes against a kubeconfig and a Polyaxon API
server (e.g. the haupt sandbox of tests/infra/haupt.py).

    polyaxon_stack.py up   --kubeconfig K --host http://127.0.0.1:PORT --namespace NS --dir D
    polyaxon_stack.py status --dir D
    polyaxon_stack.py down --dir D                  # SIGTERM, then SIGKILL, by recorded PID

What ``up`` does:

1. installs the ``polyaxon.com/v1`` CRDs (Cluster, Job, Service, KfJob) pinned in
   ``polyaxon-versions.env`` (from the polyaxon/charts agent chart; cached under
   ``$MILESRAY_TEST_CACHE/crds/polyaxon-charts-<commit>/``);
2. starts the agent: ``polyaxon agent start`` from the haupt venv (polyaxon 2.18 with
   kubernetes_asyncio), unmanaged ("base agent": no agent uuid/token), with
   ``POLYAXON_HOST``, ``POLYAXON_K8S_NAMESPACE``, ``POLYAXON_K8S_IN_CLUSTER=false``,
   ``KUBECONFIG``, ``POLYAXON_AGENT_CONNECTIONS`` and ``POLYAXON_AGENT_ARTIFACTS_STORE``. It polls
   ``GET /api/v1/orgs/default/agents/state`` and, for each queued run, converts it and creates its
   custom resource (``polyaxon.com/v1`` ``Cluster`` named ``plx-operation-<uuid>`` for raycluster
   runs) in the namespace;
3. builds (once, cached as ``$MILESRAY_TEST_CACHE/bin/mloperator-<version>``) and starts Polyaxon's
   operator, which turns that CR into a KubeRay ``RayCluster``. If it cannot be built, ``up``
   still runs the agent and records the exact reason (``mloperator_error``).

Every server listens on 127.0.0.1 only; every process runs in its own process group and is stopped
by its recorded PID (checked against its start time, so a reused PID is never signalled).
``DIR/polyaxon-stack.json`` holds PIDs, logs, versions and timings; logs are ``DIR/logs/*.log``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
VERSIONS_FILE = HERE / "polyaxon-versions.env"

if str(HERE) not in sys.path:  # cluster/ holds scripts, not a package: share fakegpu's helpers
    sys.path.insert(0, str(HERE))
import fakegpu  # noqa: E402

cache_dir = fakegpu.cache_dir
find_go = fakegpu.find_go
_proc_starttime = fakegpu._proc_starttime
_pdeathsig = fakegpu._pdeathsig
_tail = fakegpu._tail
STATE_FILE = "polyaxon-stack.json"

#: The connection the Miles operation names (a PVC mounted at /mnt/miles on every pod).
DEFAULT_CONNECTIONS: list[dict] = [
    {"name": "miles-data", "kind": "volume_claim",
     "schema": {"volumeClaim": "miles-data", "mountPath": "/mnt/miles"}},
]
#: Polyaxon requires an artifacts store; a hyphenated name so the volume name is DNS-1123 valid.
DEFAULT_ARTIFACTS_STORE: dict = {
    "name": "artifacts-store", "kind": "volume_claim",
    "schema": {"volumeClaim": "polyaxon-artifacts", "mountPath": "/artifacts"},
}
#: Where the search tool's fetch lays out the polyaxon/charts repository on this workplace.


class StackUnavailable(RuntimeError):
    """A piece of the Polyaxon stack cannot be installed or started (the message says exactly why)."""


class MloperatorUnavailable(StackUnavailable):
    """Polyaxon's operator cannot be built or started."""


def log_stderr(msg: str) -> None:
    print(f"polyaxon-stack: {msg}", file=sys.stderr, flush=True)


# --------------------------------------------------------------------------------------------
# Versions, cache


def read_versions() -> dict[str, str]:
    return fakegpu.read_versions(VERSIONS_FILE)


def haupt_venv() -> Path:
    return Path(os.environ.get("HAUPT_VENV") or cache_dir() / "haupt-venv")


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _first_error_line(text: str) -> str:
    lines = [ln.strip() for ln in text.strip().splitlines() if ln.strip()]
    for ln in lines:
        low = ln.lower()
        if "error" in low or "forbidden" in low or low.startswith("go: ") or "cannot" in low:
            return ln
    return lines[0] if lines else "(no output)"


# --------------------------------------------------------------------------------------------
# CRDs


def crd_cache_dir(v: dict[str, str] | None = None) -> Path:
    v = v or read_versions()
    return cache_dir() / "crds" / f"polyaxon-charts-{v['POLYAXON_CHARTS_COMMIT'][:12]}"


def charts_git_dir() -> Path | None:
    env = os.environ.get("MILESRAY_TEST_POLYAXON_CHARTS_GIT")
    for cand in ([Path(env)] if env else []):
        if cand.is_dir():
            return cand
    return None


def ensure_crds(log: Callable[[str], None] = log_stderr) -> list[Path]:
    """The pinned Polyaxon CRD files, from the cache or extracted once from a polyaxon/charts git
    repository (``$MILESRAY_TEST_POLYAXON_CHARTS_GIT``; the vendored tarball is used otherwise)."""
    v = read_versions()
    names = v["POLYAXON_CRDS"].split()
    out_dir = crd_cache_dir(v)
    paths = [out_dir / n for n in names]
    if all(p.is_file() and p.stat().st_size > 0 for p in paths):
        return paths
    commit = v["POLYAXON_CHARTS_COMMIT"]
    vendored = Path(__file__).resolve().parent / "crds" / f"{out_dir.name}.tar.gz"
    if vendored.is_file():  # shipped in the repo: unpack into the cache
        import tarfile

        out_dir.parent.mkdir(parents=True, exist_ok=True)
        with tarfile.open(vendored) as tar:
            members = [m for m in tar.getmembers() if m.isfile() and Path(m.name).name in names
                       and Path(m.name).parent.name == out_dir.name]
            tar.extractall(out_dir.parent, members=members, filter="data")
        if all(p.is_file() and p.stat().st_size > 0 for p in paths):
            log(f"unpacked {len(paths)} Polyaxon CRDs from {vendored} into {out_dir}")
            return paths
    git_dir = charts_git_dir()
    if git_dir is None or shutil.which("git") is None:
        raise StackUnavailable(
            f"Polyaxon CRDs are not cached in {out_dir} and no polyaxon/charts git repository is "
            f"available to extract them from (set MILESRAY_TEST_POLYAXON_CHARTS_GIT to a clone containing "
            f"commit {commit})"
        )
    out_dir.mkdir(parents=True, exist_ok=True)
    for name, path in zip(names, paths):
        ref = f"{commit}:{v['POLYAXON_CHARTS_CRD_DIR']}/{name}"
        proc = subprocess.run(["git", f"--git-dir={git_dir}", "show", ref],
                              capture_output=True, text=True)
        if proc.returncode != 0:
            raise StackUnavailable(f"cannot read {ref} from {git_dir}: {_first_error_line(proc.stderr)}")
        # the chart wraps each CRD in a helm guard ({{- if ... }} / {{- end }}): drop those lines
        text = "\n".join(ln for ln in proc.stdout.splitlines() if not ln.lstrip().startswith("{{")) + "\n"
        tmp = path.with_suffix(".tmp")
        tmp.write_text(text)
        tmp.replace(path)
    log(f"extracted {len(paths)} Polyaxon CRDs from {git_dir} @ {commit[:12]} into {out_dir}")
    return paths


def _yaml_load(text: str) -> Any:
    import yaml

    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    return yaml.load(text, Loader=loader)


def install_crds(kubeconfig: str | Path, paths: list[Path], timeout: float = 120) -> list[str]:
    """Create (or replace) the CRDs and wait until each is Established. Returns their names."""
    from kubernetes import client, config
    from kubernetes.client.rest import ApiException

    api = client.ApiextensionsV1Api(config.new_client_from_config(config_file=str(kubeconfig)))
    names = []
    for p in paths:
        body = _yaml_load(p.read_text())
        name = body["metadata"]["name"]
        names.append(name)
        try:
            api.create_custom_resource_definition(body, _request_timeout=60)
        except ApiException as e:
            if e.status != 409:
                raise StackUnavailable(f"cannot create CRD {name}: {e.status} {e.reason}") from None
            cur = api.read_custom_resource_definition(name)
            body["metadata"]["resourceVersion"] = cur.metadata.resource_version
            api.replace_custom_resource_definition(name, body, _request_timeout=60)
    deadline = time.monotonic() + timeout
    for name in names:
        while True:
            crd = api.read_custom_resource_definition(name)
            conds = {c.type: c.status for c in (crd.status.conditions or [])} if crd.status else {}
            if conds.get("Established") == "True":
                break
            if time.monotonic() > deadline:
                raise StackUnavailable(f"CRD {name} not Established after {timeout:.0f}s: {conds}")
            time.sleep(0.2)
    return names


# --------------------------------------------------------------------------------------------
# Processes


def _alive(rec: dict[str, Any]) -> bool:
    """The recorded process still runs (same PID and start time, not a zombie)."""
    return bool(rec.get("pid")) and fakegpu._is_ours_and_alive(rec)


def _spawn(name: str, argv: list[str], logs: Path, env: dict[str, str], cwd: Path,
           die_with_parent: bool) -> dict[str, Any]:
    logs.mkdir(parents=True, exist_ok=True)
    log_path = logs / f"{name}.log"
    logf = open(log_path, "ab", buffering=0)
    proc = subprocess.Popen(
        argv, stdin=subprocess.DEVNULL, stdout=logf, stderr=subprocess.STDOUT, env=env, cwd=str(cwd),
        start_new_session=True, close_fds=True,
        preexec_fn=_pdeathsig if die_with_parent and sys.platform.startswith("linux") else None,
    )
    logf.close()
    st = None
    for _ in range(100):
        st = _proc_starttime(proc.pid)
        if st:
            break
        time.sleep(0.01)
    return {"pid": proc.pid, "starttime": st, "argv": argv, "log": str(log_path), "_proc": proc}


def stop_process(rec: dict[str, Any], timeout: float = 15) -> str:
    """SIGTERM the process group led by the recorded PID (only if it is still that process), then
    SIGKILL."""
    if not _alive(rec):
        _reap(rec)
        return "not running"
    pid = rec["pid"]
    for sig, wait in ((signal.SIGTERM, timeout), (signal.SIGKILL, 5)):
        try:
            os.killpg(pid, sig)
        except ProcessLookupError:
            break
        except PermissionError:
            os.kill(pid, sig)
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            _reap(rec)
            if not _alive(rec):
                return "stopped" if sig == signal.SIGTERM else "killed"
            time.sleep(0.05)
    return "killed"


def _reap(rec: dict[str, Any]) -> None:
    proc = rec.get("_proc")
    if proc is not None:
        try:
            proc.wait(timeout=0)
        except subprocess.TimeoutExpired:
            pass
    else:
        try:
            os.waitpid(rec["pid"], os.WNOHANG)
        except (ChildProcessError, OSError):
            pass


# --------------------------------------------------------------------------------------------
# The agent


def agent_env(host: str, kubeconfig: str | Path, namespace: str, home: Path,
              connections: list[dict] | None = None, artifacts_store: dict | None = None) -> dict[str, str]:
    """Environment of an unmanaged ("base") Polyaxon agent against a kubeconfig. No other
    POLYAXON_* variable of the caller leaks in (and HOME is private: ~/.polyaxon is untouched)."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("POLYAXON_", "DJANGO_", "VIRTUAL_ENV", "PYTHONPATH", "PYTHONHOME"))}
    env.update(
        HOME=str(home),
        KUBECONFIG=str(kubeconfig),
        POLYAXON_HOST=host,
        POLYAXON_SERVICE="agent",           # settings load the agent config (AgentConfig) from env
        POLYAXON_K8S_NAMESPACE=namespace,   # where the agent creates the custom resources
        POLYAXON_K8S_IN_CLUSTER="false",    # kubernetes_asyncio load_kube_config() -> $KUBECONFIG
        POLYAXON_AGENT_CONNECTIONS=json.dumps(DEFAULT_CONNECTIONS if connections is None else connections),
        POLYAXON_AGENT_ARTIFACTS_STORE=json.dumps(
            DEFAULT_ARTIFACTS_STORE if artifacts_store is None else artifacts_store),
        POLYAXON_DISABLE_ERRORS_REPORTING="true",  # no error reporting to any outside service
        PYTHONUNBUFFERED="1",
    )
    return env


def start_agent(kubeconfig: str | Path, host: str, namespace: str, workdir: Path,
                venv: Path | None = None, connections: list[dict] | None = None,
                artifacts_store: dict | None = None, max_interval: int = 2,
                die_with_parent: bool = False, timeout: float = 120) -> dict[str, Any]:
    """Start ``polyaxon agent start`` and wait until it has polled the agent state once."""
    venv = venv or haupt_venv()
    exe = venv / "bin" / "polyaxon"
    if not exe.exists():
        raise StackUnavailable(f"the Polyaxon agent needs the haupt venv ({exe} missing: run scripts/haupt-venv.sh)")
    home = workdir / "agent-home"
    home.mkdir(parents=True, exist_ok=True)
    env = agent_env(host, kubeconfig, namespace, home, connections, artifacts_store)
    log_path = workdir / "logs" / "polyaxon-agent.log"
    offset = log_path.stat().st_size if log_path.exists() else 0  # the log is appended to
    t0 = time.monotonic()
    rec = _spawn("polyaxon-agent",
                 [str(venv / "bin" / "python"), str(Path(__file__).resolve()), "_run-agent",
                  "--max-interval", str(max_interval)],
                 workdir / "logs", env, workdir, die_with_parent)
    deadline = t0 + timeout
    while time.monotonic() < deadline:
        with open(rec["log"], "rb") as f:
            f.seek(offset)
            text = f.read().decode(errors="replace")
        if "Checking agent state." in text:
            rec["start_seconds"] = round(time.monotonic() - t0, 2)
            return rec
        if "Agent failed to start" in text or not _alive(rec):
            break
        time.sleep(0.2)
    tail = _tail(rec["log"])
    stop_process(rec)
    raise StackUnavailable(f"the Polyaxon agent did not poll {host} within {timeout:.0f}s:\n{tail}")


def _run_agent(max_interval: int) -> int:
    """In the haupt venv: ``polyaxon agent start --kind k8s`` with ONE change. The unmanaged agent
    calls ``POST /api/v1/orgs/default/agents/cron`` on every loop; so does the haupt 2.18 sandbox's
    own cron thread (haupt/cli/runners/cron.py, every ~2 s), and when two such POSTs overlap the
    server answers all but one with ``405 Method Not Allowed`` (server log: ``Method Not Allowed
    (POST): /api/v1/orgs/default/agents/cron``; 3 concurrent curl POSTs: usually 1-2 get 405). The
    sandbox's thread shrugs it off; the stock agent ends on the first one (``Agent failed to start:
    ApiException(status=405, reason=Method Not Allowed)``, seen after ~1 min). Here a failed cron
    call (server-side housekeeping only) is logged and the loop goes on; nothing else differs."""
    from polyaxon._k8s.agent.async_agent import AsyncAgent
    from polyaxon.cli import cli
    from polyaxon.logger import logger

    base_cron = AsyncAgent.cron

    async def cron(self):  # noqa: ANN001
        try:
            return await base_cron(self)
        except Exception as e:  # noqa: BLE001
            logger.warning("Agent cron call failed (ignored, server housekeeping only): %r", e)
            return None

    AsyncAgent.cron = cron
    # the real CLI entry point (logging set up as `polyaxon` does), with POLYAXON_SERVICE=agent
    cli.main(["agent", "start", "--kind", "k8s", "--max-interval", str(max_interval)],
             prog_name="polyaxon", standalone_mode=False)
    return 0


# --------------------------------------------------------------------------------------------
# mloperator


def mloperator_binary(v: dict[str, str] | None = None) -> Path:
    v = v or read_versions()
    return cache_dir() / "bin" / f"mloperator-{v['MLOPERATOR_VERSION']}"


def build_mloperator(log: Callable[[str], None] = log_stderr, timeout: float = 1800) -> Path:
    """The cached mloperator binary, building it once from the Go module proxy
    (``go mod download MODULE@VERSION`` then ``go build`` of its main package with GOFLAGS=-p=1,
    under nice). Raises :class:`MloperatorUnavailable` with the first error line."""
    v = read_versions()
    module, version, main = v["MLOPERATOR_MODULE"], v["MLOPERATOR_VERSION"], v["MLOPERATOR_MAIN"]
    out = mloperator_binary(v)
    if out.is_file() and os.access(out, os.X_OK):
        return out
    go = find_go()
    if go is None:
        raise MloperatorUnavailable(f"mloperator {version} is not cached in {out} and no Go toolchain is installed")
    env = {**os.environ, "GOFLAGS": "-p=1", "GOTOOLCHAIN": os.environ.get("GOTOOLCHAIN", "local")}
    nice = ["nice", "-n", "10"] if shutil.which("nice") else []
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="mloperator-build-") as tmp:
        subprocess.run([go, "mod", "init", "mloperatorbuild"], cwd=tmp, env=env, capture_output=True)
        dl = subprocess.run([go, "mod", "download", "-json", f"{module}@{version}"], cwd=tmp, env=env,
                            capture_output=True, text=True, timeout=600)
        info: dict[str, Any] = {}
        try:
            info = json.loads(dl.stdout or "{}")
        except ValueError:
            pass
        if dl.returncode != 0 or info.get("Error") or not info.get("Dir"):
            msg = info.get("Error") or dl.stderr or dl.stdout
            raise MloperatorUnavailable(f"mloperator {version} does not build: {_first_error_line(msg)}")
        out.parent.mkdir(parents=True, exist_ok=True)
        src = Path(tmp) / "src"  # a writable copy: the module cache is read-only
        shutil.copytree(info["Dir"], src)
        for root, dirs, files in os.walk(src):
            for n in dirs + files:
                os.chmod(os.path.join(root, n), 0o755 if n in dirs else 0o644)
        os.chmod(src, 0o755)
        tmp_out = Path(tmp) / "mloperator"
        build = subprocess.run(nice + [go, "build", "-mod=mod", "-o", str(tmp_out), main], cwd=src,
                               env=env, capture_output=True, text=True, timeout=timeout)
        if build.returncode != 0:
            raise MloperatorUnavailable(
                f"mloperator {version} does not build: {_first_error_line(build.stderr or build.stdout)}")
        shutil.copy2(tmp_out, out)
    log(f"built mloperator {version} in {time.monotonic() - t0:.0f}s -> {out}")
    return out


def start_mloperator(kubeconfig: str | Path, namespace: str, workdir: Path, binary: Path,
                     die_with_parent: bool = False, timeout: float = 60) -> dict[str, Any]:
    """Run the operator for one namespace (metrics and probes on 127.0.0.1), wait for /healthz."""
    metrics, probe = free_port(), free_port()
    env = {**os.environ, "KUBECONFIG": str(kubeconfig), "POLYAXON_K8S_NAMESPACE": namespace,
           "POLYAXON_SINGLE_NAMESPACE": "true"}
    t0 = time.monotonic()
    rec = _spawn("mloperator",
                 [str(binary), f"--metrics-bind-address=127.0.0.1:{metrics}",
                  f"--health-probe-bind-address=127.0.0.1:{probe}", f"--namespace={namespace}"],
                 workdir / "logs", env, workdir, die_with_parent)
    rec["ports"] = {"metrics": metrics, "probe": probe}
    deadline = t0 + timeout
    while time.monotonic() < deadline and _alive(rec):
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{probe}/healthz", timeout=1) as r:
                if r.status == 200:
                    rec["start_seconds"] = round(time.monotonic() - t0, 2)
                    return rec
        except OSError:
            pass
        time.sleep(0.2)
    tail = _tail(rec["log"])
    stop_process(rec)
    raise MloperatorUnavailable(f"mloperator did not become healthy within {timeout:.0f}s: {_first_error_line(tail)}")


# --------------------------------------------------------------------------------------------
# The stack


@dataclass
class Stack:
    dir: Path
    kubeconfig: str
    host: str
    namespace: str
    crds: list[str] = field(default_factory=list)
    agent: dict[str, Any] | None = None
    mloperator: dict[str, Any] | None = None
    mloperator_error: str | None = None
    timings: dict[str, float] = field(default_factory=dict)
    versions: dict[str, str] = field(default_factory=dict)

    def record(self) -> dict[str, Any]:
        strip = lambda r: None if r is None else {k: v for k, v in r.items() if not k.startswith("_")}  # noqa: E731
        return {
            "dir": str(self.dir), "kubeconfig": self.kubeconfig, "host": self.host,
            "namespace": self.namespace, "crds": self.crds, "agent": strip(self.agent),
            "mloperator": strip(self.mloperator), "mloperator_error": self.mloperator_error,
            "timings": self.timings, "versions": self.versions,
        }

    def save(self) -> None:
        (self.dir / STATE_FILE).write_text(json.dumps(self.record(), indent=2) + "\n")

    def stop(self) -> dict[str, str]:
        out = {}
        for name in ("mloperator", "agent"):
            rec = getattr(self, name)
            if rec:
                out[name] = stop_process(rec)
        return out


def up(workdir: str | Path, kubeconfig: str | Path, host: str, namespace: str,
       with_mloperator: bool = True, connections: list[dict] | None = None,
       artifacts_store: dict | None = None, die_with_parent: bool = False,
       log: Callable[[str], None] = log_stderr) -> Stack:
    """CRDs, agent and (if it can be had) mloperator. Raises StackUnavailable when the CRDs or the
    agent cannot be had; an mloperator failure is recorded in ``Stack.mloperator_error``."""
    workdir = Path(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    stack = Stack(dir=workdir, kubeconfig=str(kubeconfig), host=host, namespace=namespace,
                  versions=read_versions())
    t0 = time.monotonic()
    stack.crds = install_crds(kubeconfig, ensure_crds(log))
    stack.timings["crds_seconds"] = round(time.monotonic() - t0, 2)
    stack.agent = start_agent(kubeconfig, host, namespace, workdir, connections=connections,
                              artifacts_store=artifacts_store, die_with_parent=die_with_parent)
    stack.timings["agent_start_seconds"] = stack.agent["start_seconds"]
    stack.save()
    if with_mloperator:
        t1 = time.monotonic()
        try:
            binary = build_mloperator(log)
            stack.timings["mloperator_build_seconds"] = round(time.monotonic() - t1, 2)
            stack.mloperator = start_mloperator(kubeconfig, namespace, workdir, binary,
                                                die_with_parent=die_with_parent)
            stack.timings["mloperator_start_seconds"] = stack.mloperator["start_seconds"]
        except MloperatorUnavailable as e:
            stack.mloperator_error = str(e)
            log(str(e))
        except Exception:
            stack.stop()
            raise
    stack.save()
    return stack


def down(workdir: str | Path) -> dict[str, str]:
    path = Path(workdir) / STATE_FILE
    if not path.is_file():
        return {}
    rec = json.loads(path.read_text())
    out = {}
    for name in ("mloperator", "agent"):
        if rec.get(name):
            out[name] = stop_process(rec[name])
    return out


def status(workdir: str | Path) -> dict[str, Any]:
    path = Path(workdir) / STATE_FILE
    if not path.is_file():
        return {"running": False, "reason": f"no {path}"}
    rec = json.loads(path.read_text())
    for name in ("agent", "mloperator"):
        if rec.get(name):
            rec[name]["alive"] = _alive(rec[name])
    return rec


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    u = sub.add_parser("up", help="install CRDs, start the agent (and mloperator)")
    u.add_argument("--kubeconfig", required=True)
    u.add_argument("--host", required=True, help="Polyaxon API, e.g. http://127.0.0.1:PORT")
    u.add_argument("--namespace", default="default")
    u.add_argument("--dir", required=True, type=Path)
    u.add_argument("--no-mloperator", action="store_true")
    for name in ("down", "status"):
        p = sub.add_parser(name)
        p.add_argument("--dir", required=True, type=Path)
    ra = sub.add_parser("_run-agent", help=argparse.SUPPRESS)
    ra.add_argument("--max-interval", type=int, default=2)
    sub.add_parser("build-mloperator", help="build (or find cached) mloperator only")
    sub.add_parser("crds", help="extract (or find cached) the Polyaxon CRD files only")
    args = ap.parse_args(argv)
    if args.cmd == "_run-agent":
        return _run_agent(args.max_interval)
    try:
        if args.cmd == "up":
            stack = up(args.dir, args.kubeconfig, args.host, args.namespace,
                       with_mloperator=not args.no_mloperator)
            print(json.dumps(stack.record(), indent=2))
            print(f"stop with: {sys.executable} {Path(__file__)} down --dir {args.dir}", file=sys.stderr)
        elif args.cmd == "down":
            print(json.dumps(down(args.dir)))
        elif args.cmd == "status":
            print(json.dumps(status(args.dir), indent=2))
        elif args.cmd == "build-mloperator":
            print(build_mloperator())
        elif args.cmd == "crds":
            print("\n".join(str(p) for p in ensure_crds()))
    except StackUnavailable as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
