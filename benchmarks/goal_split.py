"""Where a FetchPickAndPlace policy fails: held-out success split by goal height.

    python3 benchmarks/goal_split.py RUN_DIR [--checkpoint PATH] [--episodes 100] [--json out.json]

FetchPickAndPlace puts half its goals on the table and half in the air (up to 0.45 m above it).
A policy that pushes but never lifts scores about the table's share plus the lowest air goals:
a plateau that more updates cannot move. This scores a checkpoint's deterministic policy on the
run's held-out episodes (seeds eval.seed + i, as `fleetrl evaluate`) and reports success on
table goals and on air goals (a goal more than 2 cm above the object's start), how often the
object was lifted on an air goal, and the heights of the air goals met and missed.

The default checkpoint is the run's newest. Figures come last.
"""

from __future__ import annotations

import argparse
import pathlib
import sys

import numpy as np
import torch
from harness import result_record, write_result  # benchmarks/harness.py (this script's folder)

from foundation.acting import Policy, rollout
from foundation.checkpoint import CheckpointError, load_policy_checkpoint, resolve_checkpoint
from foundation.config import RunConfig
from sampler.evaluator import eval_envs
from sim.tasks import TaskSet

AIR_ABOVE_M = 0.02  # a goal this far above the object's start needs a lift (success radius: 0.05)
LIFTED_M = 0.01


def split(run_dir: pathlib.Path, checkpoint: pathlib.Path, episodes: int) -> dict:
    torch.set_num_threads(1)
    config = RunConfig.load(str(run_dir / "config.json"))
    ckpt = load_policy_checkpoint(checkpoint, "live")
    policy = Policy.fixed(ckpt.version, ckpt.actor, ckpt.obs_norm, ckpt.spec)
    [env] = eval_envs(TaskSet.for_run(config), config)
    rows = []
    try:
        for i in range(episodes):
            seed = config.eval.seed + i
            episode, success = rollout(env, policy, seed=seed, rng=np.random.default_rng(seed), deterministic=True)
            start_z, goal_z = float(episode.achieved_goal[0, 2]), float(episode.desired_goal[0, 2])
            lift = float(episode.achieved_goal[:, 2].max()) - start_z
            rows.append({"seed": seed, "success": bool(success), "height": goal_z - start_z, "lift": lift})
    finally:
        env.close()
    air = [r for r in rows if r["height"] > AIR_ABOVE_M]
    table = [r for r in rows if r["height"] <= AIR_ABOVE_M]

    def rate(group: list[dict], key: str = "success") -> float | None:
        return round(float(np.mean([bool(r[key]) for r in group])), 3) if group else None

    return {
        "checkpoint": checkpoint.name,
        "version": ckpt.version,
        "episodes": episodes,
        "success": rate(rows),
        "table_goals": len(table),
        "table_success": rate(table),
        "air_goals": len(air),
        "air_success": rate(air),
        "air_lifted": round(float(np.mean([r["lift"] > LIFTED_M for r in air])), 3) if air else None,
        "air_heights_met": sorted(round(r["height"], 3) for r in air if r["success"]),
        "air_heights_missed": sorted(round(r["height"], 3) for r in air if not r["success"]),
        # per episode: the goal's height above the object's start and the object's highest lift (m)
        "per_episode": [{**r, "height": round(r["height"], 4), "lift": round(r["lift"], 4)} for r in rows],
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("run_dir", type=pathlib.Path)
    p.add_argument(
        "--checkpoint", type=pathlib.Path, help="a ckpt_<version>.pt or a folder of them (default: the run's newest)"
    )
    p.add_argument("--episodes", type=int, default=100)
    p.add_argument("--json", help="write the raw result here")
    args = p.parse_args(argv)
    try:
        checkpoint = resolve_checkpoint(args.checkpoint or args.run_dir / "checkpoints")
    except CheckpointError as e:
        sys.exit(str(e))
    figures = split(args.run_dir, checkpoint, args.episodes)
    if args.json:
        write_result(result_record("goal_split", figures), args.json)
    print(
        f"{figures['checkpoint']}: success {figures['success']} over {args.episodes}; table goals "
        f"{figures['table_success']} ({figures['table_goals']}), air goals {figures['air_success']} "
        f"({figures['air_goals']}), object lifted on {figures['air_lifted']} of the air goals"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
