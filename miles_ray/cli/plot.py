"""miles-ray runs plot RUN [RUN ...]: the curves of one or more runs on shared axes (x = rollout id), one panel per
metric, each attempt's resume marked, eval points as points: a .png/.svg (matplotlib), one self-contained offline
.html page (matplotlib's SVG inline, a <title> with the values on every point), or, without --out, in the terminal
(plotext). matplotlib and plotext are imported here, inside the verb: never by --help or status."""

from __future__ import annotations

import io
import math
import os
import re
import sys
from html import escape as html_escape
from pathlib import Path
from typing import Annotated, Any, Optional
from xml.etree import ElementTree

import typer

from miles_ray.cli.common import Output, OutputOpt, emit, out
from miles_ray.cli.options import RunFlags, run_options
from miles_ray.core.errors import ConfigError
from miles_ray.core.train_progress import Point
from miles_ray.services.runs import pick_run
from miles_ray.services.training import Curves, RunCurves, curves

FORMATS = (".png", ".svg", ".html")
WIDTH_IN, PANEL_IN, EXTRA_IN, DPI = 9.0, 2.6, 1.0, 100  # a PNG is 900 x (260 x panels + 100) pixels
HOVER_POINTS = 400  # hover titles per curve in the HTML page (evenly spread, the last always)
SVG_NS = "http://www.w3.org/2000/svg"


def image_size(panels: int) -> tuple[int, int]:
    """The PNG's size in pixels for ``panels`` metrics."""
    return int(WIDTH_IN * DPI), int(round((PANEL_IN * panels + EXTRA_IN) * DPI))


def check_out(path: Path) -> str:
    """The output format of ``path`` (bad input, exit 2: an unknown extension, a path that cannot be written)."""
    ext = path.suffix.lower()
    if ext not in FORMATS:
        raise ConfigError(f"runs plot --out {path}: unknown output extension {ext or '(none)'!r}; use one of "
                          f"{', '.join(FORMATS)} (without --out: a plot in the terminal)")
    parent = path.parent if str(path.parent) else Path(".")
    if path.is_dir() or not parent.is_dir() or not os.access(parent, os.W_OK) or (
            path.exists() and not os.access(path, os.W_OK)):
        why = ("is a directory" if path.is_dir() else f"{parent} is not a directory" if not parent.is_dir()
               else "is not writable")
        raise ConfigError(f"runs plot --out {path}: cannot write there ({why})")
    return ext


def _finite(v: float) -> float:
    return v if math.isfinite(v) else math.nan


def _segments(points: list[Point]) -> list[list[Point]]:
    """The points of one curve cut at each attempt (a resumed run's curve is not joined across its restart)."""
    parts: list[list[Point]] = []
    for p in points:
        if not parts or parts[-1][-1].attempt != p.attempt:
            parts.append([])
        parts[-1].append(p)
    return parts


def _resumes(rc: RunCurves) -> list[tuple[int, int]]:
    """(attempt, its first rollout) of every attempt after the first that logged a rollout."""
    return [(m.attempt, m.first_step) for m in rc.series.attempts if m.attempt > 1 and m.first_step is not None]


def figure(data: Curves, hover: bool = False):
    """The matplotlib figure (no pyplot: no global state, no display); with ``hover``, each drawn point carries a
    gid ``pt-N`` and the returned list holds its title (the SVG gets a <title> per point)."""
    from matplotlib.figure import Figure

    n = len(data.metrics)
    width, height = image_size(n)
    fig = Figure(figsize=(width / DPI, height / DPI), dpi=DPI)
    axes = fig.subplots(n, 1, sharex=True, squeeze=False)[:, 0]
    titles: list[str] = []
    for ax, metric in zip(axes, data.metrics):
        for i, rc in enumerate(data.runs):
            color = f"C{i % 10}"
            pts = rc.series.of(metric)
            is_eval = bool(pts) and all(p.kind == "eval" for p in pts)
            for k, seg in enumerate(_segments(pts)):
                xs, ys = [p.step for p in seg], [_finite(p.value) for p in seg]
                label = rc.run if k == 0 else None
                if is_eval:
                    ax.plot(xs, ys, linestyle=":", linewidth=1, marker="o", markersize=5, color=color, label=label)
                else:
                    ax.plot(xs, ys, linewidth=1.4, color=color, label=label)
            for attempt, first in _resumes(rc):
                ax.axvline(first, color=color, linestyle="--", linewidth=1, alpha=0.7)
                if ax is axes[0]:
                    ax.annotate(f"{rc.run}: attempt {attempt} resumes", xy=(first, 1), xycoords=("data", "axes fraction"),
                                xytext=(3, -10), textcoords="offset points", fontsize=7, color=color)
            if hover and pts:
                step = max(1, math.ceil(len(pts) / HOVER_POINTS))
                for p in pts[::step] + ([pts[-1]] if (len(pts) - 1) % step else []):
                    if math.isfinite(p.value):
                        (mark,) = ax.plot([p.step], [p.value], marker="o", markersize=3, color=color, alpha=0.35,
                                          linestyle="")
                        mark.set_gid(f"pt-{len(titles)}")
                        titles.append(f"{rc.run} · {metric} · rollout {p.step} (attempt {p.attempt}): {p.value:.6g}")
        ax.set_ylabel(metric, fontsize=8)
        ax.grid(alpha=0.3)
    axes[-1].set_xlabel("rollout id (Miles' 0-based rollout_id)")
    axes[0].legend(fontsize=8, loc="best")
    fig.suptitle("runs " + ", ".join(rc.run for rc in data.runs), fontsize=10)
    if data.eval_differences:
        fig.text(0.01, 0.005, "eval not comparable: " + "; ".join(data.eval_differences)[:300], fontsize=6,
                 color="firebrick", va="bottom", wrap=True)
    fig.subplots_adjust(left=0.1, right=0.97, top=1 - 0.45 / (PANEL_IN * n + EXTRA_IN),
                        bottom=0.6 / (PANEL_IN * n + EXTRA_IN), hspace=0.25)
    return fig, titles


def _svg_with_titles(fig, titles: list[str]) -> str:
    """The figure as an SVG element (no XML prolog or DOCTYPE), a <title> in every hover point's group."""
    import matplotlib

    buf = io.StringIO()
    with matplotlib.rc_context({"svg.fonttype": "path", "svg.hashsalt": "miles-ray"}):
        fig.savefig(buf, format="svg")
    ElementTree.register_namespace("", SVG_NS)
    ElementTree.register_namespace("xlink", "http://www.w3.org/1999/xlink")
    root = ElementTree.fromstring(re.sub(r"<!DOCTYPE[^>]*>", "", buf.getvalue()))
    for group in root.iter(f"{{{SVG_NS}}}g"):
        m = re.fullmatch(r"pt-(\d+)", group.get("id") or "")
        if m:
            title = ElementTree.Element(f"{{{SVG_NS}}}title")
            title.text = titles[int(m.group(1))]
            group.insert(0, title)
    return ElementTree.tostring(root, encoding="unicode")


def html_page(data: Curves) -> str:
    """ONE self-contained page: no script, stylesheet, font or image fetched from anywhere."""
    fig, titles = figure(data, hover=True)
    svg = _svg_with_titles(fig, titles)
    rows = []
    for rc in data.runs:
        for metric in data.metrics:
            pts = rc.series.of(metric)
            if pts:
                rows.append(f"<tr><td>{html_escape(rc.run)}</td><td>{html_escape(metric)}</td><td>{len(pts)}</td>"
                            f"<td>{pts[-1].step}</td><td>{pts[-1].value:.6g}</td></tr>")
    note = ("<p class=warn>Evaluation not comparable between these runs: "
            + html_escape("; ".join(data.eval_differences)) + "</p>") if data.eval_differences else ""
    names = ", ".join(html_escape(rc.run) for rc in data.runs)
    return (f"<!DOCTYPE html>\n<html lang=en><head><meta charset=utf-8><title>miles-ray runs plot: {names}</title>\n"
            "<style>body{font-family:sans-serif;margin:1em}td,th{padding:2px 8px;text-align:left}"
            ".warn{color:#b22222}svg{max-width:100%;height:auto}</style></head>\n<body>\n"
            f"<h1>runs {names}</h1>\n{note}\n<p>x: rollout id (Miles' 0-based rollout_id); dashed lines: an attempt "
            "resuming; dots on dotted lines: eval points. Hover a point for its value.</p>\n"
            f"{svg}\n<table><tr><th>run</th><th>metric</th><th>points</th><th>last rollout</th><th>last value</th>"
            f"</tr>{''.join(rows)}</table>\n</body></html>\n")


def terminal_plot(data: Curves) -> str:
    """The curves drawn in the terminal (plotext), colorless when stdout is not a terminal."""
    import shutil

    import plotext

    f = plotext.figure
    f.clear.all()
    plotext.terminal.limit(False, False)  # the size below, whatever stdout is
    n = len(data.metrics)
    width, height = shutil.get_terminal_size((100, 40))
    width, panel = min(width, 160), max(12, min((height - 4) // n, 18)) if sys.stdout.isatty() else 16
    f.plot_size(width, panel * n)
    if n > 1:
        f.subplots(n, 1)
    for row, metric in enumerate(data.metrics, start=1):
        sub = f.subplot(row, 1) if n > 1 else f
        sub.plot_size(width, panel)
        for rc in data.runs:
            pts = [p for p in rc.series.of(metric) if math.isfinite(p.value)]
            if not pts:
                continue
            is_eval = all(p.kind == "eval" for p in pts)
            sig = f.signal([p.step for p in pts], [p.value for p in pts], marker="o" if is_eval else None)
            sub.draw(sig.label(rc.run) if is_eval else sig.label(rc.run).lines())
            for attempt, first in _resumes(rc):
                sub.line(first, orientation=1, relative=False, label=f"{rc.run} attempt {attempt}")
        sub.title(metric)
    (f.subplot(n, 1) if n > 1 else f).label("rollout id", axis=0)
    f.theme("default" if sys.stdout.isatty() else "clear")
    return f.build().string(colorless=not sys.stdout.isatty())


def _as_json(data: Curves, written: str | None) -> dict[str, Any]:
    return {"runs": [rc.run for rc in data.runs], "metrics": data.metrics, "out": written,
            "eval_differences": data.eval_differences,
            "points": {rc.run: {m: [[p.step, p.value if math.isfinite(p.value) else str(p.value), p.attempt]
                                    for p in rc.series.of(m)] for m in data.metrics} for rc in data.runs},
            "resumes": {rc.run: [{"attempt": a, "rollout": s} for a, s in _resumes(rc)] for rc in data.runs}}


@run_options
def plot_cmd(
    runs: Annotated[list[str], typer.Argument(metavar="RUN", help="one or more runs, drawn on shared axes", show_default=False)],
    metric: Annotated[Optional[list[str]], typer.Option("--metric", help="a metric to draw (one panel each; repeat it); default: rollout/raw_reward, train/loss and every eval metric logged", show_default=False)] = None,
    out_file: Annotated[Optional[Path], typer.Option("--out", help="write FILE: .png or .svg (matplotlib), .html (one self-contained offline page, hover values); without it: a plot in the terminal", show_default=False)] = None,
    target: RunFlags = RunFlags(),
    output: OutputOpt = Output.table,
) -> None:
    """Plot the metric curves of one or more runs side by side (x = rollout id), from their logs.

    One panel per metric; each attempt that resumed is marked (a dashed line at its first rollout); eval points are
    drawn as points. Runs whose evaluation data or procedure differ are said to be (the check 'runs compare'
    makes). Works from live logs and from the copies saved after 'down'.

    Examples:

    \b
      miles-ray runs plot q4-a q4-b --out curves.png
      miles-ray runs plot q4-a q4-b --metric eval/aime --out curves.html
      miles-ray runs plot q4-a                       # in the terminal
    """
    ext = check_out(out_file) if out_file is not None else None  # bad input before any log is read
    data = curves([pick_run(r, target.namespace) for r in runs], metric, **target.reach())
    written = None
    if out_file is not None:
        try:
            if ext == ".html":
                out_file.write_text(html_page(data), encoding="utf-8")
            else:
                fig, _ = figure(data)
                fig.savefig(out_file, format=ext[1:])
        except OSError as e:
            raise ConfigError(f"runs plot --out {out_file}: cannot write there ({e.strerror or e})") from None
        written = str(out_file)

    def table() -> None:
        if written is None:
            sys.stdout.write(terminal_plot(data) + "\n")
        else:
            out.print(f"wrote {written}: {', '.join(data.metrics)} of {', '.join(rc.run for rc in data.runs)}",
                      markup=False)
        if data.eval_differences:
            out.print("note: evaluation not comparable: " + "; ".join(data.eval_differences), markup=False)

    emit(_as_json(data, written), output, table)
