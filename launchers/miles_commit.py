#!/usr/bin/env python3
"""Which Miles is in the image: runs AS a short Ray job (``submit`` in direct mode, ``doctor``).

``miles_commit.py ROOT [--timeout S]``: one task, pinned to a GPU worker (the first alive one by node IP: where
``train.py``'s actors run) with ``num_cpus=0`` so a busy node still answers, reads the commit of the Miles checkout
at ROOT (the config's ``miles_root``):

1. ``git rev-parse HEAD`` in ROOT when ROOT has a ``.git`` (the Miles image clones radixark/miles into
   ``/root/miles`` and checks out ``MILES_COMMIT``); ``safe.directory`` is set for this one command, so a
   checkout owned by another user (a non-root pod) is still read;
2. else the same from the files (``.git/HEAD``, the ref it names, ``packed-refs``) when git is not installed;
3. else unknown: upstream ships no version file and its editable install records no commit.

When no GPU worker answers within ``--timeout`` seconds (or none is alive), ROOT is read by the driver itself.
Last line: ``MILES_RAY_PROBE_RESULT {json}`` with ``commit`` (40 hex or null), ``source`` (``git``,
``git-files`` or null), ``root``, ``root_exists``, ``entry`` (ROOT/train.py, what direct mode runs),
``entry_exists``, ``node_ip``, ``where``, ``problem``.
Imports only ray and the standard library.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

RESULT_PREFIX = "MILES_RAY_PROBE_RESULT "
FULL = re.compile(r"^[0-9a-f]{40}$")


def _read(path: str) -> str | None:
    try:
        with open(path, encoding="utf-8", errors="replace") as fh:
            return fh.read().strip()
    except OSError:
        return None


def _git_dir(root: str) -> str | None:
    """The git directory of ``root``: ``root/.git`` or, for a worktree/submodule, the one its ``.git`` file names."""
    dotgit = os.path.join(root, ".git")
    if os.path.isdir(dotgit):
        return dotgit
    text = _read(dotgit)
    if text and text.startswith("gitdir:"):
        path = text[len("gitdir:"):].strip()
        return path if os.path.isabs(path) else os.path.normpath(os.path.join(root, path))
    return None


def commit_from_files(git_dir: str) -> str | None:
    """HEAD's commit from the files alone: a detached HEAD, a loose ref or a packed ref (also in a common dir)."""
    head = _read(os.path.join(git_dir, "HEAD"))
    if not head:
        return None
    if FULL.fullmatch(head):
        return head
    if not head.startswith("ref:"):
        return None
    ref = head[len("ref:"):].strip()
    common = _read(os.path.join(git_dir, "commondir"))
    dirs = [git_dir] + ([os.path.normpath(os.path.join(git_dir, common))] if common else [])
    for d in dirs:
        loose = _read(os.path.join(d, ref))
        if loose and FULL.fullmatch(loose):
            return loose
        for line in (_read(os.path.join(d, "packed-refs")) or "").splitlines():
            parts = line.split()
            if len(parts) == 2 and parts[1] == ref and FULL.fullmatch(parts[0]):
                return parts[0]
    return None


def read_commit(root: str) -> dict:
    out: dict = {"root": root, "root_exists": os.path.isdir(root), "commit": None, "source": None, "problem": None}
    # the entry point direct mode runs (``python3 ROOT/train.py``): submit refuses a job it would not find
    out["entry"] = os.path.join(root, "train.py")
    out["entry_exists"] = os.path.isfile(out["entry"])
    try:
        import ray

        out["node_ip"] = ray.util.get_node_ip_address()
    except Exception:  # noqa: BLE001 - the address is evidence only
        out["node_ip"] = None
    if not out["root_exists"]:
        out["problem"] = f"{root} does not exist on this node"
        return out
    git_dir = _git_dir(root)
    if git_dir is None:
        out["problem"] = f"{root} is not a git checkout (no .git) and Miles ships no version file"
        return out
    try:
        done = subprocess.run(["git", "-c", "safe.directory=*", "-C", root, "rev-parse", "HEAD"],
                              capture_output=True, text=True, timeout=20, check=False)
        commit = done.stdout.strip()
        if done.returncode == 0 and FULL.fullmatch(commit):
            out.update(commit=commit, source="git")
            return out
        out["problem"] = f"git rev-parse HEAD failed: {(done.stderr or '').strip()[:200]}"
    except (OSError, subprocess.TimeoutExpired) as e:
        out["problem"] = f"git not usable ({type(e).__name__})"
    commit = commit_from_files(git_dir)
    if commit:
        out.update(commit=commit, source="git-files", problem=None)
    return out


def main(argv: list[str]) -> int:
    if not argv:
        print("usage: miles_commit.py ROOT [--timeout S]", file=sys.stderr)
        return 2
    root, timeout = argv[0], 30.0
    if "--timeout" in argv[1:]:
        timeout = float(argv[argv.index("--timeout") + 1])
    result = None
    try:
        import ray
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        from probe_tasks import without_the_jobs_runtime_env

        without_the_jobs_runtime_env()  # the tasks run in the nodes' plain workers (probe_tasks.py)
        ray.init(address="auto", logging_level="ERROR", log_to_driver=False)
        workers = [n for n in ray.nodes() if n.get("Alive") and (n.get("Resources") or {}).get("GPU", 0) > 0]
        workers.sort(key=lambda n: ([int(x) if x.isdigit() else 0 for x in (n.get("NodeManagerAddress") or "").split(".")],
                                    n["NodeID"]))
        if workers:
            strategy = NodeAffinitySchedulingStrategy(node_id=workers[0]["NodeID"], soft=False)
            ref = ray.remote(read_commit).options(num_cpus=0, max_retries=0,
                                                  scheduling_strategy=strategy).remote(root)
            ready, _ = ray.wait([ref], timeout=timeout)
            if ready:
                result = ray.get(ref)
                result["where"] = f"GPU worker {result.get('node_ip')}"
            else:
                ray.cancel(ref, force=True)
    except Exception:  # noqa: BLE001 - read on the driver below
        result = None
    if result is None:
        result = read_commit(root)
        result["where"] = f"driver {result.get('node_ip')} (no GPU worker answered within {timeout:g}s)"
    # one write call: print() writes the text and its newline separately, and Ray's log thread
    # prints the workers' lines to this stdout in between
    sys.stdout.write(RESULT_PREFIX + json.dumps(result, sort_keys=True) + "\n")
    sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
