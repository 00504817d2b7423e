"""Options and printing shared by the verbs. Nothing heavy is imported here."""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from enum import Enum
from dataclasses import dataclass
from typing import Annotated, Any, Callable, Optional, Sequence

import typer
from rich.console import Console
from rich.markup import escape

from miles_ray.core.results import Result
from miles_ray.core.errors import (EXIT_JOB_RUNNING, EXIT_JOB_STOPPED, EXIT_SERVICE, ChecksFailed, ConfigError,
                                   JobFailed)

class _Page(Console):
    """stdout: as wide as $COLUMNS says when it is set (read at each print, so a resized shell or a test's
    COLUMNS=80 counts); else the terminal's width, or for piped output (CI logs, files) a wide page of 200
    columns instead of Rich's 80, so tables stay readable."""

    @property
    def size(self):  # type: ignore[override]
        size = Console.size.fget(self)  # type: ignore[attr-defined]
        columns = os.environ.get("COLUMNS", "")
        return size._replace(width=int(columns)) if columns.isdigit() and int(columns) > 0 else size

    @size.setter
    def size(self, new_size) -> None:
        Console.size.fset(self, new_size)  # type: ignore[attr-defined]


out = _Page(highlight=False, soft_wrap=True, width=None if sys.stdout.isatty() else 200)
err = Console(stderr=True, highlight=False, soft_wrap=True)


class Output(str, Enum):
    table = "table"
    json = "json"
    yaml = "yaml"


class TableOutput(str, Enum):
    """-o of a verb that prints a table: also ``wide``, every column at its full width (long lines)."""

    table = "table"
    wide = "wide"
    json = "json"
    yaml = "yaml"


_wide = False  # this command's -o was wide (set by table_output, read by fit_table; reset for each command)


def table_output(output: TableOutput | Output) -> Output:
    """The Output of a table verb's -o: ``wide`` is a table with every column (remembered for fit_table)."""
    global _wide
    _wide = output == TableOutput.wide
    return Output.table if _wide else Output(output.value)


def reset_wide() -> None:
    global _wide
    _wide = False


@dataclass(frozen=True)
class Col:
    """A column of :func:`fit_table`. The ``key`` column names the row (run, recipe, pod, node): it is never cut,
    folded or dropped. The others fold to fit and, at narrow widths, go from the last one (lowest ``keep``)
    first; ``wide`` ones show only with -o wide."""

    header: str
    key: bool = False
    wide: bool = False
    keep: int = 0
    justify: str = "left"


_FLOOR = 8  # a folded column narrower than this is not worth showing


def fit_table(columns: Sequence[Col], rows: Sequence[Sequence[str]], **table_kw: Any) -> Any:
    """A Rich Table that fits ``out``'s width without ever cutting its key column: the other columns fold, and when
    even folded they cannot fit, the least kept ones are dropped (``-o wide`` shows every column, lines as long as
    they need: the terminal wraps them, like kubectl's -o wide)."""
    from rich.table import Table
    from rich.text import Text

    wide = _wide
    shown = [i for i, c in enumerate(columns) if wide or not c.wide]

    def natural(i: int) -> int:
        cells = [Text.from_markup(str(r[i])).cell_len for r in rows] if rows else []
        return max([len(columns[i].header), *cells])

    widths = {i: natural(i) for i in shown}
    limit = out.width

    def need(keep: list[int]) -> int:
        return 1 + sum(3 + (widths[i] if columns[i].key else min(widths[i], max(len(columns[i].header), _FLOOR)))
                       for i in keep)

    if not wide:
        by_keep = sorted((i for i in shown if not columns[i].key), key=lambda i: (columns[i].keep, -i))
        while need(shown) > limit and by_keep:
            shown.remove(by_keep.pop(0))
    full = 1 + sum(3 + widths[i] for i in shown)
    # -o wide: as wide as the columns need; otherwise a terminal too narrow even for the key column alone gets a
    # longer line rather than a cut name
    width = full if wide and full > limit else need(shown) if need(shown) > limit else None
    t = Table(**table_kw, width=width)
    for i in shown:
        c = columns[i]
        if c.key:
            t.add_column(c.header, no_wrap=True, min_width=widths[i], justify=c.justify)
        else:
            t.add_column(c.header, overflow="fold", justify=c.justify)
    for r in rows:
        t.add_row(*(str(r[i]) for i in shown))
    return t


def print_table(table: Any) -> None:
    """Print a table from fit_table: never cropped (with -o wide it may be wider than the terminal)."""
    out.print(table, crop=False)


class Layout(str, Enum):
    colocated = "colocated"
    disaggregated = "disaggregated"


# -- option types (Annotated so every verb spells them the same way) --------------------------------
ConfigOpt = Annotated[Optional[str], typer.Option("--config", "-c", help="config file (default: ./miles-ray.yaml or $MILES_RAY_CONFIG)", show_default=False)]
OutputOpt = Annotated[Output, typer.Option("--output", "-o", help="table for people, json/yaml for scripts")]
TableOutputOpt = Annotated[TableOutput, typer.Option("--output", "-o", help="table for people (wide: every column, full width), json/yaml for scripts")]
NameOpt = Annotated[Optional[str], typer.Option("--name", help="cluster name (DNS-1035, <= 53 chars)", show_default=False)]
NamespaceOpt = Annotated[Optional[str], typer.Option("--namespace", "-n", help="Kubernetes namespace", show_default=False)]
RecipeOpt = Annotated[Optional[str], typer.Option("--recipe", "-r", help="recipe name, see 'miles-ray recipes' [default: Qwen3-4B]", show_default=False)]
RecipeFileOpt = Annotated[Optional[str], typer.Option("--recipe-file", help="YAML file with extra recipes", show_default=False)]
NodesOpt = Annotated[Optional[int], typer.Option("--nodes", "-N", min=1, max=4096, help="GPU worker nodes [default: 1]", show_default=False)]
GpusOpt = Annotated[Optional[int], typer.Option("--gpus-per-node", "-G", min=1, max=64, help="GPUs per worker node [default: 8]", show_default=False)]
LayoutOpt = Annotated[Optional[Layout], typer.Option("--layout", help="colocated (trainer and rollout share GPUs) or disaggregated [default: the recipe's]", show_default=False)]
RolloutNodesOpt = Annotated[Optional[int], typer.Option("--rollout-nodes", min=0, help="disaggregated: whole nodes for SGLang rollout", show_default=False)]
RolloutGpusOpt = Annotated[Optional[int], typer.Option("--rollout-gpus", min=1, help="disaggregated: rollout GPUs (a partial last node is allowed)", show_default=False)]
ImageOpt = Annotated[Optional[str], typer.Option("--image", help="Miles image pinned by digest: repo[:tag]@sha256:<64 hex>", show_default=False)]
RayVersionOpt = Annotated[Optional[str], typer.Option("--ray-version", help="Ray version inside the image (rayVersion)", show_default=False)]
QueueOpt = Annotated[Optional[str], typer.Option("--queue", help="admit the whole cluster at once through this queue: a Kueue LocalQueue (label kueue.x-k8s.io/queue-name), or with --scheduler volcano a Volcano queue", show_default=False)]
SchedulerOpt = Annotated[Optional[str], typer.Option("--scheduler", metavar="<default|volcano>", help="volcano: KubeRay's Volcano gang scheduling (ray.io/scheduler-name: volcano, one PodGroup for head + workers) [default: default]", show_default=False)]

class RayAuth(str, Enum):
    token = "token"
    none = "none"


RayAuthOpt = Annotated[Optional[RayAuth], typer.Option("--ray-auth", help="Ray token authentication of the cluster: token (every request to Ray needs the cluster's token, which miles-ray keeps in a 0600 file locally or KubeRay in a Secret, and sends itself) or none (anyone who reaches the head can run code: warns) [default: token]", show_default=False)]
GcsFtOpt = Annotated[Optional[str], typer.Option("--gcs-ft", metavar="redis://HOST:PORT", help="GCS fault tolerance (--via kuberay): a Redis the cluster's pods reach keeps the head's state, so losing the head pod does not restart the workers (KubeRay's gcsFaultToleranceOptions; up checks from the cluster that it answers). Not with --via polyaxon: Polyaxon 2.18's raycluster cannot carry it", show_default=False)]
GcsFtPasswordOpt = Annotated[Optional[str], typer.Option("--gcs-ft-password-secret", metavar="NAME[:KEY]", help="with --gcs-ft: the Secret (in the cluster's namespace) holding the Redis password, key default 'password'; pods read it by reference. 'none': a Redis without a password", show_default=False)]
GpuMemoryOpt = Annotated[Optional[str], typer.Option("--gpu-memory", metavar="SIZE", help="memory of one GPU, e.g. 80GiB or 141GB: the job's estimated GPU memory is held against it (a misfit is refused, exit 2) [default: config gpu_memory, else on Kubernetes the nodes' nvidia.com/gpu.memory or gpu.product label, else unknown: estimated, not checked]", show_default=False)]
NoMemoryCheckOpt = Annotated[bool, typer.Option("--no-memory-check", help="do not refuse a job whose memory estimate does not fit (warns; kept in the run record)")]
AllowUnpinnedOpt = Annotated[Optional[bool], typer.Option("--allow-unpinned/--require-pinned", help="accept a tag-only image (warns)", show_default=False)]


def config_flags(**kw: Any) -> dict[str, Any]:
    """Drop unset flags; turn enums into their values."""
    return {k: (v.value if isinstance(v, Enum) else v) for k, v in kw.items() if v is not None}


def dump(data: Any, output: Output) -> None:
    if isinstance(data, Result):
        data = data.to_json()
    if output is Output.yaml:
        import yaml

        sys.stdout.write(yaml.safe_dump(data, sort_keys=False, default_flow_style=False))
    else:
        sys.stdout.write(json.dumps(data, indent=2, sort_keys=False) + "\n")


def emit(data: Any, output: Output, table: Callable[[], None]) -> None:
    if output is Output.table:
        table()
    else:
        dump(data, output)


def warn(message: str) -> None:
    """A warning on one stderr line, however long (a log keeps it whole for grep), its text as written."""
    err.print(f"[yellow]warning:[/] {escape(message)}", soft_wrap=True)


def notices(result: dict) -> None:
    """Each of a result's ``notices`` on one stderr line (what was skipped and why)."""
    for n in result.get("notices") or []:
        err.print(f"[cyan]notice:[/] {escape(n)}", soft_wrap=True)


class Backend(str, Enum):
    auto = "auto"
    local = "local"
    kubernetes = "kubernetes"


BACKEND_HELP = ("auto: the local cluster of that name if one runs on this machine, else Kubernetes; "
                "local: the embedded Ray cluster on this machine; kubernetes: KubeRay (directly or through Polyaxon)")
BackendOption = Annotated[Backend, typer.Option("--backend", "-b", help=BACKEND_HELP)]
ContextOpt = Annotated[Optional[str], typer.Option("--context", help="kubeconfig context (like kubectl) [default: the current context]", show_default=False)]
KubeconfigOpt = Annotated[Optional[str], typer.Option("--kubeconfig", help="kubeconfig file (like kubectl) [default: $KUBECONFIG or ~/.kube/config]", show_default=False)]
# Run verbs (logs, stop, status RUN, runs, register, runs compare) find the namespace in the run's record;
# there --namespace narrows which runs are meant, it never points a run at another cluster.
RunNamespaceOpt = Annotated[Optional[str], typer.Option("--namespace", "-n", help="Kubernetes namespace of the run's cluster: only the runs on clusters in it (without RUN, the latest of them; with RUN, checked against the run)", show_default=False)]
TimeoutOpt = Annotated[float, typer.Option("--timeout", min=1, help="give up after this many seconds")]
YesOpt = Annotated[bool, typer.Option("--yes", "-y", help="do not ask for confirmation")]


def confirm(question: str, refusal: str, hint: str = "pass -y/--yes") -> None:
    """Ask ``question`` on the terminal; without one (CI, a pipe) refuse: one line, ``refusal`` and ``hint``.
    Anything but y/yes cancels. Both refusals are bad input (exit 2) and change nothing."""
    if not sys.stdin.isatty():
        raise ConfigError(refusal, hint=hint)
    answer = input(f"{question} [y/N] ")
    if answer.strip().lower() not in {"y", "yes"}:
        raise ConfigError("cancelled; nothing changed")


def job_state_exit(run: str, state: str) -> None:
    """End a verb that reports a job (status RUN, logs -f, submit --follow) with the exit code of its
    state, from the table in :mod:`miles_ray.core.errors`: SUCCEEDED returns (0); FAILED raises
    JobFailed (3, one error line; Ray's own message is in the report); PENDING/RUNNING exit 5 and
    STOPPED 6 (the state was already printed); any other state (UNKNOWN...) 1."""
    if state == "SUCCEEDED":
        return
    if state == "FAILED":
        raise JobFailed(f"run {run}: the job FAILED", hint=f"read its logs with 'miles-ray logs {run}'")
    codes = {"PENDING": EXIT_JOB_RUNNING, "RUNNING": EXIT_JOB_RUNNING, "STOPPED": EXIT_JOB_STOPPED}
    raise typer.Exit(codes.get(state, EXIT_SERVICE))


def checks_failed(what: str, problems: int) -> None:
    """After a check printed its report: when it found problems, exit 4 (ChecksFailed) with one line."""
    if problems:
        raise ChecksFailed(f"{what} found {problems} problem(s), each listed in its report")


def _seconds(s: float) -> str:
    return f"{max(0, int(s))}s"


class progress_display:
    """Progress of one command, ALWAYS on stderr whatever ``-o`` is (stdout carries only the result).

    Services feed it their progress messages; every line says the time spent and, for a bounded wait,
    the time left: ``[12s, 588s left] 3/4 GPU workers joined Ray``. ``timeout`` is the command's bound
    (its --timeout). On a terminal a spinner shows the latest line and ticks every second; elsewhere
    (CI logs, pipes) the latest line is repeated every ``heartbeat`` seconds while nothing new happens,
    so no wait is ever silent.
    """

    def __init__(self, title: str, timeout: float | None = None, heartbeat: float = 30.0) -> None:
        self.title = title
        self.heartbeat = heartbeat
        self._clock = time.monotonic
        self._start = self._clock()
        self._bound = timeout
        self._last = title
        self._quiet_since = self._start
        self._status = None
        self._stop = None
        self._thread = None
        self._handed = False

    def stamp(self) -> str:
        now = self._clock()
        if self._bound is None:
            return f"[{_seconds(now - self._start)}]"
        return f"[{_seconds(now - self._start)}, {_seconds(self._bound - (now - self._start))} left]"

    def __enter__(self) -> "progress_display":
        if err.is_terminal:
            self._status = err.status(escape(f"{self.stamp()} {self.title}"))
            self._status.__enter__()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._tick, name="miles-ray-progress", daemon=True)
        self._thread.start()
        self(self.title)
        return self

    def __call__(self, message: str) -> None:
        self._last = message
        self._quiet_since = self._clock()
        err.print(f"[dim]{escape(self.stamp())}[/] {escape(message)}")
        if self._status is not None:
            self._status.update(escape(f"{self.stamp()} {message}"))

    def hand_over(self) -> None:
        """Leave stderr to another live display (a progress bar of its own): the spinner stops, and the heartbeat
        too (that display shows what moves); the lines passed on still print."""
        self._handed = True
        status, self._status = self._status, None
        if status is not None:
            status.__exit__(None, None, None)

    def _tick(self) -> None:
        while True:
            status = self._status
            if status is not None or self._handed:  # a terminal: the spinner's clock ticks every second
                if self._stop.wait(1.0):
                    return
                if status is not None and self._status is status:
                    status.update(escape(f"{self.stamp()} {self._last}"))
                continue
            due = self._quiet_since + self.heartbeat - self._clock()
            if due > 0:
                if self._stop.wait(due):
                    return
                continue
            self._quiet_since = self._clock()
            err.print(f"[dim]{escape(self.stamp())}[/] still waiting: {escape(self._last)}")

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=2)
        if self._status is not None:
            self._status.__exit__(None, None, None)
