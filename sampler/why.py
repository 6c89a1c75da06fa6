"""Why a checkpoint's episodes fail: `fleetrl evaluate --why`'s episodes and their classes.

    diagnosis = diagnose_checkpoint("runs/pnp/checkpoints", config, episodes=50)
    diagnosis.tasks["FetchPickAndPlace-v4"]     # one Verdict per episode, seeds eval.seed + i

The episodes are score_checkpoint's (sampler/evaluator.py): the same envs, seeds and
deterministic policy, so the successes here are the ones `fleetrl evaluate` counts. Each is
recorded from the simulator (sim/failure_trace.py) and classified (sim/failures.py).
"""

from __future__ import annotations

import os
import pathlib
from dataclasses import dataclass, field

from foundation.acting import Policy
from foundation.checkpoint import load_policy_checkpoint, resolve_checkpoint
from foundation.config import ConfigError, RunConfig
from sampler.evaluator import eval_envs
from sim.failure_trace import FetchProbe, record_episode
from sim.failures import CLASSIFIERS, Verdict
from sim.tasks import TaskSet


@dataclass(frozen=True)
class Diagnosis:
    checkpoint: pathlib.Path  # the ckpt_<version>.pt file scored
    version: int
    tasks: dict[str, list[Verdict]]  # per classified task, in the run's order
    skipped: dict[str, str] = field(default_factory=dict)  # a task without a classifier: why


def no_classifier(task: str) -> str:
    return f"--why has no classifier for {task}; it classifies {', '.join(CLASSIFIERS)}"


def diagnose_checkpoint(path: str | os.PathLike, config: RunConfig, episodes: int, weights: str = "live") -> Diagnosis:
    """Every episode of every task of the run that has a classifier, classified. A run none of
    whose tasks has one is refused (ConfigError naming --why) before any episode runs."""
    checkpoint = resolve_checkpoint(path)
    ckpt = load_policy_checkpoint(checkpoint, weights)  # checks groups, spec, and NaN or inf weights
    tasks = TaskSet.parse(ckpt.task) if ckpt.task else TaskSet.for_run(config)
    places = [i for i, name in enumerate(tasks.names) if name in CLASSIFIERS]
    if not places:
        raise ConfigError("; ".join(no_classifier(name) for name in tasks.names), field="--why")
    policy = Policy.fixed(ckpt.version, ckpt.actor, ckpt.obs_norm, ckpt.spec)
    envs = eval_envs(tasks, config)
    try:
        seeds = range(config.eval.seed, config.eval.seed + episodes)  # the evaluator's held-out episodes
        verdicts = {tasks.names[i]: _episodes(envs[i], tasks.names[i], policy, seeds, i) for i in places}
    finally:
        for env in envs:
            env.close()
    skipped = {name: no_classifier(name) for name in tasks.names if name not in CLASSIFIERS}
    return Diagnosis(checkpoint, policy.version, verdicts, skipped)


def _episodes(env, task: str, policy: Policy, seeds: range, place: int) -> list[Verdict]:
    """One verdict per seed: task place `place` of the run, recorded and classified."""
    classify = CLASSIFIERS[task].classify
    probe = FetchProbe(env)
    out = []
    for seed in seeds:
        trace = record_episode(env, probe, policy, seed=seed, task=place)
        out.append(Verdict.of(trace, classify(trace)))
    return out
