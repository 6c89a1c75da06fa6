"""`fleetrl train --mode sync`: the fleet's parts in one process that alternates.

    demonstrate first        sampler/demos.py: every sampler.demo_episodes expert episode, marked
    collect one episode      foundation.acting.rollout + sampler.worker.episode_rows (HER)
    store it                 an in-memory ring (no Redis, no gRPC)
    train what is owed       learner.gradients.compute_gradients + aggregator.core.AggregatorCore
    score when due           sampler.evaluator.scores on the evaluator's schedule

The same code as the asynchronous fleet at the same updates per env step (the buffer's flow
control, buffer/ratelimit.py, decides when to train), collecting and training in turn:
the baseline that says what the fleet's asynchrony buys (benchmarks/async_vs_sync.py). The run
directory gets the fleet's summary.json (mode "sync"), evals.jsonl and progress.jsonl.
"""

from __future__ import annotations

import json
import logging
import os
import pathlib
import threading
import time
from dataclasses import asdict

import numpy as np
import torch

from aggregator.core import AggregatorCore
from buffer.ratelimit import rate_limit
from fleet.report.provenance import code_provenance, write_code_json
from fleet.report.summary import Summary
from foundation.acting import Policy, WeightsSnapshot, rollout
from foundation.checkpoint import save_checkpoint
from foundation.config import ConfigError, RunConfig
from foundation.policy import ACTOR_GROUPS, model_spec
from foundation.wire import Transitions
from learner.algorithm import Batch
from learner.gradients import Hyperparams, compute_gradients
from nets.models import GROUPS, SACModel
from sampler.demos import demo_plan, demonstrate
from sampler.evaluator import eval_envs, next_interval_sec, scores
from sampler.worker import TRAIN_SEEDS_FROM, episode_rows
from sim.tasks import TaskSet

log = logging.getLogger("fleetrl.sync")
PROGRESS_METRICS = ("loss/", "demo/", "alpha")  # the learner's figures each progress.jsonl row carries


class MemoryReplay:
    """A ring of transitions in this process's memory, sampled uniformly."""

    def __init__(self, capacity: int, seed: int) -> None:
        self.capacity, self.size, self._next = capacity, 0, 0
        self._columns: dict[str, np.ndarray] = {}
        self._rng = np.random.default_rng(seed)

    def add(self, transitions: Transitions, demonstration: bool = False) -> None:
        """Store rows; `demonstration`: an expert episode's, marked demo in every batch drawn."""
        columns = {**transitions.columns(), "demo": np.full(len(transitions), float(demonstration), np.float32)}
        if not self._columns:
            self._columns = {k: np.zeros((self.capacity, *v.shape[1:]), np.float32) for k, v in columns.items()}
        slots = (self._next + np.arange(len(transitions))) % self.capacity
        for name, values in columns.items():
            self._columns[name][slots] = values
        self._next = int(slots[-1] + 1) % self.capacity
        self.size = min(self.size + len(transitions), self.capacity)

    def sample(self, n: int) -> Batch:
        rows = self._rng.integers(0, self.size, n)
        c = {name: values[rows] for name, values in self._columns.items()}
        return Batch.from_numpy(c["obs"], c["goal"], c["action"], c["reward"], c["next_obs"], c["done"], demo=c["demo"])


def run_sync(config: RunConfig, started_at: float, stop: threading.Event) -> Summary:
    """Alternate collecting and training until the target, a limit, or `stop`; write and
    return the summary."""
    run = SyncRun(config.validate(), started_at)
    try:
        reason = run.loop(stop)
    finally:
        run.close()
    return run.summarize(reason)


class SyncRun:
    def __init__(self, config: RunConfig, started_at: float) -> None:
        tasks = TaskSet.for_run(config)  # the run's tasks, as every role of the fleet reads them
        if tasks.multi:
            raise ConfigError(
                f"sim.tasks ({list(tasks.names)}) must name one task for --mode sync: it trains one task; "
                "a multi-task run needs the fleet",
                field="sim.tasks",
            )
        self.config, self.started_at = config, started_at
        self.run_dir = pathlib.Path(config.run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        (self.run_dir / "config.json").write_text(config.to_json())
        write_code_json(self.run_dir)
        torch.set_num_threads(config.learner.torch_threads)
        task = self.task = tasks.tasks[0]  # sim.tasks' one task when set, else sim.task: trained and scored alike
        self.spec = model_spec(config, task)
        self.core = AggregatorCore(self.spec, config.aggregator, 1, config.learner.max_grad_staleness, tasks.label)
        self.model = (
            SACModel(self.spec)
            .train_gates(config.model.gate_grad)
            .fuse_critics(config.learner.fused_critics)
            .batch_renorm(config.learner.crossq.momentum, config.learner.crossq.warmup)
        )
        self.hp = Hyperparams.for_run(config, task.act_dim)
        self.replay = MemoryReplay(config.buffer.capacity_transitions, seed=config.aggregator.seed + 7919)
        self.limit = rate_limit(config)
        self.inserted = self.sampled = 0  # rows stored and drawn: what flow control counts
        self.env = tasks.training_env(0, config)  # as a sampler trains (sim.grasped_start included)
        (self.eval_env,) = eval_envs(tasks, config)  # scored as the evaluator scores
        streams = np.random.SeedSequence([config.sampler.seed, 0]).spawn(3)
        self.rng, self.seeds = np.random.default_rng(streams[0]), np.random.default_rng(streams[1])
        seed = int(streams[2].generate_state(1)[0])
        self.policy = Policy.exploring(config, seed)
        self.scoring = Policy()  # deterministic, on the version being scored
        self.summary = Summary(str(self.run_dir), task.name, False, config.target_success, "", 0.0, mode="sync")
        self.env_steps = self.episodes = self.successes = 0
        self.demo_episodes = self.demo_env_steps = 0  # demonstrations: not the random warm-up's steps
        self.train_sec = 0.0
        self.metrics: dict[str, float] = {}  # the newest update's (learner/gradients.py)
        self._evals = open(self.run_dir / "evals.jsonl", "a")  # noqa: SIM115 - closed by close()
        self._progress = open(self.run_dir / "progress.jsonl", "a")  # noqa: SIM115

    def age(self) -> float:
        return time.monotonic() - self.started_at

    def loop(self, stop: threading.Event) -> str:
        c, next_eval, next_progress = self.config, 0.0, 5.0
        self.demonstrate(stop)
        while not stop.is_set():
            if self.age() >= next_eval:  # the evaluator's schedule, on this process's time
                curve = self.score(stop)
                if self.summary.reached_target:
                    return f"evaluation success >= target {c.target_success}"
                next_eval = self.age() + next_interval_sec(c.eval, c.target_success, curve, self.age())
            if self.age() >= c.max_wall_sec:
                return f"max_wall_sec {c.max_wall_sec} reached"
            if c.max_env_steps and self.env_steps >= c.max_env_steps:
                return f"max_env_steps {c.max_env_steps} reached"
            self.collect()
            self.train()
            if self.age() >= next_progress:
                next_progress = self.age() + 5.0
                self.log_progress()
        return "interrupted (Ctrl-C or SIGTERM)"

    def _refresh(self, policy: Policy) -> None:
        policy.refresh(WeightsSnapshot(self.core.version, self.core.weights(ACTOR_GROUPS), self.spec))

    def demonstrate(self, stop: threading.Event) -> None:
        """Every demonstration of the run (sampler.demo_episodes), stored marked as the fleet's
        samplers store them, before the random warm-up."""
        for demo in demo_plan(self.config, tasks=1):
            if stop.is_set():
                return
            episode, _ = demonstrate(self.env, self.task, demo, self.rng)
            transitions = episode_rows(self.config, self.env, episode, self.rng)
            self.replay.add(transitions, demonstration=True)
            self.inserted += len(transitions)
            self.env_steps, self.demo_env_steps = self.env_steps + len(episode), self.demo_env_steps + len(episode)
            self.demo_episodes += 1

    def collect(self) -> None:
        """One episode, relabeled and stored, as a sampler does."""
        self._refresh(self.policy)
        warm = self.env_steps - self.demo_env_steps >= self.config.sampler.random_steps
        acting = self.policy if warm else None
        seed = int(self.seeds.integers(TRAIN_SEEDS_FROM, 2**31))
        episode, success = rollout(self.env, acting, seed=seed, rng=self.rng)
        transitions = episode_rows(self.config, self.env, episode, self.rng)  # HER, or the shaped reward's rows
        self.replay.add(transitions)
        self.inserted += len(transitions)
        self.env_steps, self.episodes = self.env_steps + len(episode), self.episodes + 1
        self.successes += int(success)

    def train(self) -> None:
        """The updates the buffer's flow control lets the fleet's learners make by now
        (buffer/ratelimit.py, the same limiter), as learner and aggregator make them."""
        batch_size = self.config.learner.batch_size
        start = time.monotonic()
        while self._may_sample(batch_size):
            for group, flat in self.core.views(GROUPS).items():
                self.model.set_flat(group, flat)
            result = compute_gradients(self.model, self.replay.sample(batch_size), self.hp)
            self.metrics = result.metrics
            self.core.submit(self.core.version, result.grads, result.norm_stats, "learner-0", batch_size)
            self.sampled += batch_size
        self.train_sec += time.monotonic() - start

    def _may_sample(self, n: int) -> bool:
        if self.limit is not None:
            return self.limit.sample_ok(self.inserted, self.sampled, n)
        # No ratio set: one gradient per env step once the replay holds enough.
        return self.replay.size >= self.config.learner.min_replay_transitions and self.core.version < self.env_steps

    def score(self, stop: threading.Event) -> float:
        """The evaluator's curve and full scores of the current version; the curve success."""
        self._refresh(self.scoring)
        curve, s = None, self.summary
        for kind, result, _ in scores(self.eval_env, self.scoring, self.config, stop.is_set):
            row: dict[str, object] = {"version": self.core.version, "success_rate": result.success_rate}
            row |= {"episodes": result.episodes, "env_steps": self.env_steps, "evaluator": "sync", "kind": kind}
            row["time"] = time.time()
            self._evals.write(json.dumps(row) + "\n")
            self._evals.flush()
            curve = result.success_rate if curve is None else curve
            s.best_success = max(s.best_success, result.success_rate)
            complete = kind == "full" and result.episodes >= self.config.eval.episodes
            if complete and result.success_rate >= self.config.target_success:
                s.reached_target, s.wall_sec_to_target = True, self.age()
                s.env_steps_to_target, s.version_to_target = self.env_steps, self.core.version
        return curve or 0.0

    def log_progress(self) -> None:
        wall, version = self.age(), self.core.version
        row: dict[str, object] = {"wall_sec": round(wall, 3), "env_steps": self.env_steps, "version": version}
        row |= {"env_steps_per_sec": round(self.env_steps / wall, 3), "updates_per_sec": round(version / wall, 3)}
        row |= {"train_success": self.successes / max(self.episodes, 1), "train_share": round(self.train_sec / wall, 3)}
        row |= {"demo_episodes": self.demo_episodes} if self.demo_episodes else {}
        row["learner"] = {k: round(v, 6) for k, v in self.metrics.items() if k.startswith(PROGRESS_METRICS)}
        self._progress.write(json.dumps(row) + "\n")
        self._progress.flush()
        log.info("sync %.0fs: env steps %d, version %d", wall, self.env_steps, version)

    def close(self) -> None:
        self._evals.close()
        self._progress.close()
        self.env.close()
        self.eval_env.close()

    def summarize(self, reason: str) -> Summary:
        s = self.summary
        s.stop_reason, s.wall_sec = reason, self.age()
        s.started_unix = time.time() - s.wall_sec
        s.final_version, s.final_env_steps = self.core.version, self.env_steps
        s.transitions_stored, s.demo_episodes = self.replay.size, self.demo_episodes
        s.updates_per_sec = round(self.core.version / s.wall_sec, 2)
        s.train_success = self.successes / self.episodes if self.episodes else None
        s.code = code_provenance()
        s.cpu = {"cores": len(os.sched_getaffinity(0)), "train_share": round(self.train_sec / s.wall_sec, 3)}
        state = self.core.state() | {"clean_shutdown": True}  # fleetrl evaluate and export read it
        s.checkpoints = [str(save_checkpoint(self.run_dir / "checkpoints", state, keep=1))]
        (self.run_dir / "summary.json").write_text(json.dumps(asdict(s), indent=2))
        return s
