#!/usr/bin/env python3
"""List a run's checkpoints: runs AS a short Ray job (``miles-ray register``, before anything is registered).

``list_checkpoints.py ROOT [PATH ...]``: one task with 0.01 CPU is scheduled on a GPU worker (the nodes that
write checkpoints; the head advertises no CPUs, so the task cannot land there); it lists ``ROOT`` (the run's
checkpoint dir, from its run record: the ``--save`` of its job): the ``iter_*`` directories and ``latest_checkpointed_iteration.txt``, and says
whether each PATH is a directory. When no worker has room within 30 s, the listing runs on the driver itself.

Iterations are Miles' numbering (``save(rollout_id)`` -> ``iter_<rollout_id:07d>``): ``iter_N`` holds rollout N trained,
``iter_0000000`` (rollout 0) is a real checkpoint.

Last line: ``MILES_RAY_PROBE_RESULT {json}`` with ``root``, ``exists``, ``iterations``, ``latest``, ``paths``,
``details`` (per iteration: bytes, files, mtime, the ``register`` marker, what is missing: :func:`describe`, the
same as ``miles_ray.adapters.checkpoint_files.describe``), ``host``, ``ip`` and ``where`` (which node answered). Imports only ray and the standard library.
"""

from __future__ import annotations

import json
import os
import socket
import sys

RESULT_PREFIX = "MILES_RAY_PROBE_RESULT "
WORKER_WAIT_SECONDS = 30
REGISTERED_MARKER = "miles-ray-registered.json"


def describe(path: str) -> dict:
    """One checkpoint dir: bytes, files, mtime, registered (the marker's content), missing (see the module doc)."""
    size = count = 0
    newest = 0.0
    names: set = set()
    for where, _dirs, files in os.walk(path):
        for name in files:
            try:
                st = os.lstat(os.path.join(where, name))
            except OSError:
                continue
            size += st.st_size
            count += 1
            newest = max(newest, st.st_mtime)
            names.add(name)
    registered = None
    try:
        with open(os.path.join(path, REGISTERED_MARKER), encoding="utf-8") as fh:
            registered = json.load(fh)
    except (OSError, ValueError):
        registered = None
    missing = None
    if not (names - {REGISTERED_MARKER}):
        missing = "no files"
    elif any(n.endswith(".distcp") for n in names) and ".metadata" not in names:
        missing = "no .metadata (a torch_dist checkpoint cut off)"
    return {"bytes": size, "files": count, "mtime": newest or None, "registered": registered, "missing": missing}


def listing(root: str, paths: list[str]) -> dict:
    out: dict = {"host": socket.gethostname(), "root": root, "exists": os.path.isdir(root), "iterations": [],
                 "latest": None, "paths": {p: os.path.isdir(p) for p in paths}}
    if out["exists"]:
        for name in sorted(os.listdir(root)):
            if name.startswith("iter_") and name[5:].isdigit() and os.path.isdir(os.path.join(root, name)):
                out["iterations"].append(int(name[5:]))
        try:
            with open(os.path.join(root, "latest_checkpointed_iteration.txt")) as fh:
                out["latest"] = fh.read().strip()
        except OSError:
            pass
        out["details"] = {str(i): describe(os.path.join(root, f"iter_{i:07d}")) for i in out["iterations"]}
    try:
        import ray

        out["ip"] = ray.util.get_node_ip_address()
    except Exception:  # noqa: BLE001 - the address is evidence only
        out["ip"] = None
    return out


def mark(root: str, iteration: int, content: str) -> str | None:
    """Write ``register``'s marker into checkpoint ``iteration`` (its run's supervisor never prunes it); why not."""
    path = os.path.join(root, f"iter_{iteration:07d}")
    if not os.path.isdir(path):
        return f"no checkpoint dir {path}"
    tmp = os.path.join(path, f".{REGISTERED_MARKER}.tmp")
    try:
        with open(tmp, "w", encoding="utf-8") as fh:
            fh.write(content)
        os.replace(tmp, os.path.join(path, REGISTERED_MARKER))
    except OSError as e:
        return str(e)
    return None


def main(argv: list[str]) -> int:
    marked = None
    if "--mark" in argv:  # --mark ITER JSON: register's marker, written where the checkpoints are
        i = argv.index("--mark")
        marked = (int(argv[i + 1]), argv[i + 2])
        argv = argv[:i] + argv[i + 3:]
    root, paths = argv[0], argv[1:]
    if marked is not None:
        sys.stdout.write(RESULT_PREFIX + json.dumps({"root": root, "marked": marked[0],
                                                     "error": mark(root, *marked)}) + "\n")
        sys.stdout.flush()
        return 0
    result = None
    try:
        import ray

        from probe_tasks import without_the_jobs_runtime_env

        without_the_jobs_runtime_env()  # the tasks run in the nodes' plain workers (probe_tasks.py)
        ray.init(address="auto", logging_level="ERROR", log_to_driver=False)
        ref = ray.remote(num_cpus=0.01)(listing).remote(root, paths)
        ready, _ = ray.wait([ref], timeout=WORKER_WAIT_SECONDS)
        if ready:
            result = ray.get(ref)
            result["where"] = f"worker {result.get('ip')} ({result['host']})"
    except Exception:  # noqa: BLE001 - fall back to listing on the driver
        result = None
    if result is None:
        result = listing(root, paths)
        result["where"] = f"driver {result.get('ip')} (no worker had room within {WORKER_WAIT_SECONDS}s)"
    # one write call: print() writes the text and its newline separately, and Ray's log thread
    # prints the workers' lines to this stdout in between
    sys.stdout.write(RESULT_PREFIX + json.dumps(result) + "\n")
    sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
