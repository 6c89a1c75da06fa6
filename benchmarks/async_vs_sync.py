"""The asynchronous fleet against synchronous mode, at the same updates per env step.

    python3 benchmarks/async_vs_sync.py --task FetchReach-v4 [--seeds 0,1,2] [--out R.json]
    python3 benchmarks/async_vs_sync.py --task FetchPush-v4 --max-wall-sec 300 --seeds 0 [--out R.json]

For each seed, one after another on this machine (nothing else running), `fleetrl train`:
- sync: `--mode sync`, one process alternating collection and training (fleet/launch/sync.py);
- async: the local fleet with one learner (the default);
- async-2: the local fleet with two learners, each gradient its own version
  (aggregator.grads_per_step=1, learner.max_grad_staleness=2), so flow control lets the
  samplers collect twice as fast.
All three keep the task preset's `sampler.max_env_steps_per_update`. Figures per run: env
steps per second over the run and in steady state (from --steady-from seconds on, from
progress.jsonl), updates per second, wall-clock and env steps to the target. Ratios of the
medians over seeds, async / sync (issue 9's goal: >= 1.7 on 2 cores, 2.0 the limit).
Prints the figures last.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import statistics
import subprocess
import sys
import tempfile

from fleet_arms import steady  # progress.jsonl rates from a second on
from harness import REPO, result_record, write_result  # benchmarks/harness.py (this script's folder)

ARMS = {
    "sync": ["--mode", "sync"],
    "async": [],
    # Each gradient its own version: while one learner computes, the other's gradient lands, so
    # a gradient is one version older than with one learner (max_grad_staleness 2, not 1).
    "async-2": ["--learners", "2", "--set", "aggregator.grads_per_step=1", "--set", "learner.max_grad_staleness=2"],
}


def run(arm: str, task: str, seed: int, max_wall_sec: float, root: pathlib.Path, steady_from: float) -> dict:
    run_dir = root / f"{arm}-seed{seed}"
    cmd = [sys.executable, "-m", "fleet.cli.main", "train", "--task", task, "--seed", str(seed), *ARMS[arm]]
    cmd += ["--run-dir", str(run_dir), "--max-wall-sec", str(max_wall_sec), "--set", "eval.final_episodes=0"]
    print(f"{arm} seed {seed}: {' '.join(cmd[3:])}", flush=True)
    subprocess.run(cmd, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=max_wall_sec + 600)
    s = json.loads((run_dir / "summary.json").read_text())
    return {
        "arm": arm,
        "seed": seed,
        "reached_target": s["reached_target"],
        "wall_sec": s["wall_sec"],
        "wall_sec_to_target": s["wall_sec_to_target"],
        "env_steps_to_target": s["env_steps_to_target"],
        "env_steps": s["final_env_steps"],
        "env_steps_per_sec": s["final_env_steps"] / s["wall_sec"],
        "steady_env_steps_per_sec": steady(run_dir, steady_from, "env_steps"),
        "updates_per_sec": s["updates_per_sec"],
        "stop_reason": s["stop_reason"],
    }


def _median(rows: list[dict], key: str) -> float | None:
    values = [r[key] for r in rows if r[key] is not None]
    return statistics.median(values) if values else None


def _ratio(a: float | None, b: float | None) -> float | None:
    return round(a / b, 3) if a and b else None


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--task", default="FetchReach-v4")
    p.add_argument("--seeds", default="0,1,2")
    p.add_argument("--max-wall-sec", type=float, default=300.0)
    p.add_argument("--steady-from", type=float, default=60.0, help="steady-state rate from this second on")
    p.add_argument("--arms", default=",".join(ARMS))
    p.add_argument("--out", help="write the raw result here")
    args = p.parse_args(argv)
    arms = args.arms.split(",")
    root = pathlib.Path(tempfile.mkdtemp(prefix="fleetrl-async-sync-"))
    rows = []
    for seed in (int(s) for s in args.seeds.split(",")):
        for arm in arms:
            rows.append(run(arm, args.task, seed, args.max_wall_sec, root, args.steady_from))
    keys = ("env_steps_per_sec", "steady_env_steps_per_sec", "updates_per_sec", "wall_sec_to_target")
    medians = {arm: {k: _median([r for r in rows if r["arm"] == arm], k) for k in keys} for arm in arms}
    ratios = {}
    for arm in (a for a in arms if a != "sync"):
        m, sync = medians[arm], medians.get("sync", {})
        ratios[arm] = {
            "env_steps_per_sec": _ratio(m["env_steps_per_sec"], sync.get("env_steps_per_sec")),
            "steady_env_steps_per_sec": _ratio(m["steady_env_steps_per_sec"], sync.get("steady_env_steps_per_sec")),
            "wall_sec_to_target_sync_over_async": _ratio(sync.get("wall_sec_to_target"), m["wall_sec_to_target"]),
        }
    figures = {"task": args.task, "max_wall_sec": args.max_wall_sec, "runs": rows, "medians": medians}
    figures["async_over_sync"] = ratios
    if args.out:
        write_result(result_record("async_vs_sync", figures), args.out)
    print(f"\n=== {args.task}: medians over seeds {args.seeds} ===")
    for arm, m in medians.items():
        shown = {k: (round(v, 1) if v is not None else None) for k, v in m.items()}
        print(f"{arm:8s} {shown}")
    for arm, r in ratios.items():
        print(f"{arm} / sync: {r}  (goal >= 1.7)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
