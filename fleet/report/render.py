"""`fleetrl report`: one self-contained HTML page that compares run directories.

    fleetrl report runs/reach-a runs/reach-b sb3/seed0 --title "FetchReach"   # runs/reach-a/report.html

    runs = [load_run(p) for p in ("runs/reach-a", "sb3/seed0")]
    write_report(runs, pathlib.Path("report.html"), "FetchReach")  # + report_files/*.png

A run directory is what `fleetrl train` or `benchmarks/sb3_baseline.py --out` writes:
summary.json, evals.jsonl, progress.jsonl, config.json. Each is read if present; a run needs
at least summary.json or evals.jsonl. Plots are PNGs in `<out stem>_files/` beside the page,
linked by relative path, so the page and that folder can be moved together.
"""

from __future__ import annotations

import argparse
import datetime
import html
import json
import pathlib
import sys
import urllib.parse
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeGuard

from fleet.report.figures import routing_figure, task_curve_figure
from foundation.errors import FleetrlError

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
)


class ReportError(FleetrlError, ValueError):
    """A run directory (or argument) the report cannot use; the message names the path."""


@dataclass(frozen=True)
class Run:
    """One run directory as read: a missing file leaves its field empty."""

    name: str  # summary.json's `label`, else the directory name
    summary: dict[str, Any]
    evals: list[dict[str, Any]]  # evals.jsonl; `wall_sec` filled in (None when it cannot be known)
    progress: list[dict[str, Any]]  # progress.jsonl
    cpu: dict[str, dict[str, float]]  # role (all its processes) -> {"cpu_sec", "share"}; share of wall_sec * cores
    config: dict[str, Any] = field(default_factory=dict)
    skipped_lines: int = 0  # malformed lines of evals.jsonl and progress.jsonl, left out


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


def load_run(path: str | pathlib.Path) -> Run:
    """Read a run directory, tolerating missing files and malformed JSONL lines.

    >>> load_run("runs/FetchReach-v4-20250101-120000").name
    'FetchReach-v4-20250101-120000'
    """
    run_dir = pathlib.Path(path)
    if not run_dir.is_dir():
        raise ReportError(f"run dir {run_dir} does not exist or is not a directory")
    summary_path, evals_path = run_dir / "summary.json", run_dir / "evals.jsonl"
    if not summary_path.exists() and not evals_path.exists():
        raise ReportError(f"run dir {run_dir} has neither summary.json nor evals.jsonl: nothing to report")
    summary = _read_json(summary_path)
    evals, bad_evals = _read_jsonl(evals_path, ("success_rate", "env_steps"))
    progress, bad_progress = _read_jsonl(run_dir / "progress.jsonl", ("wall_sec",))
    try:
        config = _read_json(run_dir / "config.json")
    except ReportError:  # optional and only used for task and seed: not worth refusing the run
        config = {}
    cpu = summary.get("cpu")
    cpu = cpu if isinstance(cpu, dict) else {}
    groups = cpu.get("groups")  # fleetrl.cpu.CpuMeter.report(): per role ("sampler": every sampler process)
    cpu = groups if isinstance(groups, dict) else cpu
    return Run(
        name=str(summary.get("label") or run_dir.resolve().name),
        summary=summary,
        evals=[_with_wall_sec(e, summary.get("started_unix")) for e in evals],
        progress=progress,
        cpu={role: v for role, v in cpu.items() if isinstance(v, dict) and _num(v.get("share"))},
        config=config,
        skipped_lines=bad_evals + bad_progress,
    )


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
    for stale in set(PLOT_NAMES) - {src.rsplit("/", 1)[1] for src, _ in images}:
        (files_dir / stale).unlink(missing_ok=True)  # a previous report's plot this one no longer has
    out.write_text(_page(runs, title, images), encoding="utf-8")
    return out


def _num(value: object) -> TypeGuard[float]:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _read_json(path: pathlib.Path) -> dict[str, Any]:
    if not path.exists():
        return {}
    try:
        data = json.loads(path.read_text(encoding="utf-8", errors="replace"))
    except json.JSONDecodeError as err:
        raise ReportError(f"{path} is not valid JSON: {err}") from None
    if not isinstance(data, dict):
        raise ReportError(f"{path} must hold a JSON object, got {type(data).__name__}")
    return data


def _read_jsonl(path: pathlib.Path, required: tuple[str, ...]) -> tuple[list[dict[str, Any]], int]:
    """(records, malformed line count): a line must be a JSON object with numbers at `required`."""
    if not path.exists():
        return [], 0
    records, skipped = [], 0
    for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError:  # e.g. the last line of a run still writing
            record = None
        if isinstance(record, dict) and all(_num(record.get(key)) for key in required):
            records.append(record)
        else:
            skipped += 1
    return records, skipped


def _with_wall_sec(record: dict[str, Any], started_unix: object) -> dict[str, Any]:
    """Older evals.jsonl lines lack `wall_sec`; derive it from `time` when the start is known."""
    if _num(record.get("wall_sec")):
        return record
    known = _num(record.get("time")) and _num(started_unix)
    return {**record, "wall_sec": record["time"] - started_unix if known else None}


@dataclass(frozen=True)
class _Series:
    label: str
    color: str  # one color per run across every plot
    points: list[tuple[float, float]]
    style: str = "-"


def _points(records: Iterable[dict[str, Any]], x: str, y: str, x_scale: float = 1.0) -> list[tuple[float, float]]:
    return sorted((r[x] * x_scale, r[y]) for r in records if _num(r.get(x)) and _num(r.get(y)))


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
    targets = sorted({r.summary["target_success"] for r in runs if _num(r.summary.get("target_success"))})
    wall, success, ev, pr = "wall-clock (min)", "success rate", _eval_series, _progress_series
    wanted = [  # file name, caption, series, x label, y label; success plots get the target lines
        (PLOT_NAMES[0], "Evaluation success vs wall-clock", ev(runs, "wall_sec", 1 / 60), wall, success),
        (PLOT_NAMES[1], "Evaluation success vs env steps", ev(runs, "env_steps", 1.0), "env steps", success),
        (PLOT_NAMES[2], "Training success (last 100 episodes)", pr(runs, "train_success"), wall, success),
        (PLOT_NAMES[3], "Learner updates per second", pr(runs, "updates_per_sec"), wall, "updates/s"),
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
    return figures


def _fmt(value: object, spec: str) -> str:
    return format(value, spec) if _num(value) else "—"


def _seconds(value: object) -> str:
    return f"{value:.1f} s ({value / 60:.1f} min)" if _num(value) else "—"


def _best_success(run: Run) -> object:
    rates = [e["success_rate"] for e in run.evals]
    return run.summary.get("best_success", max(rates, default=None))


def _overhead(run: Run) -> object:
    # Written at the top level of summary.json; some writers nest it under "cpu".
    cpu = run.summary.get("cpu")
    return run.summary.get("fleet_overhead_share", cpu.get("fleet_overhead_share") if isinstance(cpu, dict) else None)


def _nested(data: dict[str, Any], section: str, key: str) -> object:
    inner = data.get(section)
    return inner.get(key) if isinstance(inner, dict) else None


COLUMNS: list[tuple[str, Callable[[Run], str]]] = [
    ("run", lambda r: r.name),
    ("task", lambda r: str(r.summary.get("task") or _nested(r.config, "sim", "task") or "—")),
    ("seed", lambda r: _fmt(r.summary.get("seed", _nested(r.config, "sampler", "seed")), "")),
    ("stop reason", lambda r: str(r.summary.get("stop_reason") or "—")),
    ("reached target", lambda r: {True: "yes", False: "no", None: "—"}.get(r.summary.get("reached_target"), "—")),
    ("wall-clock to target", lambda r: _seconds(r.summary.get("wall_sec_to_target"))),
    ("env steps to target", lambda r: _fmt(r.summary.get("env_steps_to_target"), ",")),
    ("best success", lambda r: _fmt(_best_success(r), ".2f")),
    ("final env steps", lambda r: _fmt(r.summary.get("final_env_steps"), ",")),
    ("final version", lambda r: _fmt(r.summary.get("final_version"), ",")),
    ("updates/s", lambda r: _fmt(r.summary.get("updates_per_sec"), ".1f")),
    ("fleet overhead", lambda r: _fmt(_overhead(r), ".1%")),
]

STYLE = """body{font-family:sans-serif;margin:2em;color:#222}table{border-collapse:collapse}
td,th{border:1px solid #ccc;padding:4px 8px;text-align:left}th{background:#f2f2f2}
figure{margin:1.5em 0}figcaption{font-weight:bold;margin-bottom:.3em}.note{color:#a60}"""


def _cpu_table(runs: list[Run]) -> str:
    """A row per run that measured CPU, a column per role: CPU share of the machine (seconds)."""
    measured = [run for run in runs if run.cpu]
    if not measured:
        return ""
    esc = html.escape
    roles = sorted({role for run in measured for role in run.cpu})

    def cell(run: Run, role: str) -> str:
        entry = run.cpu.get(role)
        return "—" if entry is None else f"{entry['share']:.1%} ({_fmt(entry.get('cpu_sec'), '.1f')} s)"

    header = "<th>run</th>" + "".join(f"<th>{esc(role)}</th>" for role in roles)
    rows = "".join(
        f"<tr><td>{esc(run.name)}</td>" + "".join(f"<td>{esc(cell(run, role))}</td>" for role in roles) + "</tr>\n"
        for run in measured
    )
    caption = "CPU per role: share of wall-clock x cores (CPU-seconds)"
    return f"<h2>{esc(caption)}</h2>\n<table><tr>{header}</tr>\n{rows}</table>\n"


def _notes(runs: list[Run]) -> list[str]:
    notes = [f"{r.name}: {r.skipped_lines} malformed JSONL line(s) skipped" for r in runs if r.skipped_lines]
    unplaced = [r.name for r in runs if any(e["wall_sec"] is None for e in r.evals)]
    notes += [f"{name}: evals lack wall_sec and summary lacks started_unix: no wall-clock plot" for name in unplaced]
    return notes


def _page(runs: list[Run], title: str, images: list[tuple[str, str]]) -> str:
    esc = html.escape
    generated = datetime.datetime.now().astimezone().isoformat(timespec="seconds")
    header = "".join(f"<th>{esc(name)}</th>" for name, _ in COLUMNS)
    rows = "".join("<tr>" + "".join(f"<td>{esc(cell(run))}</td>" for _, cell in COLUMNS) + "</tr>\n" for run in runs)
    notes = "".join(f'<p class="note">{esc(note)}</p>\n' for note in _notes(runs))
    plots = "".join(
        f'<figure><figcaption>{esc(caption)}</figcaption><img src="{esc(src)}" alt="{esc(caption)}"></figure>\n'
        for src, caption in images
    )
    return (
        f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8"><title>{esc(title)}</title>'
        f"<style>{STYLE}</style></head>\n<body><h1>{esc(title)}</h1>\n<p>Generated {esc(generated)}</p>\n"
        f"<table><tr>{header}</tr>\n{rows}</table>\n{_cpu_table(runs)}{notes}{plots}</body></html>\n"
    )
