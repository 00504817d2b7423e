"""`status RUN` with its progress, `doctor RUN`'s training findings and `runs plot`, on runs whose cluster is gone
(the head is a closed port): their job info and driver logs come from the saved copies, as after `down`. The runs
are recorded by today's submit preparation; their logs are Miles' metric lines (0-based rollout ids)."""

from __future__ import annotations

import datetime as _dt
import json
import os
import re
import struct
import subprocess
import sys
import time
from html.parser import HTMLParser

import pytest

from miles_ray.adapters import state
from miles_ray.core.config import load_config
from miles_ray.core.submission import SubmitRequest, SubmitTarget, prepare_submit, validate_request
from tests.conftest import REPO

CLOSED = "http://127.0.0.1:9"
CREATED = "2026-08-22T00:00:00+00:00"


def stamp(t: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t))


def miles_log(rollouts: range, start: float, pace: float, *, nan_from: int | None = None, eval_every: int = 0,
              reward_scale: float = 0.5) -> str:
    lines = []
    for rid in rollouts:
        at = f"[{stamp(start + (rid - rollouts.start) * pace)} rank0]"
        loss = "nan" if nan_from is not None and rid >= nan_from else round(0.05 / (rid + 1), 6)
        lines += [f"{at} rollout.py:88 - perf {rid}: {{'rollout/episode_raw_reward': {rid * reward_scale / 40}, "
                  "'perf/rollout_time': 1.5}",
                  f"{at} actor.py:512 - rollout {rid}: {{'rollout/raw_reward': {rid * reward_scale / 40}}}",
                  f"{at} actor.py:601 - step {rid}: {{'train/loss': {loss}, 'train/grad_norm': 0.2}}"]
        if eval_every and (rid + 1) % eval_every == 0:
            lines.append(f"{at} rollout.py:61 - eval {rid}: {{'eval/aime': {rid / 100}}}")
    return "\n".join(lines) + "\n"


@pytest.fixture
def state_dir(clean_env, monkeypatch):
    monkeypatch.setenv("MILES_RAY_STATE_DIR", str(clean_env / "state"))
    monkeypatch.chdir(clean_env)
    return clean_env / "state"


def gone_run(run: str, status: str, logs: str, *, dataset_revision: str = "d1", mode_rehearse: bool = False) -> dict:
    """A direct-mode run of 40 rollouts whose cluster is gone, its job info and logs saved (status ``status``)."""
    cfg = load_config({"name": "gone", "recipe": "Qwen3-4B", "nodes": 1}, environ={})
    valid = validate_request(cfg, SubmitRequest(run=run, num_rollout=40, max_restarts=None if mode_rehearse else 0, rehearse=mode_rehearse,
                                                dataset_revision=dataset_revision))
    job = prepare_submit(cfg, valid, SubmitTarget("address", CLOSED, supervisors=frozenset()), created=CREATED,
                         launchers_dir="/unused")
    state.create_record(job.record)
    sid = job.record["submission_id"]
    state.save_run_copy(run, {"job_id": sid, "submission_id": sid, "status": status, "start_time": 1}, logs, "down",
                        CREATED)
    return job.record


def test_status_shows_progress_in_json_and_table(cli, state_dir):
    now = time.time()
    gone_run("done-a", "SUCCEEDED", miles_log(range(0, 40), now - 400, 10, eval_every=20))
    code, out, err = cli("status", "done-a", "-o", "json")
    assert code == 0, err
    st = json.loads(out)
    assert {"run", "submission_id", "address", "status", "output_dir", "recipe", "mode", "saved_copy"} <= set(st)
    p = st["progress"]
    assert (p["step"], p["of"], p["fraction"], p["seconds_per_step"]) == (39, 40, 1.0, 10.0)
    assert (p["eta_seconds"], p["stalled"], p["stalled_for_seconds"]) == (None, False, None)  # it ended
    assert p["last_step_at"].endswith("+00:00")
    assert p["metrics"]["reward"]["metric"] == "rollout/raw_reward" and p["metrics"]["reward"]["trend"] == "up"
    assert p["metrics"]["eval"]["metric"] == "eval/aime" and p["metrics"]["throughput"]["metric"] == "perf/rollout_time"
    assert p["findings"] == []
    code, out, err = cli("status", "done-a")
    assert code == 0, err
    assert "rollout 39 (40/40 done, 100%)" in out and "10 s/rollout" in out
    assert "reward 0.4875↑ @39" in out and "loss " in out and "eval/aime 0.39" in out
    assert "WARN" not in out


def test_a_quiet_running_run_is_stalled_and_a_nan_loss_warned(cli, state_dir, monkeypatch):
    """A saved copy of a job that was running is STOPPED once its cluster is gone: here its head is taken to say
    RUNNING (the integration test reads a live one)."""
    from miles_ray.services import training

    real = training.run_status
    monkeypatch.setattr(training, "run_status",
                        lambda run, **kw: real(run, **kw).model_copy(update={"status": "RUNNING"}))
    now = time.time()
    # 12 rollouts 10 s apart, the last one 20 minutes ago: 5 x 10 s = 50 s, floored to 60 s: stalled
    gone_run("quiet", "RUNNING", miles_log(range(0, 12), now - 1200 - 110, 10, nan_from=10))
    code, out, err = cli("status", "quiet", "-o", "json")
    assert code == 5, err
    p = json.loads(out)["progress"]
    assert (p["step"], p["of"], p["stalled"], p["stall_after_seconds"]) == (11, 40, True, 60.0)
    assert 1190 <= p["stalled_for_seconds"] <= 1300
    assert p["eta_seconds"] == 28 * 10.0
    assert {f["check"] for f in p["findings"]} == {"stall", "nan_loss"}
    code, out, err = cli("status", "quiet")
    assert code == 5
    warn = [ln for ln in out.splitlines() if ln.startswith("WARN")]
    assert len(warn) == 2 and "no new rollout for" in warn[0] and "miles-ray doctor quiet" in warn[0]
    assert "train/loss is nan at rollout 11" in warn[1]
    code, out, err = cli("doctor", "quiet", "-o", "json")
    found = {f["check"]: f for f in json.loads(out)["findings"]}
    assert found["stall"]["status"] == "warning" and found["stall"]["checklist"] == "Training stalls or diverges"
    assert found["nan_loss"]["status"] == "warning" and "miles-ray logs quiet" in found["nan_loss"]["fix"]


def test_status_of_a_rehearsal_has_no_progress_key(cli, state_dir):
    gone_run("reh", "SUCCEEDED", "placed\n", mode_rehearse=True)
    code, out, err = cli("status", "reh", "-o", "json")
    assert code == 0, err
    assert "progress" not in json.loads(out)


class Page(HTMLParser):
    """Every element with its attributes, the text, and whatever could load a resource."""

    def __init__(self) -> None:
        super().__init__()
        self.tags: list[tuple[str, dict]] = []
        self.text: list[str] = []

    def handle_starttag(self, tag, attrs):
        self.tags.append((tag, dict(attrs)))

    def handle_startendtag(self, tag, attrs):
        self.tags.append((tag, dict(attrs)))

    def handle_data(self, data):
        self.text.append(data)


def png_size(path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and data[12:16] == b"IHDR"
    return struct.unpack(">II", data[16:24])


@pytest.fixture
def two_runs(state_dir):
    now = time.time() - 3600
    gone_run("plot-a", "SUCCEEDED", miles_log(range(0, 40), now, 10, eval_every=20))
    gone_run("plot-b", "SUCCEEDED", miles_log(range(0, 40), now, 12, eval_every=20, reward_scale=0.7),
             dataset_revision="d2")
    return state_dir


def test_runs_plot_writes_png_svg_and_one_offline_html(cli, two_runs, tmp_path):
    from miles_ray.cli.plot import image_size

    code, out, err = cli("runs", "plot", "plot-a", "plot-b", "--out", str(tmp_path / "x.png"))
    assert code == 0, err
    assert png_size(tmp_path / "x.png") == image_size(3)  # reward, loss, eval/aime
    assert "dataset revisions differ: plot-a d1 vs plot-b d2" in out
    code, out, err = cli("runs", "plot", "plot-a", "plot-b", "--metric", "train/loss", "--out", str(tmp_path / "x.svg"))
    assert code == 0, err
    assert (tmp_path / "x.svg").read_text().lstrip().startswith("<?xml")
    code, out, err = cli("runs", "plot", "plot-a", "plot-b", "--out", str(tmp_path / "x.html"), "-o", "json")
    assert code == 0, err
    got = json.loads(out)
    assert got["runs"] == ["plot-a", "plot-b"] and got["metrics"] == ["rollout/raw_reward", "train/loss", "eval/aime"]
    assert got["points"]["plot-a"]["eval/aime"] == [[19, 0.19, 1], [39, 0.39, 1]]
    page = Page()
    page.feed((tmp_path / "x.html").read_text())
    text = " ".join(page.text)
    assert "plot-a" in text and "plot-b" in text and "dataset revisions differ" in text
    remote = [(t, a) for t, a in page.tags for k, v in a.items()
              if k in ("src", "href", "xlink:href", "data", "action") and v and not v.startswith("#")]
    assert remote == [] and not [t for t, _ in page.tags if t in ("script", "link", "iframe", "img", "object")]
    html = (tmp_path / "x.html").read_text()
    assert {u[:1] for u in re.findall(r"url\(\s*['\"]?([^)'\"]*)", html)} == {"#"} and "@import" not in html
    titles = [t for t in page.text if " · eval/aime · rollout 39" in t]
    assert titles == ["plot-a · eval/aime · rollout 39 (attempt 1): 0.39", "plot-b · eval/aime · rollout 39 (attempt 1): 0.39"]


def test_runs_plot_bad_input_is_one_line_and_exit_2(cli, two_runs, tmp_path):
    gone_run("empty", "RUNNING", "loading the model\n")
    cases = [
        (["plot-a", "--metric", "eval/gsm8k", "--out", str(tmp_path / "a.png")], "no run logged eval/gsm8k; they logged:"),
        (["plot-a", "empty"], "run empty has no metric lines yet"),
        (["plot-a", "--out", str(tmp_path / "a.pdf")], "unknown output extension '.pdf'"),
        (["plot-a", "--out", str(tmp_path / "no" / "a.png")], "cannot write there"),
        (["plot-a", "--out", str(tmp_path)], "unknown output extension"),
    ]
    for args, says in cases:
        code, out, err = cli("runs", "plot", *args)
        lines = [ln for ln in err.splitlines() if ln.strip()]
        assert (code, len(lines)) == (2, 1), (args, err)
        assert says in lines[0] and "Traceback" not in err, (args, err)
    code, _, err = cli("runs", "plot", "plot-a", "--metric", "eval/gsm8k")
    assert "rollout/raw_reward" in err and "train/loss" in err  # names the ones it did log
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o500)
    if not os.access(ro, os.W_OK):  # root writes anywhere
        code, _, err = cli("runs", "plot", "plot-a", "--out", str(ro / "a.png"))
        assert code == 2 and "cannot write there (is not writable)" in err


def test_runs_plot_in_the_terminal(cli, two_runs):
    code, out, err = cli("runs", "plot", "plot-a", "plot-b", "--metric", "rollout/raw_reward")
    assert code == 0, err
    assert "rollout/raw_reward" in out and "plot-a" in out and "plot-b" in out and "rollout id" in out


@pytest.mark.parametrize("argv", [["--help"], ["runs", "plot", "--help"], ["status", "nope"], ["runs", "--no-live"]])
def test_plotting_libraries_stay_out_of_the_start_path(argv, clean_env):
    code = ("import sys\nfrom miles_ray.cli.app import main\n"
            f"main({argv!r})\n"
            "print('PLOT=' + ','.join(sorted(m for m in sys.modules if m.split('.')[0] in ('matplotlib', 'plotext'))))\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("MILES_RAY_")}
    env["MILES_RAY_STATE_DIR"] = str(clean_env / "state")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=REPO, timeout=60)
    assert "PLOT=\n" in res.stdout, res.stdout[-500:] + res.stderr[-500:]


# -- status RUN --watch ---------------------------------------------------------------------------------------------

class Script:
    """What a watched run does between two reads (the fake clock of ``training._pause``): each pause moves the run
    on to its next state -- its saved log grows, its state and attempts change (a live job cannot run here: the
    integration test watches one). ``training.run_status`` is the real read of the saved copy, with the state and
    attempts of the current step put in."""

    def __init__(self, run: str, steps: list[dict], interrupt_at: int | None = None) -> None:
        self.run, self.steps, self.at, self.interrupt_at = run, steps, 0, interrupt_at
        self.pauses: list[float] = []
        self.save()

    def save(self) -> None:
        sid = state.load_record(self.run)["submission_id"]
        state.save_run_copy(self.run, {"job_id": sid, "submission_id": sid, "status": "SUCCEEDED", "start_time": 1},
                            self.steps[self.at]["log"], "down", CREATED)

    def pause(self, seconds: float) -> None:
        self.pauses.append(seconds)
        if self.interrupt_at is not None and len(self.pauses) == self.interrupt_at:
            raise KeyboardInterrupt
        self.at += 1
        self.save()

    def status(self, real):
        def read(run, **kw):
            step = self.steps[self.at]
            return real(run, **kw).model_copy(update={"status": step["status"], "attempts": step.get("attempts")})
        return read


@pytest.fixture
def scripted(monkeypatch):
    from miles_ray.services import training

    def install(run: str, steps: list[dict], interrupt_at: int | None = None) -> Script:
        script = Script(run, steps, interrupt_at)
        monkeypatch.setattr(training, "run_status", script.status(training.run_status))
        monkeypatch.setattr(training, "_pause", script.pause)
        return script

    return install


def attempt(n: int, status: str, ended: bool = False, resumed: str | None = None, **kw):
    from miles_ray.core.runs import Attempt

    return Attempt.of({"attempt": n, "submission_id": f"sid-{n}", "status": status, "started": CREATED,
                       "ended": CREATED if ended else None, "resumed_from": resumed, **kw})


def test_watch_without_a_terminal_prints_each_new_rollout_and_ends_with_the_run(cli, state_dir, scripted):
    now = time.time() - 40  # 5 s apart: no stall (60 s) at any read
    gone_run("w", "RUNNING", "")
    logs = [miles_log(range(0, n), now, 5, nan_from=7) for n in (3, 6, 6, 9)]
    script = scripted("w", [{"status": "PENDING", "log": "loading the model\n"}]
                      + [{"status": "RUNNING", "log": log} for log in logs]
                      + [{"status": "SUCCEEDED", "log": logs[-1]}])
    code, out, err = cli("status", "w", "--watch")
    assert code == 0, err
    lines = out.splitlines()
    assert lines[0].startswith("run w: PENDING") and lines[1].startswith("run w: RUNNING")
    rollouts = [int(re.match(r"rollout (\d+) \(", ln).group(1)) for ln in lines if ln.startswith("rollout ")]
    assert rollouts == list(range(0, 9))  # each once, in order (the first read had none)
    assert ("\nrollout 2 (3/40) · reward 0.025 · loss 0.01667 · perf/rollout_time 1.5 · 5 s/rollout · ETA 3m05s\n"
            in out)
    assert "\nrollout 1 (2/40) · reward 0.0125 · loss 0.025 · perf/rollout_time 1.5\n" in out  # pace: a read's last
    assert "rollout 7 (8/40) · reward 0.0875 · loss nan" in out
    warn = [i for i, ln in enumerate(lines) if ln.startswith("WARN run w: train/loss is nan")]
    assert len(warn) == 1 and lines[warn[0] - 1].startswith("rollout 8 ")  # once, after the read's rollouts
    assert lines[-1] == "run w: SUCCEEDED · rollout 8 (9/40 done)"
    assert script.pauses == [5.0] * 5
    assert "\x1b" not in out  # plain lines for a log


def test_watch_without_a_terminal_says_each_attempt_and_resume(cli, state_dir, scripted):
    now = time.time() - 40
    gone_run("sup", "RUNNING", "")
    first = "== attempt 1 (sid-1) ==\n" + miles_log(range(0, 4), now, 5)
    second = first + "== attempt 2 (sid-2), resumed from /ckpt iter 1 ==\n" + miles_log(range(2, 5), now + 20, 5)
    a1 = attempt(1, "RUNNING")
    a1_failed = attempt(1, "FAILED", ended=True, reason="node lost", retry=True, why="1 of 2 restarts left")
    a2 = attempt(2, "RUNNING", resumed="/ckpt", resumed_iteration=1)
    a2_failed = attempt(2, "FAILED", ended=True, retry=False, why="no restart left")
    scripted("sup", [{"status": "RUNNING", "log": first[:first.index("step 2:")], "attempts": [a1]},
                     {"status": "PENDING", "log": first, "attempts": [a1_failed]},
                     {"status": "RUNNING", "log": second, "attempts": [a1_failed, a2]},
                     {"status": "FAILED", "log": second, "attempts": [a1_failed, a2_failed]}])
    code, out, err = cli("status", "sup", "-w")
    assert code == 3 and "run sup: the job FAILED" in err  # status's exit code for FAILED
    assert out.splitlines() == [
        "run sup: RUNNING",  # the run as it is: its state, its attempt, its last rollout
        "attempt 1 RUNNING (job sid-1)",
        "rollout 2 (3/40) · reward 0.025 · perf/rollout_time 1.5 · 5 s/rollout · ETA 3m05s",
        "run sup: PENDING",  # then what changed, read by read
        "rollout 3 (4/40) · reward 0.0375 · loss 0.0125 · perf/rollout_time 1.5 · 5 s/rollout",
        "attempt 1 ended FAILED (node lost) · retried: 1 of 2 restarts left",
        "run sup: RUNNING",
        "attempt 2 started (job sid-2), resumed from /ckpt iter 1, from rollout 2",
        # attempt 2 logs rollouts 2 and 3 again (its checkpoint held rollout 1): new rollouts of attempt 2
        "rollout 2 (3/40) · reward 0.025 · loss 0.01667 · perf/rollout_time 1.5 · attempt 2",
        "rollout 3 (4/40) · reward 0.0375 · loss 0.0125 · perf/rollout_time 1.5 · attempt 2",
        "rollout 4 (5/40) · reward 0.05 · loss 0.01 · perf/rollout_time 1.5 · attempt 2 · 5 s/rollout · "
        "ETA 2m55s",
        "attempt 2 ended FAILED · not retried: no restart left",
        "run sup: FAILED · rollout 4 (5/40 done)"]


def test_watch_ctrl_c_leaves_the_run_as_it_is(cli, state_dir, scripted):
    gone_run("cc", "RUNNING", "")
    script = scripted("cc", [{"status": "RUNNING", "log": miles_log(range(0, 3), time.time() - 60, 10)}] * 3,
                      interrupt_at=2)
    record = state.load_record("cc")
    code, out, err = cli("status", "cc", "--watch")
    assert code == 130
    assert "stopped watching run cc; the run goes on" in err and "miles-ray status cc --watch" in err
    assert state.load_record("cc") == record and len(script.pauses) == 2  # read twice, changed nothing


def test_watch_on_a_terminal_redraws_in_place(cli, state_dir, scripted, monkeypatch):
    """The live view (Rich Live on a terminal): the progress bar, ETA, the curves, the attempts, redrawn."""
    import io

    from rich.console import Console

    from miles_ray.cli import status as status_cli

    screen = io.StringIO()
    monkeypatch.setattr(status_cli, "out", Console(file=screen, force_terminal=True, width=150, height=60,
                                                   color_system=None))
    now = time.time() - 300
    gone_run("tty", "RUNNING", "")
    scripted("tty", [{"status": "RUNNING", "log": miles_log(range(0, n), now, 10, eval_every=5),
                      "attempts": [attempt(1, "RUNNING")]} for n in (6, 12)]
             + [{"status": "SUCCEEDED", "log": miles_log(range(0, 12), now, 10, eval_every=5),
                 "attempts": [attempt(1, "SUCCEEDED", ended=True)]}])
    code, _, err = cli("status", "tty", "--watch")
    assert code == 0, err
    text = screen.getvalue()
    assert text.count("run tty: RUNNING") == 2 and "run tty: SUCCEEDED" in text
    assert "\x1b[2K" in text or "\x1b[1A" in text  # redrawn in place (cursor up / erase line)
    assert "rollout 5 (6/40 done, 15%)" in text and "ETA 5m40s" in text and "rollout 11 (12/40 done, 30%)" in text
    assert "━" in text  # the bar
    assert "reward 0.1375 @11" in text and "loss " in text and "eval/aime 0.09 @9" in text  # the curves' titles
    assert "┌" in text and "┤" in text  # plotext's frames
    assert "attempt" in text and "sid-1" in text  # the attempts table
    assert "Ctrl-C leaves, the run goes on" in text


def test_watch_bad_input_is_one_line_and_exit_2(cli, state_dir):
    gone_run("bi", "SUCCEEDED", miles_log(range(0, 3), time.time() - 60, 10))
    for args, says in [(["status", "--watch"], "name the RUN to watch"),
                       (["status", "bi", "-w", "-o", "json"], "not with -o json/yaml")]:
        code, _, err = cli(*args)
        assert code == 2 and says in err and len(err.strip().splitlines()) == 1, err


def test_watch_of_an_ended_run_prints_it_once_and_exits_with_its_state(cli, state_dir):
    gone_run("ended", "SUCCEEDED", miles_log(range(0, 40), time.time() - 600, 10))
    code, out, err = cli("status", "ended", "--watch")
    assert code == 0, err
    assert out.splitlines()[0].startswith("rollout 39 (40/40)")
    assert out.splitlines()[-1].startswith("run ended: SUCCEEDED · rollout 39 (40/40 done)")
