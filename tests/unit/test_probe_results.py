"""How a probe payload hands its answer to miles-ray: one ``MILES_RAY_PROBE_RESULT {json}`` line in the job's log,
which is also where Ray prints the workers' log lines (from a thread of the driver)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from miles_ray.core.probes import RESULT_PREFIX, parse_result

ROOT = Path(__file__).resolve().parents[2]


def test_the_last_result_line_wins_and_other_lines_are_ignored():
    log = "\n".join(["starting", RESULT_PREFIX + '{"n": 1}', "(Peer pid=7, ip=127.0.0.3) hello",
                     RESULT_PREFIX + '{"n": 2, "ok": true}', "bye"])
    assert parse_result(log) == {"n": 2, "ok": True}


def test_text_glued_after_the_json_is_ignored():
    """Another thread of the driver wrote on the same line before the payload's newline."""
    log = RESULT_PREFIX + '{"ok": false, "errors": ["a}b"]}(Peer pid=7, ip=127.0.0.3) late line\n'
    assert parse_result(log) == {"ok": False, "errors": ["a}b"]}
    assert parse_result("(raylet) x " + RESULT_PREFIX + '{"ok": true}') == {"ok": True}


def test_a_cut_short_line_does_not_hide_an_earlier_answer():
    log = RESULT_PREFIX + '{"n": 1}\n' + RESULT_PREFIX + '{"n": 2, "nodes": [1, 2'
    assert parse_result(log) == {"n": 1}


@pytest.mark.parametrize("log", ["", "no result here", RESULT_PREFIX + "[1, 2]", RESULT_PREFIX + "{not json"])
def test_no_answer(log):
    assert parse_result(log) is None


_CHILD = r"""
import sys, threading
sys.path.insert(0, sys.argv[1])
from launchers.comm_check import emit
stop = False
def chatter():  # what Ray's log thread does in a driver: print workers' lines to the same stdout
    while not stop:
        print("(Peer pid=1, ip=127.0.0.3) x" * 3)
t = threading.Thread(target=chatter, daemon=True)
t.start()
sys.setswitchinterval(1e-6)  # switch threads as often as possible
for i in range(2000):
    emit({"i": i, "pad": "y" * 200})
stop = True
t.join()
"""


def test_the_payloads_result_line_is_whole_while_another_thread_prints():
    """A real child Python: a thread prints like Ray's log thread while the payload emits 2000 answers; every
    answer ends its line (print() writes text and newline separately, so chatter could land between)."""
    out = subprocess.run([sys.executable, "-c", _CHILD, str(ROOT)], capture_output=True, text=True, timeout=120,
                         check=True).stdout
    lines = [ln for ln in out.splitlines() if RESULT_PREFIX in ln]
    assert len(lines) == 2000
    # the chatter may start a line the answer then ends (its own newline comes later): the answer is still the
    # rest of that line, nothing glued after it
    assert [json.loads(ln[ln.index(RESULT_PREFIX) + len(RESULT_PREFIX):])["i"] for ln in lines] == list(range(2000))
