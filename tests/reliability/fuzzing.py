"""Property-based fuzzing of every CLI command's arguments and of config and recipe files, in-process
through ``miles_ray.cli.app.main``. Shared by tests/reliability/test_hostile_input.py (a few hundred
examples) and benchmarks/reliability.py (>= 10,000).

Nothing generated here may reach a real service: every run points KUBECONFIG at a file that does not
exist, RAY_ADDRESS at a closed loopback port, leaves POLYAXON_HOST unset, and never lets ``up`` pick the
local backend (that would start real Ray processes). Commands must refuse bad input before any network.

Outcome of one example, counted in ``Tally``:
  ok            exit 0
  refused       exit 2 with exactly one 'error:' line on stderr
  unreachable   exit 1 naming an unreachable/missing service (counted separately, allowed)
  diagnosis     exit 4 from a diagnostic verb ('doctor') whose report lists the problems it found (allowed)
  bad_exit      any other exit code, exit 1 that is not about a service, or a refusal that is not one line
  traceback     an exception escaped main(), or 'Traceback' appeared in the output (must be 0)
"""

from __future__ import annotations

import ast
import contextlib
import io
import os
import re
import socket
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

# exit 1 is allowed only for these: a service that is not there (the fuzz points everything at nothing)
UNREACHABLE = re.compile(
    r"cannot reach|unreachable|refused|no local cluster|not running|no RayCluster|no run named|no runs yet|"
    r"is only reachable inside|no Ray head|does not exist|no such job", re.I)
# commands (and values) that would start or touch real things even with good input
NEVER = {("up", "local"), ("up", "auto")}


@dataclass
class Tally:
    tried: int = 0
    ok: int = 0
    refused: int = 0
    unreachable: int = 0
    diagnosis: int = 0
    not_found: int = 0
    bad_exit: int = 0
    traceback: int = 0
    examples: list[tuple[list[str], int, str]] = field(default_factory=list)

    def add(self, kind: str, argv: list[str], code: int, err: str) -> None:
        self.tried += 1
        setattr(self, kind, getattr(self, kind) + 1)
        if kind in ("bad_exit", "traceback") and len(self.examples) < 20:
            self.examples.append((argv, code, err[-600:]))


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]  # closed again when the socket is: connecting is refused at once


def command_options() -> dict[str, list[tuple[str, Any]]]:
    """Every leaf command and its options (name, click param), read from the live Typer app, so verbs and
    flags added by others are fuzzed too."""
    import typer.main

    from miles_ray.cli.app import app

    root = typer.main.get_command(app)
    out: dict[str, list[tuple[str, Any]]] = {}

    def walk(cmd, path: list[str]) -> None:
        subs = getattr(cmd, "commands", None)
        if subs:
            for name, sub in subs.items():
                walk(sub, path + [name])
            if path:
                out[" ".join(path)] = [(o, p) for p in cmd.params for o in p.opts + p.secondary_opts
                                       if o.startswith("-")]
            return
        out[" ".join(path)] = [(o, p) for p in cmd.params for o in p.opts + p.secondary_opts if o.startswith("-")]

    walk(root, [])
    return out


_hostile_text = st.one_of(
    st.text(max_size=24),
    st.sampled_from(["", " ", "-", "--", "..", "../../etc/passwd", "/etc/shadow", "a" * 300, "\x00", "é", "☃",
                     "${HOME}", "$(id)", "`id`", "; rm -rf /", "'", '"', "\n", "null", "~", "*", "&a", "!!python/object"]),
    st.integers(-10, 10_000).map(str),
    st.floats(allow_nan=True, allow_infinity=True).map(str),
)
_values = {
    "--nodes": st.one_of(st.integers(-3, 5000).map(str), _hostile_text),
    "--gpus-per-node": st.one_of(st.integers(-3, 80).map(str), _hostile_text),
    "--image": st.one_of(st.just("radixark/miles:latest@sha256:" + "3f" * 32), st.just("radixark/miles:latest"),
                         _hostile_text),
    "--ray-version": st.one_of(st.just("2.60.0"), _hostile_text),
    "--name": st.one_of(st.from_regex(r"[a-z][-a-z0-9]{0,60}", fullmatch=True), _hostile_text),
    "--namespace": st.one_of(st.from_regex(r"[a-z0-9][-a-z0-9]{0,70}", fullmatch=True), _hostile_text),
    "--address": st.one_of(st.just("ray://1.2.3.4:10001"), st.just("http://127.0.0.1:6379"), _hostile_text),
    "--env": st.one_of(st.from_regex(r"[A-Z_]{1,12}=[ -~]{0,40}", fullmatch=True), _hostile_text),
    "--run": st.one_of(st.from_regex(r"[a-z0-9][-a-z0-9]{0,45}", fullmatch=True), _hostile_text),
}


@st.composite
def argv_for(draw, commands: dict[str, list[tuple[str, Any]]]) -> list[str]:
    cmd = draw(st.sampled_from(sorted(commands)))
    opts = commands[cmd]
    argv = cmd.split()
    for _ in range(draw(st.integers(0, 7))):
        kind = draw(st.integers(0, 9))
        if kind == 0 or not opts:
            argv.append(draw(_hostile_text))  # a stray positional or garbage
            continue
        name, param = draw(st.sampled_from(opts))
        argv.append(name)
        if getattr(param, "is_flag", False) or getattr(param, "count", False):
            continue
        choices = getattr(getattr(param, "type", None), "choices", None)
        if choices and draw(st.booleans()):
            argv.append(str(draw(st.sampled_from(list(choices)))))
        else:
            argv.append(draw(_values.get(name, _hostile_text)))
    return argv


def safe_argv(argv: list[str], commands: dict[str, list[tuple[str, Any]]], kubeconfig: str) -> list[str]:
    """Append what keeps a command away from real services (the last value of an option wins)."""
    cmd = argv[0]
    names = {n for n, _ in commands.get(cmd, [])}
    argv = list(argv)
    if cmd == "up":
        # '--backend local|auto' would start real Ray processes: force the Kubernetes path (to nothing)
        argv = [("kubernetes" if a in ("local", "auto") and i and argv[i - 1] in ("--backend", "-b") else a)
                for i, a in enumerate(argv)]
        argv += ["--backend", "kubernetes"]
    if "--kubeconfig" in names:
        argv += ["--kubeconfig", kubeconfig]
    if "--timeout" in names:
        argv += ["--timeout", "2"]
    if "--follow" in names and cmd != "submit":
        argv += ["--no-follow"]
    if "--yes" in names:
        pass  # down without a terminal refuses unless -y; with -y it still meets no cluster
    return argv


def run_cli(argv: list[str]) -> tuple[int | None, str, str, BaseException | None]:
    from miles_ray.cli.app import main

    out, err = io.StringIO(), io.StringIO()
    exc: BaseException | None = None
    code: int | None = None
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(argv)
        except SystemExit as e:  # main() must return, not exit; still not a traceback
            code = e.code if isinstance(e.code, int) else 1
        except BaseException as e:  # noqa: BLE001 - what we count
            exc = e
    return code, out.getvalue(), err.getvalue(), exc


# The endpoints sandbox() points every service at, each dead on purpose (a closed port, a kubeconfig that does not
# exist): exit 1 ("a service failed") is accepted only for an error that names one of these.
DEAD_ENDPOINTS: list[str] = []


LOOPBACK_URL = re.compile(r"https?://127\.0\.0\.1:(\d{1,5})")


def refuses(port: int) -> bool:
    """Nothing listens on 127.0.0.1:port now (a connection is refused at once)."""
    with socket.socket() as s:
        s.settimeout(2)
        return s.connect_ex(("127.0.0.1", port)) != 0


def names_dead_endpoint(line: str, argv: list[str] | None = None) -> bool:
    """The error names an endpoint that is dead: one the sandbox made dead, or a loopback URL the command line
    itself gave (``--address http://127.0.0.1:6379``) on which nothing listens."""
    given = [a for a in argv or [] if (m := LOOPBACK_URL.fullmatch(a)) and 0 < int(m.group(1)) < 65536
             and refuses(int(m.group(1)))]
    return any(e in line for e in [*DEAD_ENDPOINTS, *given])


NO_RUN = re.compile(r"""^error: no run named ('(?:[^'\\]|\\.)*'|"(?:[^"\\]|\\.)*")""")


def run_truly_absent(line: str, argv: list[str] | None) -> bool:
    """``error: no run named 'X'`` (not found: exit 1, the exit-code table) is a true answer only when X is what the
    command line asked for and the sandbox's state dir holds no record of it."""
    m = NO_RUN.match(line)
    if not m or argv is None:
        return False
    from miles_ray.adapters import state

    name = ast.literal_eval(m.group(1))  # the CLI quotes the name as Python's repr does
    return name in argv and not state.record_path(name).exists()  # where the product looks the run up


def classify(code: int | None, out: str, err: str, exc: BaseException | None, argv: list[str] | None = None) -> str:
    if exc is not None or "Traceback (most recent call last)" in out + err:
        return "traceback"
    if code == 0:
        return "ok"
    lines = [ln for ln in err.splitlines() if ln.startswith("error:")]
    if code == 2:
        return "refused" if len(lines) == 1 else "bad_exit"
    if code == 1 and len(lines) == 1 and UNREACHABLE.search(lines[0]) and names_dead_endpoint(lines[0], argv):
        return "unreachable"
    if code == 1 and len(lines) == 1 and run_truly_absent(lines[0], argv):
        return "not_found"
    if code == 4 and len(lines) == 1 and re.search(r"^\d+ problem\(s\)", out, re.M):
        return "diagnosis"
    return "bad_exit"


@contextlib.contextmanager
def sandbox():
    """A temp cwd and state dir, and an environment that points every service at nothing."""
    keep_cwd = os.getcwd()
    saved = dict(os.environ)
    with tempfile.TemporaryDirectory(prefix="miles-ray-fuzz-") as d:
        for k in list(os.environ):
            if k.startswith(("MILES_RAY_", "RAY_", "POLYAXON")) or k == "KUBECONFIG":
                del os.environ[k]
        ray_address = f"http://127.0.0.1:{closed_port()}"
        os.environ.update({"MILES_RAY_STATE_DIR": str(Path(d) / "state"), "KUBECONFIG": str(Path(d) / "no-kubeconfig"),
                           "RAY_ADDRESS": ray_address, "HOME": d, "NO_PROXY": "*"})
        DEAD_ENDPOINTS[:] = [ray_address, os.environ["KUBECONFIG"]]
        os.chdir(d)
        try:
            yield Path(d)
        finally:
            DEAD_ENDPOINTS.clear()
            os.chdir(keep_cwd)
            os.environ.clear()
            os.environ.update(saved)


# -- config and recipe files ----------------------------------------------------------------------

_KEYS = ["name", "namespace", "nodes", "gpus_per_node", "layout", "rollout_nodes", "cpus_per_node", "memory_per_node",
         "mount_path", "models_dir", "datasets_dir", "runs_dir", "miles_root", "env", "secret_env", "node_selector",
         "tolerations", "image", "ray_version", "recipe", "volume_claim", "worker_group", "nccl_nvls_enable", "bogus"]
_scalar = st.one_of(st.none(), st.booleans(), st.integers(-5, 10_000), st.text(max_size=20),
                    st.sampled_from(["../../x", "/abs", "..", "a/../../b", "Qwen3-4B", "512Gi", "colocated"]))
_yaml_value = st.recursive(_scalar, lambda inner: st.one_of(st.lists(inner, max_size=3),
                                                            st.dictionaries(st.text(max_size=8), inner, max_size=3)),
                           max_leaves=8)


def _dump(doc: Any) -> str:
    import yaml

    return yaml.safe_dump(doc, allow_unicode=True)


config_doc = st.one_of(
    st.dictionaries(st.sampled_from(_KEYS), _yaml_value, max_size=6).map(_dump),
    st.text(max_size=200),
    st.sampled_from(["a: &x [1]\nb: *x\n", "!!python/object/apply:os.system ['id']\n", "[1, 2", "{", "- - -",
                     "name: !!binary aGVsbG8=\n", "\ufeffname: x\n"]),
)
_RECIPE_KEYS = ["name", "hf_dir", "megatron_dir", "train_data", "eval_data", "tp", "pp", "global_batch_size",
                "rollout_batch_size", "n_samples_per_prompt", "layout", "bogus"]
recipe_doc = st.one_of(
    st.fixed_dictionaries({"recipes": st.lists(st.dictionaries(st.sampled_from(_RECIPE_KEYS), _yaml_value, max_size=6),
                                               max_size=2)}).map(_dump),
    st.text(max_size=200),
)


def file_argv(draw_cmd: str, path: str, which: str) -> list[str]:
    flag = "--config" if which == "config" else "--recipe-file"
    if draw_cmd == "render":
        return ["render", flag, path, "-F", "kuberay", "--image", "radixark/miles:latest@sha256:" + "3f" * 32,
                "--ray-version", "2.60.0"]
    return ["plan", flag, path, "-o", "json"]


def make_property(tally: Tally, max_examples: int, seed: int | None = None):
    """A hypothesis-driven callable: run it and ``tally`` counts ``max_examples`` CLI argument lists plus
    ``max_examples // 4`` config files and ``max_examples // 4`` recipe files."""
    commands = command_options()

    def _settings(n: int):
        kw: dict[str, Any] = dict(max_examples=n, deadline=None, database=None, derandomize=seed is not None,
                                  suppress_health_check=list(HealthCheck))
        return settings(**kw)

    @_settings(max_examples)
    @given(argv=argv_for(commands))
    def args_prop(argv: list[str]) -> None:
        full = safe_argv(argv, commands, os.environ["KUBECONFIG"])
        code, out, err, exc = run_cli(full)
        tally.add(classify(code, out, err, exc, full), full, code if code is not None else -1, err or repr(exc))

    @_settings(max(1, max_examples // 4))
    @given(text=config_doc, cmd=st.sampled_from(["plan", "render"]))
    def config_prop(text: str, cmd: str) -> None:
        p = Path("fuzz-config.yaml")
        p.write_text(text, encoding="utf-8", errors="surrogatepass") if _encodable(text) else p.write_bytes(b"\xff")
        full = file_argv(cmd, str(p), "config")
        code, out, err, exc = run_cli(full)
        tally.add(classify(code, out, err, exc), full + [text[:200]], code if code is not None else -1, err or repr(exc))

    @_settings(max(1, max_examples // 4))
    @given(text=recipe_doc, cmd=st.sampled_from(["plan", "render"]))
    def recipe_prop(text: str, cmd: str) -> None:
        p = Path("fuzz-recipes.yaml")
        p.write_text(text, encoding="utf-8") if _encodable(text) else p.write_bytes(b"\xff")
        full = file_argv(cmd, str(p), "recipe")
        code, out, err, exc = run_cli(full)
        tally.add(classify(code, out, err, exc), full + [text[:200]], code if code is not None else -1, err or repr(exc))

    def run_all() -> Tally:
        with sandbox():
            args_prop()
            config_prop()
            recipe_prop()
        return tally

    return run_all


def _encodable(text: str) -> bool:
    try:
        text.encode("utf-8")
        return True
    except UnicodeEncodeError:
        return False
