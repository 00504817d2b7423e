#!/usr/bin/env python3
"""Data and checkpoint preflight: runs AS a short Ray job (``miles-ray check-data``).

On the head and on every alive GPU worker node -- one task per node, pinned with
``NodeAffinitySchedulingStrategy(soft=False)``, ``num_cpus=0`` so it also lands on a 0-CPU head, each
round bounded by ``--timeout`` -- it checks what the Miles launcher will read and write:

1. the shared volume ``mount_path`` exists (and whether it is a mount point);
2. every input path exists and is readable (directories are listed, files are read);
3. the output dir's parent (``mount_path/runs_dir``, or the nearest existing ancestor inside the mount)
   is writable: a probe file is created and removed on every node;
4. it is the SAME storage everywhere: one reference node (the head, else the first node that could write)
   writes a random token there, every other node must read exactly that token, then it is removed;
5. when resuming, ``<checkpoint dir>/latest_checkpointed_iteration.txt`` exists (the spec's ``tracker``: the dir the
   resumed run saved to, from its run record).

"Mounted" means: the path exists and either is a mount point (``os.path.ismount``) or holds the
reference node's token (step 4). Device ids are NOT compared across nodes: ``st_dev`` numbers are
assigned per kernel (an NFS volume gets a different anonymous device on each host), so they only prove
something on one machine. The token is the proof that works everywhere. A path that exists but is no
mount point and does not see the token is a directory baked into the image or the node's own disk.

Every problem on every node is collected; nothing stops at the first. The spec comes in the
``CHECK_DATA_SPEC`` environment variable (JSON); the last stdout line is ``MILES_RAY_PROBE_RESULT {json}``.
Exit 0 when the checks ran (whatever they found), 1 when they could not run.

Only ``ray`` and the standard library are imported.
"""

from __future__ import annotations

import json
import os
import secrets
import sys
import time

RESULT_PREFIX = "MILES_RAY_PROBE_RESULT "
SPEC_ENV = "CHECK_DATA_SPEC"
TOKEN_PREFIX = ".miles-ray-check-data-"


# -- what runs on each node ------------------------------------------------------------------------

def _node_ip() -> str:
    import ray

    return ray.util.get_node_ip_address()


def _readable(p: str) -> str | None:
    """None when readable, else why not."""
    if not os.path.exists(p):
        return "does not exist"
    try:
        if os.path.isdir(p):
            os.listdir(p)
        else:
            with open(p, "rb") as fh:
                fh.read(1)
    except OSError as e:
        return f"not readable ({e.strerror or type(e).__name__})"
    return None


def probe(spec: dict) -> dict:
    """Steps 1, 2, 3 and 5 on this node."""
    out: dict = {"node_ip": _node_ip(), "hostname": os.uname().nodename, "checks": [], "missing": []}

    def record(what: str, path: str, problem: str | None, **evidence) -> None:
        out["checks"].append({"what": what, "path": path, "ok": problem is None, **evidence,
                              **({"problem": problem} if problem else {})})
        if problem:
            out["missing"].append({"what": what, "path": path, "problem": problem})

    mount = spec["mount_path"]
    exists = os.path.isdir(mount)
    out["mount_exists"] = exists
    out["mount_is_mountpoint"] = bool(exists and os.path.ismount(mount))
    if exists:
        st = os.stat(mount)
        out["mount_device"] = f"{os.major(st.st_dev)}:{os.minor(st.st_dev)}"
    record("shared volume", mount, None if exists else "does not exist (volume not mounted on this node)",
           mountpoint=out["mount_is_mountpoint"])
    for what, path in spec["inputs"]:
        record(what, path, _readable(path))
    # the output dir's parent, or the nearest existing ancestor inside the mount
    parent = spec["output_parent"]
    probe_dir = parent
    while probe_dir != mount and not os.path.isdir(probe_dir):
        probe_dir = os.path.dirname(probe_dir)
    out["writable_dir"] = probe_dir
    problem = None
    if not os.path.isdir(probe_dir):
        problem = "does not exist"
    else:
        f = os.path.join(probe_dir, f".miles-ray-probe-{secrets.token_hex(6)}")
        try:
            with open(f, "w") as fh:
                fh.write("probe\n")
            os.unlink(f)
        except OSError as e:
            problem = f"not writable ({e.strerror or type(e).__name__})"
    record("output dir parent writable", probe_dir, problem,
           **({"note": f"{parent} does not exist yet; probed {probe_dir}"} if probe_dir != parent else {}))
    if spec.get("tracker"):
        t = spec["tracker"]
        why = _readable(t)
        evidence = {}
        if why is None:
            try:
                with open(t) as fh:
                    evidence["iteration"] = fh.read(64).strip()
            except OSError:
                pass
        record("resume checkpoint tracker", spec["tracker"],
               None if why is None else f"{why}: the run would start from scratch", **evidence)
    return out


def write_token(spec: dict, directory: str, token: str) -> dict:
    path = os.path.join(directory, TOKEN_PREFIX + token)
    try:
        with open(path, "w") as fh:
            fh.write(token)
            fh.flush()
            os.fsync(fh.fileno())
        return {"ok": True, "node_ip": _node_ip()}
    except OSError as e:
        return {"ok": False, "node_ip": _node_ip(), "problem": e.strerror or type(e).__name__}


def read_token(spec: dict, directory: str, token: str) -> dict:
    path = os.path.join(directory, TOKEN_PREFIX + token)
    try:
        with open(path) as fh:
            seen = fh.read()
    except OSError as e:
        return {"same": False, "node_ip": _node_ip(), "why": f"token not found ({e.strerror or type(e).__name__})"}
    return {"same": seen == token, "node_ip": _node_ip(), "why": "" if seen == token else "a different token"}


def remove_token(spec: dict, directory: str, token: str) -> bool:
    try:
        os.unlink(os.path.join(directory, TOKEN_PREFIX + token))
        return True
    except OSError:
        return False


# -- the driver --------------------------------------------------------------------------------------

def target_nodes() -> list[dict]:
    import ray

    nodes = []
    for n in ray.nodes():
        if not n.get("Alive"):
            continue
        res = n.get("Resources") or {}
        is_head = "node:__internal_head__" in res
        if is_head or res.get("GPU", 0) > 0:
            nodes.append({"node_id": n["NodeID"], "node_ip": n.get("NodeManagerAddress"),
                          "role": "head" if is_head else "gpu worker", "gpus": res.get("GPU", 0)})
    nodes.sort(key=lambda x: (x["role"] != "head", x["node_ip"] or "", x["node_id"]))
    return nodes


def run_round(fn, nodes: list[dict], spec: dict, timeout: float, *args) -> dict[str, object]:
    """One task per node (pinned, 0 CPUs), bounded by ``timeout``: node_id -> result or a timeout marker."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    remote = ray.remote(fn)
    refs = {}
    for n in nodes:
        strategy = NodeAffinitySchedulingStrategy(node_id=n["node_id"], soft=False)
        refs[n["node_id"]] = remote.options(num_cpus=0, max_retries=0, scheduling_strategy=strategy).remote(spec, *args)
    ready, _ = ray.wait(list(refs.values()), num_returns=len(refs), timeout=timeout)
    done = set(ready)
    out: dict[str, object] = {}
    for node_id, ref in refs.items():
        if ref in done:
            try:
                out[node_id] = ray.get(ref)
            except Exception as e:  # noqa: BLE001 - reported per node
                out[node_id] = {"error": f"{type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}"}
        else:
            ray.cancel(ref, force=True)
            out[node_id] = {"error": f"no answer within {timeout:.0f}s (node busy, dead or unreachable)"}
    return out


def main() -> int:
    raw = os.environ.get(SPEC_ENV)
    if not raw:
        print(f"{SPEC_ENV} is not set", file=sys.stderr)
        return 1
    spec = json.loads(raw)
    timeout = float(spec.get("timeout", 60))
    import ray

    started = time.monotonic()
    from probe_tasks import without_the_jobs_runtime_env

    without_the_jobs_runtime_env()  # the tasks run in the nodes' plain workers (probe_tasks.py)
    ray.init(logging_level="ERROR", log_to_driver=False)
    nodes = target_nodes()
    results = run_round(probe, nodes, spec, timeout)
    report = []
    for n in nodes:
        r = results[n["node_id"]]
        entry = {**n, **(r if "error" not in r else {"checks": [], "missing": [
            {"what": "node probe", "path": "", "problem": r["error"]}]})}
        report.append(entry)

    # same storage: the reference node writes a token, every other node must read it
    token = secrets.token_hex(16)
    candidates = [e for e in report if any(c["what"] == "output dir parent writable" and c["ok"]
                                           for c in e.get("checks", []))]
    ref = candidates[0] if candidates else None
    same_storage: dict = {"reference": None, "directory": None}
    if ref is not None:
        directory = ref["writable_dir"]
        same_storage.update(reference=ref["node_ip"], directory=directory)
        wrote = run_round(write_token, [n for n in nodes if n["node_id"] == ref["node_id"]], spec, timeout,
                          directory, token)[ref["node_id"]]
        if wrote.get("ok"):
            others = [n for n in nodes if n["node_id"] != ref["node_id"]]
            seen = run_round(read_token, others, spec, timeout, directory, token) if others else {}
            run_round(remove_token, [n for n in nodes if n["node_id"] == ref["node_id"]], spec, timeout,
                      directory, token)
            for e in report:
                if e["node_id"] == ref["node_id"]:
                    e["same_storage"] = True
                    continue
                s = seen.get(e["node_id"], {})
                e["same_storage"] = bool(s.get("same"))
                if not e["same_storage"]:
                    why = s.get("why") or s.get("error") or "no answer"
                    e.setdefault("missing", []).append({
                        "what": "same storage as the reference node", "path": directory,
                        "problem": f"{why}: this node does not see what {ref['node_ip']} wrote there "
                                   "(a different volume, or a local directory in place of the mount)"})
        else:
            same_storage["problem"] = f"the reference node could not write the token: {wrote.get('problem') or wrote.get('error')}"
    else:
        same_storage["problem"] = "no node could write under the mount; same-storage check not possible"
    for e in report:
        # "mounted": a mount point, or provably the same storage as the reference node
        if e.get("mount_exists") and not e.get("mount_is_mountpoint") and not e.get("same_storage"):
            e.setdefault("missing", []).append({
                "what": "shared volume mounted", "path": spec["mount_path"],
                "problem": "exists but is not a mount point and is not the shared storage (a directory in the "
                           "image or on the node's disk)"})
    result = {
        "nodes": report,
        "same_storage": same_storage,
        "ok": bool(report) and all(not e.get("missing") for e in report),
        "seconds": round(time.monotonic() - started, 2),
    }
    # one write call: print() writes the text and its newline separately, and Ray's log thread
    # prints the workers' lines to this stdout in between
    sys.stdout.write(RESULT_PREFIX + json.dumps(result, sort_keys=True) + "\n")
    sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
