"""The asynchronous fleet against synchronous mode, at the same updates per env step.

    python3 benchmarks/async_vs_sync.py --task FetchReach-v4 [--seeds 0,1,2] [--out R.json]
    python3 benchmarks/async_vs_sync.py --task FetchPush-v4 --max-wall-sec 300 --seeds 0 [--out R.json]

For each seed, one after another on this machine (nothing else running), the arms interleaved
(each seed is a repeat), `fleetrl train`:
- sync: `--mode sync`, one process alternating collection and training (fleet/launch/sync.py);
- async: the local fleet with one learner (the default);
- async-2: the local fleet with two learners, each gradient its own version
  (aggregator.grads_per_step=1, learner.max_grad_staleness=2), so flow control lets the
  samplers collect twice as fast.
All three keep the task preset's `sampler.max_env_steps_per_update`. Figures per run: env
steps per second over the run and in steady state (from --steady-from seconds on, from
progress.jsonl), updates per second, wall-clock and env steps to the target. Ratios of the
medians over seeds, async / sync (goal: >= 1.7 on 2 cores, 2.0 the limit).
Prints the figures last.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import subprocess
import sys
import tempfile

from fleet_arms import steady  # progress.jsonl rates from a second on
from harness import (  # benchmarks/harness.py (this script's folder)
    REPO,
    median_figures,
    print_table,
    ratio,
    result_record,
    run_interleaved,
    write_result,
)

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


def over_sync(medians: dict[str, dict[str, float | None]]) -> dict[str, dict[str, float | None]]:
    """Each async arm's rates over sync's, and sync's wall-clock to the target over the arm's."""
    sync = medians.get("sync", {})
    return {
        arm: {
            "env_steps_per_sec": ratio(m["env_steps_per_sec"], sync.get("env_steps_per_sec")),
            "steady_env_steps_per_sec": ratio(m["steady_env_steps_per_sec"], sync.get("steady_env_steps_per_sec")),
            "wall_sec_to_target_sync_over_async": ratio(sync.get("wall_sec_to_target"), m["wall_sec_to_target"]),
        }
        for arm, m in medians.items()
        if arm != "sync"
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--task", default="FetchReach-v4")
    p.add_argument("--seeds", default="0,1,2")
    p.add_argument("--max-wall-sec", type=float, default=300.0)
    p.add_argument("--steady-from", type=float, default=60.0, help="steady-state rate from this second on")
    p.add_argument("--arms", default=",".join(ARMS), help=f"comma-separated, of {list(ARMS)}")
    p.add_argument("--out", help="write the raw result here")
    args = p.parse_args(argv)
    arms, seeds = args.arms.split(","), [int(s) for s in args.seeds.split(",")]
    if unknown := set(arms) - set(ARMS):
        p.error(f"--arms: unknown {sorted(unknown)}; expected some of {list(ARMS)}")
    root = pathlib.Path(tempfile.mkdtemp(prefix="fleetrl-async-sync-"))
    runs = run_interleaved(
        {
            arm: (lambda r, a=arm: run(a, args.task, seeds[r], args.max_wall_sec, root, args.steady_from))
            for arm in arms
        },
        len(seeds),
    )
    keys = ("env_steps_per_sec", "steady_env_steps_per_sec", "updates_per_sec", "wall_sec_to_target")
    medians = {arm: {k: m.get(k) for k in keys} for arm, m in median_figures(runs).items()}
    figures = {"task": args.task, "max_wall_sec": args.max_wall_sec, "runs": runs, "medians": medians}
    figures["async_over_sync"] = over_sync(medians)
    if args.out:
        write_result(result_record("async_vs_sync", figures), args.out)
    print_table(f"{args.task}: medians over seeds {args.seeds}", medians)
    print_table("async / sync (goal >= 1.7)", figures["async_over_sync"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
