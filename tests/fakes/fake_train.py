#!/usr/bin/env python3
"""Stand-in for Miles's ``train.py`` in tests.

Writes what it was started with -- argv, the env vars miles-ray is expected to set, and the whole
environment -- as JSON to the path in ``$MILESRAY_TEST_FAKE_TRAIN_OUT`` (if set) and prints it.
Sleeps ``$MILESRAY_TEST_FAKE_TRAIN_SLEEP`` seconds, then exits ``$MILESRAY_TEST_FAKE_TRAIN_EXIT`` (default 0). Standard library only.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import time

SELECTED = (
    "MILES_SCRIPT_EXTERNAL_RAY",
    "RAY_ADDRESS",
    "PROMETHEUS_PORT",
    "NCCL_NVLS_ENABLE",
    "PYTHONUNBUFFERED",
)


def main() -> int:
    record = {
        "argv": sys.argv[1:],
        "script": os.path.abspath(__file__),
        "cwd": os.getcwd(),
        "pid": os.getpid(),
        "host": socket.gethostname(),
        "time": time.time(),
        "selected_env": {k: os.environ.get(k) for k in SELECTED},
        "env": dict(os.environ),
    }
    text = json.dumps(record, indent=2, sort_keys=True)
    out = os.environ.get("MILESRAY_TEST_FAKE_TRAIN_OUT")
    if out:
        os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
        tmp = f"{out}.{os.getpid()}.tmp"
        with open(tmp, "w") as fh:
            fh.write(text)
        os.replace(tmp, out)
    print("FAKE_TRAIN " + json.dumps({k: record[k] for k in ("argv", "selected_env")}, sort_keys=True), flush=True)
    print(text, flush=True)
    time.sleep(float(os.environ.get("MILESRAY_TEST_FAKE_TRAIN_SLEEP", "0") or 0))  # to test stop/scale guards
    return int(os.environ.get("MILESRAY_TEST_FAKE_TRAIN_EXIT", "0") or 0)


if __name__ == "__main__":
    sys.exit(main())
