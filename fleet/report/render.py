"""`fleetrl report`: one self-contained HTML page that compares run directories.

    fleetrl report runs/reach-a runs/reach-b sb3/seed0 --title "FetchReach"   # runs/reach-a/report.html

    runs = [load_run(p) for p in ("runs/reach-a", "sb3/seed0")]
    write_report(runs, pathlib.Path("report.html"), "FetchReach")  # + report_files/*.png

A run directory is what `fleetrl train` or `benchmarks/sb3_baseline.py --out` writes
(fleet/report/rundir.py reads it: summary.json, evals.jsonl, progress.jsonl, config.json,
code.json). The page: the runs' table, CPU per role, what the terms mean, the plots, and what
each run ran with (fleet/report/sections.py). Plots are PNGs in `<out stem>_files/` beside the
page, linked by relative path, so the page and that folder can be moved together.
"""

from __future__ import annotations

import argparse
import datetime
import html
import pathlib
import shutil
import sys
import urllib.parse
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from fleet.report.figures import overlap_figure, routing_figure, task_curve_figure
from fleet.report.rundir import ReportError, Run, load_run, num

__all__ = ["ReportError", "Run", "add_arguments", "load_run", "main", "write_report"]

if TYPE_CHECKING:
    from matplotlib.figure import Figure

PLOT_NAMES = (
    "eval_wall.png",
    "eval_env_steps.png",
    "train_wall.png",
    "updates_wall.png",
    "cpu_share.png",
    "task_success.png",
    "expert_routing.png",
    "expert_overlap.png",
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("run_dirs", nargs="+", help="run directories to compare (summary.json and/or evals.jsonl)")
    parser.add_argument(
        "--out", help="HTML page to write (default: report.html in the first run directory); plots go to <stem>_files/"
    )
    parser.add_argument("--title", help="page title; default: the runs' labels")


def main(args: argparse.Namespace) -> int:
    """Load every run, write the page, print its path. Raises ReportError naming a bad run dir."""
    runs = [load_run(path) for path in args.run_dirs]
    for note in _notes(runs):
        print(f"fleetrl report: warning: {note}", file=sys.stderr)
    title = args.title or "fleetrl report: " + ", ".join(run.name for run in runs)
    out = pathlib.Path(args.out) if args.out else pathlib.Path(args.run_dirs[0]) / "report.html"
    print(write_report(runs, out, title))
    return 0


def write_report(runs: list[Run], out: pathlib.Path, title: str) -> pathlib.Path:
    """Write the page to `out` and its plots to `<out stem>_files/`; returns `out`."""
    if not runs:
        raise ReportError("write_report needs at least one run; got none")
    import matplotlib

    matplotlib.use("Agg")  # files only: never open a window, work without a display
    files_dir = out.with_name(f"{out.stem}_files")
    files_dir.mkdir(parents=True, exist_ok=True)
    images: list[tuple[str, str]] = []
    for filename, caption, figure in _figures(runs):
        figure.savefig(files_dir / filename, dpi=100)
        images.append((f"{urllib.parse.quote(files_dir.name)}/{filename}", caption))
    for i, run in enumerate(runs):  # deploy-check --sweep's pictures, copied beside the plots (by run index:
        for png in run.envelopes:  # a run's label may hold any character)
            name = f"envelope_{i}_{png.name}"
            shutil.copyfile(png, files_dir / name)
            images.append((f"{urllib.parse.quote(files_dir.name)}/{urllib.parse.quote(name)}",
                           f"Robustness envelope of {png.stem} ({run.name}; deploy-check --sweep)"))  # fmt: skip
    for stale in set(PLOT_NAMES) - {src.rsplit("/", 1)[1] for src, _ in images}:
        (files_dir / stale).unlink(missing_ok=True)  # a previous report's plot this one no longer has
    out.write_text(_page(runs, title, images), encoding="utf-8")
    return out


@dataclass(frozen=True)
class _Series:
    label: str
    color: str  # one color per run across every plot
    points: list[tuple[float, float]]
    style: str = "-"


def _points(records: Iterable[dict[str, Any]], x: str, y: str, x_scale: float = 1.0) -> list[tuple[float, float]]:
    return sorted((r[x] * x_scale, r[y]) for r in records if num(r.get(x)) and num(r.get(y)))


def _legend_label(name: str) -> str:
    # matplotlib hides labels starting with "_" and reads "$...$" as math: show both literally.
    return (" " + name if name.startswith("_") else name).replace("$", r"\$")


def _eval_series(runs: list[Run], x: str, x_scale: float) -> list[_Series]:
    """Curve scores (a fixed episode budget; runs without kinds count as curve) as a line;
    complete full scores (the most episodes, the ones that can reach the target) dotted."""
    series = []
    for i, run in enumerate(runs):
        curve = [e for e in run.evals if e.get("kind", "curve") in ("curve", "")]
        full = [e for e in run.evals if e.get("kind") == "full"]
        most = max((e.get("episodes", 0) for e in full), default=0)
        full = [e for e in full if e.get("episodes", 0) >= most]  # early-stopped full scores left out
        for records, suffix, style in ((curve, "", "-"), (full, " (full scores)", ":")):
            points = _points(records, x, "success_rate", x_scale)
            if points:
                series.append(_Series(_legend_label(run.name + suffix), f"C{i % 10}", points, style))
    return series


def _progress_series(runs: list[Run], y: str) -> list[_Series]:
    found = [(i, run, _points(run.progress, "wall_sec", y, 1 / 60)) for i, run in enumerate(runs)]
    return [_Series(_legend_label(run.name), f"C{i % 10}", points) for i, run, points in found if points]


def _line_figure(series: list[_Series], xlabel: str, ylabel: str, targets: list[float]) -> Figure:
    from matplotlib.figure import Figure

    figure = Figure(figsize=(8, 4.5))
    ax = figure.add_subplot()
    for s in series:
        ax.plot(*zip(*s.points, strict=True), s.style, marker=".", color=s.color, label=s.label)
    for target in targets:
        ax.axhline(target, linestyle="--", color="gray", linewidth=1, label=f"target {target:g}")
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    if "success" in ylabel:  # keep all of 0..1 in view: plots of different reports compare by eye
        ax.set_ylim(-0.05, 1.05)
    ax.grid(alpha=0.3)
    ax.legend(fontsize="small")
    figure.tight_layout()
    return figure


def _cpu_figure(runs: list[Run]) -> Figure | None:
    """Grouped horizontal bars: one group per role, one bar per run that measured CPU."""
    from matplotlib.figure import Figure

    measured = [(i, run) for i, run in enumerate(runs) if run.cpu]
    if not measured:
        return None
    roles = sorted({role for _, run in measured for role in run.cpu})
    height = 0.8 / len(measured)
    figure = Figure(figsize=(8, 1.5 + 0.3 * len(roles) * len(measured)))
    ax = figure.add_subplot()
    for k, (i, run) in enumerate(measured):
        shares = [100 * run.cpu.get(role, {}).get("share", 0.0) for role in roles]
        ys = [r + k * height for r in range(len(roles))]
        ax.barh(ys, shares, height=height, color=f"C{i % 10}", label=_legend_label(run.name))
    ax.set_yticks([r + 0.4 - height / 2 for r in range(len(roles))], roles)
    ax.invert_yaxis()
    ax.set_xlabel("CPU share (% of wall-clock x cores)")
    ax.grid(axis="x", alpha=0.3)
    ax.legend(fontsize="small")
    figure.tight_layout()
    return figure


def _figures(runs: list[Run]) -> list[tuple[str, str, Figure]]:
    """(file name, caption, figure) for every plot some run has data for."""
    targets = sorted({r.summary["target_success"] for r in runs if num(r.summary.get("target_success"))})
    from fleet.report.progress import RATE_WINDOW_SEC  # the live rates' window (grpc, rich: only when writing)

    wall, success, ev, pr = "wall-clock (min)", "success rate", _eval_series, _progress_series
    updates, rate = pr(runs, "updates_per_sec"), f"updates/s (rate over the last {RATE_WINDOW_SEC:.0f} s)"
    wanted = [  # file name, caption, series, x label, y label; success plots get the target lines
        (PLOT_NAMES[0], "Evaluation success vs wall-clock", ev(runs, "wall_sec", 1 / 60), wall, success),
        (PLOT_NAMES[1], "Evaluation success vs env steps", ev(runs, "env_steps", 1.0), "env steps", success),
        (PLOT_NAMES[2], "Training success (last 100 episodes)", pr(runs, "train_success"), wall, success),
        (PLOT_NAMES[3], f"Updates per second (rate over the last {RATE_WINDOW_SEC:.0f} s)", updates, wall, rate),
    ]
    figures = [
        (name, caption, _line_figure(series, x, y, targets if y == success else []))
        for name, caption, series, x, y in wanted
        if series
    ]
    cpu = _cpu_figure(runs)
    if cpu is not None:
        figures.append((PLOT_NAMES[4], "CPU share per role", cpu))
    tasks = task_curve_figure(runs, _legend_label)
    if tasks is not None:
        figures.append((PLOT_NAMES[5], "Evaluation success per task (curve scores)", tasks))
    routed = next((run for run in runs if run.summary.get("expert_routing")), None)
    routing = None if routed is None else routing_figure(routed.summary["expert_routing"])
    if routed is not None and routing is not None:
        version = routed.summary["expert_routing"].get("version")
        caption = f"Experts each task is routed to, per layer ({routed.name}, version {version}; gate weight)"
        figures.append((PLOT_NAMES[6], caption, routing))
        overlap = overlap_figure(routed.summary["expert_routing"])
        if overlap is not None:
            caption = f"Expert overlap between tasks, actor, mean over layers ({routed.name}; 1: alike, 0: none shared)"
            figures.append((PLOT_NAMES[7], caption, overlap))
    return figures


STYLE = """body{font-family:sans-serif;margin:2em;color:#222}table{border-collapse:collapse}
td,th{border:1px solid #ccc;padding:4px 8px;text-align:left}th{background:#f2f2f2}
figure{margin:1.5em 0}figcaption{font-weight:bold;margin-bottom:.3em}.note{color:#a60}
dt{font-weight:bold}dd{margin:0 0 .4em 1.5em}"""


def _notes(runs: list[Run]) -> list[str]:
    notes = [f"{r.name}: {r.skipped_lines} malformed JSONL line(s) skipped" for r in runs if r.skipped_lines]
    unplaced = [r.name for r in runs if any(e["wall_sec"] is None for e in r.evals)]
    notes += [f"{name}: evals lack wall_sec and summary lacks started_unix: no wall-clock plot" for name in unplaced]
    return notes


def _page(runs: list[Run], title: str, images: list[tuple[str, str]]) -> str:
    from fleet.report.progress import RATE_WINDOW_SEC
    from fleet.report.sections import cpu_table, glossary, run_table, setup_table  # the config: only when writing

    esc = html.escape
    generated = datetime.datetime.now().astimezone().isoformat(timespec="seconds")
    notes = "".join(f'<p class="note">{esc(note)}</p>\n' for note in _notes(runs))
    plots = "".join(
        f'<figure><figcaption>{esc(caption)}</figcaption><img src="{esc(src)}" alt="{esc(caption)}"></figure>\n'
        for src, caption in images
    )
    return (
        f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8"><title>{esc(title)}</title>'
        f"<style>{STYLE}</style></head>\n<body><h1>{esc(title)}</h1>\n<p>Generated {esc(generated)}</p>\n"
        f"{run_table(runs)}{cpu_table(runs)}{notes}{glossary(RATE_WINDOW_SEC)}{plots}{setup_table(runs)}"
        "</body></html>\n"
    )
