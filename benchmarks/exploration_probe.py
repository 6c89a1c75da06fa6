"""How often does exploration alone move the object? The share of episodes, per task and
exploration setting, in which a fresh policy moves the achieved goal out of the success region
it started in (HER's `moved` test, sampler/her.py): the only episodes whose relabeled goals say
anything about moving the object, before the critic has learned a thing.

    python3 benchmarks/exploration_probe.py --task FetchPush-v4 --task MetaWorld-push-v3 \
        --repeat 1,5,10 [--random-share 0.3] [--episodes 100] [--json out.json]

Each episode acts through the sampler's own Policy (foundation/acting.py) with the weights of a
policy that has learned nothing: actions tanh(N(0, 1)) (zero weights, log-std 0), and on
--random-share of the steps uniform random actions held for --repeat steps
(sampler.random_action_repeat). --random-share 1 is pure uniform exploration. Envs are the
registry's, with the run's default domain randomization, episodes seeded 0..N-1 per setting (the
same starts for every setting). Figures come last: per task and setting, the moved share and a
95% Wilson interval.
"""

from __future__ import annotations

import argparse
import functools
import math
import sys

import numpy as np
from harness import print_table, result_record, write_result  # benchmarks/harness.py (this script's folder)

from foundation.acting import Policy, WeightsSnapshot, rollout
from foundation.config import RunConfig
from foundation.policy import ModelSpec
from sampler.her import moved
from sim.registry import TASKS, goal_reward, make_env


def fresh_policy(task: str, random_share: float, repeat: int, seed: int) -> Policy:
    """The sampler's Policy with a learned-nothing actor: zero weights, log-std 0."""
    spec_task = TASKS[task]
    spec = ModelSpec(obs_dim=spec_task.obs_dim, goal_dim=spec_task.goal_dim, act_dim=spec_task.act_dim)
    obs_norm = np.concatenate([np.zeros(spec.input_dim), np.ones(spec.input_dim)]).astype(np.float32)
    policy = Policy(seed=seed, random_action_prob=random_share, random_action_repeat=repeat)
    policy.refresh(WeightsSnapshot(0, {"actor": np.zeros(spec.actor_size(), np.float32), "obs_norm": obs_norm}, spec))
    return policy


def wilson(hits: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """95% Wilson score interval of a share hits / n."""
    if n == 0:
        return 0.0, 1.0
    p = hits / n
    mid = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return max(0.0, mid - half), min(1.0, mid + half)


def probe(task: str, random_share: float, repeat: int, episodes: int, seed: int) -> dict:
    env = make_env(task, RunConfig().sim.randomization)
    reward = functools.partial(goal_reward, env)
    policy = fresh_policy(task, random_share, repeat, seed)
    rng = np.random.default_rng(seed)
    hits = 0
    for episode_seed in range(episodes):
        episode, _ = rollout(env, policy, seed=episode_seed, rng=rng)
        hits += moved(episode, reward)
    env.close()
    low, high = wilson(hits, episodes)
    return {
        "task": task,
        "random_share": random_share,
        "repeat": repeat,
        "episodes": episodes,
        "moved": hits,
        "moved_share": hits / episodes,
        "wilson95": [round(low, 3), round(high, 3)],
    }


def probe_rows(tasks: list[str], shares: list[float], repeats: list[int], episodes: int, seed: int) -> list[dict]:
    """`probe` for every task, random share and repeat, in that order."""
    rows = []
    for task in tasks:
        for share in shares:
            for repeat in repeats:
                row = probe(task, share, repeat, episodes, seed)
                print(f"{task} share {share} repeat {repeat}: {row['moved']}/{row['episodes']}", file=sys.stderr)
                rows.append(row)
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--task", action="append", required=True, choices=sorted(TASKS))
    parser.add_argument("--repeat", default="1,5,10", help="sampler.random_action_repeat values, comma-separated")
    parser.add_argument("--random-share", type=float, action="append", help="sampler.random_action_prob (repeatable)")
    parser.add_argument("--episodes", type=int, default=100)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", help="write the raw result here")
    args = parser.parse_args(argv)
    repeats = [int(r) for r in args.repeat.split(",")]
    shares = args.random_share or [0.3]
    if args.episodes < 1 or min(repeats) < 1 or not all(0.0 < s <= 1.0 for s in shares):
        parser.error("--episodes >= 1, every --repeat >= 1 and every --random-share in (0, 1]")
    rows = probe_rows(args.task, shares, repeats, args.episodes, args.seed)
    if args.json:
        write_result(result_record("exploration_probe", {"rows": rows}), args.json)
    table = {
        f"{r['task']}, random share {r['random_share']}, repeat {r['repeat']}": {
            "moved": f"{r['moved']}/{r['episodes']}",
            "moved_share": r["moved_share"],
            "wilson95_low": r["wilson95"][0],
            "wilson95_high": r["wilson95"][1],
        }
        for r in rows
    }
    print_table("episodes that moved the object, by a policy that has learned nothing", table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
