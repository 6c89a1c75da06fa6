"""Dense against MoE (with and without router decay), and no / plain / layered SWA, on a multi-task set.

    python3 benchmarks/moe_ablation.py [--tasks A,B,...] [--seeds 0,1,2] [--arms dense,moe,moe-decay,moe-task] \\
        [--env-steps 20000] [--max-wall-sec 900] [--episodes 50] --out benchmarks/results/moe_ablation-seed0.json

Each run, one after another on this machine, the arms interleaved within each seed:
`fleetrl train --tasks ...` for the same env-step budget (`--env-steps`, over all tasks;
`--max-wall-sec` only guards against a hung run, and a run it stops is marked so), with the same
replay ratio, with layered SWA on, so the run's checkpoint holds three actors from the same
versions: the live one, the layered average and the plain average of the same scored versions.
After the run, each of the three is scored on `--episodes` held-out episodes per task
(`fleetrl evaluate --weights live|swa|swa_plain`).

Arms:
- dense: the dense networks (model.kind dense);
- moe: MoE networks without router decay (the balancing loss at full weight: router_decay 0);
- moe-decay: MoE with router decay (model.router_decay, default 1).
- moe-task: moe-decay with gates on the task embedding alone (model.router "task"): one
  routing per task, which the frozen-routing export keeps exactly.

Figures per run: success per task for each of the three actors, expert load std/mean per layer
(summary.json expert_load), env steps and updates. Then, per arm and actor, the mean and spread
(min, max) of each task's success over seeds. Runs need not happen at once: run a seed or an
arm at a time, each with its own --out. Prints the figures last.
"""

from __future__ import annotations

import argparse
import functools
import json
import pathlib
import statistics
import subprocess
import sys
import tempfile

from harness import REPO, result_record, run_interleaved, write_result  # benchmarks/harness.py (this script's folder)

TASKS = "FetchReach-v4,FetchPush-v4,MetaWorld-reach-v3,MetaWorld-push-v3"
ARMS = {
    "dense": ["--set", 'model.kind="dense"'],
    "moe": ["--set", 'model.kind="moe"', "--set", "model.router_decay=0"],
    "moe-decay": ["--set", 'model.kind="moe"'],
    # Gates on the task embedding alone: one routing per task, what a frozen-routing export keeps.
    "moe-task": ["--set", 'model.kind="moe"', "--set", 'model.router="task"'],
}
WEIGHTS = ("live", "swa", "swa_plain")


def _score(run_dir: pathlib.Path, weights: str, episodes: int) -> dict:
    cmd = [sys.executable, "-m", "fleet.cli.main", "evaluate", str(run_dir), "--episodes", str(episodes)]
    out = subprocess.run([*cmd, "--weights", weights, "--json"], cwd=REPO, capture_output=True, text=True)
    if out.returncode != 0:
        return {"error": out.stderr.strip()[-500:]}
    return json.loads(out.stdout.strip().splitlines()[-1])


def run(arm: str, tasks: str, seed: int, budget: tuple[int, float], episodes: int, root: pathlib.Path) -> dict:
    env_steps, max_wall_sec = budget
    run_dir = root / f"{arm}-seed{seed}"
    cmd = [sys.executable, "-m", "fleet.cli.main", "train", "--tasks", tasks, "--seed", str(seed), *ARMS[arm]]
    cmd += ["--run-dir", str(run_dir), "--max-wall-sec", str(max_wall_sec), "--target-success", "1.0"]
    cmd += ["--set", f"max_env_steps={env_steps}"]
    cmd += ["--set", 'aggregator.swa="layered"', "--set", "eval.final_episodes=0"]
    print(f"{arm} seed {seed}: {' '.join(cmd[3:])}", flush=True)
    subprocess.run(cmd, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=max_wall_sec + 900)
    summary = json.loads((run_dir / "summary.json").read_text())
    load = {k: v for k, v in summary.get("expert_load", {}).items() if k.endswith("load_std_over_mean")}
    return {
        "arm": arm,
        "seed": seed,
        "env_steps": summary["final_env_steps"],
        "task_env_steps": summary.get("task_env_steps", {}),
        "updates": summary["final_version"],
        "wall_sec": summary["wall_sec"],
        "stop_reason": summary["stop_reason"],
        "budget_reached": summary["final_env_steps"] >= env_steps,
        "expert_load_std_over_mean": load,
        "success": {w: _score(run_dir, w, episodes) for w in WEIGHTS},
    }


def summarize(rows: list[dict]) -> dict:
    """Per arm and actor: each task's success, mean and (min, max) over seeds."""
    out: dict = {}
    for arm in dict.fromkeys(r["arm"] for r in rows):
        for weights in WEIGHTS:
            per_task: dict[str, list[float]] = {}
            for r in (r for r in rows if r["arm"] == arm):
                for task, rate in r["success"][weights].get("task_success", {}).items():
                    per_task.setdefault(task, []).append(rate)
            out.setdefault(arm, {})[weights] = {
                task: {"mean": statistics.fmean(v), "min": min(v), "max": max(v), "seeds": len(v)}
                for task, v in per_task.items()
            }
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--tasks", default=TASKS)
    p.add_argument("--seeds", default="0,1,2")
    p.add_argument("--arms", default=",".join(ARMS))
    p.add_argument("--env-steps", type=int, default=20000, help="env steps per run, over all tasks")
    p.add_argument("--max-wall-sec", type=float, default=900.0, help="a guard: a run stopped by it misses the budget")
    p.add_argument("--episodes", type=int, default=50, help="held-out episodes per task for each actor")
    p.add_argument("--out", help="write the raw result here")
    args = p.parse_args(argv)
    root = pathlib.Path(tempfile.mkdtemp(prefix="fleetrl-moe-ablation-"))
    seeds = [int(seed) for seed in args.seeds.split(",")]

    def measure(arm: str, repeat: int) -> dict:  # repeat i runs seed i
        return run(arm, args.tasks, seeds[repeat], (args.env_steps, args.max_wall_sec), args.episodes, root)

    runs = run_interleaved({arm: functools.partial(measure, arm) for arm in args.arms.split(",")}, len(seeds))
    rows = [row for arm_rows in runs.values() for row in arm_rows]
    figures = {"tasks": args.tasks.split(","), "env_steps": args.env_steps, "max_wall_sec": args.max_wall_sec}
    figures["runs"] = rows
    figures["summary"] = summarize(rows)
    if args.out:
        write_result(result_record("moe_ablation", figures), args.out)
    print(f"\n=== success per task ({args.episodes} held-out episodes each), mean [min, max] over seeds ===")
    for arm, by_weights in figures["summary"].items():
        for weights, tasks in by_weights.items():
            cells = ", ".join(f"{t} {v['mean']:.2f} [{v['min']:.2f}, {v['max']:.2f}]" for t, v in tasks.items())
            print(f"{arm:10s} {weights:9s} {cells}")
    for r in rows:
        print(f"{r['arm']} seed {r['seed']}: expert load std/mean {r['expert_load_std_over_mean']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
