"""Regenerate the captured output of docs/walkthrough.md's last section ("The same, embedded") from a real run.

Runs the section's commands, as written in COMMANDS, on this machine: a local Ray cluster of 4 fake 8-GPU
nodes, direct-mode runs whose train.py is the STAND-IN tests/fakes/fake_metrics_train.py (a stand-in Miles
checkout), a real Polyaxon API server (haupt sandbox, as the tests start it) for `register`. Prints the
transcript ("$ command", its output, "[exit N]") and, with --write, replaces the block between the markers
``<!-- embedded-transcript:start -->`` / ``:end -->`` in docs/walkthrough.md. Everything it starts is
stopped; its files live in one temp dir, removed at the end.

Run: .venv/bin/python tools/walkthrough_embedded.py [--write]
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
DOC = REPO / "docs" / "walkthrough.md"
START, END = "<!-- embedded-transcript:start -->", "<!-- embedded-transcript:end -->"
SUBMIT = "--miles-commit abc123 --allow-miles-drift --model-revision m1 --dataset-revision d1"
# The section's commands, in order ({host} is the Polyaxon server's address). tests/unit/test_docs_commands.py
# checks that the doc shows exactly these.
COMMANDS = [
    "miles-ray up --backend local --nodes 4 --name wt",
    "miles-ray comm-check --name wt --size-mb 16",
    "miles-ray submit --rehearse --nodes 4 --name wt --run wt-rehearse",
    f"miles-ray submit --name wt --run q4-a --nodes 4 --num-rollout 40 {SUBMIT} "
    "--env MILESRAY_TEST_FAKE_EVAL_FINAL=0.31 --keep-checkpoints 1 --keep-best eval/aime --follow",
    "miles-ray runs outputs q4-a",
    f"miles-ray submit --name wt --run q4-b --nodes 4 --num-rollout 60 --resume-from q4-a {SUBMIT} "
    "--env MILESRAY_TEST_FAKE_EVAL_FINAL=0.38 --follow",
    "miles-ray runs compare q4-a q4-b",
    "miles-ray register q4-b --checkpoint 59 --polyaxon-host {host} --project walkthrough",
    "miles-ray register q4-b --checkpoint 50 --polyaxon-host {host} --project walkthrough",
    "miles-ray runs pull q4-b --best eval/aime --to q4-b-best",
    "miles-ray down --backend local --name wt -y",
]
# lines of a run's own output left out of the transcript (the stand-in's metric lines, Ray's INFO lines)
ELIDED = re.compile(r"\.py:\d+ - (rollout|step|perf) \d+:|train\.py:\d+|^REHEARSAL_RESULT |^Running entrypoint|^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d+\s+INFO|"
                    r"^\(\w+ pid=|Job '.*' (submitted|succeeded)|^-{10,}|^Job submission|^Next steps|^  Query|^    ray job|"
                    r"^  Request|^Tailing logs")


def transcript(workdir: Path, host: str) -> str:
    miles = workdir / "miles"
    miles.mkdir()
    shutil.copy(REPO / "tests" / "fakes" / "fake_metrics_train.py", miles / "train.py")  # STAND-IN train.py
    (workdir / "miles-ray.yaml").write_text(f"miles_root: {miles}   # stand-in checkout: train.py = "
                                            "tests/fakes/fake_metrics_train.py\nmount_path: "
                                            f"{workdir / 'mnt'}\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MILES_RAY_", "RAY_", "POLYAXON"))}
    env.update(MILES_RAY_STATE_DIR=str(workdir / "state"), RAY_USAGE_STATS_ENABLED="0", COLUMNS="200")
    exe = Path(sys.executable).parent / "miles-ray"
    out: list[str] = []
    for command in COMMANDS:
        argv = command.format(host=host).split()
        proc = subprocess.run([str(exe), *argv[1:]], cwd=workdir, env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True, timeout=900)  # as a terminal shows them
        text = proc.stdout
        lines, elided = [], False
        for line in text.splitlines():
            if ELIDED.search(line):
                if not elided:
                    lines.append("...")
                elided = True
                continue
            elided = False
            lines.append(line.rstrip())
        out += [f"$ {command.format(host=host)}", *lines, f"[exit {proc.returncode}]", ""]
    return "\n".join(out).replace(str(workdir), "/tmp/wt").rstrip() + "\n"


def main() -> int:
    from tests.infra import haupt

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--write", action="store_true", help="replace the transcript block in docs/walkthrough.md")
    args = ap.parse_args()
    workdir = Path(tempfile.mkdtemp(prefix="walkthrough-"))
    server = haupt.start(haupt.ensure_venv(), workdir / "haupt")
    exe = Path(sys.executable).parent / "miles-ray"
    try:
        server.create_project("walkthrough")
        text = transcript(workdir / "run", server.host) if (workdir / "run").mkdir() is None else ""
    finally:
        subprocess.run([str(exe), "down", "--backend", "local", "--name", "wt", "-y"], capture_output=True,
                       env={**os.environ, "MILES_RAY_STATE_DIR": str(workdir / "run" / "state")})
        server.stop()
        shutil.rmtree(workdir, ignore_errors=True)
    text = text.replace(server.host, "http://127.0.0.1:<port>")
    print(text)
    if args.write:
        doc = DOC.read_text()
        head, rest = doc.split(START, 1)
        _, tail = rest.split(END, 1)
        DOC.write_text(f"{head}{START}\n```\n{text}```\n{END}{tail}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
