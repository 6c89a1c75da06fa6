"""Whether a run's controllers disagree by export or by the task's chaos: paired outcomes, as a raw result.

    python3 benchmarks/controller_agreement.py RUN [--episodes 50] [--hz 120] [--delay-ms 10] [--nominal]
        [--int8] [--epsilon 1e-7] [--threshold 1e-4] [--task T] [--graphs-dir DIR] [--json OUT.json]

Runs the agreement check (deploy_npu/agreement_run.py) in this process: the run's float ONNX
graph, its torch policy, the torch policy again, the torch policy with every action moved by
--epsilon, and with --int8 the int8 graph, over the same seeded episodes at deploy-check's
operating point. Prints each controller's successes, then one row per pair: flips (episodes one
wins and the other loses), the success-rate difference with its paired standard error, the
largest action gap on identical inputs, and how many episodes' trajectories part (the achieved
goal off by more than --threshold) and at which median tick. The raw result holds every
episode's outcome per controller and every pair's divergence ticks. Exit status 1 when torch run
again differs from torch (the drive is not deterministic: no other figure can be read), 2 for input
it cannot use.
"""

from __future__ import annotations

import argparse
import pathlib
import sys
import time

from harness import print_table, result_record, write_result  # benchmarks/harness.py (this script's folder)

REPO = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from deploy_npu.agreement import AgreementReport  # noqa: E402 - after the path above


def success_rows(report: AgreementReport) -> dict[str, dict[str, object]]:
    """One table row per controller: its successes and rate over the shared episodes."""
    return {
        name: {"successes": sum(won), "episodes": len(won), "success rate": round(sum(won) / len(won), 3)}
        for name, won in report.outcomes.items()
    }


def pair_rows(report: AgreementReport) -> dict[str, dict[str, object]]:
    """One table row per pair, in the report's order (the export, the chaos floor, determinism, int8)."""
    rows: dict[str, dict[str, object]] = {}
    for p in report.pairs:
        rows[f"{p.a} vs {p.b}"] = {
            "flips": p.flips,
            "won by a only / b only": f"{p.a_only} / {p.b_only}",
            "difference": round(p.rate_difference, 3),
            "paired SE": None if p.paired_se is None else round(p.paired_se, 3),
            "action gap, same input": p.first_action_gap,
            "parted": f"{p.diverged}/{p.episodes}",
            "median tick parted": _tick(p.median_divergence_tick),
        }
    return rows


def _tick(tick: float | None) -> float | int | None:
    """A median tick as the table shows it: whole where it is whole (odd episode counts)."""
    return int(tick) if tick is not None and tick.is_integer() else tick


def main() -> int:
    from deploy_npu.agreement_run import agreement
    from foundation.errors import FleetrlError

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("run_dir")
    parser.add_argument("--episodes", type=int, default=50)
    parser.add_argument("--hz", type=float, default=120.0)
    parser.add_argument("--delay-ms", type=float, default=10.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--nominal", action="store_true", help="the nominal task (default: the run's randomization)")
    parser.add_argument("--int8", action="store_true", help="also the int8 graph (deploy_npu/quantize.py)")
    parser.add_argument("--epsilon", type=float, default=1e-7, help="torch+eps: the move of every action component")
    parser.add_argument("--threshold", type=float, default=1e-4, help="achieved-goal gap at which trajectories part")
    parser.add_argument("--task", help="the task of a multi-task run")
    parser.add_argument("--graphs-dir", help="where the graphs are written (default RUN/agreement/)")
    parser.add_argument("--json", help="write the raw result here")
    args = parser.parse_args()
    started = time.monotonic()
    try:
        report = agreement(
            args.run_dir, hz=args.hz, delay_ms=args.delay_ms, episodes=args.episodes, seed=args.seed,
            nominal=args.nominal, int8=args.int8, epsilon=args.epsilon, divergence_threshold=args.threshold,
            task=args.task, graphs_dir=args.graphs_dir,
        )  # fmt: skip
    except FleetrlError as exc:  # input it cannot use: the message names the value and the limit
        parser.error(str(exc))
    wall = round(time.monotonic() - started, 1)
    print(report.summary())
    print_table(f"success on the same {report.setting.episodes} episodes", success_rows(report))
    print_table("pairs on the same episodes (a vs b; difference: a's rate - b's)", pair_rows(report))
    print(f"agreement wall-clock {wall} s")
    if args.json:
        figures = {"wall_sec": wall, "run_dir": args.run_dir, **report.to_dict()}
        write_result(result_record("controller_agreement", figures), args.json)
    return 0 if report.deterministic else 1


if __name__ == "__main__":
    sys.exit(main())
