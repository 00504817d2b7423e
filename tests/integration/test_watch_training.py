"""Watch it train, on the embedded Ray cluster: while a run runs, `status RUN -o json` shows its ``progress`` (the
rollout id moving, ``of`` = --num-rollout, an ETA); a diverged loss is a WARN finding of `status` and `doctor`;
`status RUN --watch` without a terminal prints one line per new rollout and ends when the run ends, with its exit
code; `runs plot A B --out x.png|x.svg|x.html` draws both runs (a PNG that decodes to the expected size, an HTML
page that names both runs, holds their points and loads nothing from anywhere).

Miles cannot run here (no GPU, no Miles image): each run's train.py is the STAND-IN tests/fakes/fake_metrics_train.py
(Miles' loop and metric lines, 0-based rollout ids); ``MILESRAY_TEST_FAKE_ROLLOUT_SECONDS`` makes run A slow enough
to be seen running, ``MILESRAY_TEST_FAKE_NAN_LOSS_FROM`` makes run B's loss nan from a rollout on."""

from __future__ import annotations

import json
import os
import re
import shutil
import struct
import time
from html.parser import HTMLParser

import pytest

from tests.conftest import REPO
from tests.infra.fixtures import poll

pytestmark = [pytest.mark.ray]

ROLLOUTS = 24


@pytest.fixture(scope="module")
def world(local_ray, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("watch")
    root = tmp / "miles"
    root.mkdir(parents=True)
    shutil.copy(REPO / "tests" / "fakes" / "fake_metrics_train.py", root / "train.py")  # STAND-IN train.py
    (tmp / "miles-ray.yaml").write_text(f"miles_root: {root}\nmount_path: {tmp / 'mnt'}\n")
    return {"tmp": tmp, "state": tmp / "state", "cluster": local_ray}


@pytest.fixture
def env(world, monkeypatch):
    monkeypatch.setenv("MILES_RAY_STATE_DIR", str(world["state"]))
    for key in [k for k in os.environ if k.startswith("MILES_RAY_") and k != "MILES_RAY_STATE_DIR"] + [
            "RAY_ADDRESS", "POLYAXON_HOST"]:
        monkeypatch.delenv(key, raising=False)
    monkeypatch.chdir(world["tmp"])
    return world


def submit(cli, world, run, *env_vars):
    code, _, err = cli("submit", "--address", world["cluster"].address, "--name", "miles-test", "--run", run,
                       "--nodes", "1", "--num-rollout", str(ROLLOUTS), "--no-follow", "-o", "json",
                       "--miles-commit", "abc123", "--allow-miles-drift", "--dataset-revision", "d1",
                       *[a for v in env_vars for a in ("--env", v)])
    assert code == 0, err


def status(cli, run) -> dict:
    code, out, err = cli("status", run, "-o", "json")
    assert out, err
    return json.loads(out)


class Page(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.tags: list[tuple[str, dict]] = []
        self.text: list[str] = []

    def handle_starttag(self, tag, attrs):
        self.tags.append((tag, dict(attrs)))

    handle_startendtag = handle_starttag

    def handle_data(self, data):
        self.text.append(data)


def test_progress_moves_while_it_runs_and_plots_of_two_runs(env, cli, tmp_path, monkeypatch):
    # watch-c goes silent after rollout 5 (a stuck collective): checked at the end, once its stall bound has passed
    submit(cli, env, "watch-c", "MILESRAY_TEST_FAKE_ROLLOUT_SECONDS=0.3", "MILESRAY_TEST_FAKE_HANG_AFTER=5")
    quiet_c = poll("watch-c to log rollout 5", lambda: (s := status(cli, "watch-c"))["status"] == "RUNNING" and (
        (s.get("progress") or {}).get("step") == 5) and s, 180)["progress"]
    assert quiet_c["stalled"] is False and quiet_c["stalled_for_seconds"] is None  # not before its bound
    submit(cli, env, "watch-a", "MILESRAY_TEST_FAKE_ROLLOUT_SECONDS=0.6")
    submit(cli, env, "watch-b", "MILESRAY_TEST_FAKE_NAN_LOSS_FROM=20", "MILESRAY_TEST_FAKE_EVAL_FINAL=0.6")

    first = poll("watch-a to log two rollouts", lambda: (s := status(cli, "watch-a"))["status"] == "RUNNING" and (
        (s.get("progress") or {}).get("step") or -1) >= 1 and s, 180)
    p1 = first["progress"]
    assert p1["of"] == ROLLOUTS and 0 < p1["fraction"] < 1 and p1["stalled"] is False
    assert p1["seconds_per_step"] is not None and 0.3 < p1["seconds_per_step"] < 5
    assert p1["eta_seconds"] is not None and p1["eta_seconds"] > 0
    moved = poll("watch-a's rollout id to move", lambda: (s := status(cli, "watch-a"))["progress"]["step"] > p1["step"]
                 and s, 120)
    p2 = moved["progress"]
    assert p2["of"] == ROLLOUTS and p2["fraction"] > p1["fraction"]
    if moved["status"] == "RUNNING":
        # the ETA is the rollouts left at the recent pace, and fewer are left (the pace itself moves on a busy
        # machine: a whole run saw 9.5 s then 18 s as the pace halved)
        left1, left2 = ROLLOUTS - p1["step"] - 1, ROLLOUTS - p2["step"] - 1
        assert left2 < left1
        assert abs(p2["eta_seconds"] - left2 * p2["seconds_per_step"]) <= 0.2, p2
    for key in ("run", "submission_id", "address", "status", "output_dir", "recipe", "mode"):
        assert key in moved  # every key status had before is still there
    code, out, _ = cli("status", "watch-a")
    assert code in (0, 5) and f"/{ROLLOUTS} done" in out and "reward " in out

    # status RUN --watch without a terminal (stdout captured): the run as it is, then one line per new rollout,
    # until the run ends, with status's exit code for its final state (read every 0.5 s instead of 5 s here)
    from miles_ray.services import training

    monkeypatch.setattr(training, "_pause", lambda seconds: time.sleep(0.5))
    code, out, err = cli("status", "watch-a", "--watch")
    assert code == 0, err
    lines = out.splitlines()
    steps = [int(ln.split()[1]) for ln in lines if ln.startswith("rollout ")]
    assert steps == list(range(steps[0], ROLLOUTS)) and steps[0] >= p2["step"], out  # each once, in order
    if moved["status"] == "RUNNING":
        assert lines[0] == "run watch-a: RUNNING" or lines[0].startswith("run watch-a: RUNNING (")
        assert re.search(r"^rollout \d+ \(\d+/24\) · reward [\d.]+ · loss [\d.e-]+", out, re.M)
    assert lines[-1].startswith(f"run watch-a: SUCCEEDED · rollout {ROLLOUTS - 1} ({ROLLOUTS}/{ROLLOUTS} done)")

    for run in ("watch-a", "watch-b"):
        poll(f"{run} to end", lambda run=run: status(cli, run)["status"] in ("SUCCEEDED", "FAILED", "STOPPED"), 300)
    done = status(cli, "watch-a")
    assert done["status"] == "SUCCEEDED"
    assert (done["progress"]["step"], done["progress"]["fraction"], done["progress"]["stalled"]) == (
        ROLLOUTS - 1, 1.0, False)
    b = status(cli, "watch-b")["progress"]
    assert [f["check"] for f in b["findings"]] == ["nan_loss"]
    assert f"train/loss is nan at rollout {ROLLOUTS - 1}" in b["findings"][0]["summary"]
    code, out, _ = cli("status", "watch-b")
    assert "WARN run watch-b: train/loss is nan" in out and "miles-ray logs watch-b" in out
    code, out, _ = cli("doctor", "watch-b", "-o", "json")
    nan = [f for f in json.loads(out)["findings"] if f["check"] == "nan_loss"]
    assert nan and nan[0]["status"] == "warning" and "first at rollout 20" in nan[0]["evidence"][0]

    from miles_ray.cli.plot import image_size

    png, svg, html = tmp_path / "x.png", tmp_path / "x.svg", tmp_path / "x.html"
    for path in (png, svg, html):
        code, out, err = cli("runs", "plot", "watch-a", "watch-b", "--out", str(path))
        assert code == 0, err
        assert f"wrote {path}" in out
    data = png.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    assert struct.unpack(">II", data[16:24]) == image_size(3)  # reward, loss, eval/aime
    assert "<svg" in svg.read_text()
    page = Page()
    page.feed(html.read_text())
    text = " ".join(page.text)
    assert "runs watch-a, watch-b" in text
    # their points: one hover title per logged eval point, with its value
    assert "watch-a · eval/aime · rollout 19 (attempt 1)" in text and "watch-b · eval/aime · rollout 19" in text
    assert not [t for t, _ in page.tags if t in ("script", "link", "img", "iframe", "object", "embed")]
    assert not [(t, a) for t, a in page.tags for k, v in a.items()
                if k in ("src", "href", "xlink:href", "data") and v and not v.startswith("#")]
    code, out, err = cli("runs", "plot", "watch-a", "watch-b", "--metric", "eval/gsm8k", "--out", str(png))
    assert code == 2 and "no run logged eval/gsm8k; they logged:" in err and "eval/aime" in err

    # watch-c went silent after rollout 5: it is reported stalled within the documented bound (k x its usual rollout
    # time, never under the floor), with the next things to look at, and it is not stopped by that (the test stops it)
    from miles_ray.core import train_progress

    import datetime as _dt

    c = poll("watch-c to be told stalled", lambda: (s := status(cli, "watch-c"))["progress"]["stalled"] and s,
             train_progress.STALL_FLOOR_SECONDS + 120)
    read_at = _dt.datetime.now(_dt.timezone.utc)
    pc = c["progress"]
    assert c["status"] == "RUNNING" and pc["step"] == 5 and pc["stall_after_seconds"] == train_progress.STALL_FLOOR_SECONDS
    # every read past the bound tells it, with how long it has been quiet: since its last rollout, to the read
    quiet = (read_at - _dt.datetime.fromisoformat(pc["last_step_at"])).total_seconds()
    assert quiet > pc["stall_after_seconds"] and abs(pc["stalled_for_seconds"] - quiet) <= 15, (pc, quiet)
    code, out, _ = cli("status", "watch-c")
    assert "WARN run watch-c has logged no new rollout for" in out and "miles-ray doctor watch-c" in out, out
    code, out, err = cli("stop", "watch-c")
    assert code == 0, err
