"""Single-process baseline: SAC + HerReplayBuffer in Stable-Baselines3 or SBX, time to 90% success.

    python3 benchmarks/sb3_baseline.py [--seed 0] [--max-steps 20000] [--max-wall-sec 1200]
    python3 benchmarks/sb3_baseline.py --task FetchPush-v4 --out runs/sb3-push-seed0
    python3 benchmarks/sb3_baseline.py --algo sbx --task FetchPush-v4 --out runs/sbx-push-seed0
    fleetrl report runs/FLEET_RUN runs/sb3-push-seed0 --out push.html

What a user would run instead of the fleet: one process that alternates one env step and one
gradient update (train_freq=1, gradient_steps=1), batch 256, HER 'future' with
n_sampled_goal=4, torch on 1 thread. Hyperparameters follow the rl-baselines3-zoo SAC entry
for FetchReach (gamma 0.95, learning rate 1e-3, buffer 1e6, ent_coef 'auto',
learning_starts 1000: uniform random actions for the first 1000 env steps), with the hidden
layers of fleetrl's learner (256, 256) so both train the same network size.

`--task` picks another Fetch task. FetchPush-v4 and FetchPickAndPlace-v4 use tau 0.05 instead
of 0.005 (the rest as above): the settings of the SBX peer measurement the fleet is compared
with. Other tasks use FetchReach's.

`--algo sb3-tqc` runs sb3-contrib's TQC+HER with rl-baselines3-zoo's settings for the task
(hyperparams/tqc.yml: FetchPickAndPlace batch 1024, FetchPush and FetchSlide 2048, three hidden
layers of 512, two critics, tau 0.05; `ZOO_TQC`), the rest of the protocol as above. The zoo
trains PickAndPlace for 1M env steps; this runs it on the same wall-clock as every other arm.

`--algo sbx` runs the same protocol with SBX (`sbx-rl`, Stable-Baselines in JAX; SB3's
HerReplayBuffer, same hyperparameters and network size). XLA runs on one CPU thread
(XLA_FLAGS="--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1" and
OMP_NUM_THREADS=1, set before jax's first import): the SBX peer measurement was made
that way (one thread, ~85 updates/s on a 2-core host), and the torch arm has one thread too.

Training env: plain `gym.make(task)` (what users would use; `--randomized` trains
under fleetrl's default domain randomization instead, as fleetrl's samplers do).
Evaluation mirrors fleetrl's evaluator (sampler/evaluator.py): every `--eval-every` env steps,
deterministic episodes on the nominal task with held-out seeds 1_000_000 + i (the same seeds
every time), ended early once the target is out of reach. Training stops at the first
evaluation with success >= `--target`, or at `--max-steps` / `--max-wall-sec`.

`--out RUN_DIR` also writes summary.json and evals.jsonl in fleetrl's run-directory format, so
`fleetrl report` overlays this baseline on fleet runs (an evaluation's `version` is the number
of gradient steps taken so far).

Prints LAST the env steps and the wall-clock seconds since process start (interpreter start
and imports included; `fleetrl train` counts from its CLI module's import, just after) at the
first evaluation that reached the target; evaluation time is included and shown separately.
Also printed: gradient steps per second of training (from the first update to the end,
evaluation excluded; each update comes with its env step and action, as in the peer's ~85/s).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import pathlib
import sys
import time
from dataclasses import asdict

import gymnasium as gym
import numpy as np
import psutil
import torch
from baseline_hyperparams import TASK_HYPERPARAMS, ZOO_TQC, SacHyperparams  # this script's folder
from baseline_outcome import EvalPoint, Outcome, train_updates_per_sec  # this script's folder
from harness import result_record, write_result
from stable_baselines3 import SAC, HerReplayBuffer
from stable_baselines3.common.callbacks import BaseCallback
from stable_baselines3.common.off_policy_algorithm import OffPolicyAlgorithm

PROCESS_START = psutil.Process().create_time()  # epoch seconds: wall time counts from the process's start

with contextlib.redirect_stderr(io.StringIO()):  # gymnasium_robotics prints an unrelated notice
    import gymnasium_robotics

gym.register_envs(gymnasium_robotics)

DEFAULT_TASK = "FetchReach-v4"
EVAL_SEED = 1_000_000  # fleetrl's EvalConfig.seed: far from every training seed
ALGO_LABELS = {"sb3": "SB3 SAC+HER", "sbx": "SBX SAC+HER", "sb3-tqc": "SB3-contrib TQC+HER (zoo)"}
# One XLA CPU thread, as in the SBX peer measurement (~85 updates/s); set before jax is imported.
ONE_XLA_THREAD_FLAGS = "--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1"


def wall_sec() -> float:
    return time.time() - PROCESS_START


def evaluate(
    model: OffPolicyAlgorithm, env: gym.Env, episodes: int, target: float | None, curve_episodes: int = 0
) -> list[bool]:
    """Each episode's success: deterministic, seeds EVAL_SEED + i, as fleetrl's evaluator.

    The first `curve_episodes` always run (fleetrl's curve score); the rest stop once `target`
    is out of reach over `episodes` (fleetrl's full score). target None: never stop early.
    """
    allowed_failures = episodes - int(np.ceil(target * episodes)) if target is not None else episodes
    outcomes: list[bool] = []
    for i in range(episodes):
        obs, _ = env.reset(seed=EVAL_SEED + i)
        info: dict = {}
        done = False
        while not done:
            action, _ = model.predict(obs, deterministic=True)
            obs, _, terminated, truncated, info = env.step(action)
            done = terminated or truncated
        outcomes.append(bool(info.get("is_success", 0.0)))
        if i + 1 >= curve_episodes and outcomes.count(False) > allowed_failures:
            break
    return outcomes


class EvalUntilTarget(BaseCallback):
    """Evaluates every `every` env steps; stops training at the target or a limit."""

    def __init__(self, args: argparse.Namespace, outcome: Outcome) -> None:
        super().__init__()
        self.args, self.outcome = args, outcome
        self.eval_env = gym.make(args.task)

    def _on_step(self) -> bool:
        steps = self.num_timesteps
        if steps == self.args.learning_starts + 1:  # SB3 and SBX train after steps > learning_starts
            self.outcome.train_start_wall_sec = wall_sec()
            self.outcome.eval_sec_before_train = self.outcome.eval_sec_total
        if steps % self.args.eval_every == 0:
            start = time.monotonic()
            a = self.args
            outcomes = evaluate(self.model, self.eval_env, a.eval_episodes, a.target, a.curve_episodes)
            self.outcome.eval_sec_total += time.monotonic() - start
            # SB3's and SBX's SAC count gradient steps in `_n_updates` and offer no public accessor.
            curve = outcomes[: a.curve_episodes]
            points = [EvalPoint(steps, wall_sec(), float(np.mean(curve)), len(curve), self.model._n_updates, "curve")]
            if len(outcomes) > a.curve_episodes:  # the full score went on past the curve episodes
                points.append(
                    EvalPoint(steps, wall_sec(), float(np.mean(outcomes)), len(outcomes), points[0].gradient_steps)
                )
            self.outcome.evals += points
            point = points[-1]
            success = point.success
            print(
                f"env steps {steps:6d}  wall {point.wall_sec:7.1f}s  success {success:.2f} over {point.episodes} "
                f"episodes (curve {points[0].success:.2f})",
                flush=True,
            )
            if point.kind == "full" and success >= a.target:
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


def make_train_env(task: str, randomized: bool, seed: int) -> gym.Env:
    if not randomized:
        env = gym.make(task)
    else:
        sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent))
        from foundation.config import RandomizationConfig
        from sim.registry import make_env

        env = make_env(task, RandomizationConfig())
    env.reset(seed=seed)
    return env


def import_sbx_sac() -> type[OffPolicyAlgorithm]:
    """SBX's SAC, imported only for `--algo sbx`, with XLA held to one CPU thread."""
    if "jax" in sys.modules:
        raise RuntimeError("jax was imported before XLA_FLAGS was set: XLA would use every core, not one thread")
    os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} {ONE_XLA_THREAD_FLAGS}".strip()
    os.environ["OMP_NUM_THREADS"] = "1"
    from sbx import SAC as SbxSAC

    return SbxSAC


def build_tqc(args: argparse.Namespace, env: gym.Env) -> OffPolicyAlgorithm:
    """sb3-contrib's TQC with the zoo's settings for the task (ZOO_TQC); its network sizes, not
    --net-arch: the peer as the zoo trains it."""
    from sb3_contrib import TQC

    if args.task not in ZOO_TQC:
        raise SystemExit(f"--algo sb3-tqc: the zoo has no TQC entry for {args.task}; known: {sorted(ZOO_TQC)}")
    hp = ZOO_TQC[args.task]
    return TQC(
        "MultiInputPolicy",
        env,
        learning_rate=hp.learning_rate,
        buffer_size=hp.buffer_size,
        learning_starts=args.learning_starts,
        batch_size=hp.batch_size,
        tau=hp.tau,
        gamma=hp.gamma,
        train_freq=1,
        gradient_steps=1,
        ent_coef="auto",
        replay_buffer_class=HerReplayBuffer,
        replay_buffer_kwargs=dict(n_sampled_goal=4, goal_selection_strategy="future"),
        policy_kwargs=dict(net_arch=list(hp.net_arch), n_critics=hp.n_critics),
        seed=args.seed,
        device="cpu",
        verbose=0,
    )


def build_model(args: argparse.Namespace, env: gym.Env) -> OffPolicyAlgorithm:
    if args.algo == "sb3-tqc":
        return build_tqc(args, env)
    hp = TASK_HYPERPARAMS.get(args.task, SacHyperparams())
    sac_class = import_sbx_sac() if args.algo == "sbx" else SAC
    return sac_class(
        "MultiInputPolicy",
        env,
        learning_rate=hp.learning_rate,
        buffer_size=hp.buffer_size,
        learning_starts=args.learning_starts,
        batch_size=hp.batch_size,
        tau=hp.tau,
        gamma=hp.gamma,
        train_freq=1,
        gradient_steps=1,
        ent_coef=hp.ent_coef,
        replay_buffer_class=HerReplayBuffer,
        replay_buffer_kwargs=dict(n_sampled_goal=4, goal_selection_strategy="future"),
        policy_kwargs=dict(net_arch=[int(n) for n in args.net_arch.split(",")]),
        seed=args.seed,
        device="cpu",
        verbose=0,
    )


def write_run_dir(run_dir: pathlib.Path, args: argparse.Namespace, outcome: Outcome) -> None:
    """summary.json and evals.jsonl as `fleetrl train` writes them (fleet/report/render.py reads both)."""
    run_dir.mkdir(parents=True, exist_ok=True)
    evals = [
        {
            "version": e.gradient_steps,
            "success_rate": e.success,
            "episodes": e.episodes,
            "env_steps": e.env_steps,
            "time": PROCESS_START + e.wall_sec,
            "wall_sec": e.wall_sec,
            "kind": e.kind,
        }
        for e in outcome.evals
    ]
    (run_dir / "evals.jsonl").write_text("".join(json.dumps(e) + "\n" for e in evals))
    summary = {
        "task": args.task,
        "label": f"{ALGO_LABELS[args.algo]} seed {args.seed}" + (" randomized" if args.randomized else ""),
        "algo": args.algo,
        "seed": args.seed,
        "stop_reason": outcome.stop_reason,
        "reached_target": outcome.reached,
        "target_success": args.target,
        "wall_sec": outcome.wall_sec,
        "wall_sec_to_target": outcome.wall_sec_to_target,
        "env_steps_to_target": outcome.env_steps_to_target,
        "best_success": max((e.success for e in outcome.evals), default=0.0),  # curve or full, as fleetrl
        "final_success": outcome.final_success,
        "final_success_episodes": outcome.final_episodes,
        "final_env_steps": outcome.env_steps,
        "final_version": outcome.gradient_steps,
        "updates_per_sec": outcome.gradient_steps / outcome.wall_sec if outcome.wall_sec > 0 else 0.0,
        "train_updates_per_sec": train_updates_per_sec(outcome),
        "started_unix": PROCESS_START,
    }
    (run_dir / "summary.json").write_text(json.dumps(summary, indent=2))


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--task", default=DEFAULT_TASK, help="gymnasium-robotics Fetch task to train and evaluate")
    p.add_argument(
        "--algo",
        choices=sorted(ALGO_LABELS),
        default="sb3",
        help="SAC of SB3 (torch) or SBX (JAX), or sb3-contrib's TQC with the zoo's settings",
    )
    p.add_argument("--seed", type=int, default=0, help="seed of the SAC (weights, sampling) and the training env")
    p.add_argument("--max-steps", type=int, default=20_000, help="stop after this many env steps")
    p.add_argument("--max-wall-sec", type=float, default=1200.0, help="stop after this many seconds")
    p.add_argument("--target", type=float, default=0.9, help="evaluation success to reach")
    p.add_argument("--eval-every", type=int, default=500, help="evaluate every N env steps")
    p.add_argument("--eval-episodes", type=int, default=50, help="episodes of a full score (fleetrl: eval.episodes)")
    p.add_argument(
        "--curve-episodes",
        type=int,
        default=10,
        help="episodes every score runs, never cut short (fleetrl: eval.curve_episodes)",
    )
    p.add_argument(
        "--final-episodes",
        type=int,
        default=50,
        help="episodes of a final score at the end when the target was not reached, never cut short "
        "(fleetrl: eval.final_episodes); 0 = none",
    )
    p.add_argument("--learning-starts", type=int, default=1000, help="random-action env steps before updates")
    p.add_argument("--net-arch", default="256,256", help="hidden layer widths of actor and critics")
    p.add_argument("--randomized", action="store_true", help="train under fleetrl's default domain randomization")
    p.add_argument("--json", help="also write the outcome here as a raw result (JSON)")
    p.add_argument("--out", metavar="RUN_DIR", help="also write summary.json and evals.jsonl here for `fleetrl report`")
    args = p.parse_args(argv)
    if args.max_steps < 1 or args.eval_every < 1 or args.eval_episodes < 1 or not 0.0 < args.target <= 1.0:
        p.error("--max-steps, --eval-every, --eval-episodes must be >= 1 and --target in (0, 1]")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    torch.set_num_threads(1)
    outcome = Outcome(seed=args.seed, target=args.target, algo=args.algo)
    env = make_train_env(args.task, args.randomized, args.seed)
    model = build_model(args, env)
    try:
        model.learn(total_timesteps=args.max_steps, callback=EvalUntilTarget(args, outcome))
    except KeyboardInterrupt:
        outcome.stop_reason = "interrupted (Ctrl-C)"
    env.close()
    outcome.stop_reason = outcome.stop_reason or f"max_steps {args.max_steps} reached"
    outcome.env_steps, outcome.wall_sec = model.num_timesteps, wall_sec()
    if not outcome.reached and args.final_episodes:  # after wall_sec: as fleetrl, outside the run's time
        eval_env = gym.make(args.task)
        final = evaluate(model, eval_env, args.final_episodes, None)
        outcome.final_success, outcome.final_episodes = float(np.mean(final)), len(final)
        eval_env.close()
    outcome.gradient_steps = model._n_updates
    if args.json:
        write_result(result_record("sb3_baseline", asdict(outcome)), args.json)
    if args.out:
        write_run_dir(pathlib.Path(args.out), args, outcome)
    return print_outcome(args, outcome)


def print_outcome(args: argparse.Namespace, outcome: Outcome) -> int:
    """Prints the figures, the ones to compare last; returns the exit status (0: target reached)."""
    threads = "1 XLA thread" if args.algo == "sbx" else "1 torch thread"
    print(f"\n=== {ALGO_LABELS[args.algo]} {args.task}, seed {args.seed}, {threads}: {outcome.stop_reason} ===")
    print(
        f"ran {outcome.env_steps} env steps in {outcome.wall_sec:.1f}s (evaluation {outcome.eval_sec_total:.1f}s of it)"
    )
    print(
        f"{outcome.gradient_steps} gradient steps, {train_updates_per_sec(outcome):.1f} updates/s of training "
        "(from the first update, evaluation excluded)"
    )
    if outcome.reached:
        print(f"reached {args.target:.0%} success at env steps: {outcome.env_steps_to_target}")
        print(
            f"reached {args.target:.0%} success at wall-clock seconds from process start: "
            f"{outcome.wall_sec_to_target:.1f}"
        )
        return 0
    best = max((e.success for e in outcome.evals), default=0)
    if outcome.final_success is not None:
        print(f"final policy: success {outcome.final_success:.2f} over {outcome.final_episodes} episodes")
    print(f"did not reach {args.target:.0%} success (best {best:.2f})")
    return 1


if __name__ == "__main__":
    sys.exit(main())
