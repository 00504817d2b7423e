"""The CLI's surface, read from the live Typer app: one meaning per short flag, the Kubernetes options on
every verb that can reach a cluster, -o everywhere, --backend auto, hints that name real commands, plain
words, exit codes mapped in one place and documented identically in README and `--help`, `--debug`,
`stop` that never stops the newest run silently, and progress on stderr with elapsed and time left."""

from __future__ import annotations

import io
import json
import re
import subprocess
import sys
import time

import pytest
import typer
import typer.main

from miles_ray.cli.app import VERBS, app, verb_command
from miles_ray.core.errors import EXIT_CODES, JobFailed
from tests.conftest import IMAGE, REPO

# Every verb that talks to Kubernetes or to a Ray head that may sit behind a port-forward.
CLUSTER_VERBS = {"up", "submit", "scale", "status", "logs", "stop", "runs", "runs compare", "runs plot", "runs outputs", "runs pull", "park", "resume", "down", "check-data",
                 "doctor", "comm-check", "register", "env"}
OFFLINE_VERBS = {"plan", "render", "recipes", "init", "clusters"}
SHORT_FLAGS = {"-o": "--output", "-c": "--config", "-n": "--namespace", "-b": "--backend", "-r": "--recipe",
               "-N": "--nodes", "-G": "--gpus-per-node", "-F": "--format", "-f": "--follow", "-w": "--watch", "-y": "--yes",
               "-h": "--help"}


def commands() -> dict[str, object]:
    """Every command of the live app by its path ('status', 'runs compare'), the root excluded."""
    found: dict[str, object] = {}

    def walk(cmd, path: list[str]) -> None:
        if path:
            found[" ".join(path)] = cmd
        for name, sub in (getattr(cmd, "commands", None) or {}).items():
            walk(sub, path + [name])

    walk(typer.main.get_command(app), [])
    return found


def params(cmd) -> list:
    """A command's parameters as they parse under the root (which gives every verb -h/--help)."""
    root = typer.main.get_command(app)
    return cmd.get_params(typer.Context(cmd, parent=typer.Context(root, **root.context_settings)))


def options(cmd) -> dict[str, object]:
    """Each option string of a command (long and short, --no-x too) -> its click parameter."""
    return {o: p for p in params(cmd) if p.param_type_name == "option" for o in p.opts + p.secondary_opts}


def help_text(cli, *path: str) -> str:
    code, out, err = cli(*path, "--help")
    assert code == 0, err
    return out


def test_every_verb_is_classified_and_listed():
    assert set(commands()) == CLUSTER_VERBS | OFFLINE_VERBS
    assert set(VERBS) == {c.split()[0] for c in commands()}


def test_every_short_flag_has_one_long_meaning_everywhere():
    meanings: dict[str, set[str]] = {}
    for path, cmd in commands().items():
        for p in params(cmd):
            longs = [o for o in p.opts if o.startswith("--")]
            for short in (o for o in p.opts if re.fullmatch(r"-[^-]", o)):
                meanings.setdefault(short, set()).update(longs or [f"<{p.name}>"])
    assert {s: m for s, m in meanings.items() if len(m) != 1} == {}
    assert {s: next(iter(m)) for s, m in meanings.items()} == SHORT_FLAGS


@pytest.mark.parametrize("path", sorted(CLUSTER_VERBS))
def test_cluster_verbs_take_the_kubernetes_options(path):
    opts = options(commands()[path])
    assert {"--context", "--kubeconfig", "--namespace", "-n"} <= set(opts), sorted(opts)
    assert opts["-n"] is opts["--namespace"]


@pytest.mark.parametrize("path", sorted(CLUSTER_VERBS | OFFLINE_VERBS))
def test_every_verb_has_output(path):
    opts = options(commands()[path])
    assert "-o" in opts and opts["-o"] is opts["--output"]


def test_backend_defaults_to_auto_and_says_what_auto_means():
    with_backend = {path: options(cmd)["--backend"] for path, cmd in commands().items() if "--backend" in options(cmd)}
    assert {"up", "submit", "scale", "status", "down", "doctor", "check-data", "comm-check"} <= set(with_backend)
    for path, p in with_backend.items():
        assert getattr(p.default, "value", p.default) == "auto", path
        assert "auto: the local cluster of that name if one runs on this machine, else Kubernetes" in p.help, path


def test_each_listed_summary_is_the_first_paragraph_of_the_verbs_own_help():
    for name, (_, _, summary) in VERBS.items():
        first = " ".join(verb_command(name).help.strip().split("\n\n")[0].split())
        assert summary == first, name


def test_top_level_help_lists_every_verb_without_importing_one():
    code = ("import sys; from miles_ray.cli.app import main; main(['--help']); "
            "print(sorted(m for m in sys.modules if m.startswith('miles_ray.cli.')), file=sys.stderr)")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=60)
    assert res.returncode == 0, res.stderr
    assert res.stderr.strip() == "['miles_ray.cli.app']"
    listed = re.findall(r"^  ([a-z][a-z-]*)  ", res.stdout.split("Commands:")[1], re.M)
    assert listed == list(VERBS)


def _readme_table(section: str) -> list[list[str]]:
    text = (REPO / "README.md").read_text()
    body = text.split(f"\n## {section}\n", 1)[1].split("\n## ", 1)[0]
    rows = [ln for ln in body.splitlines() if ln.startswith("|") and not ln.startswith("|---")]
    return [[c.strip() for c in re.split(r"(?<!\\)\|", row)[1:-1]] for row in rows[1:]]


def test_readme_command_table_lists_exactly_the_commands_of_help(cli):
    top = help_text(cli).split("Commands:")[1]
    in_help = re.findall(r"^  ([a-z][a-z-]*)  ", top, re.M)
    in_readme = [re.match(r"`([a-z][a-z-]*)", row[0]).group(1) for row in _readme_table("Commands")]
    assert in_readme == in_help == list(VERBS)
    assert "compare" in help_text(cli, "runs")  # 'runs compare' is listed under runs, in both


def test_exit_codes_are_one_table_in_readme_and_help(cli):
    assert {int(code): meaning for code, meaning in _readme_table("Exit codes")} == EXIT_CODES
    epilog = " ".join(help_text(cli).split("Exit codes", 1)[1].split())
    for code, meaning in EXIT_CODES.items():
        assert f"{code} {meaning}" in epilog


def test_every_command_named_in_messages_help_and_docs_exists(cli):
    real = set(VERBS)
    texts = {str(p.relative_to(REPO)): p.read_text() for p in
             [*(REPO / "miles_ray").rglob("*.py"), REPO / "README.md", *(REPO / "docs").glob("*.md")]}
    texts.update({f"help of {path or 'miles-ray'}": help_text(cli, *path.split()) for path in ["", *commands()]})
    named = re.compile(r"(?:^|[`'\"]|\$ )miles-ray ([a-z][a-z-]*)", re.M)
    wrong = {(where, verb) for where, text in texts.items() for verb in named.findall(text) if verb not in real}
    assert wrong == set()
    assert sum(len(named.findall(t)) for t in texts.values()) > 100  # the scan does see the hints


def test_plain_words_in_help_readme_and_docs(cli):
    texts = {f"help of {path or 'miles-ray'}": help_text(cli, *path.split()) for path in ["", *commands()]}
    texts.update({str(p.relative_to(REPO)): p.read_text() for p in [REPO / "README.md", *(REPO / "docs").glob("*.md")]})
    assert {where for where, text in texts.items() if re.search(r"\bseeds?\b", text, re.I)} == set()


def test_debug_shows_the_traceback_and_only_then(cli, clean_env):
    code, out, err = cli("plan", "--nodes", "3")
    assert code == 2 and "Traceback" not in err and err.count("\n") == 1
    code, out, err = cli("--debug", "plan", "--nodes", "3")
    assert code == 2 and "Traceback (most recent call last)" in err and "PlanError" in err
    assert err.splitlines()[-1].startswith("error: ") and sum(ln.startswith("error:") for ln in err.splitlines()) == 1
    code, _, err = cli("plan", "--nodes", "3")  # --debug does not stick to the next call
    assert "Traceback" not in err


def test_an_unexpected_exception_is_one_line_too(cli, clean_env, monkeypatch):
    """A bug (here: the recipe catalog raising RuntimeError) still ends as one error line, exit 1; --debug shows it."""
    import miles_ray.services.recipes

    def broken(_recipe_file=None):
        raise RuntimeError("boom")

    monkeypatch.setattr(miles_ray.services.recipes, "catalog", broken)  # the name the recipes service calls
    code, out, err = cli("recipes")
    assert (code, out) == (1, "") and err.count("\n") == 1 and "Traceback" not in err
    assert err.startswith("error: unexpected RuntimeError: boom") and "miles-ray --debug" in err
    code, _, err = cli("--debug", "recipes")
    assert code == 1 and "Traceback (most recent call last)" in err and 'raise RuntimeError("boom")' in err


def test_render_prints_json_with_o(cli, clean_env):
    code, out, err = cli("render", "-F", "kuberay", "--image", IMAGE, "--ray-version", "2.60.0", "-o", "json")
    assert code == 0, err
    assert json.loads(out)["kind"] == "RayCluster"
    code, out, err = cli("render", "-F", "all", "--image", IMAGE, "--ray-version", "2.60.0", "-o", "json")
    assert code == 0, err
    docs = json.loads(out)  # the three documents, in the order of the YAML output
    assert [d["kind"] for d in docs] == ["operation", "Cluster", "RayCluster"]  # polyaxon-cr: core.polyaxon.com Cluster


# -- stop never stops the newest run silently -----------------------------------------------------------------

@pytest.fixture
def two_runs(clean_env, monkeypatch):
    """Two run records in a fresh state dir; their heads are a closed port (nothing is ever stopped here)."""
    from miles_ray.adapters import state

    monkeypatch.setenv("MILES_RAY_STATE_DIR", str(clean_env / "state"))
    for run, address, created in (("in-ml", "k8s://ml/miles", "2026-01-01T00:00:00+00:00"),
                                  ("newest", "http://127.0.0.1:9", "2026-01-02T00:00:00+00:00")):
        state.create_record({"run": run, "address": address, "created": created, "submission_id": f"job-{run}",
                             "output_dir": f"/mnt/miles/runs/{run}"})
    return state


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_stop_without_a_run_refuses_without_a_terminal(cli, two_runs, monkeypatch):
    monkeypatch.setattr(sys, "stdin", io.StringIO(""))
    code, out, err = cli("stop")
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and "refusing to stop the latest run 'newest' without confirmation" in err
    assert "-y" in err
    code, _, err = cli("stop", "-n", "ml")  # the latest run in that namespace, still not without asking
    assert code == 2 and "'in-ml'" in err
    code, _, err = cli("stop", "-y")  # -y goes ahead: the newest run's head is a closed port
    assert code == 1 and "127.0.0.1:9" in err
    code, _, err = cli("stop", "newest")  # a named run is not asked about
    assert code == 1 and "127.0.0.1:9" in err


def test_stop_without_a_run_asks_on_a_terminal(cli, two_runs, monkeypatch):
    monkeypatch.setattr(sys, "stdin", _Terminal())
    asked = []
    monkeypatch.setattr("builtins.input", lambda q: asked.append(q) or "n")
    code, _, err = cli("stop")
    assert code == 2 and "cancelled" in err and asked == ["stop run 'newest' (the latest run)? [y/N] "]


def test_namespace_is_checked_against_the_named_run(cli, two_runs):
    code, _, err = cli("status", "newest", "-n", "ml")
    assert code == 2 and "run 'newest' is not on a cluster in namespace 'ml'" in err and err.count("\n") == 1


# -- exit codes of job states: one table ------------------------------------------------------------------------

def test_job_states_exit_through_the_one_table():
    from miles_ray.cli.common import job_state_exit
    from miles_ray.core.errors import EXIT_JOB_RUNNING, EXIT_JOB_STOPPED, EXIT_SERVICE

    assert job_state_exit("r", "SUCCEEDED") is None
    with pytest.raises(JobFailed) as failed:
        job_state_exit("r", "FAILED")
    assert failed.value.exit_code == 3 and "miles-ray logs r" in str(failed.value)
    for state, code in (("PENDING", EXIT_JOB_RUNNING), ("RUNNING", EXIT_JOB_RUNNING), ("STOPPED", EXIT_JOB_STOPPED),
                        ("UNKNOWN", EXIT_SERVICE)):
        with pytest.raises(typer.Exit) as ended:
            job_state_exit("r", state)
        assert ended.value.exit_code == code, state
    assert (EXIT_JOB_RUNNING, EXIT_JOB_STOPPED) == (5, 6)


# -- progress: always on stderr, with elapsed and time left -------------------------------------------------------

STAMP = r"\[\d+s, \d+s left\]"


def test_progress_lines_go_to_stderr_with_elapsed_and_time_left(capsys):
    from miles_ray.cli.common import progress_display

    with progress_display("waiting for the GPU workers", timeout=600) as p:
        p("3/4 GPU workers joined Ray")
    out, err = capsys.readouterr()
    assert out == ""
    lines = err.splitlines()
    assert re.fullmatch(r"\[0s, (600|599)s left\] waiting for the GPU workers", lines[0]), lines
    assert re.fullmatch(STAMP + r" 3/4 GPU workers joined Ray", lines[1]), lines


def test_a_quiet_wait_repeats_its_last_line(capsys):
    from miles_ray.cli.common import progress_display

    with progress_display("waiting", timeout=60, heartbeat=0.2) as p:
        p("pods scheduled 2/4")
        time.sleep(0.9)
    err = capsys.readouterr().err
    assert re.search(STAMP + r" still waiting: pods scheduled 2/4", err), err


def test_up_with_json_output_prints_progress_on_stderr(cli, clean_env):
    """No cluster: the kubeconfig does not exist, so up fails at once, but only after saying what it started."""
    code, out, err = cli("up", "--backend", "kubernetes", "--via", "kuberay", "--image", IMAGE, "--ray-version",
                         "2.60.0", "--kubeconfig", str(clean_env / "no-kubeconfig"), "-o", "json")
    assert code in (1, 2) and out == ""
    assert re.search(r"^\[0s, (600|599)s left\] starting kubernetes cluster miles$", err, re.M), err
    assert sum(ln.startswith("error:") for ln in err.splitlines()) == 1
