#!/usr/bin/env python3
"""Benchmark: ``runs pull`` on real pods (KubeRay on real kubelets + containerd, tests/infra/realpods.py) against a
plain ``kubectl cp``-equivalent tar stream of the same files, in one run, measured the same way (wall time of the
command, the checkpoint's bytes over it).

Brings up the real-pod cluster, ``up --via kuberay --nodes 1`` and one run of the FAKE checkpointing trainer
(tests/realpods/test_outputs_pull.py's ``bring_up``), makes its newest checkpoint ``SHARDS`` x ``SHARD_MIB`` MiB of
random bytes bigger (``grow``), then, ``ROUNDS`` times alternating, into fresh dirs:

* ``runs pull RUN --to DIR`` (a short-lived pull pod: sha256 of each file on the cluster's side, a streamed tar through
  exec, each file verified here): the whole command, and its copy phase alone (``copy_seconds`` of its JSON: after the
  pod started and the manifest was computed);
* ``kubectl exec HEAD -- tar cf - -C ROOT iter_N | tar xf - -C DIR`` (what ``kubectl cp`` does: no verification), and
  the same with ``tar czf``/``tar xzf``.

Prints MiB/s per way (best of the rounds), the ratios of ``runs pull`` to ``kubectl exec tar cf`` (target >= 0.8x) and
``BENCH_RESULT {json}``. Needs root (network and mount namespaces) and the cached binaries and image
(cluster/build.sh real-nodes).

    .venv/bin/python benchmarks/bench_pull.py
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.infra.realpods import start_real_pods  # noqa: E402
from tests.realpods.test_outputs_pull import NAME, NS, RUN, bring_up, grow  # noqa: E402

SHARDS, SHARD_MIB, ROUNDS = 8, 48, 2
TARGET = 0.8


def _kubectl_tar(kubeconfig: str, head: str, root: str, it: str, dest: Path, z: bool) -> float:
    dest.mkdir(parents=True)
    t = time.monotonic()
    pull = subprocess.Popen(["kubectl", "--kubeconfig", kubeconfig, "-n", NS, "exec", head, "-c", "ray", "--", "tar",
                             "czf" if z else "cf", "-", "-C", root, it], stdout=subprocess.PIPE)
    untar = subprocess.run(["tar", "xzf" if z else "xf", "-", "-C", str(dest)], stdin=pull.stdout, check=True)
    pull.stdout.close()
    assert pull.wait() == 0 and untar.returncode == 0
    return time.monotonic() - t


def main() -> int:
    out: dict = {"shards": SHARDS, "shard_mib": SHARD_MIB, "rounds": ROUNDS}
    with tempfile.TemporaryDirectory(prefix="bench-pull-") as d:
        t = time.monotonic()
        rp = start_real_pods(Path(d) / "realpods")
        out["real_pods_up_s"] = round(time.monotonic() - t, 1)
        try:
            live = bring_up(rp, Path(d) / "work")
            out["up_s"] = live.up_s
            grow(live, 3, SHARDS, SHARD_MIB)
            it = "iter_0000003"
            size = sum(p.stat().st_size for p in (live.root_here / it).rglob("*") if p.is_file())
            out["mib"] = round(size / 2**20, 1)
            [head] = [p.metadata.name for p in live.core.list_namespaced_pod(
                NS, label_selector=f"ray.io/cluster={NAME},ray.io/node-type=head").items if p.status.phase == "Running"]
            times: dict[str, list[float]] = {"runs_pull": [], "runs_pull_copy": [], "kubectl_tar_cf": [],
                                             "kubectl_tar_czf": []}
            for r in range(ROUNDS):
                dest = live.work / f"pulled-{r}"
                t = time.monotonic()
                code, stdout, err = live.mr("runs", "pull", RUN, "--to", str(dest), "-o", "json")
                times["runs_pull"].append(time.monotonic() - t)
                assert code == 0, err[-3000:]
                got = json.loads(stdout)
                assert got["copied_bytes"] >= size, got
                times["runs_pull_copy"].append(got["copy_seconds"])
                for z, key in ((False, "kubectl_tar_cf"), (True, "kubectl_tar_czf")):
                    times[key].append(_kubectl_tar(str(rp.kubeconfig), head, live.root, it,
                                                   live.work / f"{key}-{r}", z))
                for p in live.work.glob(f"*-{r}"):
                    shutil.rmtree(p)
            out["seconds"] = {k: [round(v, 2) for v in vs] for k, vs in times.items()}
            out["mib_s"] = {k: round(size / 2**20 / min(vs), 1) for k, vs in times.items()}
            live.down()
        finally:
            td = rp.stop()
            out["teardown_s"] = round(td.seconds, 1)
    base = out["mib_s"]["kubectl_tar_cf"]
    ratios = {k: round(v / base, 2) for k, v in out["mib_s"].items()}
    out["ratios_to_kubectl_tar_cf"] = ratios
    print(f"{out['mib']} MiB (checkpoint {RUN}/iter_0000003), best of {ROUNDS} rounds")
    print(f"{'way':<34} {'MiB/s':>8} {'ratio':>6}")
    for k in ("runs_pull", "runs_pull_copy", "kubectl_tar_cf", "kubectl_tar_czf"):
        print(f"{k:<34} {out['mib_s'][k]:>8} {ratios[k]:>6}")
    print(f"target: runs_pull >= {TARGET}x kubectl_tar_cf (runs_pull: the whole command, its listing, pod start and "
          "cluster-side sha256 included; runs_pull_copy: its streamed copy, each file verified)")
    print("BENCH_RESULT " + json.dumps(out, sort_keys=True))
    return 0 if ratios["runs_pull"] >= TARGET else 1


if __name__ == "__main__":
    sys.exit(main())
