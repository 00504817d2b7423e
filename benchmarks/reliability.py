"""Reliability and security figures, measured in one run.

1. Generated input: >= 10,000 hypothesis-generated inputs (every command's flags read from the live app,
   config files, recipe files) in-process through ``miles_ray.cli.app.main``, with every service pointed at
   nothing. Counts tracebacks (must be 0), refusals (exit 2, one line), exit 1 for unreachable services
   (counted separately) and anything else (must be 0).
2. Canary secrets: credentials planted in the environment and in attempted flags/config across plan,
   render, submit and init in-process; every output and file produced is scanned (must be 0 leaks).
3. kill -9 during state writes: a writer killed mid-write repeatedly while a reader reads (0 torn reads).
4. The suite (unless --no-suite): ``pytest tests/reliability`` against the real components (fake-GPU
   Kubernetes with KubeRay, local Ray, the Polyaxon sandbox); each fault/race/scan test registers what it
   injects in a ledger ($MILESRAY_TEST_LEDGER), and the test's own outcome is written beside it when the
   test ends (tests/reliability/conftest.py): a fault counts as survived only if its test passed.

Run: .venv/bin/python benchmarks/reliability.py [--examples 6700] [--no-suite] [--fail-fast]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def fuzz(examples: int) -> dict:
    from tests.reliability.fuzzing import Tally, make_property

    t0 = time.monotonic()
    tally = make_property(Tally(), max_examples=examples)()
    return {"tally": tally, "seconds": time.monotonic() - t0}


def canaries() -> dict:
    """In-process: plant canaries, drive the commands that need no cluster, scan what they produce."""
    from tests.conftest import IMAGE
    from tests.reliability.fuzzing import run_cli, sandbox
    from tests.reliability.test_secrets import CANARIES, CANARY_AWS_SECRET, CANARY_ENV, CANARY_HF, CANARY_SK

    blobs: dict[str, str] = {}
    attempts = 0
    with sandbox() as d:
        os.environ.update(CANARY_ENV)
        (d / "miles-ray.yaml").write_text(json.dumps({"secret_env": {"HF_TOKEN": "hf-token/token"}}))
        inputs = Path(tempfile.mkdtemp(prefix="canary-inputs-"))
        (inputs / "bad.yaml").write_text(json.dumps({"env": {"MODEL": CANARY_SK}}))
        (inputs / "bad2.yaml").write_text(json.dumps({"secret_env": {"HF_TOKEN": CANARY_HF}}))
        runs = [
            ["render", "-F", "all", "--nodes", "2", "--image", IMAGE, "--ray-version", "2.60.0", "--out", "rendered"],
            ["render", "-F", "kuberay", "--nodes", "4", "--image", IMAGE, "--ray-version", "2.60.0", "-o", "json"],
            ["plan", "--nodes", "4", "-o", "json"],
            ["init", "starter.yaml"],
            ["submit", "--run", "c1", "--env", f"HF_TOKEN={CANARY_HF}", "--address", "http://127.0.0.1:9"],
            ["submit", "--run", "c2", "--env", f"X={CANARY_SK}", "--address", "http://127.0.0.1:9"],
            ["submit", "--run", "c3", "--extra-args", f"--note {CANARY_AWS_SECRET}", "--address", "http://127.0.0.1:9"],
            ["submit", "--run", "c4", "--rehearse", "--address", "http://127.0.0.1:9"],
            ["render", "-F", "kuberay", "--image", f"{CANARY_HF}@sha256:{'3f' * 32}", "--ray-version", "2.60.0"],
            ["plan", "--recipe", CANARY_SK],
            ["plan", "-c", str(inputs / "bad.yaml")],
            ["plan", "-c", str(inputs / "bad2.yaml")],
            ["up", "--via", "kuberay", "--nodes", "2", "--image", IMAGE, "--ray-version", "2.60.0"],
            ["runs", "-o", "json"],
        ]
        for argv in runs:
            code, out, err, exc = run_cli(argv)
            attempts += 1
            blobs[" ".join(argv[:2]) + f"#{attempts}"] = out + err + (repr(exc) if exc else "")
        for p in d.rglob("*"):
            if p.is_file() and p.name != "miles-ray.yaml":
                blobs[str(p)] = p.read_text(errors="replace")
    leaks = [(where, c) for where, text in blobs.items() for c in CANARIES if c in text]
    return {"attempts": attempts, "artifacts": len(blobs), "leaks": leaks}


def kill9_writes(rounds: int = 20) -> dict:
    import signal
    import threading

    from miles_ray.adapters.state import read_json
    from tests.reliability.test_faults import WRITER

    d = Path(tempfile.mkdtemp(prefix="kill9-"))
    target = d / "r.json"
    stats = {"reads": 0, "torn": 0}
    stop = threading.Event()

    def reader():
        while not stop.is_set():
            try:
                data = read_json(target)
                if data is not None:
                    stats["reads"] += 1
                    if len(data["pad"]) != data["i"] % 50000:
                        stats["torn"] += 1
            except Exception:  # noqa: BLE001
                stats["torn"] += 1

    t = threading.Thread(target=reader, daemon=True)
    t.start()
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    survived = 0
    for i in range(rounds):
        p = subprocess.Popen([sys.executable, "-c", WRITER, str(target)], env=env, stdout=subprocess.PIPE, text=True)
        p.stdout.readline()
        time.sleep(0.03 + (i % 5) * 0.05)
        p.send_signal(signal.SIGKILL)
        p.wait()
        # a kill is survived when the reader then reads the file whole: reads counted after the kill, none torn
        reads, torn = stats["reads"], stats["torn"]
        deadline = time.monotonic() + 5
        while stats["reads"] == reads and time.monotonic() < deadline:
            time.sleep(0.005)
        survived += stats["reads"] > reads and stats["torn"] == torn
    stop.set()
    t.join(5)
    return {"kills": rounds, "survived": survived, **stats}


def suite(ledger: Path, fail_fast: bool) -> dict:
    from tests.infra.knobs import LEDGER
    from tests.infra.knobs import STRICT

    # strict: a fault test whose real component is missing fails instead of skipping, so no figure below
    # comes from a test that did not run
    env = {**os.environ, LEDGER: str(ledger), "PYTHONPATH": str(REPO), STRICT: "1"}
    t0 = time.monotonic()
    res = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/reliability",
                          "-m", "e2e or ray or polyaxon", *(["-x"] if fail_fast else [])],
                         cwd=REPO, env=env, capture_output=True, text=True)
    tail = [ln for ln in res.stdout.splitlines() if " passed" in ln or " failed" in ln or " error" in ln][-1:] or [""]
    events = [json.loads(ln) for ln in ledger.read_text().splitlines()] if ledger.exists() else []
    passed = int(m.group(1)) if (m := re.search(r"(\d+) passed", tail[0])) else 0
    skipped = int(m.group(1)) if (m := re.search(r"(\d+) skipped", tail[0])) else 0
    return {"rc": res.returncode, "summary": tail[0], "events": events, "seconds": time.monotonic() - t0,
            "passed": passed, "skipped": skipped, "out": res.stdout[-3000:]}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--examples", type=int, default=6700,
                    help="generated argument lists (config and recipe files add a quarter each)")
    ap.add_argument("--no-suite", action="store_true", help="skip the pytest suite against real components")
    ap.add_argument("--fail-fast", action="store_true", help="stop the suite at its first failure (pytest -x)")
    args = ap.parse_args()

    rows: list[tuple[str, str, str]] = []
    f = fuzz(args.examples)
    t = f["tally"]
    c = canaries()
    k = kill9_writes()
    faults_injected = k["kills"]
    faults_survived = k["survived"]
    races = races_ok = scans_failed = 0
    leak_scans = len(c["leaks"])
    s = None
    if not args.no_suite:
        with tempfile.TemporaryDirectory() as tmp:
            s = suite(Path(tmp) / "ledger.jsonl", args.fail_fast)
        for e in s["events"]:  # "ok" is the outcome of the test that injected the event
            if e["kind"] == "fault":
                faults_injected += 1
                faults_survived += bool(e["ok"])
            elif e["kind"] == "race":
                races += 1
                races_ok += bool(e["ok"])
            elif e["kind"] == "leak_scan":
                leak_scans += int(e.get("leaks", 0))
                scans_failed += not e["ok"]

    rows += [
        ("generated inputs tried", f"{t.tried}", f"{f['seconds']:.0f} s in-process; exit 0: {t.ok}, refused (exit 2): "
                                                 f"{t.refused}, unreachable (exit 1): {t.unreachable}, doctor reports (exit 4): "
                                                 f"{t.diagnosis}"),
        ("tracebacks seen", f"{t.traceback}", "must be 0"),
        ("other exits (not 0/2, or 1 not about a service)", f"{t.bad_exit}", "must be 0"),
        ("faults injected", f"{faults_injected}", f"{k['kills']} kill -9 during state writes ({k['reads']} reads)"
                                                   + ("" if s is None else f" + {faults_injected - k['kills']} in the suite")),
        ("faults survived", f"{faults_survived}", f"torn reads: {k['torn']}"),
        ("concurrent races run", f"{races}", f"consistent: {races_ok}" if s else "skipped (--no-suite)"),
        ("secrets leaked", f"{leak_scans}", f"canaries in {c['artifacts']} in-process artifacts from {c['attempts']} "
                                             "commands" + ("" if s is None else " + the suite's canary scan "
                                                           "(render/up on Kubernetes/submit on Ray/runs/logs)"
                                                           + (f"; {scans_failed} scan test(s) FAILED" if scans_failed
                                                              else ""))),
    ]
    if s is not None:
        rows.append(("suite (pytest tests/reliability, real components)", s["summary"], f"{s['seconds']:.0f} s"))
    w0 = max(len(r[0]) for r in rows)
    w1 = max(len(r[1]) for r in rows)
    print(f"{'measure':<{w0}}  {'count':>{w1}}  notes")
    for name, val, note in rows:
        print(f"{name:<{w0}}  {val:>{w1}}  {note}")
    for ex in t.examples[:5]:
        print("example:", ex)
    if c["leaks"]:
        print("leaks:", c["leaks"])
    if s is not None and s["rc"] != 0:
        print(s["out"])
    # figures only from events observed: nothing generated, a suite that ran nothing or skipped anything, or a
    # kill the reader never read after, is a failure of the benchmark, not a pass
    empty = [why for why, is_empty in (
        ("no generated input was tried", t.tried == 0),
        ("the kill -9 reader read nothing", k["reads"] == 0),
        ("the suite ran no test", s is not None and s["passed"] == 0),
        (f"the suite skipped {s and s['skipped']} test(s)", s is not None and s["skipped"] > 0),
        ("the suite recorded no fault and no race", s is not None and not s["events"])) if is_empty]
    for why in empty:
        print(f"FAILED: {why}")
    bad = t.traceback or t.bad_exit or leak_scans or scans_failed or empty \
        or (s is not None and (s["rc"] != 0 or races_ok != races)) or faults_survived != faults_injected
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
