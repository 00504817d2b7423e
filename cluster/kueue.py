#!/usr/bin/env python3
"""Kueue beside the fake-GPU control plane: Kueue's controller manager (built from the Go module
sigs.k8s.io/kueue by ``cluster/build.sh kueue``), its CRDs and its admission webhooks, as a local process.

    kueue.py up   [--cluster-dir /tmp/miles-ray-fakegpu] [--dir DIR]   # DIR defaults to CLUSTER_DIR/kueue
    kueue.py down [--dir DIR]                                          # by recorded PID, then cleans up

What ``up`` does, against a control plane started by ``fakegpu.py up``:

1. installs Kueue's CRDs from the same module zip (``config/components/crd/bases``), with the conversion
   webhook the module's kustomize patches configure pointed at the local process (``clientConfig.url``);
2. issues, with the control plane's CA, a client certificate ``kueue-controller-manager`` in
   ``system:masters`` (as for kwok and the KubeRay operator) and a serving certificate for 127.0.0.1;
3. starts the manager with ``integrations.frameworks: [ray.io/raycluster]``, leader election off,
   ``internalCertManagement.enable: false`` (its webhook server uses the certificate of step 2),
   health, metrics and webhook servers on free 127.0.0.1 ports, and ``VisibilityOnDemand`` off (that
   extension API server reads its certificate from the fixed path ``/visibility``). The manager also
   reads the metrics certificate from the fixed path ``/etc/kueue/metrics/certs``: it runs in a
   private mount namespace (``unshare --mount``) whose ``/etc`` is an overlay adding that directory,
   so nothing is written to the machine's ``/etc``;
4. once ``/readyz`` answers, registers the module's Mutating/ValidatingWebhookConfigurations
   (``config/components/webhook/manifests.yaml``), only the webhooks of Kueue's own kinds and of
   RayCluster, with ``clientConfig.url: https://127.0.0.1:<port>/<path>`` and the CA bundle, and
   checks that the API server reaches them (a server-side dry-run create).

``down`` deletes the webhook configurations first (their failure policy is Fail: a dead webhook would
refuse every RayCluster), stops the process by PID (SIGTERM, then SIGKILL), then removes the finalizers
of whatever Kueue objects are left and deletes the CRDs and the ``kueue-system`` namespace.
``DIR/kueue.json`` holds the PID, ports, timings and what was created; the log is ``DIR/logs/kueue.log``.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import ipaddress
import json
import os
import shutil
import sys
import time
import urllib.error
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:  # cluster/ holds scripts, not a package: share fakegpu's helpers
    sys.path.insert(0, str(HERE))
import fakegpu  # noqa: E402

STATE_FILE = "kueue.json"
NAMESPACE = "kueue-system"
GROUP = "kueue.x-k8s.io"
#: The CRDs whose conversion webhook the module's config/components/crd/kustomization.yaml enables.
CONVERTED = ("localqueues", "clusterqueues", "cohorts", "workloads", "multikueueclusters")
#: Webhooks registered: those of Kueue's own kinds and of the one integration enabled (RayCluster).
WEBHOOK_RESOURCES = {("ray.io", "rayclusters")}
WEBHOOK_CONFIG_PREFIX = "miles-ray-kueue-"


class KueueUnavailable(RuntimeError):
    """Kueue cannot be built or started here (the message says exactly why)."""


def log_stderr(msg: str) -> None:
    print(f"[kueue] {msg}", file=sys.stderr, flush=True)


def version() -> str:
    return fakegpu.read_versions()["KUEUE_VERSION"]


def artifact_paths() -> dict[str, Path]:
    """As ``cluster/build.sh kueue`` lays them out."""
    v = version()
    assets = fakegpu.cache_dir() / f"kueue-{v}"
    return {"kueue": fakegpu.cache_dir() / "bin" / f"kueue-{v}", "crds": assets / "crds",
            "webhooks": assets / "webhooks.yaml", "assets": assets}


def cached() -> bool:
    p = artifact_paths()
    return (p["kueue"].is_file() and os.access(p["kueue"], os.X_OK) and p["webhooks"].is_file()
            and (p["crds"] / "kueue.x-k8s.io_workloads.yaml").is_file())


def ensure_built(log: Callable[[str], None] = log_stderr) -> float:
    """Run ``build.sh kueue`` unless cached; returns the seconds it took (0 when cached)."""
    import subprocess

    if cached():
        return 0.0
    if fakegpu.find_go() is None:
        raise KueueUnavailable(f"Kueue {version()} is not cached in {fakegpu.cache_dir()} and no Go toolchain is "
                               "installed to build it (install Go >= 1.26, then run cluster/build.sh kueue)")
    log(f"building Kueue {version()} (cluster/build.sh kueue; ~15 min cold on 2 cores)")
    t = time.monotonic()
    env = dict(os.environ)
    env.setdefault("GO", fakegpu.find_go() or "go")
    proc = subprocess.run(["bash", str(fakegpu.BUILD_SH), "kueue"], env=env, capture_output=True, text=True)
    if proc.returncode != 0 or not cached():
        tail = "\n".join((proc.stdout + proc.stderr).splitlines()[-15:])
        raise KueueUnavailable(f"cluster/build.sh kueue failed (exit {proc.returncode}):\n{tail}")
    return time.monotonic() - t


# --------------------------------------------------------------------------------------------
# Certificates: a client identity and a serving certificate, issued by the control plane's CA


def _issue(pki: Path, out: Path, stem: str, cn: str, orgs: list[str], server: bool) -> None:
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    ca_cert = x509.load_pem_x509_certificate((pki / "ca.crt").read_bytes())
    ca_key = serialization.load_pem_private_key((pki / "ca.key").read_bytes(), None)
    key = ec.generate_private_key(ec.SECP256R1())
    now = _dt.datetime.now(_dt.timezone.utc) - _dt.timedelta(minutes=5)
    attrs = [x509.NameAttribute(NameOID.ORGANIZATION_NAME, o) for o in orgs]
    attrs.append(x509.NameAttribute(NameOID.COMMON_NAME, cn))
    b = (x509.CertificateBuilder().subject_name(x509.Name(attrs)).issuer_name(ca_cert.subject)
         .public_key(key.public_key()).serial_number(x509.random_serial_number())
         .not_valid_before(now).not_valid_after(now + _dt.timedelta(days=30))
         .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
         .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH if server
                                               else ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False))
    if server:
        b = b.add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1")),
                                                         x509.DNSName("localhost")]), critical=False)
    out.mkdir(parents=True, exist_ok=True)
    key_path = out / f"{stem}.key"
    key_path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    key_path.chmod(0o600)
    (out / f"{stem}.crt").write_bytes(b.sign(ca_key, hashes.SHA256()).public_bytes(serialization.Encoding.PEM))


def _kubeconfig(path: Path, server: str, ca: Path, crt: Path, key: Path) -> None:
    import base64

    def b64(p: Path) -> str:
        return base64.b64encode(p.read_bytes()).decode()

    path.write_text(json.dumps({
        "apiVersion": "v1", "kind": "Config", "current-context": "fakegpu",
        "clusters": [{"name": "fakegpu", "cluster": {"server": server, "certificate-authority-data": b64(ca)}}],
        "users": [{"name": "kueue", "user": {"client-certificate-data": b64(crt), "client-key-data": b64(key)}}],
        "contexts": [{"name": "fakegpu", "context": {"cluster": "fakegpu", "user": "kueue"}}],
    }, indent=2) + "\n")
    path.chmod(0o600)


# --------------------------------------------------------------------------------------------
# Objects: CRDs, webhook configurations


def _yaml_docs(path: Path) -> list[dict]:
    import yaml

    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def _crd_bodies(crds: Path, port: int, ca_b64: str) -> list[dict]:
    out = []
    for f in sorted(crds.glob("*.yaml")):
        [crd] = _yaml_docs(f)
        if crd["spec"]["names"]["plural"] in CONVERTED:
            crd["spec"]["conversion"] = {"strategy": "Webhook", "webhook": {
                "conversionReviewVersions": ["v1"],
                "clientConfig": {"url": f"https://127.0.0.1:{port}/convert", "caBundle": ca_b64}}}
        out.append(crd)
    return out


def webhook_configurations(manifests: Path, port: int, ca_b64: str) -> list[dict]:
    """The module's webhook configurations, restricted to Kueue's own kinds and RayCluster, pointed at
    https://127.0.0.1:PORT by URL (the manifests name a Service, which nothing routes to here)."""
    out = []
    for doc in _yaml_docs(manifests):
        hooks = []
        for hook in doc.get("webhooks") or []:
            targets = {(g, r) for rule in hook.get("rules") or [] for g in rule.get("apiGroups") or []
                       for r in rule.get("resources") or []}
            if not any(g == GROUP or (g, r) in WEBHOOK_RESOURCES for g, r in targets):
                continue
            hook = dict(hook)
            path = hook["clientConfig"]["service"]["path"]
            hook["clientConfig"] = {"url": f"https://127.0.0.1:{port}{path}", "caBundle": ca_b64}
            hooks.append(hook)
        kind = doc["kind"]
        name = WEBHOOK_CONFIG_PREFIX + ("mutating" if kind.startswith("Mutating") else "validating")
        out.append({"apiVersion": doc["apiVersion"], "kind": kind, "metadata": {"name": name}, "webhooks": hooks})
    return out


def _webhook_url(kind: str) -> str:
    plural = "mutatingwebhookconfigurations" if kind.startswith("Mutating") else "validatingwebhookconfigurations"
    return f"/apis/admissionregistration.k8s.io/v1/{plural}"


def _check(code: int, body: Any, what: str, ok: tuple[int, ...] = (200, 201)) -> None:
    if code not in ok:
        raise KueueUnavailable(f"{what}: HTTP {code}: {str(body)[:1500]}")


# --------------------------------------------------------------------------------------------
# Up / down


@dataclass
class Kueue:
    dir: Path
    pid: int
    log: Path
    ports: dict[str, int]
    timings: dict[str, float] = field(default_factory=dict)

    def down(self) -> dict[str, str]:
        return down(self.dir)


def _read_state(d: Path) -> dict[str, Any] | None:
    try:
        return json.loads((d / STATE_FILE).read_text())
    except (OSError, ValueError):
        return None


def _write_state(d: Path, state: dict[str, Any]) -> None:
    tmp = d / (STATE_FILE + ".tmp")
    tmp.write_text(json.dumps(state, indent=2) + "\n")
    tmp.replace(d / STATE_FILE)


def _config(ports: dict[str, int], cert_dir: Path) -> dict[str, Any]:
    return {
        "apiVersion": "config.kueue.x-k8s.io/v1beta2", "kind": "Configuration",
        "namespace": NAMESPACE,
        "health": {"healthProbeBindAddress": f"127.0.0.1:{ports['health']}"},
        "metrics": {"bindAddress": f"127.0.0.1:{ports['metrics']}"},
        "webhook": {"host": "127.0.0.1", "port": ports["webhook"], "certDir": str(cert_dir)},
        "leaderElection": {"leaderElect": False},
        "internalCertManagement": {"enable": False},
        "integrations": {"frameworks": ["ray.io/raycluster"]},
        "featureGates": {"VisibilityOnDemand": False},
    }


def up(cluster_dir: str | Path = fakegpu.DEFAULT_DIR, dir: str | Path | None = None, timeout: float = 120,
       die_with_parent: bool = False, build: bool = True, log: Callable[[str], None] = log_stderr) -> Kueue:
    """Start Kueue against the control plane of ``cluster_dir`` (``fakegpu.py up``); ready when it returns."""
    cdir = Path(cluster_dir).resolve()
    d = Path(dir).resolve() if dir else cdir / "kueue"
    cstate = fakegpu._read_state(cdir)
    if not cstate or not cstate.get("ready"):
        raise KueueUnavailable(f"no ready control plane in {cdir} (run: fakegpu.py up --dir {cdir})")
    old = _read_state(d)
    if old and fakegpu._is_ours_and_alive(old["process"]):
        raise KueueUnavailable(f"Kueue is already running from {d} (run: kueue.py down --dir {d})")
    if shutil.which("unshare") is None or shutil.which("mount") is None:
        raise KueueUnavailable("unshare/mount (util-linux) not found: Kueue's manager needs a private mount "
                               "namespace for its fixed /etc/kueue/metrics/certs path")
    timings: dict[str, float] = {}
    t = time.monotonic()
    if build:
        timings["build"] = round(ensure_built(log), 1)
    elif not cached():
        raise KueueUnavailable(f"Kueue {version()} is not cached in {fakegpu.cache_dir()} (run cluster/build.sh kueue)")
    paths = artifact_paths()
    t_up = time.monotonic()

    fakegpu.remove_paths(d, ("certs", "etc-upper", "etc-work", "logs", STATE_FILE, "config.yaml", "kubeconfig"))
    d.mkdir(parents=True, exist_ok=True)
    (d / "logs").mkdir()
    pki = cdir / "pki"
    certs = d / "certs"
    _issue(pki, certs, "client", "kueue-controller-manager", ["system:masters"], server=False)
    _issue(pki, certs, "tls", "kueue-webhook", [], server=True)
    metrics_certs = d / "etc-upper" / "kueue" / "metrics" / "certs"
    metrics_certs.mkdir(parents=True)
    (d / "etc-work").mkdir()
    for f in ("tls.crt", "tls.key"):
        shutil.copy2(certs / f, metrics_certs / f)
    _kubeconfig(d / "kubeconfig", cstate["server"], pki / "ca.crt", certs / "client.crt", certs / "client.key")
    import base64

    ca_b64 = base64.b64encode((pki / "ca.crt").read_bytes()).decode()
    ports = dict(zip(("health", "metrics", "webhook"), fakegpu.free_ports(3)))
    (d / "config.yaml").write_text(json.dumps(_config(ports, certs), indent=2) + "\n")
    timings["certs+config"] = round(time.monotonic() - t_up, 2)

    api = fakegpu.Api(cstate["server"], pki)
    state: dict[str, Any] = {"cluster_dir": str(cdir), "dir": str(d), "version": version(),
                             "binary": str(paths["kueue"]), "server": cstate["server"], "ports": ports,
                             "crds": [], "webhook_configurations": [], "namespace_created": False,
                             "process": {}, "ready": False}
    _write_state(d, state)
    try:
        t = time.monotonic()
        code, body = api.request("POST", "/api/v1/namespaces", {"metadata": {"name": NAMESPACE}})
        _check(code, body, f"creating namespace {NAMESPACE}", (201, 409))
        state["namespace_created"] = code == 201
        for crd in _crd_bodies(paths["crds"], ports["webhook"], ca_b64):
            code, body = api.request("POST", "/apis/apiextensions.k8s.io/v1/customresourcedefinitions", crd,
                                     timeout=60)
            _check(code, body, f"creating CRD {crd['metadata']['name']}", (201,))
            state["crds"].append(crd["metadata"]["name"])
            _write_state(d, state)

        def established() -> bool:
            for n in state["crds"]:
                code, crd = api.request("GET", f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{n}")
                conds = {c["type"]: c["status"] for c in ((crd or {}).get("status") or {}).get("conditions") or []}
                if code != 200 or conds.get("Established") != "True":
                    return False
            return True

        _wait("Kueue CRDs Established", established, 60, None)
        timings["crds"] = round(time.monotonic() - t, 2)

        t = time.monotonic()
        overlay = f"lowerdir=/etc,upperdir={d / 'etc-upper'},workdir={d / 'etc-work'}"
        userns = [] if os.geteuid() == 0 else ["--user", "--map-root-user"]
        argv = ["unshare", *userns, "--mount", "--propagation", "private", "--", "sh", "-c",
                'mount -t overlay milesray-kueue -o "$0" /etc && exec "$@"', overlay,
                str(paths["kueue"]), f"--config={d / 'config.yaml'}", "--zap-log-level=2"]
        state["process"] = fakegpu._start("kueue", argv, d / "logs", {"KUBECONFIG": str(d / "kubeconfig")},
                                          die_with_parent)
        _write_state(d, state)
        _wait("Kueue /readyz", lambda: fakegpu._http_ok(f"http://127.0.0.1:{ports['health']}/readyz"), timeout,
              state["process"])
        timings["manager-ready"] = round(time.monotonic() - t, 2)

        t = time.monotonic()
        for wh in webhook_configurations(paths["webhooks"], ports["webhook"], ca_b64):
            code, body = api.request("POST", _webhook_url(wh["kind"]), wh)
            _check(code, body, f"creating {wh['kind']} {wh['metadata']['name']}", (201,))
            state["webhook_configurations"].append([wh["kind"], wh["metadata"]["name"]])
            _write_state(d, state)
        # The API server reaches the webhook server (TLS, CA bundle, URL): a dry-run create goes through it.
        probe = {"apiVersion": f"{GROUP}/v1beta2", "kind": "ResourceFlavor", "metadata": {"name": "webhook-probe"}}

        def webhook_answers() -> bool:
            code, body = api.request("POST", f"/apis/{GROUP}/v1beta2/resourceflavors?dryRun=All", probe)
            state["webhook_probe"] = f"HTTP {code}: {str(body)[:300]}" if code != 201 else "ok"
            return code == 201

        _wait("Kueue's webhooks answering the API server", webhook_answers, 30, state["process"],
              lambda: state.get("webhook_probe", ""))
        timings["webhooks"] = round(time.monotonic() - t, 2)
    except BaseException:
        log("start-up failed: cleaning up what was created")
        down(d, log=log)
        raise
    timings["up_total"] = round(time.monotonic() - t_up, 2)
    state.update({"ready": True, "timings": timings})
    _write_state(d, state)
    return Kueue(dir=d, pid=state["process"]["pid"], log=Path(state["process"]["log"]), ports=ports, timings=timings)


def _wait(what: str, pred: Callable[[], bool], timeout: float, proc: dict[str, Any] | None,
          detail: Callable[[], str] | None = None) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return
        if proc and not fakegpu._is_ours_and_alive(proc):
            raise KueueUnavailable(f"Kueue's manager exited while waiting for {what}; its log ends:\n"
                                   + fakegpu._tail(proc["log"], 25))
        time.sleep(0.25)
    extra = f" ({detail()})" if detail else ""
    tail = f"; its log ends:\n{fakegpu._tail(proc['log'], 25)}" if proc else ""
    raise KueueUnavailable(f"timed out after {timeout:.0f}s waiting for {what}{extra}{tail}")


def down(dir: str | Path, timeout: float = 15, log: Callable[[str], None] = log_stderr) -> dict[str, str]:
    """Webhook configurations, then the process (by PID), then Kueue's objects, CRDs and namespace."""
    d = Path(dir).resolve()
    state = _read_state(d)
    if not state:
        return {}
    result: dict[str, str] = {}
    pki = Path(state["cluster_dir"]) / "pki"
    api = fakegpu.Api(state["server"], pki) if (pki / "admin.crt").is_file() else None

    def request(method: str, path: str, body: Any = None, ctype: str = "application/json") -> tuple[int, Any]:
        try:
            return api.request(method, path, body, ctype, timeout=10) if api else (0, "no API")
        except (urllib.error.URLError, OSError) as e:
            return 0, str(e)

    for kind, name in state.get("webhook_configurations", []):
        code, _ = request("DELETE", f"{_webhook_url(kind)}/{name}")
        result[name] = "deleted" if code in (200, 404) else f"not deleted (HTTP {code})"
    if state.get("process"):
        result["kueue"] = fakegpu._stop("kueue", state["process"], timeout, log)
    for crd in state.get("crds", []):
        plural = crd.split(".", 1)[0]
        code, body = request("GET", f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{crd}")
        served = [v["name"] for v in (body or {}).get("spec", {}).get("versions", [])
                  if v.get("storage")] if code == 200 else []
        # Kueue puts finalizers on what it manages; with Kueue gone nobody would remove them.
        for v in served:
            code, objs = request("GET", f"/apis/{GROUP}/{v}/{plural}")
            for o in (objs or {}).get("items", []) if code == 200 else []:
                if o["metadata"].get("finalizers"):
                    ns = o["metadata"].get("namespace")
                    path = (f"/apis/{GROUP}/{v}/" + (f"namespaces/{ns}/" if ns else "")
                            + f"{plural}/{o['metadata']['name']}")
                    request("PATCH", path, {"metadata": {"finalizers": None}}, "application/merge-patch+json")
        code, _ = request("DELETE", f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{crd}")
        result[crd] = "deleted" if code in (200, 404) else f"not deleted (HTTP {code})"
    if state.get("namespace_created"):
        code, _ = request("DELETE", f"/api/v1/namespaces/{NAMESPACE}")
        result[f"namespace/{NAMESPACE}"] = "deleted" if code in (200, 202, 404) else f"not deleted (HTTP {code})"
    state.update({"ready": False, "stopped": result})
    _write_state(d, state)
    return result


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="kueue.py", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    pu = sub.add_parser("up", help="build if needed, install CRDs, start the manager, register its webhooks")
    pu.add_argument("--cluster-dir", type=Path, default=fakegpu.DEFAULT_DIR, help="the fakegpu.py up --dir")
    pu.add_argument("--dir", type=Path, default=None, help="state and logs (default CLUSTER_DIR/kueue)")
    pu.add_argument("--no-build", action="store_true", help="fail instead of building a missing binary")
    pd = sub.add_parser("down", help="unregister the webhooks, stop by PID, delete CRDs and namespace")
    pd.add_argument("--dir", type=Path, default=fakegpu.DEFAULT_DIR / "kueue")
    args = p.parse_args(argv)
    try:
        if args.cmd == "up":
            k = up(args.cluster_dir, args.dir, build=not args.no_build)
            print(f"Kueue {version()} ready in {k.timings['up_total']:.1f}s (pid {k.pid}); log: {k.log}")
            return 0
        res = down(args.dir)
        for name, what in res.items():
            print(f"{name:40s} {what}")
        if not res:
            print(f"nothing recorded in {args.dir}")
        return 1 if any(not w.startswith(("deleted", "stopped", "not running", "killed")) for w in res.values()) else 0
    except KueueUnavailable as e:
        log_stderr(f"ERROR: {e}")
        return 1


if __name__ == "__main__":
    sys.exit(main())
