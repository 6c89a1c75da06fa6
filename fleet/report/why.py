"""`fleetrl evaluate --why`'s outputs: the class table (printed and JSON) and a plot per task.

    text = class_table(task, verdicts)                 # counts per class, by goal height where it matters
    doc = write_why(diagnosis, setting, out_dir)       # <stem>.json and <stem>.png (<stem>_<task>.png: several)

The classes and their rules are sim/failures.py's; this module only counts and draws them.
"""

from __future__ import annotations

import json
import pathlib
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from sim.failures import CLASSIFIERS, GOAL_IN_AIR_M, LIFT_M, NEAR_GOAL_M, SUCCESS, SUCCESS_M, Verdict

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

    from sampler.why import Diagnosis

TASK_COLORS = "tab10"  # a failure class's colour, in the task's class order; success is grey
SUCCESS_COLOR = "0.75"
COLUMNS = ("goal_in_air", "goal_on_table", "all")
HEADINGS = {"goal_in_air": "goal in air", "goal_on_table": "goal on table", "all": "all"}


@dataclass(frozen=True)
class WhySetting:
    """What was scored: printed above each table and kept in the JSON."""

    run_dir: str
    weights: str
    first_seed: int
    episodes: int  # per task

    def stem(self, diagnosis: Diagnosis) -> str:
        """The files' name: the checkpoint's, and the weights when not the live actor's."""
        stem = diagnosis.checkpoint.stem
        return stem if self.weights == "live" else f"{stem}_{self.weights}"


def columns(task: str) -> tuple[str, ...]:
    """The table's columns: split by goal height for a task that puts goals in the air and on the table."""
    return COLUMNS if CLASSIFIERS[task].goal_heights else ("all",)


def counts(task: str, verdicts: list[Verdict]) -> dict[str, dict[str, int]]:
    """{class: {column: episodes}} for every class of the task, in its order, zeros included."""
    out = {c.name: dict.fromkeys(columns(task), 0) for c in CLASSIFIERS[task].classes}
    for v in verdicts:
        out[v.label]["all"] += 1
        if CLASSIFIERS[task].goal_heights:
            out[v.label]["goal_in_air" if v.goal_in_air else "goal_on_table"] += 1
    return out


def class_table(task: str, verdicts: list[Verdict]) -> str:
    """The printed table: a row per class, each cell episodes (share of the column's episodes),
    the episodes per column, then every class's rule."""
    table = counts(task, verdicts)
    cols = columns(task)
    totals = {col: sum(row[col] for row in table.values()) for col in cols}
    width = max(len(name) for name in table) + 2
    lines = [" " * width + "".join(f"{HEADINGS[col]:>16}" for col in cols)]
    for name, row in table.items():
        cells = [f"{row[col]} ({row[col] / totals[col]:.0%})" if row[col] else "0" for col in cols]
        lines.append(f"{name:<{width}}" + "".join(f"{cell:>16}" for cell in cells))
    lines.append(f"{'episodes':<{width}}" + "".join(f"{totals[col]:>16}" for col in cols))
    lines.append("")
    lines += [f"  {c.name}: {c.rule}" for c in CLASSIFIERS[task].classes]
    return "\n".join(lines)


def heading(task: str, diagnosis: Diagnosis, setting: WhySetting) -> str:
    last = setting.first_seed + setting.episodes - 1
    return (
        f"{task}: {diagnosis.checkpoint.name} (version {diagnosis.version}, {setting.weights} weights), "
        f"{setting.episodes} episodes on seeds {setting.first_seed}-{last}"
    )


def document(diagnosis: Diagnosis, setting: WhySetting, plots: dict[str, str]) -> dict[str, Any]:
    """The JSON: what was scored, the thresholds, and per task the table, the plot and every episode."""
    tasks = {}
    for task, verdicts in diagnosis.tasks.items():
        rules = {c.name: c.rule for c in CLASSIFIERS[task].classes}
        table = counts(task, verdicts)
        tasks[task] = {
            "success_rate": sum(v.label == SUCCESS for v in verdicts) / len(verdicts),
            "classes": {name: {"rule": rules[name], **row} for name, row in table.items()},
            "plot": plots[task],
            "episodes": [v.to_dict() for v in verdicts],
        }
    thresholds = {"success_m": SUCCESS_M, "near_goal_m": NEAR_GOAL_M, "lift_m": LIFT_M, "goal_in_air_m": GOAL_IN_AIR_M}
    return {
        "run_dir": setting.run_dir,
        "checkpoint": diagnosis.checkpoint.name,
        "version": diagnosis.version,
        "weights": setting.weights,
        "first_seed": setting.first_seed,
        "episodes": setting.episodes,
        "thresholds": thresholds,
        "tasks": tasks,
        "skipped": diagnosis.skipped,
    }


def write_why(diagnosis: Diagnosis, setting: WhySetting, out_dir: pathlib.Path) -> dict[str, Any]:
    """<out_dir>/<stem>.json and a PNG per task beside it; returns the JSON document written."""
    import matplotlib

    matplotlib.use("Agg")  # files only: never open a window, work without a display
    out_dir.mkdir(parents=True, exist_ok=True)
    stem = setting.stem(diagnosis)
    plots = {}
    for task, verdicts in diagnosis.tasks.items():
        png = out_dir / (f"{stem}.png" if len(diagnosis.tasks) == 1 else f"{stem}_{task}.png")
        why_figure(task, verdicts, heading(task, diagnosis, setting)).savefig(png, dpi=100)
        plots[task] = str(png)
    doc = document(diagnosis, setting, plots)
    (out_dir / f"{stem}.json").write_text(json.dumps(doc, indent=1) + "\n")
    return doc


def why_figure(task: str, verdicts: list[Verdict], title: str) -> Figure:
    """Two panels, a point per episode coloured by its class: where the goal lay from the object's
    start (seen from above), and what the rules read: the goal's height against the object's
    highest lift (goals in the air and on the table), else where the object ended against the
    start-to-goal line."""
    from matplotlib.figure import Figure

    figure = Figure(figsize=(11, 4.5))
    top, rules = figure.subplots(1, 2)
    colors = _colors(task)
    for name, color in colors.items():
        group = [v for v in verdicts if v.label == name]
        if not group:
            continue
        label = f"{name} ({len(group)})"
        for in_air in (False, True):
            part = [v for v in group if v.goal_in_air == in_air]
            marker = "^" if in_air else "o"
            _top_view(top, part, color, marker)
            if CLASSIFIERS[task].goal_heights:
                rules.scatter([v.goal_height_m for v in part], [v.max_lift_m for v in part], color=color, marker=marker)
            else:
                rules.scatter(
                    [v.line.along_m for v in part], [v.line.lateral_m for v in part], color=color, marker=marker
                )
        top.scatter([], [], color=color, label=label)  # one legend entry per class
    _label_panels(task, top, rules)
    figure.suptitle(title, fontsize="small")
    figure.tight_layout()
    return figure


def _colors(task: str) -> dict[str, Any]:
    from matplotlib import colormaps

    palette = colormaps[TASK_COLORS].colors  # type: ignore[attr-defined]  # a ListedColormap: its ten colours
    failures = [c.name for c in CLASSIFIERS[task].classes if c.name != SUCCESS]
    return {SUCCESS: SUCCESS_COLOR, **{name: palette[i % len(palette)] for i, name in enumerate(failures)}}


def _top_view(ax: Axes, verdicts: list[Verdict], color: Any, marker: str) -> None:
    dx = [v.goal[0] - v.object_start[0] for v in verdicts]
    dy = [v.goal[1] - v.object_start[1] for v in verdicts]
    ax.scatter(dx, dy, color=color, marker=marker)


def _label_panels(task: str, top: Axes, rules: Axes) -> None:
    top.set_xlabel("goal x - object start x (m)")
    top.set_ylabel("goal y - object start y (m)")
    in_air = " (^: in the air)" if CLASSIFIERS[task].goal_heights else ""
    top.set_title(f"goals from the object's start, from above{in_air}")
    top.set_aspect("equal", adjustable="datalim")
    top.legend(fontsize="x-small")
    if CLASSIFIERS[task].goal_heights:
        rules.axhline(LIFT_M, color="0.5", linestyle=":", linewidth=1)
        rules.set_xlabel("goal height above the table (m)")
        rules.set_ylabel("object's highest lift (m)")
        rules.set_title(f"lifted: above the dotted line ({LIFT_M * 100:g} cm)")
    else:
        from matplotlib.patches import Circle

        rules.axvline(0.0, color="0.5", linestyle=":", linewidth=1)
        rules.add_patch(Circle((0.0, 0.0), SUCCESS_M, fill=False, color="0.5", linestyle="--"))
        rules.set_aspect("equal", adjustable="datalim")  # metres alike on both axes: the circle is round
        rules.set_xlabel("object's end past the goal along the start-to-goal line (m)")
        rules.set_ylabel("off the line (m)")
        rules.set_title(f"where the object ended: short < 0 < past (dashed: {SUCCESS_M * 100:g} cm)")
    for ax in (top, rules):
        ax.grid(alpha=0.3)
