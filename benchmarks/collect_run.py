"""Package training runs' figures as one raw result under benchmarks/results/.

    python3 benchmarks/collect_run.py RUN_DIR --command "fleetrl train --task FetchPush-v4 --seed 0" \\
        --out benchmarks/results/push-seed0.json [--commit HASH] [--note TEXT]
    python3 benchmarks/collect_run.py RUN_DIR RUN_DIR ... --command "for S in 0 1 2; do fleetrl train ...; done" \\
        --out benchmarks/results/push-time-to-90-3seeds.json

Reads each run directory `fleetrl train` leaves (summary.json, evals.jsonl, progress.jsonl,
config.json) and writes: the summary, the learning curve (every curve score; complete full
scores), success at given minutes, the config fields that differ from the built-in defaults,
and the command and commit that produced it. `--commit` defaults to this checkout's HEAD:
pass the commit the run actually used when it is older.

One run directory gives a "training_run" record whose figures are that run's. Several (the
seeds of one recipe) give a "training_runs" record: `runs`, each run's figures in the order
given with its `run_dir`, and `across_runs`, each run's minutes and env steps to the target
with their median and worst, None unless every run reached it.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import sys
from typing import Any

from harness import median_and_worst, result_record, write_result  # benchmarks/harness.py (this script's folder)

from foundation.config import RunConfig


def _jsonl(path: pathlib.Path) -> list[dict]:
    if not path.exists():
        return []
    rows = []
    for line in path.read_text().splitlines():
        try:
            rows.append(json.loads(line))
        except ValueError:
            continue  # a line torn by a crash
    return rows


def _changed(config: dict, defaults: dict, prefix: str = "") -> dict:
    out = {}
    for key, value in config.items():
        default = defaults.get(key)
        if isinstance(value, dict) and isinstance(default, dict):
            out.update(_changed(value, default, f"{prefix}{key}."))
        elif value != default and key not in ("run_dir", "run_id"):
            out[prefix + key] = value
    return out


def _reconstructed_summary(run_dir: pathlib.Path) -> dict:
    """What summary.json would say, from progress.jsonl, when the launcher died before writing
    it; the start time is config.json's (written as the run starts)."""
    progress = _jsonl(run_dir / "progress.jsonl")
    last = progress[-1] if progress else {}
    config = json.loads((run_dir / "config.json").read_text())
    return {
        "reconstructed": True,
        "task": config["sim"]["task"],
        "target_success": config.get("target_success"),
        "stop_reason": "no summary.json: reconstructed from progress.jsonl",
        "started_unix": (run_dir / "config.json").stat().st_mtime,
        "wall_sec": last.get("wall_sec"),
        "final_version": last.get("version"),
        "final_env_steps": last.get("env_steps"),
        "best_success": max((e["success_rate"] for e in _jsonl(run_dir / "evals.jsonl")), default=0.0),
    }


def collect(run_dir: pathlib.Path, minutes: list[float]) -> dict:
    path = run_dir / "summary.json"
    summary = json.loads(path.read_text()) if path.exists() else _reconstructed_summary(run_dir)
    started = summary.get("started_unix", 0.0)
    evals = _jsonl(run_dir / "evals.jsonl")
    for row in evals:
        row["wall_sec"] = round(row["time"] - started, 1) if started else None
    curve = [e for e in evals if e.get("kind", "curve") in ("curve", "")]
    full = [e for e in evals if e.get("kind") == "full"]
    progress = _jsonl(run_dir / "progress.jsonl")
    config = json.loads((run_dir / "config.json").read_text()) if (run_dir / "config.json").exists() else {}

    def curve_at(minute: float) -> float | None:
        seen = [e["success_rate"] for e in curve if e["wall_sec"] is not None and e["wall_sec"] <= 60 * minute]
        return max(seen) if seen else None

    return {
        "summary": summary,
        "config_changed": _changed(config, json.loads(RunConfig().to_json())),  # lists, as config.json has them
        "best_curve_success_by_minute": {str(m): curve_at(m) for m in minutes},
        "curve": [
            {k: e.get(k) for k in ("wall_sec", "env_steps", "version", "success_rate", "task_success") if k in e}
            for e in curve
        ],  # task_success: each task's score, in a multi-task run
        "full_scores": [
            {k: e.get(k) for k in ("wall_sec", "env_steps", "version", "success_rate", "episodes")} for e in full
        ],
        "train_success_last": progress[-1].get("train_success") if progress else None,
    }


def across_runs(runs: list[dict]) -> dict[str, Any]:
    """Time to the target over several runs' figures (collect's): each run's minutes and env steps
    to it, with their median and worst; those are None unless every run reached the target."""
    summaries = [run["summary"] for run in runs]
    minutes = [_minutes(s.get("wall_sec_to_target")) if s.get("reached_target") else None for s in summaries]
    env_steps = [s.get("env_steps_to_target") if s.get("reached_target") else None for s in summaries]
    median_minutes, worst_minutes = median_and_worst(minutes, digits=2)
    median_steps, worst_steps = median_and_worst(env_steps)
    return {
        "target_success": summaries[0].get("target_success"),
        "reached_target": sum(m is not None for m in minutes),
        "minutes_to_target": minutes,
        "median_minutes_to_target": median_minutes,
        "worst_minutes_to_target": worst_minutes,
        "env_steps_to_target": env_steps,
        "median_env_steps_to_target": median_steps,
        "worst_env_steps_to_target": worst_steps,
    }


def _minutes(wall_sec: float | None) -> float | None:
    return None if wall_sec is None else round(wall_sec / 60, 2)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument(
        "run_dirs",
        nargs="+",
        type=pathlib.Path,
        metavar="RUN_DIR",
        help="a run's directory, or several: the seeds of one recipe",
    )
    p.add_argument("--command", required=True, help="the command that produced the runs")
    p.add_argument("--out", required=True)
    p.add_argument("--commit", help="the commit the runs used (default: this checkout's HEAD)")
    p.add_argument("--note", default="", help="anything a reader must know about the runs")
    p.add_argument("--minutes", default="10,20,30,60", help="report the best curve success by these minutes")
    p.add_argument(
        "--scores",
        help='JSON of one run\'s held-out scores taken apart (fleetrl evaluate), e.g. {"30": {"success_rate": ...}}',
    )
    return p


def main(argv: list[str] | None = None) -> int:
    p = _parser()
    args = p.parse_args(argv)
    for run_dir in args.run_dirs:
        if not (run_dir / "summary.json").exists() and not (run_dir / "progress.jsonl").exists():
            p.error(f"{run_dir}: neither summary.json nor progress.jsonl: not a run directory")
    if len(set(args.run_dirs)) < len(args.run_dirs):
        p.error("a run directory is named twice: it would count twice in the median")
    if args.scores and len(args.run_dirs) > 1:
        p.error(f"--scores holds one run's held-out scores, and {len(args.run_dirs)} run directories are given")
    minutes = [float(m) for m in args.minutes.split(",")]
    runs = [collect(run_dir, minutes) for run_dir in args.run_dirs]
    targets = {run["summary"].get("target_success") for run in runs}
    if len(targets) > 1:
        p.error(f"the runs have different target_success ({sorted(targets, key=str)}): no time to one target")
    if len(runs) == 1:
        benchmark, figures = "training_run", runs[0]
    else:
        named = [{"run_dir": str(d), **run} for d, run in zip(args.run_dirs, runs, strict=True)]
        benchmark, figures = "training_runs", {"runs": named, "across_runs": across_runs(runs)}
    figures["note"] = args.note
    if args.scores:
        figures["scores"] = json.loads(args.scores)
    record = result_record(benchmark, figures)
    record["command"] = args.command
    if args.commit:
        record["commit"] = args.commit
    write_result(record, args.out)
    for run in runs:
        s = run["summary"]
        print(f"{s['task']}: {s['stop_reason']}; best {s['best_success']:.2f}; {s.get('final_env_steps')} env steps")
    if len(runs) > 1:
        t = figures["across_runs"]
        print(
            f"{t['reached_target']} of {len(runs)} runs reached {t['target_success']}: median "
            f"{t['median_minutes_to_target']} min, worst {t['worst_minutes_to_target']} min"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
