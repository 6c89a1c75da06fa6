"""Per-task defaults, chosen by measurement: what `fleetrl train --task X` starts from.

    config = preset_config("FetchPush-v4")                 # RunConfig with the preset applied
    config = with_overrides(config, ["learner.batch_size=512"])   # the user's overrides still win

A preset is a set of `section.field` overrides on the built-in defaults (which are the
FetchReach preset). Each entry says why; the figures behind them are in
docs/presets.md and benchmarks/results/. `fleetrl config --task X` prints the preset in force.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

from foundation.config import RunConfig, with_overrides

# The harder Fetch tasks share one recipe: the object must first be touched by chance, and
# the sparse reward only then says anything. Why each value (runs in docs/presets.md):
#   random_action_prob 0.3  HER's epsilon exploration: SAC's temperature falls to ~1e-3 within
#                       8k updates on Push (measured), after which a Gaussian policy stops
#                       finding the object; uniform actions on 30% of steps keep finding it
#   gamma 0.95, batch 256, one env step per update: the settings of the one peer measured to
#                       leave chance on Push here (SBX SAC+HER: 0.2-0.4 from ~125k updates).
#                       gamma 0.98 with 2-3 env steps per update (batch 256 or 512) stayed at
#                       0.00 curve success for 20 and 30 minutes (docs/presets.md).
#   her_k_unmoved 0     an episode that never moved the object stores no HER copies (4 for one
#                       that moved it): its relabeled goals are free successes where the object
#                       already lies, so without them the episodes that moved it are a larger
#                       share of every batch. FetchPush, one core each (--mode sync): 1 copy
#                       reached 90% on 50 episodes at 89.7k updates (seed 0, 22.7 min), where 4
#                       copies were at chance after 200k updates (55 min); 0 copies reached it at
#                       49.8k and 46.4k updates (seeds 1 and 2, 13.1 and 13.0 min), seeds that
#                       with 1 copy had not in the 30-minute fleet runs (0.72 and 0.68).
_MANIPULATION: dict[str, Any] = {
    "learner.gamma": 0.95,
    "learner.batch_size": 256,
    "sampler.random_action_prob": 0.3,
    "sampler.max_env_steps_per_update": 1.0,
    "sampler.her_k_unmoved": 0,
}

TASK_PRESETS: dict[str, dict[str, Any]] = {
    "FetchReach-v4": {},  # the built-in defaults: 90% in ~20 s here
    "FetchPush-v4": dict(_MANIPULATION),
    "FetchPickAndPlace-v4": dict(_MANIPULATION),
    "FetchSlide-v4": dict(_MANIPULATION),
}


def preset_task(tasks: list[str]) -> str:
    """The task whose preset a run starts from: a multi-task run takes the first of its tasks
    with a non-empty preset, so `--tasks FetchReach-v4,FetchPush-v4` trains Push with the
    manipulation recipe (Reach's own preset is the defaults; the recipe leaves Reach's learning
    alone: its HER rule only touches episodes whose achieved goal never moved, and a Reach
    gripper always moves). A one-task run takes its task's."""
    return next((t for t in tasks if TASK_PRESETS.get(t)), tasks[0])


def preset_overrides(task: str) -> list[str]:
    """The preset as `section.field=json` override strings ([] for a task without one)."""
    return [f"{key}={json.dumps(value)}" for key, value in TASK_PRESETS.get(task, {}).items()]


def preset_config(task: str, base: RunConfig | None = None) -> RunConfig:
    """`base` (default: built-in defaults) with `task` and its preset applied."""
    config = dataclasses.replace(base or RunConfig(), preset=task if task in TASK_PRESETS else "")
    return with_overrides(config, [f"sim.task={json.dumps(task)}", *preset_overrides(task)])
