"""`fleetrl report`'s multi-task plots: each task's curve, and what a MoE's experts learned.

    figure = task_curve_figure(runs, label)   # success per task vs wall-clock (curve scores)
    figure = routing_figure(run)          # per network and layer: tasks x experts, the gates

Both return None when no run has the data (a single-task run; a dense or state-routed MoE).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from matplotlib.figure import Figure

RUN_STYLES = ("-", "--", ":", "-.")  # a run's line style; a task's colour is its own (TASK_COLORS)
TASK_COLORS = "tab10"  # matplotlib's qualitative cycle: ten colours told apart at a glance


def task_curves(evals: list[dict[str, Any]]) -> dict[str, list[tuple[float, float]]]:
    """Per task: (wall-clock minutes, curve success) of every live-policy curve score."""
    out: dict[str, list[tuple[float, float]]] = {}
    for e in evals:
        if e.get("kind", "curve") not in ("curve", "") or not isinstance(e.get("wall_sec"), int | float):
            continue
        for task, rate in (e.get("task_success") or {}).items():
            out.setdefault(task, []).append((e["wall_sec"] / 60, float(rate)))
    return {task: sorted(points) for task, points in sorted(out.items())}


def task_curve_figure(runs: list[Any], label: Any) -> Figure | None:
    """One line per (run, task): the task's colour (tab10, in order of first appearance), the
    run's line style. `label` shortens names."""
    from matplotlib import colormaps
    from matplotlib.figure import Figure

    lines = [(i, run, task, pts) for i, run in enumerate(runs) for task, pts in task_curves(run.evals).items()]
    if not lines:
        return None
    figure = Figure(figsize=(8, 4.5))
    ax = figure.add_subplot()
    palette = colormaps[TASK_COLORS].colors  # type: ignore[attr-defined]  # a ListedColormap: its ten colours
    colors: dict[str, Any] = {}
    for i, run, task, pts in lines:
        color = colors.setdefault(task, palette[len(colors) % len(palette)])
        style = RUN_STYLES[i % len(RUN_STYLES)]
        name = f"{label(run.name)}: {task}" if len(runs) > 1 else task
        ax.plot(*zip(*pts, strict=True), style, marker=".", color=color, label=name)
    ax.set_xlabel("wall-clock (min)")
    ax.set_ylabel("curve success per task")
    ax.set_ylim(-0.05, 1.05)
    ax.grid(alpha=0.3)
    ax.legend(fontsize="x-small")
    figure.tight_layout()
    return figure


def routing_figure(routing: dict[str, Any]) -> Figure | None:
    """summary.json `expert_routing` drawn: one panel per network and layer, tasks x experts,
    each cell the task's gate on that expert (blank: not chosen); the title gives the layer's
    experts used and load max/mean."""
    from matplotlib.figure import Figure

    panels = [
        (net, layer, row)
        for net, layers in routing.items()
        if isinstance(layers, dict)
        for layer, row in layers.items()
    ]
    if not panels:
        return None
    tasks = list(panels[0][2]["tasks"])
    experts = 1 + max(e for _, _, row in panels for t in row["tasks"].values() for e in t["experts"])
    figure = Figure(figsize=(10, 1.0 + 0.35 * len(tasks) * len(panels)))
    for k, (net, layer, row) in enumerate(panels):
        ax = figure.add_subplot(len(panels), 1, k + 1)
        grid = [[0.0] * experts for _ in tasks]
        for t, task in enumerate(tasks):
            for e, g in zip(row["tasks"][task]["experts"], row["tasks"][task]["gates"], strict=True):
                grid[t][e] = g
        ax.imshow(grid, aspect="auto", cmap="Blues", vmin=0.0, vmax=1.0)
        ax.set_yticks(range(len(tasks)), tasks, fontsize="x-small")
        ax.set_xticks(range(experts), [str(e) if e % 4 == 0 else "" for e in range(experts)], fontsize="x-small")
        ax.set_title(
            f"{net} {layer}: {row['experts_used']} experts used, load max/mean {row['load_max_over_mean']:.2f}",
            fontsize="small",
        )
    figure.supxlabel("expert")
    figure.tight_layout()
    return figure


def overlap_matrix(routing: dict[str, Any], net: str = "actor") -> tuple[list[str], list[list[float]]] | None:
    """`net`'s task x task expert overlap, averaged over its layers (summary.json `expert_routing`):
    1 where two tasks route alike, 0 where they share no expert (foundation/routing_stats.py)."""
    layers = [row for row in (routing.get(net) or {}).values() if isinstance(row, dict)]
    if not layers:
        return None
    tasks = list(layers[0]["tasks"])
    matrix = [[1.0 if a == b else 0.0 for b in tasks] for a in tasks]
    for i, a in enumerate(tasks):
        for j, b in enumerate(tasks[i + 1 :], i + 1):
            shares = [row["overlap"].get(f"{a}|{b}", row["overlap"].get(f"{b}|{a}", 0.0)) for row in layers]
            matrix[i][j] = matrix[j][i] = sum(shares) / len(shares)
    return tasks, matrix


def overlap_figure(routing: dict[str, Any]) -> Figure | None:
    """overlap_matrix of the actor as a heatmap, each cell's value written in it."""
    from matplotlib.figure import Figure

    found = overlap_matrix(routing)
    if found is None:
        return None
    tasks, matrix = found
    figure = Figure(figsize=(2.5 + 0.55 * len(tasks), 2.0 + 0.45 * len(tasks)))
    ax = figure.add_subplot()
    image = ax.imshow(matrix, cmap="Blues", vmin=0.0, vmax=1.0)
    for i, row in enumerate(matrix):
        for j, value in enumerate(row):
            ax.text(j, i, f"{value:.2f}", ha="center", va="center", fontsize="x-small",
                    color="white" if value > 0.6 else "black")  # fmt: skip
    ax.set_xticks(range(len(tasks)), tasks, rotation=60, ha="right", fontsize="x-small")
    ax.set_yticks(range(len(tasks)), tasks, fontsize="x-small")
    figure.colorbar(image, ax=ax, fraction=0.04)
    figure.tight_layout()
    return figure
