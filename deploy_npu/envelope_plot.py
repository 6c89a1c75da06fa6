"""The robustness envelope as one picture: a panel per axis, success against the perturbation.

Each panel shades the run's training range, draws the line at 80% of the nominal score, and marks
where success first falls below it (deploy_npu/envelope.py). Float and int8 graphs share a panel.
"""

from __future__ import annotations

import math
import pathlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from deploy_npu.envelope import AxisResult, Envelope

COLOURS = {"float": "tab:blue", "int8": "tab:orange"}


def plot_envelope(envelope: Envelope, out: pathlib.Path) -> pathlib.Path:
    """Write the envelope's panels to `out` (PNG)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cols = 4
    rows = max(1, math.ceil(len(envelope.axes) / cols))
    fig, grid = plt.subplots(rows, cols, figsize=(4 * cols, 3 * rows), squeeze=False)
    for panel, axis in zip(grid.flat, envelope.axes, strict=False):
        _panel(panel, axis)
    for panel in list(grid.flat)[len(envelope.axes) :]:
        panel.set_visible(False)
    fig.suptitle(
        f"{envelope.task}: success over {envelope.episodes} episodes per point at {envelope.hz:g} Hz "
        "(shaded: training range; dotted: 80% of nominal)"
    )
    fig.tight_layout()
    fig.savefig(out, dpi=80)
    plt.close(fig)
    return out


def _panel(panel, axis: AxisResult) -> None:
    categorical = any(isinstance(v, str) for v in axis.values)
    xs = list(range(len(axis.values))) if categorical else axis.values
    nominal_at = axis.values.index(axis.nominal_value)
    for graph, success in axis.success.items():
        colour = COLOURS.get(graph, "tab:green")
        panel.plot(xs, success, "o-", color=colour, label=graph)
        panel.axhline(0.8 * success[nominal_at], color=colour, linestyle=":", linewidth=1)
        if not categorical:
            for x in axis.falls_below.get(graph, []):
                if x is not None:
                    panel.axvline(x, color=colour, linestyle="--", linewidth=1)
    if axis.training_range is not None and not categorical:
        panel.axvspan(*axis.training_range, color="grey", alpha=0.2)
    if categorical:
        panel.set_xticks(xs, [str(v) for v in axis.values])
    panel.set_title(axis.axis)
    panel.set_ylim(-0.05, 1.05)
    panel.set_ylabel("success")
    panel.legend(fontsize="small")
