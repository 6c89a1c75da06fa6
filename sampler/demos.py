"""Expert demonstrations, stored at the start of a run (sampler.demo_episodes; Nair et al. 2018).

    plan = demo_plan(config, len(tasks), sampler_id, num_samplers)   # this sampler's share, in order
    with demo_envs(config, tasks, plan, own_envs) as envs:
        for demo in plan[stored:]:                          # less what the buffer holds already
            episode, success = demonstrate(envs[demo.place], tasks.tasks[demo.place], demo, rng)
            rows = episode_rows(config, envs[demo.place], episode, rng)   # as a training episode's
            pusher.put(rows, 0, env_steps=len(episode), task_id=..., demonstration=True)

Each task of the run gets sampler.demo_episodes episodes of its scripted expert
(sim/metaworld_experts.py), spread over the samplers: sampler i runs episode j of every task
where j % num_samplers == i, before its random warm-up. They run in the run's training env of
the task (its randomization, sim.control_hz, sim.reward and training horizon), and their rows
are built as every training episode's (sampler/her.py), then marked as demonstrations.

Seeds: episode j of the task at place p starts from DEMO_SEEDS_FROM + (sampler.seed * tasks +
p) * demo_episodes + j, one seed per episode of the run, all at or above 2**31, where no
training episode (seeds in [2**21, 2**31)) and no evaluation episode (below 2**21) draws one.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from typing import Any, NamedTuple

import numpy as np

from foundation.acting import Episode, rollout
from foundation.config import RunConfig
from sim.metaworld_experts import ExpertPolicy
from sim.registry import TaskSpec
from sim.tasks import TaskSet

DEMO_SEEDS_FROM = 2**31  # the first demonstration seed; training episodes draw theirs below it


class DemoEpisode(NamedTuple):
    """One demonstration of the run: the task's place in the run, its number j, its seed."""

    place: int
    number: int
    seed: int


def demo_seed(config: RunConfig, place: int, number: int) -> int:
    """The seed of demonstration `number` of the task at `place` (the module docstring's layout)."""
    tasks = len(config.sim.tasks) or 1
    return DEMO_SEEDS_FROM + (config.sampler.seed * tasks + place) * config.sampler.demo_episodes + number


def demo_plan(config: RunConfig, tasks: int, sampler_id: int = 0, samplers: int = 1) -> list[DemoEpisode]:
    """Sampler `sampler_id`'s share of the run's demonstrations of its `tasks` task places when
    `samplers` share them (the fleet's sampler.num_samplers; the sync mode's one), in the order it
    runs them: its episodes j (j % samplers == sampler_id), each over every task place in turn."""
    mine = range(sampler_id % samplers, config.sampler.demo_episodes, samplers)
    return [DemoEpisode(place, j, demo_seed(config, place, j)) for j in mine for place in range(tasks)]


@contextlib.contextmanager
def demo_envs(
    config: RunConfig, tasks: TaskSet, plan: Sequence[DemoEpisode], own: dict[int, Any]
) -> Iterator[dict[int, Any]]:
    """The training env of every task place in `plan`: `own[place]` where the caller holds one
    (left open), else one built here as the samplers build theirs and closed on the way out."""
    built: dict[int, Any] = {}
    try:
        for place in sorted({demo.place for demo in plan} - set(own)):
            built[place] = tasks.make_env(place, config.sim.randomization, config.sim.control_hz, config.sim.reward)
        yield {**own, **built}
    finally:
        for env in built.values():
            env.close()


def demonstrate(env: Any, spec: TaskSpec, demo: DemoEpisode, rng: np.random.Generator) -> tuple[Episode, bool]:
    """The task's scripted expert over one training episode from the demonstration's seed:
    (episode, success), success the env's verdict on its last step."""
    return rollout(env, ExpertPolicy(spec, env.action_space), seed=demo.seed, rng=rng, task=demo.place)
