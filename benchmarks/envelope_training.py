"""Which training widens a controller's envelope, and what it costs in time to the target.

    python3 benchmarks/envelope_training.py --seeds 0 --cap-sec 900 --episodes 20 --out-dir runs/widen \\
        --json benchmarks/results/OUT.json [--arms none,preset,wide] [--task FetchPush-v4] [--workers N]

Per arm and seed, `fleetrl train --task TASK --seed S --max-wall-sec CAP --run-dir OUT_DIR/<arm>-seed<S>`
with the arm's options (ARMS; the run stops at its target, 90% success over 50 evaluation
episodes), then the run's envelope (`fleetrl deploy-check --sweep`) on the preset's ranges:
OUT_DIR/preset-ranges.json, what `fleetrl config --task TASK --json` resolves. Every arm so meets
the same points and the same seeded episodes, whatever ranges it trained on.

Per run: time to the target and whether it was reached (summary.json) and its ratio to the same
seed's preset run; per axis `falls_below`, the carry (CARRY_DOC) and the goal shares: success as a
share of nominal at 1.5x the preset's half-width (scale axes, the lower side) and at 2 ticks of
delay. The widest training is the one whose carry is furthest out on the most VERDICT_AXES
(`widest`). The JSON is written after every training and every sweep; a run already in it is not
done again, so the script continues where it stopped.
"""

from __future__ import annotations

import argparse
import json
import math
import pathlib
import statistics
import subprocess
import sys
import time
from typing import Any

from harness import (  # benchmarks/harness.py (this script's folder)
    REPO,
    print_table,
    ratio,
    result_record,
    start_train,
    wait_train,
    write_result,
)

sys.path.insert(0, str(REPO))

from deploy_npu.envelope import AXES, SCALE_AXES, AxisResult, SweepRanges, ranges_of  # noqa: E402 - after the path
from foundation.config import RandomizationConfig, RunConfig  # noqa: E402

PRESET = "preset"
ARMS = ("none", PRESET, "wide")
WIDEN_FACTOR = 2.0  # the wide arm: every scale range of the preset with its half-width doubled
GOAL_TIME_RATIO = 1.3  # the widest training's time to the target may cost at most this much of the preset's
VERDICT_AXES = (*SCALE_AXES, "delay_ticks", "obs_noise_std")  # the knobs a training's randomization sets
CARRY_DOC = (
    "distance from nominal to the nearer point where success falls below 80% of nominal, in the axis's units; "
    "None: it holds over the whole swept range; 0: it fails at nominal"
)
SWEEP_SEED = 0  # every run is swept on the same episodes


def arm_options(arm: str, preset: RandomizationConfig) -> list[str]:
    """The `fleetrl train` options of an arm: none turns randomization off, wide widens the preset's."""
    if arm == "none":
        return ["--set", "sim.randomization.enabled=false"]
    if arm == "wide":
        return [option for axis in SCALE_AXES for option in ("--set", widened(axis, preset, WIDEN_FACTOR))]
    return []


def widened(axis: str, preset: RandomizationConfig, factor: float) -> str:
    """`sim.randomization.<axis>=[low, high]`: the preset's range about its centre, `factor` times as wide."""
    low, high = getattr(preset, axis)
    centre, half = (low + high) / 2, (high - low) / 2 * factor
    if centre - half <= 0:
        raise SystemExit(f"{axis}: {factor}x the preset's range {low}..{high} reaches {centre - half:g} <= 0")
    return f"sim.randomization.{axis}=[{round(centre - half, 4)}, {round(centre + half, 4)}]"


def carry(axis: AxisResult, graph: str = "float") -> float | None:
    """How far the controller carries on `axis` (CARRY_DOC)."""
    if axis.success[graph][axis.values.index(axis.nominal_value)] == 0:
        return 0.0
    below = axis.falls_below.get(graph) or []
    distances = [abs(v - axis.nominal_value) for v in below if v is not None and not isinstance(v, str)]
    return round(min(distances), 6) if distances else None


def median_carry(carries: list[float | None]) -> float | None:
    """The median of carries (None counting as furthest out), one of the values itself."""
    if not carries:
        return None
    middle = statistics.median_low([math.inf if c is None else c for c in carries])
    return None if middle == math.inf else middle


def widest(carries: dict[str, dict[str, float | None]]) -> dict[str, Any]:
    """The verdict over arms' carries (arm -> axis -> carry): on each of VERDICT_AXES every arm
    swept on, the arms with the furthest carry win it (tied arms all win; an axis where every arm
    ties decides nothing); the widest are the arms with the most wins (several: a tie)."""
    arms = list(carries)
    axes = [a for a in VERDICT_AXES if arms and all(a in carries[arm] for arm in arms)]
    winners: dict[str, list[str]] = {}
    for axis in axes:
        reach = {arm: math.inf if carries[arm][axis] is None else carries[arm][axis] for arm in arms}
        top = [arm for arm in arms if reach[arm] == max(reach.values())]
        winners[axis] = top if len(top) < len(arms) else []
    wins = {arm: sum(arm in top for top in winners.values()) for arm in arms}
    most = max(wins.values(), default=0)
    best = [arm for arm in arms if most and wins[arm] == most]
    return {"axis_winners": winners, "wins": wins, "widest": best, "tie": len(best) > 1}


def time_ratios(runs: dict[str, dict[str, Any]], arm: str) -> list[float | None]:
    """Per seed, the arm's time to the target over the same seed's preset run (None: either missed it)."""
    out = []
    for run in (r for r in runs.values() if r["arm"] == arm):
        preset = runs.get(f"{PRESET}-seed{run['seed']}", {}).get("train", {})
        own = run.get("train", {})
        out.append(ratio(_to_target(own), _to_target(preset)))
    return out


def _to_target(train: dict[str, Any]) -> float | None:
    return train.get("wall_sec_to_target") if train.get("reached_target") else None


def summarize(runs: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """Per arm, over its seeds: reached, median time and ratio to the preset, median carry and
    goal share per axis; and the verdict on the median carries, with the widest's time ratio."""
    arms: dict[str, dict[str, Any]] = {}
    for arm in dict.fromkeys(r["arm"] for r in runs.values()):
        mine = [r for r in runs.values() if r["arm"] == arm]
        swept = [r["sweep"] for r in mine if "sweep" in r]
        times = [_to_target(r.get("train", {})) for r in mine]
        ratios = time_ratios(runs, arm)
        axes = list(dict.fromkeys(a for s in swept for a in s["carry"]))
        arms[arm] = {
            "seeds": len(mine),
            "reached": sum(t is not None for t in times),
            "sec_to_target_median": _median([t for t in times if t is not None]),
            "time_ratio_to_preset": ratios,
            "time_ratio_median": _median([r for r in ratios if r is not None]),
            "carry_median": {a: median_carry([s["carry"][a] for s in swept if a in s["carry"]]) for a in axes},
            "goal_share_median": {
                a: _median([s["goal_shares"][a] for s in swept if s["goal_shares"].get(a) is not None])
                for a in dict.fromkeys(a for s in swept for a in s["goal_shares"])
            },
        }
    verdict = widest({arm: figures["carry_median"] for arm, figures in arms.items() if figures["carry_median"]})
    verdict["time_ratio_median"] = {arm: arms[arm]["time_ratio_median"] for arm in verdict["widest"]}
    verdict["goal_time_ratio"] = GOAL_TIME_RATIO
    return {"arms": arms, "verdict": verdict}


def _median(values: list[float]) -> float | None:
    return round(statistics.median(values), 3) if values else None


def train(run_dir: pathlib.Path, argv: list[str], swept_on: SweepRanges) -> dict[str, Any]:
    """Train one run to its target or the cap: what its summary.json says of the target, and
    whether it trained on the ranges every run is swept on (the preset arm must)."""
    started = time.monotonic()
    status = wait_train(start_train([*argv, "--run-dir", str(run_dir)], run_dir.with_suffix(".log")))
    summary_path = run_dir / "summary.json"
    if status != 0 or not summary_path.exists():
        return {"error": f"fleetrl train exited {status}; see {run_dir.with_suffix('.log')}"}
    summary = json.loads(summary_path.read_text())
    return {
        "wall_sec": round(time.monotonic() - started, 1),
        "reached_target": bool(summary.get("reached_target")),
        "wall_sec_to_target": summary.get("wall_sec_to_target"),
        "env_steps_to_target": summary.get("env_steps_to_target"),
        "best_success": summary.get("best_success"),
        "trained_on_sweep_ranges": RunConfig.load(run_dir / "config.json").sim.randomization == swept_on.randomization,
    }


def sweep_run(run_dir: pathlib.Path, ranges: SweepRanges, args: argparse.Namespace) -> dict[str, Any]:
    """The run's float envelope on `ranges`: per axis falls_below and carry, and the goal shares."""
    from robustness_envelope import goal_figures

    from deploy_npu.envelope_run import SweepSetting, sweep

    setting = SweepSetting(
        hz=args.hz, delay_ms=args.delay_ms, episodes=args.episodes, seed=SWEEP_SEED, workers=args.workers,
        axes=tuple(args.axes.split(",")), ranges=ranges,
    )  # fmt: skip
    (envelope,) = sweep(run_dir, setting, progress=lambda line: print(f"  {line}"))
    return {
        "wall_sec": envelope.wall_sec,
        "envelope": str(run_dir / "envelope" / f"{envelope.task}.json"),
        "ranges_from": envelope.ranges_from,
        "falls_below": {a.axis: a.falls_below["float"] for a in envelope.axes},
        "carry": {a.axis: carry(a) for a in envelope.axes if a.axis in VERDICT_AXES},
        "goal_shares": goal_figures(envelope)["float"],
    }


def preset_ranges(task: str, out_dir: pathlib.Path) -> SweepRanges:
    """OUT_DIR/preset-ranges.json, the task's preset as `fleetrl config` resolves it (written once)."""
    path = out_dir / "preset-ranges.json"
    if not path.exists():
        cmd = [sys.executable, "-m", "fleet.cli.main", "config", "--task", task, "--json"]
        path.write_text(subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, check=True).stdout)
    return ranges_of(path)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--task", default="FetchPush-v4", help="the task, with its preset")
    p.add_argument("--seeds", type=int, nargs="+", default=[0], help="training seeds")
    p.add_argument("--arms", default=",".join(ARMS), help=f"comma-separated, of {', '.join(ARMS)}")
    p.add_argument("--cap-sec", type=float, default=900.0, help="every training's --max-wall-sec")
    p.add_argument("--episodes", type=int, default=20, help="episodes a point of every sweep")
    p.add_argument("--hz", type=float, default=120.0, help="the sweeps' control rate")
    p.add_argument("--delay-ms", type=float, default=10.0, help="the sweeps' actuation delay")
    p.add_argument("--axes", default=",".join(AXES), help="the swept axes, comma-separated")
    p.add_argument("--workers", type=int, help="sweep worker processes (default: one per core)")
    p.add_argument("--out-dir", required=True, help="the runs, their logs and preset-ranges.json")
    p.add_argument("--json", required=True, help="the raw result, written after every step; runs in it are kept")
    return p


def _settings(args: argparse.Namespace) -> dict[str, Any]:
    keys = ("task", "cap_sec", "episodes", "hz", "delay_ms", "axes")
    return {k: getattr(args, k) for k in keys} | {"sweep_seed": SWEEP_SEED}


def _load(path: pathlib.Path, settings: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The runs of an earlier invocation with the same settings (none: a fresh start)."""
    if not path.exists():
        return {}
    figures = json.loads(path.read_text())["figures"]
    if changed := [k for k, v in settings.items() if figures["settings"].get(k) != v]:
        raise SystemExit(f"--json {path} was made with other {', '.join(changed)}: pass another --json")
    return figures["runs"]


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    arms = [a for a in args.arms.split(",") if a]
    if unknown := sorted(set(arms) - set(ARMS)):
        _parser().error(f"--arms: unknown {', '.join(unknown)} (known: {', '.join(ARMS)})")
    out_dir, out = pathlib.Path(args.out_dir), pathlib.Path(args.json)
    out_dir.mkdir(parents=True, exist_ok=True)
    settings = _settings(args)
    runs = _load(out, settings)
    ranges = preset_ranges(args.task, out_dir)
    clock = _Clock()
    for seed in args.seeds:
        for arm in arms:
            key, run_dir = f"{arm}-seed{seed}", out_dir / f"{arm}-seed{seed}"
            run = runs.setdefault(key, {"arm": arm, "seed": seed, "run_dir": str(run_dir)})
            if "train" not in run:
                if run_dir.exists():
                    raise SystemExit(
                        f"{run_dir} exists but --json has no training of it: remove it or use another --out-dir"
                    )
                run["options"] = arm_options(arm, ranges.randomization)
                clock.say(f"{key}: training, cap {args.cap_sec:g} s {' '.join(run['options'])}")
                base = ["--task", args.task, "--seed", str(seed), "--max-wall-sec", str(args.cap_sec)]
                run["train"] = train(run_dir, [*base, *run["options"]], ranges)
                clock.say(f"{key}: {json.dumps(run['train'])}")
                _write(out, settings, runs)
            if "sweep" not in run and "error" not in run["train"]:
                clock.say(f"{key}: sweeping on the ranges of {ranges.source}")
                run["sweep"] = sweep_run(run_dir, ranges, args)
                _write(out, settings, runs)
    _print(summarize(runs))
    return 0


class _Clock:
    """Progress lines with the seconds since the script started."""

    def __init__(self) -> None:
        self.started = time.monotonic()

    def say(self, line: str) -> None:
        print(f"[{time.monotonic() - self.started:.0f} s] {line}", flush=True)


def _write(out: pathlib.Path, settings: dict[str, Any], runs: dict[str, dict[str, Any]]) -> None:
    figures = {"settings": settings, "runs": runs, **summarize(runs), "carry_definition": CARRY_DOC}
    write_result(result_record("envelope_training", figures), out)


def _print(summary: dict[str, Any]) -> None:
    arms = summary["arms"]
    rows = {
        arm: {"reached": f"{a['reached']}/{a['seeds']}", "sec_to_target": a["sec_to_target_median"],
              "time_ratio_to_preset": a["time_ratio_median"], "axes_won": summary["verdict"]["wins"].get(arm)}
        for arm, a in arms.items()
    }  # fmt: skip
    print_table("time to the target, medians over seeds", rows)
    print_table(
        "carry (distance to the 80% point; - = beyond the swept range)", {a: f["carry_median"] for a, f in arms.items()}
    )
    verdict = summary["verdict"]
    print(
        f"widest: {', '.join(verdict['widest']) or 'none'}{' (a tie)' if verdict['tie'] else ''}; "
        f"time ratio {verdict['time_ratio_median']} (goal <= {GOAL_TIME_RATIO})"
    )


if __name__ == "__main__":
    sys.exit(main())
