"""The miles-ray command line: parse, call the services, print. Heavy libraries (ray, polyaxon,
kubernetes) are imported only inside the commands that need them, and a verb's module only when that verb
runs: `miles-ray --help` lists every verb from :data:`VERBS` without importing one."""

from __future__ import annotations

import importlib
import sys
from collections.abc import Iterator, Mapping

import typer
from typer.core import TyperGroup

from miles_ray.core.errors import (EXIT_BAD_INPUT, EXIT_CODES, EXIT_INTERRUPTED, EXIT_OK, EXIT_SERVICE, MilesRayError,
                                   plain)
from miles_ray.core.secrets import redact

# verb -> (module in miles_ray.cli, its command function or Typer group, the first paragraph of its help).
# The order is the order of `miles-ray --help`; tests/unit/test_cli_consistency.py checks each summary
# against the verb's own help.
VERBS: dict[str, tuple[str, str, str]] = {
    "plan": ("plan", "plan_cmd",
             "Plan the trainer/rollout GPU split for a recipe on N nodes x G GPUs, with the exact Miles flags."),
    "render": ("render", "render_cmd", "Render what 'up' would create, validated, without touching a cluster."),
    "up": ("up", "up_cmd", "Create a Ray cluster and wait until every GPU worker has joined Ray."),
    "clusters": ("clusters", "clusters_cmd",
                 "List the clusters this machine knows (local and the Kubernetes ones 'up' made); * marks the current one."),
    "env": ("env", "env_cmd", "Print the shell lines that let Ray's own tools (ray job list, ray status) reach a cluster."),
    "submit": ("submit", "submit_cmd",
               "Submit Miles (or a rehearsal) to an existing Ray head with MILES_SCRIPT_EXTERNAL_RAY=1."),
    "scale": ("scale", "scale_cmd",
              "Resize the GPU worker group, wait until Ray sees the change, and print the split for the new size."),
    "status": ("status", "status_cmd",
               "Show the cluster (nodes alive in Ray, GPUs per node) or, given RUN, that run's job."),
    "logs": ("logs", "logs_cmd", "Print a run's job logs (from the Ray Jobs API)."),
    "stop": ("stop", "stop_cmd", "Stop a run's Ray job."),
    "runs": ("runs", "runs_cmd", "Run records: list them (the default), compare two."),
    "park": ("park", "park_cmd",
             "Park the cluster: its pods go (GPUs freed), the RayCluster object, claims and checkpoints stay."),
    "resume": ("resume", "resume_cmd", "Resume a parked cluster and wait until every GPU worker has rejoined Ray."),
    "down": ("down", "down_cmd", "Delete the cluster. Shared storage, PVCs and checkpoints are never touched."),
    "check-data": ("check_data", "check_data_cmd",
                   "Check on the head and EVERY GPU worker that the launcher's paths exist, are readable, and that "
                   "the output storage is writable and shared (a token written on one node is read on the others)."),
    "doctor": ("doctor", "doctor_cmd", "Diagnose a cluster or a run against the troubleshooting checklist."),
    "comm-check": ("comm_check", "comm_check_cmd",
                   "Run one all-reduce across all GPU worker nodes as a Ray job, before training."),
    "register": ("register", "register_cmd",
                 "Register checkpoint ITER of RUN as a model version in Polyaxon's model registry."),
    "recipes": ("recipes", "recipes_cmd",
                "List the recipes: parallel sizes, GPUs per rollout engine, batch sizes and directories."),
    "init": ("init", "init_cmd",
             "Write a commented starter configuration file (every key, its default and what it does)."),
}

# a verb that is a group: its function is the group's callback (run when no subcommand is given), and its
# subcommands, name -> (module in miles_ray.cli, command function), are verb modules of their own
GROUPS: dict[str, dict[str, tuple[str, str]]] = {
    "runs": {"compare": ("compare", "compare_cmd"), "plot": ("plot", "plot_cmd"), "outputs": ("outputs", "outputs_cmd"),
             "pull": ("pull", "pull_cmd")},
}


def _group(name: str, callback) -> typer.Typer:
    group = typer.Typer(invoke_without_command=True, no_args_is_help=False, rich_markup_mode=None,
                        add_completion=False)
    for sub, (module, attr) in GROUPS[name].items():
        group.command(sub)(getattr(importlib.import_module(f"miles_ray.cli.{module}"), attr))
    group.callback()(callback)
    return group


def _exit_code_table() -> str:
    """The exit-code table of miles_ray.core.errors, one row per code, kept as is by click's wrapping (\\b)."""
    import textwrap

    rows = [textwrap.fill(meaning, width=70, initial_indent=f"{code:>3}  ", subsequent_indent=" " * 5)
            for code, meaning in EXIT_CODES.items()]
    return "Exit codes ('miles-ray --debug VERB ...' also prints an error's traceback):\n\n\b\n" + "\n".join(rows)


EPILOG = _exit_code_table()

_loaded: dict[str, typer.core.TyperCommand | TyperGroup] = {}


def verb_command(name: str):
    """The click command of verb ``name``, importing its module on first use."""
    if name not in _loaded:
        module, attr, _ = VERBS[name]
        obj = getattr(importlib.import_module(f"miles_ray.cli.{module}"), attr)
        if name in GROUPS:
            obj = _group(name, obj)
        elif not isinstance(obj, typer.Typer):
            single = typer.Typer(add_completion=False, pretty_exceptions_enable=False, rich_markup_mode=None)
            single.command(name)(obj)
            obj = single
        command = typer.main.get_command(obj)
        command.name = name
        _loaded[name] = command
    return _loaded[name]


class _Verbs(Mapping):
    """``group.commands`` for code that walks the app (tests, the fuzzer): every verb, loaded on access."""

    def __getitem__(self, name: str):
        if name not in VERBS:
            raise KeyError(name)
        return verb_command(name)

    def __contains__(self, name: object) -> bool:
        return name in VERBS

    def __iter__(self) -> Iterator[str]:
        return iter(VERBS)

    def __len__(self) -> int:
        return len(VERBS)


class LazyVerbs(TyperGroup):
    """The verbs, imported only when one runs. Listing them in the top-level help uses their summaries."""

    _listing = False

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.commands = _Verbs()

    def list_commands(self, ctx) -> list[str]:
        return list(VERBS)

    def get_command(self, ctx, cmd_name: str):
        if cmd_name not in VERBS:
            return None
        if self._listing and cmd_name not in _loaded:
            summary = VERBS[cmd_name][2]
            return typer.core.TyperCommand(cmd_name, short_help=summary, help=summary)
        return verb_command(cmd_name)

    def format_help(self, ctx, formatter) -> None:
        self._listing = True
        try:
            super().format_help(ctx, formatter)
        finally:
            self._listing = False


app = typer.Typer(
    name="miles-ray",
    cls=LazyVerbs,
    help=(
        "Take Miles RL post-training from one 8-GPU node to many on Ray/KubeRay.\n\n"
        "Start with one single-node job ('render --single-node', 'up --single-node'), then 'plan' (is the "
        "trainer/rollout GPU split valid for the recipe?) and 'render' (the Polyaxon raycluster operation or "
        "KubeRay RayCluster: one pinned image and the same mounts on head and workers). 'up' makes the cluster "
        "and waits until every GPU worker has joined Ray; 'submit' runs Miles on it with "
        "MILES_SCRIPT_EXTERNAL_RAY=1; 'scale', 'status', 'logs', 'stop', 'runs', 'down' do the rest. "
        "Try it with no cluster: 'miles-ray up --backend local --nodes 4', 'miles-ray submit --rehearse --nodes 2'."
    ),
    epilog=EPILOG,
    rich_markup_mode=None,  # plain help: '[default: X]' stays visible, paragraphs rewrap, no Rich import
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)

_debug = False


def _version_callback(value: bool) -> None:
    if value:
        from importlib.metadata import version

        typer.echo(f"miles-ray {version('miles-ray')}")
        raise typer.Exit()


@app.callback()
def _root(
    version: bool = typer.Option(False, "--version", callback=_version_callback, is_eager=True,
                                 help="print the version and exit"),
    debug: bool = typer.Option(False, "--debug", help="on an error, also print its Python traceback"),
) -> None:
    global _debug
    _debug = debug


def _fail(message: str, code: int) -> int:
    """The one way an error leaves miles-ray: its traceback only under --debug, then one line."""
    if _debug:
        import traceback

        traceback.print_exc()
    print(f"error: {message}", file=sys.stderr)
    return code


def _help_path(e, argv: list[str] | None) -> str:
    """The command whose --help an error points at: the verb (and subcommand) typed, even when the error came
    from parsing it before its own context existed (``miles-ray plan --nodes`` -> ``miles-ray plan``)."""
    typed = ["miles-ray"]
    words = [a for a in (sys.argv[1:] if argv is None else argv) if not a.startswith("-")]
    if words and words[0] in VERBS:
        typed.append(words[0])
        if len(words) > 1 and words[1] in GROUPS.get(words[0], {}):
            typed.append(words[1])
    path = e.ctx.command_path if e.ctx else "miles-ray"
    return path if len(path.split()) >= len(typed) else " ".join(typed)


def _usage_message(e, click) -> str:
    """A usage error in miles-ray's words: the flag or argument by the name the user types, then what is
    wrong with it (never a Python parameter name or a validator's wording)."""
    param = getattr(e, "param", None)
    if param is not None and isinstance(e, click.MissingParameter):
        if getattr(param, "param_type_name", "") == "argument":
            name = param.metavar or param.name.upper()
            help_text = getattr(param, "help", None)
            return f"missing {name}" + (f" ({help_text})" if help_text else "")
        return f"missing {_flag(param)}"
    if param is not None and isinstance(e, click.BadParameter):
        what = (param.metavar or param.name.upper()) if getattr(param, "param_type_name", "") == "argument" \
            else _flag(param)
        return f"{what} {plain(e.message)}".rstrip(".")
    return plain(e.format_message())


def _flag(param) -> str:
    """The long spelling of an option (``--nodes`` rather than ``-N``)."""
    opts = list(getattr(param, "opts", []) or [])
    longs = [o for o in opts if o.startswith("--")]
    return (longs or opts or [param.name])[0]


def main(argv: list[str] | None = None) -> int:
    """Entry point, and the ONE place where outcomes become exit codes (the table in
    :mod:`miles_ray.core.errors`, printed by `miles-ray --help`): every failure is one `error:` line on
    stderr and its code, never a traceback unless --debug."""
    global _debug
    try:  # Typer >= 0.22 vendors its own click
        from typer._click import exceptions as click
    except ImportError:  # pragma: no cover - older Typer on real click
        from click import exceptions as click  # type: ignore[no-redef]

    _debug = False
    common = sys.modules.get("miles_ray.cli.common")  # loaded by an earlier command in this process
    if common is not None:
        common.reset_wide()
    try:
        rv = app(args=argv, prog_name="miles-ray", standalone_mode=False)
        return rv if isinstance(rv, int) else EXIT_OK
    except MilesRayError as e:
        return _fail(str(e), e.exit_code)
    except click.NoArgsIsHelpError as e:
        # 'miles-ray' or 'miles-ray <group>' alone prints help (exit 0 for the top level, like git)
        print(e.ctx.get_help() if e.ctx else "", file=sys.stdout)
        return EXIT_OK
    except click.UsageError as e:
        return _fail(f"{_usage_message(e, click)} (see '{_help_path(e, argv)} --help')", EXIT_BAD_INPUT)
    except typer.Exit as e:
        return e.exit_code
    except (typer.Abort, KeyboardInterrupt):
        return _fail("interrupted", EXIT_INTERRUPTED)
    except click.ClickException as e:
        return _fail(e.format_message(), EXIT_BAD_INPUT)
    except BrokenPipeError:
        return EXIT_OK
    except Exception as e:  # noqa: BLE001 - a bug or an unclassified failure: still one line, no traceback

        return _fail(f"unexpected {type(e).__name__}: {redact(str(e))} (run 'miles-ray --debug ...' for the "
                     "traceback and report it)", EXIT_SERVICE)


def run() -> None:
    sys.exit(main())


if __name__ == "__main__":
    run()
