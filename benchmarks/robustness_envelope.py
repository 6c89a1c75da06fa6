"""How far a run's controllers carry: the robustness envelope, with its cost, as a raw result.

    python3 benchmarks/robustness_envelope.py RUN [--hz 120] [--delay-ms 10] [--episodes 20] [--int8]
        [--axes mass_scale,delay_ticks] [--workers 2] [--json benchmarks/results/OUT.json]

Runs `fleetrl deploy-check RUN --sweep` (deploy_npu/envelope_run.py) in this process and prints,
per task, axis and graph: the nominal success, the training range and where success first falls
below 80% of nominal on either side; then the goal figures: success at 1.5x the training range on
every scaled-dynamics axis and at 2 ticks of delay, each as a share of nominal, and the int8
graph's largest distance from the float graph over every point. The sweep's wall-clock is its cost.
"""

from __future__ import annotations

import argparse
import pathlib
import sys
import time

from harness import print_table, result_record, write_result  # benchmarks/harness.py (this script's folder)

REPO = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from deploy_npu.envelope import SCALE_AXES, AxisResult, Envelope  # noqa: E402 - after the path above


def at_value(axis: AxisResult, graph: str, value: float) -> float | None:
    """Success of `graph` at the point of `axis` nearest `value` (None: the axis has no such point)."""
    numeric = [(abs(v - value), i) for i, v in enumerate(axis.values) if not isinstance(v, str)]
    if not numeric:
        return None
    distance, index = min(numeric)
    return axis.success[graph][index] if distance < 1e-6 else None


def goal_figures(envelope: Envelope) -> dict[str, object]:
    """Per graph, success as a share of nominal at 1.5x the half-width each scaled axis was swept
    at (the run's training range, or the ranges it was swept on; both sides, the lower of the
    two) and at 2 ticks of delay; and int8's largest gap to float."""
    figures: dict[str, object] = {}
    axes = {a.axis: a for a in envelope.axes}
    for graph in envelope.graphs:
        shares = {}
        for name in [a for a in SCALE_AXES if a in axes] + (["delay_ticks"] if "delay_ticks" in axes else []):
            axis = axes[name]
            nominal = axis.success[graph][axis.values.index(axis.nominal_value)]
            if name == "delay_ticks":
                points = [2.0]
            else:
                half = envelope.half_widths[name]
                points = [1.0 - 1.5 * half, 1.0 + 1.5 * half]
            rates = [at_value(axis, graph, round(p, 4)) for p in points]
            worst = min((r for r in rates if r is not None), default=None)
            shares[name] = None if worst is None or nominal == 0 else round(worst / nominal, 3)
        figures[graph] = shares
    if {"float", "int8"} <= set(envelope.graphs):
        gaps = [abs(f - q) for a in envelope.axes for f, q in zip(a.success["float"], a.success["int8"], strict=True)]
        figures["int8_max_gap"] = round(max(gaps), 3) if gaps else None
    return figures


def rows(envelope: Envelope) -> dict[str, dict[str, object]]:
    """One table row per axis and graph."""
    out = {}
    for axis in envelope.axes:
        for graph, rates in axis.success.items():
            out[f"{axis.axis} {graph}"] = {
                "nominal": rates[axis.values.index(axis.nominal_value)],
                "trained": axis.training_range,
                "below 80% at": axis.falls_below.get(graph),
            }
    return out


def main() -> int:
    from deploy_npu.envelope import AXES
    from deploy_npu.envelope_run import SweepSetting, sweep

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("run_dir")
    parser.add_argument("--hz", type=float, default=120.0)
    parser.add_argument("--delay-ms", type=float, default=10.0)
    parser.add_argument("--episodes", type=int, default=20)
    parser.add_argument("--int8", action="store_true")
    parser.add_argument("--axes", default=",".join(AXES))
    parser.add_argument("--workers", type=int, default=None)
    parser.add_argument("--json", help="write the raw result here")
    args = parser.parse_args()
    started = time.monotonic()
    setting = SweepSetting(hz=args.hz, delay_ms=args.delay_ms, episodes=args.episodes, int8=args.int8,
                           workers=args.workers, axes=tuple(args.axes.split(",")))  # fmt: skip
    envelopes = sweep(args.run_dir, setting)
    wall = round(time.monotonic() - started, 1)
    for envelope in envelopes:
        print_table(f"envelope of {envelope.task} ({envelope.episodes} episodes a point)", rows(envelope))
        print(f"{envelope.task}: {goal_figures(envelope)}")
    print(f"sweep wall-clock {wall} s on {envelopes[0].workers} worker(s)")
    if args.json:
        import dataclasses

        figures = {"sweep_wall_sec": wall, "tasks": {e.task: goal_figures(e) for e in envelopes}}
        figures["envelopes"] = [dataclasses.asdict(e) for e in envelopes]
        write_result(result_record("robustness_envelope", figures), args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
