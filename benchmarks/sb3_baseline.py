"""Single-process baseline: Stable-Baselines3 SAC + HerReplayBuffer on FetchReach-v4, time to 90% success.

    python3 benchmarks/sb3_baseline.py [--seed 0] [--max-steps 20000] [--max-wall-sec 1200]

What a user would run instead of the fleet: one process that alternates one env step and one
gradient update (train_freq=1, gradient_steps=1), batch 256, HER 'future' with
n_sampled_goal=4, torch on 1 thread. Hyperparameters follow the rl-baselines3-zoo SAC entry
for FetchReach (gamma 0.95, learning rate 1e-3, buffer 1e6, ent_coef 'auto',
learning_starts 1000: uniform random actions for the first 1000 env steps), with the hidden
layers of fleetrl's learner (256, 256) so both train the same network size.

Training env: plain `gym.make("FetchReach-v4")` (what users would use; `--randomized` trains
under fleetrl's default domain randomization instead, as fleetrl's samplers do).
Evaluation mirrors fleetrl's evaluator (sampler/evaluator.py): every `--eval-every` env steps,
deterministic episodes on the nominal task with held-out seeds 1_000_000 + i (the same seeds
every time), ended early once the target is out of reach. Training stops at the first
evaluation with success >= `--target`, or at `--max-steps` / `--max-wall-sec`.

Prints LAST the env steps and the wall-clock seconds since process start (interpreter start
and imports included; `fleetrl train` counts from its CLI module's import, just after) at the
first evaluation that reached the target; evaluation time is included and shown separately.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import pathlib
import sys
import time
from dataclasses import asdict, dataclass, field

import gymnasium as gym
import numpy as np
import psutil
import torch
from stable_baselines3 import SAC, HerReplayBuffer
from stable_baselines3.common.callbacks import BaseCallback

PROCESS_START = psutil.Process().create_time()  # epoch seconds: wall time counts from the process's start

with contextlib.redirect_stderr(io.StringIO()):  # gymnasium_robotics prints an unrelated notice
    import gymnasium_robotics

gym.register_envs(gymnasium_robotics)

TASK = "FetchReach-v4"
EVAL_SEED = 1_000_000  # fleetrl's EvalConfig.seed: far from every training seed


def wall_sec() -> float:
    return time.time() - PROCESS_START


@dataclass
class EvalPoint:
    env_steps: int
    wall_sec: float
    success: float
    episodes: int


@dataclass
class Outcome:
    seed: int
    target: float
    reached: bool = False
    env_steps_to_target: int | None = None
    wall_sec_to_target: float | None = None
    eval_sec_total: float = 0.0
    stop_reason: str = ""
    env_steps: int = 0
    wall_sec: float = 0.0
    evals: list[EvalPoint] = field(default_factory=list)


def evaluate(model: SAC, env: gym.Env, episodes: int, target: float) -> tuple[float, int]:
    """(success rate, episodes run): deterministic, seeds EVAL_SEED + i, stops once `target` is out of reach."""
    allowed_failures = episodes - int(np.ceil(target * episodes))
    successes = 0
    for i in range(episodes):
        obs, _ = env.reset(seed=EVAL_SEED + i)
        info: dict = {}
        done = False
        while not done:
            action, _ = model.predict(obs, deterministic=True)
            obs, _, terminated, truncated, info = env.step(action)
            done = terminated or truncated
        successes += bool(info.get("is_success", 0.0))
        if (i + 1) - successes > allowed_failures:
            return successes / (i + 1), i + 1
    return successes / episodes, episodes


class EvalUntilTarget(BaseCallback):
    """Evaluates every `every` env steps; stops training at the target or a limit."""

    def __init__(self, args: argparse.Namespace, outcome: Outcome) -> None:
        super().__init__()
        self.args, self.outcome = args, outcome
        self.eval_env = gym.make(TASK)

    def _on_step(self) -> bool:
        steps = self.num_timesteps
        if steps % self.args.eval_every == 0:
            start = time.monotonic()
            success, episodes = evaluate(self.model, self.eval_env, self.args.eval_episodes, self.args.target)
            self.outcome.eval_sec_total += time.monotonic() - start
            point = EvalPoint(steps, wall_sec(), success, episodes)
            self.outcome.evals.append(point)
            print(
                f"env steps {steps:6d}  wall {point.wall_sec:7.1f}s  success {success:.2f} over {episodes} episodes",
                flush=True,
            )
            if success >= self.args.target:
                self.outcome.reached = True
                self.outcome.env_steps_to_target, self.outcome.wall_sec_to_target = steps, point.wall_sec
                self.outcome.stop_reason = f"evaluation success {success:.2f} >= target {self.args.target}"
                return False
        if wall_sec() >= self.args.max_wall_sec:
            self.outcome.stop_reason = f"max_wall_sec {self.args.max_wall_sec} reached"
            return False
        return True

    def _on_training_end(self) -> None:
        self.eval_env.close()


def make_train_env(randomized: bool, seed: int) -> gym.Env:
    if not randomized:
        env = gym.make(TASK)
    else:
        sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent))
        from fleetrl.config import RandomizationConfig
        from sim.registry import make_env

        env = make_env(TASK, RandomizationConfig())
    env.reset(seed=seed)
    return env


def build_model(args: argparse.Namespace, env: gym.Env) -> SAC:
    return SAC(
        "MultiInputPolicy",
        env,
        learning_rate=1e-3,
        buffer_size=1_000_000,
        learning_starts=args.learning_starts,
        batch_size=256,
        gamma=0.95,
        train_freq=1,
        gradient_steps=1,
        ent_coef="auto",
        replay_buffer_class=HerReplayBuffer,
        replay_buffer_kwargs=dict(n_sampled_goal=4, goal_selection_strategy="future"),
        policy_kwargs=dict(net_arch=[int(n) for n in args.net_arch.split(",")]),
        seed=args.seed,
        device="cpu",
        verbose=0,
    )


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seed", type=int, default=0, help="seed of SB3 (weights, sampling) and the training env")
    p.add_argument("--max-steps", type=int, default=20_000, help="stop after this many env steps")
    p.add_argument("--max-wall-sec", type=float, default=1200.0, help="stop after this many seconds")
    p.add_argument("--target", type=float, default=0.9, help="evaluation success to reach")
    p.add_argument("--eval-every", type=int, default=500, help="evaluate every N env steps")
    p.add_argument("--eval-episodes", type=int, default=20, help="deterministic episodes per evaluation")
    p.add_argument("--learning-starts", type=int, default=1000, help="random-action env steps before updates")
    p.add_argument("--net-arch", default="256,256", help="hidden layer widths of actor and critics")
    p.add_argument("--randomized", action="store_true", help="train under fleetrl's default domain randomization")
    p.add_argument("--json", help="also write the outcome here as JSON")
    args = p.parse_args(argv)
    if args.max_steps < 1 or args.eval_every < 1 or args.eval_episodes < 1 or not 0.0 < args.target <= 1.0:
        p.error("--max-steps, --eval-every, --eval-episodes must be >= 1 and --target in (0, 1]")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    torch.set_num_threads(1)
    outcome = Outcome(seed=args.seed, target=args.target)
    env = make_train_env(args.randomized, args.seed)
    model = build_model(args, env)
    try:
        model.learn(total_timesteps=args.max_steps, callback=EvalUntilTarget(args, outcome))
    except KeyboardInterrupt:
        outcome.stop_reason = "interrupted (Ctrl-C)"
    env.close()
    outcome.stop_reason = outcome.stop_reason or f"max_steps {args.max_steps} reached"
    outcome.env_steps, outcome.wall_sec = model.num_timesteps, wall_sec()
    if args.json:
        pathlib.Path(args.json).write_text(json.dumps(asdict(outcome), indent=2))
    print(f"\n=== SB3 SAC+HER {TASK}, seed {args.seed}, 1 torch thread: {outcome.stop_reason} ===")
    print(
        f"ran {outcome.env_steps} env steps in {outcome.wall_sec:.1f}s (evaluation {outcome.eval_sec_total:.1f}s of it)"
    )
    if outcome.reached:
        print(f"reached {args.target:.0%} success at env steps: {outcome.env_steps_to_target}")
        print(
            f"reached {args.target:.0%} success at wall-clock seconds from process start: "
            f"{outcome.wall_sec_to_target:.1f}"
        )
        return 0
    print(f"did not reach {args.target:.0%} success (best {max((e.success for e in outcome.evals), default=0):.2f})")
    return 1


if __name__ == "__main__":
    sys.exit(main())
