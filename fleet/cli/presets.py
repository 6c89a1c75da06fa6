"""Per-task defaults, chosen by measurement: what `fleetrl train --task X` starts from.

    config = preset_config("FetchPush-v4")                 # RunConfig with the preset applied
    config = with_overrides(config, ["learner.batch_size=512"])   # the user's overrides still win
    config = with_overrides(preset_for(user, overrides), overrides)   # what the CLI does: user = defaults + overrides

A preset is a set of `section.field` overrides on the built-in defaults (which are the
FetchReach preset). Each entry says why; docs/presets.md explains each preset and the docs'
results page gives the figures behind them. A run of several tasks adds the multi-task recipe
(MULTITASK; MULTITASK_BATCH for a dense policy or a task-routed MoE; TASK_ROUTED_MOE and
TASK_ROUTED_SHARED for the latter; METAWORLD_MULTITASK for a run whose tasks are all Meta-World's).
`fleetrl config --task X` (or `--tasks A,B`) prints the preset in force.

A multi-task run takes a task's preset in part (task_preset): the fields measured for a task alone
(ALONE_ONLY) take the multi-task values, and a task whose whole preset is measured for it alone
(ALONE_ONLY_TASKS: every Meta-World task) gives nothing, so it neither picks the run's base
(preset_task), adds fields (_later_presets) nor names the preset: `--tasks mt10` starts from the
built-in defaults and the multi-task recipe, Meta-World's included, as if those tasks had no preset.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Collection
from typing import Any

from foundation.config import ModelConfig, RunConfig, with_overrides
from foundation.config_experience import METAWORLD_TASKS

# The manipulation recipe: the harder Fetch tasks share it. The object must first be touched by
# chance, and the sparse reward only then says anything (docs/presets.md, "The manipulation recipe"):
#   random_action_prob 0.3  HER's epsilon exploration: SAC's temperature falls to ~1e-3 within a
#                       few thousand updates on Push, after which a Gaussian policy stops finding
#                       the object; uniform actions on 30% of steps keep finding it.
#   gamma 0.95, batch 256, one env step per update: the settings under which a peer (SBX SAC+HER)
#                       leaves chance on Push; gamma 0.98 with 2-3 env steps per update stays at
#                       chance for 30 minutes.
#   her_k_unmoved 0     an episode that never moved the object stores no HER copies (4 for one
#                       that moved it): its relabeled goals are free successes where the object
#                       already lies, so without them the episodes that moved it are a larger
#                       share of every batch. With 1 copy FetchPush needs about twice the
#                       updates to 90%; with 4 it stays at chance.
_MANIPULATION: dict[str, Any] = {
    "learner.gamma": 0.95,
    "learner.batch_size": 256,
    "sampler.random_action_prob": 0.3,
    "sampler.max_env_steps_per_update": 1.0,
    "sampler.her_k_unmoved": 0,
}

# The FetchPickAndPlace-v4 preset adds to that recipe (docs/presets.md, "FetchPickAndPlace-v4"):
#   random_keep_dims 1  a random step draws the arm's 3 dimensions and takes the gripper's from
#                       the policy, so a grasp survives the 30% of random steps a lift crosses.
#                       Without it the policy pushes and does not lift. (Push and Slide block
#                       the gripper: nothing there to keep.)
#   num_learners 2, grads_per_step 1, max_grad_staleness 2: two learners at K=1.
#   Together: 90% on 50 held-out episodes on every seed of 3, median 31.5 min (results page,
#                       "FetchPickAndPlace: time to 90%").
_PICK_AND_PLACE: dict[str, Any] = {
    **_MANIPULATION,
    "sampler.random_keep_dims": 1,
    "learner.num_learners": 2,
    "aggregator.grads_per_step": 1,
    "learner.max_grad_staleness": 2,
}

# The FetchPush-v4 preset adds to that recipe, measured on Push alone (docs/presets.md, "FetchPush-v4"):
#   batch_size 1024, max_env_steps_per_update 4: 4x the rows and 4x the env steps per gradient,
#                       so as many env steps per row learned as batch 256 at 1.
#   autocast "auto"     bfloat16 losses where the learner's CPU has BF16 instructions, else float32.
#   num_learners 2, grads_per_step 1, max_grad_staleness 2: both cores learn.
#   min_replay_transitions 2000: a first batch of 1024 rows from more than a few episodes.
#   Together: 90% on 50 held-out episodes on every seed of 3, median 5.4 min in bfloat16 and 8.2
#                       in float32 (results page, "FetchPush: time to 90%").
#   A multi-task run does not take the batch, precision, env steps and first batch as set here
#                       (SINGLE_TASK_ONLY): the multi-task recipe sets its own (MULTITASK,
#                       MULTITASK_BATCH).
_PUSH_ALONE: dict[str, Any] = {
    "learner.batch_size": 1024,
    "sampler.max_env_steps_per_update": 4.0,
    "learner.autocast": "auto",
    "learner.num_learners": 2,
    "aggregator.grads_per_step": 1,
    "learner.max_grad_staleness": 2,
    "learner.min_replay_transitions": 2000,
}
SINGLE_TASK_ONLY = frozenset(
    {"learner.batch_size", "sampler.max_env_steps_per_update", "learner.autocast", "learner.min_replay_transitions"}
)

# The FetchSlide-v4 preset takes FetchPush's whole preset and adds (docs/presets.md, "FetchSlide-v4"):
#   randomization.enabled false  the nominal task, as the zoo and the SB3/SBX peers train: a slide's
#                       length follows the table's friction and the hit's speed, and a policy cannot
#                       see the friction before it hits. Randomized, the recipe scores 0.46 at 60 min.
#   gamma 0.98          1 - 1/T for 50-step episodes (the HER paper's): a puck succeeds 10-20 steps
#                       after the hit.
#   Together: a median 0.70 held-out at 60 min over 5 seeds (results page, "FetchSlide: success
#                       at 60 minutes"). The price: a policy trained on the nominal task succeeds
#                       less often under randomized dynamics (fleetrl deploy-check drives the run's
#                       ranges even where it trained without them).
#   A multi-task run takes neither (SLIDE_ALONE_ONLY): they are measured for Slide alone.
_SLIDE_ALONE: dict[str, Any] = {
    "learner.gamma": 0.98,
    "sim.randomization.enabled": False,
}
SLIDE_ALONE_ONLY = frozenset(_SLIDE_ALONE)
# Every field a multi-task run does not take from a task's preset as the preset sets it.
ALONE_ONLY = SINGLE_TASK_ONLY | SLIDE_ALONE_ONLY
# ... and takes the manipulation recipe's value of those a manipulation preset sets (batch 256,
# 1 env step per gradient, gamma 0.95), not the built-in defaults' (3 env steps per gradient:
# Reach's); the domain randomization stays the default (on).
_MULTITASK_BASE: dict[str, Any] = {k: v for k, v in _MANIPULATION.items() if k in ALONE_ONLY}

# The preset of a Meta-World task trained alone, measured on MetaWorld-push-v3 (docs/presets.md,
# "Meta-World tasks alone"). It needs the task's own shaped reward and its scripted expert, which
# every Meta-World task has (foundation/config_experience.py: SHAPED_TASKS, EXPERT_TASKS); a task
# without either would fail its preset's validation (tests/test_presets.py):
#   reward "shaped", her_k 0, gamma 0.99: the task's own dense reward, as the field trains
#                       Meta-World, each step stored once (a shaped reward cannot be recomputed for
#                       a relabeled goal), over 150-step training episodes (1 - 1/T ~ 0.99). The
#                       built-in defaults' sparse goal reward with HER never learns push: random
#                       steps almost never move the puck, so HER gets almost no episode that moved it.
#   demo_episodes 100   100 episodes of the task's scripted expert stored before the random warm-up,
#                       cloned where the critic values their actions above the actor's (the Q-filter):
#                       the shaped reward stays flat until the hand reaches the puck, which random
#                       steps rarely do, and the demonstrations put episodes that move it in the
#                       buffer.
#   critic_norm "layer" a LayerNorm after every hidden layer of both critics: the demonstrations' high
#                       returns beside random rows otherwise let the critic's Q extrapolate and diverge.
#   and FetchPush's batch recipe (_PUSH_ALONE): batch 1024 at 4 env steps per gradient, autocast
#                       "auto", two learners at K=1, a first batch from 2000 rows. At batch 256
#                       and 1 env step per gradient the learners bind the run (its sampler waits
#                       97% of the time): with 10 demonstrations 0.40 at 27 minutes, against 0.80
#                       at 30 with this batch.
#   Together, with 100 demonstrations: 90% on 50 held-out episodes on every seed of 3, median
#                       14.8 minutes, worst 15.9 (results page, "Meta-World push alone").
#   A multi-task run takes none of it as a task's preset (ALONE_ONLY_TASKS): it is measured for one
#                       task alone. A run whose tasks are all Meta-World's takes its own fields again
#                       as the Meta-World multi-task recipe (METAWORLD_MULTITASK); a set of Fetch and
#                       Meta-World tasks keeps the sparse goal reward with HER and no demonstrations.
_METAWORLD_ALONE: dict[str, Any] = {
    "sim.reward": "shaped",
    "sampler.her_k": 0,
    "learner.gamma": 0.99,
    "sampler.demo_episodes": 100,
    "model.critic_norm": "layer",
}
# The tasks whose whole preset is measured for the task alone: a multi-task run takes none of it as
# the task's preset (a run of Meta-World tasks only takes the Meta-World multi-task recipe instead).
ALONE_ONLY_TASKS = frozenset(METAWORLD_TASKS)

TASK_PRESETS: dict[str, dict[str, Any]] = {
    "FetchReach-v4": {},  # the built-in defaults: 90% in ~20 s (results page, "FetchReach: time to 90%")
    "FetchPush-v4": _MANIPULATION | _PUSH_ALONE,
    "FetchPickAndPlace-v4": dict(_PICK_AND_PLACE),
    "FetchSlide-v4": _MANIPULATION | _PUSH_ALONE | _SLIDE_ALONE,
    **{name: _METAWORLD_ALONE | _PUSH_ALONE for name in METAWORLD_TASKS},
}


# The multi-task recipe, for a run of several tasks (docs/presets.md, "Multi-task runs"):
#   task_sampling "focus"  each task keeps learner.task_min_share, the rest goes to the first task
#                       in --tasks order still below target_success. With "success" shares a task
#                       that is never solved (MetaWorld-push) takes as much as FetchPush, which then
#                       stays at chance.
#   task_alpha true     one SAC temperature per task: a solved task's near-deterministic actor
#                       otherwise holds the shared temperature where an unsolved task's policy
#                       stays noisier than its target.
#   min_replay_transitions 2000 (or the batch, if larger): the first batch has rows of every task.
#   num_learners 2, grads_per_step 1, max_grad_staleness 2: two learners whose every gradient
#                       steps the optimizer alone (K=1) on weights at most 2 versions old: better
#                       than one learner on every seed measured, MoE and dense.
MULTITASK: dict[str, Any] = {
    "learner.task_sampling": "focus",
    "model.task_alpha": True,
    "learner.min_replay_transitions": 2000,
    "learner.num_learners": 2,
    "aggregator.grads_per_step": 1,
    "learner.max_grad_staleness": 2,
}
# ... and with a task-routed MoE (model.kind "moe", model.router "task"), tasks share no weight:
#   task_onehot false   a one-hot constant within a task is a second first-layer bias; FetchPush
#                       learns in a multi-task run with it hidden and not with it read.
#   task_heads true     one output layer per task: a shared one carries FetchReach's habit (the
#                       gripper to the goal) into FetchPush's policy.
#   gate_grad false     the task losses drive each task's gates to one expert within a few
#                       thousand updates, turning its layers toward another random matrix each time.
TASK_ROUTED_MOE: dict[str, Any] = {
    "model.task_onehot": False,
    "model.task_heads": True,
    "model.gate_grad": False,
}
# ... and its experts keep one shared per layer (TASK_ROUTED_SHARED): top_k 3, of which expert 0
#   is in every task's routing and two are the task's own, at the same cost per row (a task's k
#   experts are mixed into one Linear). FetchPush reaches 90% sooner on every seed, and the mean
#   over 4 tasks comes within 0.01 of the dense policy's (results page, "Mixture of experts vs
#   dense, multi-task"). Only where the user left the routing alone (set neither model.top_k nor
#   model.shared_experts): a run that sets either keeps what it set, and `--set model.top_k=2`
#   runs the design's plain top-2.
TASK_ROUTED_SHARED: dict[str, Any] = {
    "model.top_k": 3,
    "model.shared_experts": 1,
}
# ... and a dense or task-routed MoE run learns at the FetchPush-v4 preset's batch (MULTITASK_BATCH:
#   batch 1024, 4 env steps per gradient, autocast "auto"): with it FetchReach and FetchPush hold
#   >= 0.9 at 45 min on every seed of both arms, and the dense policy's mean over 4 tasks rises
#   from 0.70 to 0.73. A state-routed MoE keeps the manipulation recipe's batch (unmeasured with
#   this one), and a CPU without BF16 instructions runs it in float32.
MULTITASK_BATCH: dict[str, Any] = {
    "learner.batch_size": 1024,
    "sampler.max_env_steps_per_update": 4.0,
    "learner.autocast": "auto",
}
# ... and a run whose tasks are all Meta-World's (`--tasks mt10`) takes the fields of a Meta-World
#   task's preset that are not FetchPush's batch recipe (METAWORLD_MULTITASK: the same dict as
#   _METAWORLD_ALONE; the learners and the batch come from MULTITASK and MULTITASK_BATCH). What push
#   alone shows holds for the MT10 tasks whose shaped reward stays flat until the hand reaches an
#   object (push, pick-place, door-open, button-press-topdown, peg-insert-side): without
#   demonstrations they stay at or near zero at 90 minutes (results page, "Meta-World MT10, one
#   policy"):
#   reward "shaped", her_k 0, gamma 0.99: each task's own dense reward, each step stored once, over
#                       100- to 150-step training episodes, as the field trains MT10.
#   demo_episodes 100   100 episodes of each task's scripted expert (1,000 for MT10) stored before
#                       the random warm-up: episodes that reach each task's object, which random
#                       steps rarely do.
#   critic_norm "layer" LayerNorm critics: the demonstrations' returns beside random rows otherwise
#                       let the critic's Q extrapolate and diverge.
#   Together, MT10 with the task-routed MoE, seed 0: mean 0.83 at 90 minutes (0.39 without the
#                       demonstrations and LayerNorm critics); with a dense policy, 0.90 by 81 minutes.
#   A run with a Fetch task takes none of it: a Fetch task has neither a shaped reward nor a scripted
#                       expert (validation refuses both), and learns with the sparse goal reward and HER.
METAWORLD_MULTITASK: dict[str, Any] = _METAWORLD_ALONE


def preset_task(tasks: list[str]) -> str:
    """The task whose preset a run starts from: a multi-task run takes the first of its tasks
    whose preset it takes something of (task_preset), so `--tasks FetchReach-v4,FetchPush-v4`
    trains Push with the manipulation recipe (Reach's own preset is the defaults; the recipe
    leaves Reach's learning alone: its HER rule only touches episodes whose achieved goal never
    moved, and a Reach gripper always moves), and a Meta-World task (ALONE_ONLY_TASKS) is passed
    over. A one-task run takes its task's."""
    multitask = len(tasks) > 1
    return next((t for t in tasks if task_preset(t, multitask)), tasks[0])


def _as_overrides(preset: dict[str, Any]) -> list[str]:
    return [f"{key}={json.dumps(value)}" for key, value in preset.items()]


def task_preset(task: str, multitask: bool = False) -> dict[str, Any]:
    """`task`'s preset ({} for a task without one); in a multi-task run the fields measured for
    the task alone (ALONE_ONLY) take the manipulation recipe's values where it sets them (_MULTITASK_BASE),
    their defaults elsewhere, and a task whose whole preset is measured alone (ALONE_ONLY_TASKS) gives {}."""
    preset = TASK_PRESETS.get(task, {})
    if not multitask:
        return dict(preset)
    if task in ALONE_ONLY_TASKS:
        return {}
    shared = {k: v for k, v in preset.items() if k not in ALONE_ONLY}
    return shared | {k: v for k, v in _MULTITASK_BASE.items() if k in preset}


def preset_overrides(task: str, multitask: bool = False) -> list[str]:
    """The preset as `section.field=json` override strings ([] for a task without one)."""
    return _as_overrides(task_preset(task, multitask))


def _task_routed_moe(user: RunConfig) -> bool:
    return user.model.kind == "moe" and user.model.router == "task"


def _all_metaworld(user: RunConfig) -> bool:
    return set(user.sim.tasks) <= set(METAWORLD_TASKS)


def multitask_overrides(user: RunConfig, user_set: Collection[str] = ()) -> list[str]:
    """The multi-task recipe for a run the user set up as `user` ([] for a one-task run): MULTITASK,
    and MULTITASK_BATCH for a dense policy or a MoE with the task router, which takes
    TASK_ROUTED_MOE too, and TASK_ROUTED_SHARED where the user left its routing alone: neither
    field named in `user_set` (the `section.field` names the user set) nor changed from the
    design's (a state-routed MoE: none of them, unmeasured); METAWORLD_MULTITASK where every task
    is a Meta-World task, whatever the policy."""
    if len(user.sim.tasks) < 2:
        return []
    moe = _task_routed_moe(user)
    batch = moe or user.model.kind == "dense"
    recipe = MULTITASK | (TASK_ROUTED_MOE if moe else {}) | (MULTITASK_BATCH if batch else {})
    if _all_metaworld(user):
        recipe |= METAWORLD_MULTITASK
    design = ModelConfig()
    routing_left = (user.model.top_k, user.model.shared_experts) == (design.top_k, design.shared_experts)
    if moe and routing_left and TASK_ROUTED_SHARED.keys().isdisjoint(user_set):
        recipe |= TASK_ROUTED_SHARED
    # never below the user's batch (a check refuses fewer rows than one batch)
    recipe["learner.min_replay_transitions"] = max(recipe["learner.min_replay_transitions"], user.learner.batch_size)
    return _as_overrides(recipe)


def preset_for(user: RunConfig, overrides: Collection[str] = ()) -> RunConfig:
    """What a run starts from, chosen by what the user set (`user`: the built-in defaults with the
    user's `overrides`, `section.field=value` strings): its task's preset (preset_task) and, with
    several tasks, the multi-task recipe, named "Meta-World multi-task" where every task is a
    Meta-World task. The user's overrides go on top of it and win."""
    tasks = list(user.sim.tasks) or [user.sim.task]
    first = preset_task(tasks)
    extra = multitask_overrides(user, {o.split("=", 1)[0].strip() for o in overrides})
    config = preset_config(first, multitask=bool(extra))
    if not extra:
        return config
    added, contributors = _later_presets(tasks, first)
    recipe = "multi-task MoE" if _task_routed_moe(user) else "multi-task"
    if _all_metaworld(user):
        recipe = f"Meta-World {recipe}"
    label = " + ".join([*([config.preset] if config.preset else []), *contributors, recipe])
    return dataclasses.replace(with_overrides(config, [*added, *extra]), preset=label)


def _later_presets(tasks: list[str], first: str) -> tuple[list[str], list[str]]:
    """What the other tasks' presets add to the first's: the fields it does not set, the earlier
    task in --tasks order winning (FetchPickAndPlace's sampler.random_keep_dims joins Push's
    recipe in `--tasks FetchPush-v4,FetchReach-v4,FetchPickAndPlace-v4`; the gripper dimension it
    keeps is blocked, so ignored, in Reach and Push). Returns the overrides and the tasks that
    added something."""
    taken = task_preset(first, multitask=True)
    added: dict[str, Any] = {}
    contributors = []
    for task in tasks:  # the first task's fields are all taken: it adds nothing
        new = {k: v for k, v in task_preset(task, multitask=True).items() if k not in taken}
        if new:
            contributors.append(task)
            added |= new
            taken |= new
    return _as_overrides(added), contributors


def preset_config(task: str, base: RunConfig | None = None, multitask: bool = False) -> RunConfig:
    """`base` (default: built-in defaults) with `task` and its preset applied (`multitask`: as a
    multi-task run takes it, task_preset). The config names the preset after the task where the run
    takes it: a multi-task run names no preset of a task in ALONE_ONLY_TASKS."""
    named = task in TASK_PRESETS and not (multitask and task in ALONE_ONLY_TASKS)
    config = dataclasses.replace(base or RunConfig(), preset=task if named else "")
    return with_overrides(config, [f"sim.task={json.dumps(task)}", *preset_overrides(task, multitask)])
