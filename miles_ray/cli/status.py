"""miles-ray status: a cluster's nodes and GPUs, or a run's job state."""

from __future__ import annotations

from typing import Annotated, Optional

import typer
from rich.markup import escape

from miles_ray.cli.common import (ConfigOpt, Output, TableOutput, TableOutputOpt, emit, job_state_exit, notices,
                                  out, table_output)
from miles_ray.cli.options import ClusterFlags, cluster_options
from miles_ray.cli.views import attempts_table, cluster_status, ray_tools_hint, run_status_line
from miles_ray.core.errors import ConfigError, Interrupted
from miles_ray.core.runs import RunStatus
from miles_ray.core.supervision import resumed_at
from miles_ray.core.train_progress import TrainingProgress, by_rollout, rollouts
from miles_ray.services import clusters
from miles_ray.services.runs import pick_run
from miles_ray.services.training import LIVE_STATES, WATCH_SECONDS, Snapshot, run_training, watch

ARROW = {"up": "↑", "down": "↓", "flat": "→", None: ""}
KEYS = (("reward", "reward"), ("loss", "loss"), ("eval", None), ("throughput", None))


def _duration(seconds: float | None) -> str:
    if seconds is None:
        return "?"
    s = int(round(seconds))
    if s < 120:
        return f"{s}s"
    if s < 7200:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{(s % 3600) // 60:02d}m"


def _value(v) -> str:
    return f"{v:.4g}" if isinstance(v, (int, float)) else str(v)


def metrics_line(prog: TrainingProgress) -> str:
    """One line of key metrics: the last value of each, its rollout and trend arrow."""
    parts = []
    for key, label in KEYS:
        m = prog.metrics.get(key)
        if m:
            parts.append(f"{label or m['metric']} {_value(m['value'])}{ARROW.get(m.get('trend'), '')} @{m['step']}")
    return " · ".join(parts) or "no metric logged yet"


def progress_text(prog: TrainingProgress) -> str:
    """The words beside the bar: rollouts done of how many, pace, ETA, the last rollout's time."""
    step = prog.step
    done = 0 if step is None else step + 1
    words = [f"rollout {'-' if step is None else step} ({done}/{prog.of or '?'} done"
             + (f", {prog.fraction * 100:.0f}%)" if prog.fraction is not None else ")")]
    if prog.seconds_per_step is not None:
        words.append(f"{prog.seconds_per_step:.3g} s/rollout")
    if prog.eta_seconds is not None:
        words.append(f"ETA {_duration(prog.eta_seconds)}")
    if prog.last_step_at:
        words.append(f"last at {prog.last_step_at}")
    if prog.attempt > 1:
        words.append(f"attempt {prog.attempt}")
    if prog.stalled:
        words.append(f"[yellow]stalled for {_duration(prog.stalled_for_seconds)}[/] (after "
                     f"{_duration(prog.stall_after_seconds)} without a rollout)")
    return " · ".join(words)


def progress_parts(prog: TrainingProgress) -> list:
    """The progress as Rich renderables: a bar with its words, one line of key metrics, a WARN line per finding
    (what to look at next)."""
    from rich.progress_bar import ProgressBar
    from rich.table import Table
    from rich.text import Text

    done = 0 if prog.step is None else prog.step + 1
    grid = Table.grid(padding=(0, 1))
    grid.add_row(ProgressBar(total=float(prog.of or max(done, 1)), completed=float(done), width=30),
                 progress_text(prog))
    return [grid, Text(metrics_line(prog))] + [
        Text.from_markup(f"[yellow]WARN[/] {escape(f['summary'])}; next: {escape(f['next'])}") for f in prog.findings]


def progress_view(info: RunStatus) -> None:
    """status RUN's progress (:func:`progress_parts`)."""
    if "progress" not in info.model_fields_set:
        return
    if info.progress is None:
        out.print(f"progress: unknown (the log of run {info.run} cannot be read now)")
        return
    for part in progress_parts(info.progress):
        out.print(part, soft_wrap=True)


# -- status RUN --watch -----------------------------------------------------------------------------------------

CURVE_ROWS = 8  # the height of the curves in the live view (plotext), in terminal rows


def _how_far(prog: TrainingProgress | None) -> str:
    if prog is None or prog.step is None:
        return "no rollout logged yet"
    return f"rollout {prog.step} ({prog.step + 1}/{prog.of or '?'} done)"


class StepLines:
    """``status RUN --watch`` without a terminal (CI logs, a pipe): what changed since the last read, one line
    each. The first read says the run as it is (its state, its current attempt, its last rollout); then one line
    per new rollout (its reward, loss and eval values; the last of a read also the pace and ETA), per attempt that
    starts (resumed from where) or ends (retried or not), per state change and per new finding (WARN)."""

    def __init__(self) -> None:
        self.first = True
        self.status: str | None = None
        self.seen: set[tuple[int, int]] = set()
        self.attempts: dict[int, bool] = {}  # attempt -> ended
        self.checks: set[str] = set()

    def lines(self, snap: Snapshot) -> list[str]:
        """The lines ``snap`` says that the reads before did not: a live state first; then per attempt its start,
        its new rollouts and its end; then new WARN lines; an ended state last."""
        info, prog = snap.info, snap.info.progress
        head: list[str] = []
        tail: list[str] = []
        if info.status != self.status:
            ended = info.status not in LIVE_STATES
            (tail if ended else head).append(
                f"run {info.run}: {info.status}" + (f" · {_how_far(prog)}" if ended else "")
                + (f" ({info.message.splitlines()[0]})" if info.message else ""))
            self.status = info.status
        started: dict[int, str] = {}
        finished: dict[int, str] = {}
        for a in info.attempts or []:
            was = self.attempts.get(a.attempt)
            self.attempts[a.attempt] = bool(a.ended)
            if was is None and (not self.first or a is info.attempts[-1]):
                resumed = f", resumed from {resumed_at(a.resumed_from, a.resumed_iteration)}" if a.resumed_from else ""
                started[a.attempt] = (f"attempt {a.attempt} {a.status if self.first else 'started'} "
                                      f"(job {a.submission_id}){resumed}")
            if a.ended and not was and not self.first:
                retried = "" if a.retry is None else (" · retried" if a.retry else " · not retried")
                finished[a.attempt] = (f"attempt {a.attempt} ended {a.status}" + (f" ({a.reason})" if a.reason else "")
                                       + retried + (f": {a.why}" if a.why else ""))
        steps: dict[int, list[str]] = {}
        warns: list[str] = []
        if prog is not None:
            new = [k for k in rollouts(snap.series) if k not in self.seen]
            self.seen.update(new)
            if self.first:
                new = new[-1:]
            values = by_rollout(snap.series, [m["metric"] for m in prog.metrics.values() if m])
            for i, (attempt, step) in enumerate(new):
                steps.setdefault(attempt, []).append(
                    self.step_line(prog, attempt, step, values.get((attempt, step), {}), i == len(new) - 1))
            current = {f["check"]: f for f in prog.findings}
            warns = [f"WARN {f['summary']}; next: {f['next']}" for c, f in current.items() if c not in self.checks]
            self.checks = set(current)
        body = [line for n in sorted({*started, *steps, *finished})
                for line in [started.get(n), *steps.get(n, []), finished.get(n)] if line]
        self.first = False
        return head + body + warns + tail

    @staticmethod
    def step_line(prog: TrainingProgress, attempt: int, step: int, values: dict[str, float], last: bool) -> str:
        words = [f"rollout {step} ({step + 1}/{prog.of or '?'})"]
        for key, label in KEYS:
            m = prog.metrics.get(key)
            if m and m["metric"] in values:
                words.append(f"{label or m['metric']} {_value(values[m['metric']])}")
        if attempt > 1:
            words.append(f"attempt {attempt}")
        if last and prog.seconds_per_step is not None and step == prog.step:
            words.append(f"{prog.seconds_per_step:.3g} s/rollout")
        if last and prog.eta_seconds is not None and step == prog.step:
            words.append(f"ETA {_duration(prog.eta_seconds)}")
        return " · ".join(words)


def curves(snap: Snapshot, width: int):
    """The reward, loss and eval curves side by side (plotext; x = rollout id, the last value of each rollout id),
    a Rich Text; None before any value."""
    import math

    import plotext
    from rich.text import Text

    prog = snap.info.progress
    panels = []
    for key, label in KEYS[:3]:
        m = prog.metrics.get(key) if prog is not None else None
        if not m:
            continue
        pts = snap.series.of(m["metric"])
        last = {p.step: p.value for p in pts if math.isfinite(p.value)}
        if last:
            panels.append((label or m["metric"], sorted(last.items()), all(p.kind == "eval" for p in pts)))
    if not panels:
        return None
    f = plotext.figure
    f.clear.all()
    plotext.terminal.limit(False, False)  # the size below, whatever the terminal is
    each = max(24, min((width - 1) // len(panels), 70))
    f.plot_size(each * len(panels), CURVE_ROWS)
    if len(panels) > 1:
        f.subplots(1, len(panels))
    for col, (title, pts, is_eval) in enumerate(panels, start=1):
        sub = f.subplot(1, col) if len(panels) > 1 else f
        sub.plot_size(each, CURVE_ROWS)
        sig = f.signal([s for s, _ in pts], [v for _, v in pts], marker="o" if is_eval else None)
        sub.draw(sig if is_eval else sig.lines())
        sub.title(f"{title} {pts[-1][1]:.4g} @{pts[-1][0]}")
    return Text(f.build().string(colorless=True))


def watch_view(snap: Snapshot, width: int, interval: float):
    """The live view of ``status RUN --watch``: the run's state, its progress bar and ETA, its key metrics, the
    reward/loss/eval curves, its findings and its attempts."""
    import time

    from rich.console import Group
    from rich.text import Text

    info = snap.info
    parts: list = [Text.from_markup(
        f"run {escape(info.run)}: [bold]{escape(str(info.status))}[/] (job {escape(info.submission_id)} on "
        f"{escape(info.address)})"),
        Text(f"read {time.strftime('%H:%M:%S')}, every {interval:g}s · Ctrl-C leaves, the run goes on", style="dim")]
    if info.message:
        parts.append(Text(info.message.splitlines()[0], style="dim"))
    if "progress" in info.model_fields_set and info.progress is None:
        parts.append(Text(f"progress: unknown (the log of run {info.run} cannot be read now)"))
    elif info.progress is not None:
        parts += progress_parts(info.progress)
        drawn = curves(snap, width)
        if drawn is not None:
            parts.append(drawn)
    if info.attempts:
        parts.append(attempts_table(info))
    return Group(*parts)


def watch_run(run: str, kube_context: str | None, kubeconfig: str | None,
              interval: float = WATCH_SECONDS) -> RunStatus:
    """``status RUN --watch`` until the run ends (its last status returned): in place (Rich Live) on a terminal,
    else :class:`StepLines`. Ctrl-C leaves it (exit 130), the run untouched: the watch only reads."""
    snaps = watch(run, kube_context, kubeconfig, interval)
    last: Snapshot | None = None
    try:
        if out.is_terminal:
            from rich.live import Live

            with Live(console=out, auto_refresh=False, redirect_stdout=False, redirect_stderr=False) as live:
                for last in snaps:
                    live.update(watch_view(last, out.width, interval), refresh=True)
        else:
            lines = StepLines()
            for last in snaps:
                for line in lines.lines(last):
                    out.print(line, markup=False, highlight=False, soft_wrap=True)
                out.file.flush()
    except KeyboardInterrupt:
        raise Interrupted(f"stopped watching run {run}; the run goes on (watching changes nothing)",
                          hint=f"'miles-ray status {run} --watch' watches it again; 'miles-ray stop {run}' stops "
                               "it") from None
    finally:
        snaps.close()
    assert last is not None  # the watch reads the run at least once
    return last.info


@cluster_options
def status_cmd(
    run: Annotated[Optional[str], typer.Argument(metavar="RUN", help="a run name: show its job instead of the cluster", show_default=False)] = None,
    cluster: ClusterFlags = ClusterFlags(),
    ray: Annotated[bool, typer.Option("--ray/--no-ray", help="kubernetes: also ask Ray (via a port-forward to the head) how many nodes are alive and since when it is idle")] = False,
    config: ConfigOpt = None,
    output: TableOutputOpt = TableOutput.table,
    watch_it: Annotated[bool, typer.Option("--watch", "-w", help=f"with RUN: refresh in place every {WATCH_SECONDS:g} s (progress bar, ETA, curves, attempts) until the run ends; without a terminal, one line per new rollout; Ctrl-C leaves, the run goes on")] = False,
) -> None:
    """Show the cluster (nodes alive in Ray, GPUs per node) or, given RUN, that run's job.

    For the cluster it also says since when it has been idle -- no job pending or running and no active
    driver, from the Ray dashboard's activity API (on Kubernetes with --ray) -- or that it is parked.

    A supervised run (submit --max-restarts) shows its attempts (-o json: ``attempts``, each with started, ended,
    reason, resumed_from): its state is its supervisor's final one, else its current attempt's.

    A training run (direct mode) also shows how far it is, from the metric lines in its logs: a progress bar of
    its rollouts (Miles numbers them from 0: after rollout N, N+1 of --num-rollout are done), the recent seconds
    per rollout, the ETA, and the last value and trend of the reward, the loss, the eval metric and the
    throughput (-o json: ``progress``). A WARN line says when it stalled (no new rollout for 5x its usual step
    time, at least 60 s; 30 min before its second rollout), when a loss is NaN/inf or its reward collapsed to a
    constant, and what to look at next. A stalled run is told, never stopped.

    With --watch/-w (as kubectl's), RUN is read again every 5 s until it ends: on a terminal the view is
    redrawn in place (its state, the progress bar, ETA, the key metrics, the reward/loss/eval curves, the WARN
    lines, the attempts); without one (CI, a pipe) it prints the run as it is, then one line per new rollout, per
    attempt that starts or ends (and where it resumed from), per state change and per new WARN. It ends when the
    run does, with the exit code below for its final state. Ctrl-C leaves the watch (exit 130) and never touches
    the run. Not with -o json/yaml.

    With RUN, once the run's cluster is gone, the job info saved when the run ended or its cluster went down
    is shown instead, saying so. With RUN the exit code tells the job's state: 0 succeeded, 3 failed, 5 pending or running, 6 stopped
    (--namespace must then be the namespace of the run's cluster).
    """
    output = table_output(output)
    if watch_it:
        if not run:
            raise ConfigError("status --watch: name the RUN to watch (a cluster is not watched)")
        if output is not Output.table:
            raise ConfigError("status --watch draws for people: not with -o json/yaml",
                              hint=f"read 'miles-ray status {run} -o json' as often as needed")
        name = pick_run(run, cluster.namespace)
        job_state_exit(name, watch_run(name, cluster.context, cluster.kubeconfig).status)
        return
    if run:
        info = run_training(pick_run(run, cluster.namespace), kube_context=cluster.context,
                            kubeconfig=cluster.kubeconfig)
        emit(info, output, lambda: (run_status_line(info), progress_view(info)))
        job_state_exit(info.run, info.status)
        return

    cfg = cluster.config(config)
    status = clusters.status(cfg, clusters.backend_for(cfg, cluster.backend.value), with_ray=ray)
    notices(status.to_json())
    emit(status, output, lambda: cluster_status(status))
    if not status.to_json().get("parked"):
        ray_tools_hint(cfg.name, output)
