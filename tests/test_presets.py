"""Task presets: what `fleetrl train --task X` and `fleetrl config --task X` start from."""

from __future__ import annotations

import functools
import json

import pytest

from fleet.cli.main import main
from fleet.cli.presets import (
    METAWORLD_MULTITASK,
    MULTITASK,
    MULTITASK_BATCH,
    SINGLE_TASK_ONLY,
    TASK_PRESETS,
    TASK_ROUTED_MOE,
    TASK_ROUTED_SHARED,
    preset_config,
)
from foundation.config import RunConfig, help_lines, with_overrides
from sim.registry import TASKS, get_task


@pytest.mark.parametrize("task", sorted(TASK_PRESETS))
def test_every_preset_names_a_registered_task_and_validates(task):
    get_task(task)
    config = preset_config(task).validate()
    assert (config.sim.task, config.preset) == (task, task)
    for dotted, value in TASK_PRESETS[task].items():
        assert functools.reduce(getattr, dotted.split("."), config) == value  # sim.randomization.enabled too


def test_the_push_preset_differs_from_the_built_in_defaults():
    config = preset_config("FetchPush-v4")
    assert config.sampler.max_env_steps_per_update != RunConfig().sampler.max_env_steps_per_update
    assert config.sampler.random_action_prob > 0


def test_push_alone_learns_on_both_cores_at_batch_1024_and_a_multi_task_run_takes_it_but_a_state_routed_moe(capsys):
    alone = _cli_config(capsys, "--task", "FetchPush-v4")
    defaults = RunConfig()
    assert (alone["learner"]["batch_size"], alone["learner"]["autocast"]) == (1024, "auto")
    assert (alone["sampler"]["max_env_steps_per_update"], alone["learner"]["num_learners"]) == (4.0, 2)
    assert (alone["aggregator"]["grads_per_step"], alone["learner"]["max_grad_staleness"]) == (1, 2)
    assert alone["learner"]["min_replay_transitions"] >= alone["learner"]["batch_size"]
    assert SINGLE_TASK_ONLY <= set(TASK_PRESETS["FetchPush-v4"])
    # PickAndPlace keeps its measured batch; Slide takes Push's recipe (test below)
    assert preset_config("FetchPickAndPlace-v4").learner.batch_size == 256
    state_routed = ("--set", 'model.kind="moe"', "--set", 'model.router="state"')
    for tasks in ("FetchPush-v4,FetchReach-v4", "FetchReach-v4,FetchPush-v4,FetchPickAndPlace-v4"):
        dense = _cli_config(capsys, "--tasks", tasks)  # MULTITASK_BATCH: measured on 4 tasks, 3 seeds
        assert (dense["learner"]["batch_size"], dense["learner"]["autocast"]) == (1024, "auto")
        assert dense["sampler"]["max_env_steps_per_update"] == 4.0
        multi = _cli_config(capsys, "--tasks", tasks, *state_routed)
        # a state-routed MoE (unmeasured with the batch) keeps the manipulation recipe's batch 256, float32 and
        # 1 env step per gradient, not the built-in defaults' 3
        assert (multi["learner"]["batch_size"], multi["learner"]["autocast"]) == (256, RunConfig().learner.autocast)
        assert multi["sampler"]["max_env_steps_per_update"] == 1.0 != defaults.sampler.max_env_steps_per_update
        assert multi["learner"]["batch_size"] == preset_config("FetchPickAndPlace-v4").learner.batch_size
        assert multi["learner"]["min_replay_transitions"] == MULTITASK["learner.min_replay_transitions"]
        assert multi["sampler"]["her_k_unmoved"] == alone["sampler"]["her_k_unmoved"] != defaults.sampler.her_k_unmoved
    mine = _cli_config(capsys, "--tasks", "FetchPush-v4,FetchReach-v4", "--set", "learner.batch_size=512")
    assert mine["learner"]["batch_size"] == 512  # the user's --set still wins
    assert (
        _cli_config(capsys, "--task", "FetchPush-v4", "--set", 'learner.autocast="off"')["learner"]["autocast"] == "off"
    )


def test_the_pick_and_place_preset_keeps_the_gripper_on_random_steps_and_trains_two_learners(capsys):
    config = preset_config("FetchPickAndPlace-v4")
    defaults = RunConfig()
    assert config.sampler.random_keep_dims == 1 != defaults.sampler.random_keep_dims
    assert (
        (config.learner.num_learners, config.aggregator.grads_per_step, config.learner.max_grad_staleness)
        == (
            2,
            1,
            2,
        )
        != (defaults.learner.num_learners, defaults.aggregator.grads_per_step, defaults.learner.max_grad_staleness)
    )
    assert config.sampler.random_action_prob == preset_config("FetchPush-v4").sampler.random_action_prob
    assert preset_config("FetchPush-v4").sampler.random_keep_dims == 0  # Push keeps its measured recipe
    shown = _cli_config(capsys, "--task", "FetchPickAndPlace-v4", "--set", "learner.num_learners=1")
    assert (shown["learner"]["num_learners"], shown["sampler"]["random_keep_dims"]) == (1, 1)  # the user's wins


def test_a_task_without_a_preset_keeps_the_defaults():
    config = preset_config("FetchReach-v4")
    assert config.learner == RunConfig().learner and config.sampler == RunConfig().sampler


def test_user_overrides_win_over_the_preset():
    config = with_overrides(preset_config("FetchPush-v4"), ["learner.gamma=0.9"])
    assert config.learner.gamma == 0.9


def _cli_config(capsys, *argv: str) -> dict:
    assert main(["config", "--json", *argv]) == 0
    return json.loads(capsys.readouterr().out)


def test_cli_applies_the_preset_of_the_chosen_task_under_set_overrides(capsys):
    push = _cli_config(capsys, "--task", "FetchPush-v4")
    assert push["preset"] == "FetchPush-v4"
    assert push["learner"]["gamma"] == TASK_PRESETS["FetchPush-v4"]["learner.gamma"]
    assert _cli_config(capsys, "--set", 'sim.task="FetchPush-v4"')["preset"] == "FetchPush-v4"
    mine = _cli_config(capsys, "--task", "FetchPush-v4", "--set", "learner.gamma=0.9")
    assert mine["learner"]["gamma"] == 0.9 != push["learner"]["gamma"]
    assert mine["sampler"]["random_action_prob"] == push["sampler"]["random_action_prob"]


def test_cli_takes_a_resolved_config_file_as_is(capsys, tmp_path):
    path = tmp_path / "run.json"
    path.write_text(with_overrides(RunConfig(), ["learner.gamma=0.97"]).to_json())
    loaded = _cli_config(capsys, "--config", str(path), "--task", "FetchPush-v4")
    assert loaded["learner"]["gamma"] == 0.97  # no preset re-applied over a resolved file
    assert loaded["sim"]["task"] == "FetchPush-v4"


def test_config_listing_marks_what_the_preset_changed():
    lines = help_lines(preset_config("FetchPush-v4"))
    eps = next(line for line in lines if line.startswith("sampler.random_action_prob = "))
    assert eps.startswith("sampler.random_action_prob = 0.3  [default 0.0]")
    tau = next(line for line in lines if line.startswith("aggregator.tau = "))
    assert "[default" not in tau  # a field the preset leaves alone is not marked


def test_a_multi_task_run_takes_the_first_preset_among_its_tasks_whatever_their_order(capsys):
    push_first = _cli_config(capsys, "--tasks", "FetchPush-v4,FetchReach-v4")
    reach_first = _cli_config(capsys, "--tasks", "FetchReach-v4,MetaWorld-reach-v3,FetchPush-v4")
    for config in (push_first, reach_first):
        assert config["preset"] == "FetchPush-v4 + multi-task"
        assert config["sampler"]["random_action_prob"] == TASK_PRESETS["FetchPush-v4"]["sampler.random_action_prob"]
    assert reach_first["sim"]["task"] == "FetchReach-v4"  # the first task still names the run
    assert _cli_config(capsys, "--tasks", "FetchReach-v4,MetaWorld-reach-v3")["preset"] == "FetchReach-v4 + multi-task"


def test_a_multi_task_run_adds_what_later_tasks_presets_set_and_the_first_leaves_alone(capsys):
    push_first = _cli_config(capsys, "--tasks", "FetchPush-v4,FetchReach-v4,FetchPickAndPlace-v4")
    pnp_first = _cli_config(capsys, "--tasks", "FetchPickAndPlace-v4,FetchPush-v4")
    assert push_first["preset"] == "FetchPush-v4 + FetchPickAndPlace-v4 + multi-task"
    assert pnp_first["preset"] == "FetchPickAndPlace-v4 + multi-task"  # Push adds nothing to it
    for config in (push_first, pnp_first):
        assert config["sampler"]["random_keep_dims"] == TASK_PRESETS["FetchPickAndPlace-v4"]["sampler.random_keep_dims"]
        assert config["sampler"]["random_action_prob"] == TASK_PRESETS["FetchPush-v4"]["sampler.random_action_prob"]
    # the user's --set still wins over a later task's preset
    mine = _cli_config(capsys, "--tasks", "FetchPush-v4,FetchPickAndPlace-v4", "--set", "sampler.random_keep_dims=0")
    assert mine["sampler"]["random_keep_dims"] == 0
    assert _cli_config(capsys, "--tasks", "FetchPush-v4,FetchSlide-v4")["preset"] == "FetchPush-v4 + multi-task"


def _differs(config: dict, dotted: str) -> bool:
    section, name = dotted.split(".")
    return config[section][name] != getattr(getattr(RunConfig(), section), name)


def test_a_multi_task_run_adds_the_multitask_recipe_and_a_task_routed_moe_its_switches(capsys):
    dense = _cli_config(capsys, "--tasks", "FetchReach-v4,FetchPush-v4")
    moe = _cli_config(capsys, "--tasks", "FetchReach-v4,FetchPush-v4", "--set", 'model.kind="moe"')
    state = _cli_config(
        capsys, "--tasks", "FetchReach-v4,FetchPush-v4", "--set", 'model.kind="moe"', "--set", 'model.router="state"'
    )
    for config in (dense, moe, state):
        for dotted, value in MULTITASK.items():
            assert config[dotted.split(".")[0]][dotted.split(".")[1]] == value and _differs(config, dotted), dotted
    for dotted, value in (TASK_ROUTED_MOE | TASK_ROUTED_SHARED).items():
        assert moe[dotted.split(".")[0]][dotted.split(".")[1]] == value and _differs(moe, dotted), dotted
        assert not _differs(dense, dotted) and not _differs(state, dotted), (
            dotted
        )  # a dense or state-routed run keeps them
    for dotted, value in MULTITASK_BATCH.items():  # dense, task-routed MoE; state-routed: the recipe's
        section, name = dotted.split(".")
        assert moe[section][name] == dense[section][name] == value != state[section][name], dotted
    assert (dense["learner"]["batch_size"], state["learner"]["batch_size"], moe["learner"]["batch_size"]) == (
        1024,
        256,
        1024,
    )
    for config in (dense, moe):
        assert config["learner"]["min_replay_transitions"] >= config["learner"]["batch_size"]
    assert (dense["preset"], moe["preset"], state["preset"]) == (
        "FetchPush-v4 + multi-task",
        "FetchPush-v4 + multi-task MoE",
        "FetchPush-v4 + multi-task",
    )
    RunConfig.from_json(json.dumps(moe)).validate()


def test_the_shared_expert_recipe_leaves_a_routing_the_user_set_alone(capsys):
    moe = ("--tasks", "FetchReach-v4,FetchPush-v4", "--set", 'model.kind="moe"')
    # the design's plain top-2: naming either routing field, even at its default, keeps the recipe out
    for plain in (("model.top_k=2",), ("model.shared_experts=0",), ("model.top_k=2", "model.shared_experts=0")):
        config = _cli_config(capsys, *moe, *[a for s in plain for a in ("--set", s)])
        assert (config["model"]["top_k"], config["model"]["shared_experts"]) == (2, 0), plain
    for top_k, shared in ((1, 0), (4, 0), (4, 2)):  # top_k 1 cannot hold a shared expert: the recipe stays out
        mine = _cli_config(capsys, *moe, "--set", f"model.top_k={top_k}", "--set", f"model.shared_experts={shared}")
        assert (mine["model"]["top_k"], mine["model"]["shared_experts"]) == (top_k, shared)
        RunConfig.from_json(json.dumps(mine)).validate()
    own = _cli_config(capsys, *moe, "--set", "model.shared_experts=1")  # top_k left as the design's 2
    assert (own["model"]["top_k"], own["model"]["shared_experts"]) == (2, 1)
    alone = _cli_config(capsys, "--task", "FetchPush-v4", "--set", 'model.kind="moe"')  # one task: no recipe
    assert (alone["model"]["top_k"], alone["model"]["shared_experts"]) == (2, 0)


def test_a_one_task_run_gets_no_multitask_recipe_and_the_users_set_wins_over_it(capsys):
    alone = _cli_config(capsys, "--task", "FetchPush-v4", "--set", 'model.kind="moe"')
    own = TASK_PRESETS["FetchPush-v4"]  # its two learners and first batch are Push's own (the recipe's too)
    assert {"learner.task_sampling", "model.task_alpha", *TASK_ROUTED_MOE}.isdisjoint(own)
    assert not any(_differs(alone, d) for d in (*MULTITASK, *TASK_ROUTED_MOE) if d not in own)
    assert all(alone[d.split(".")[0]][d.split(".")[1]] == own[d] for d in MULTITASK if d in own)
    mine = _cli_config(
        capsys,
        "--tasks",
        "FetchReach-v4,FetchPush-v4",
        "--set",
        'model.kind="moe"',
        "--set",
        'learner.task_sampling="success"',
        "--set",
        "model.task_heads=false",
    )
    assert (mine["learner"]["task_sampling"], mine["model"]["task_heads"]) == ("success", False)
    assert mine["model"]["gate_grad"] is False  # the rest of the recipe stays


def test_the_multitask_recipe_never_asks_for_fewer_replay_rows_than_the_users_batch(capsys):
    big = _cli_config(capsys, "--tasks", "FetchReach-v4,FetchPush-v4", "--set", "learner.batch_size=4096")
    assert big["learner"]["min_replay_transitions"] == 4096
    RunConfig.from_json(json.dumps(big)).validate()


def test_slide_alone_trains_push_s_recipe_on_the_nominal_task_at_gamma_098_but_not_in_a_multi_task_run(capsys):
    slide, push = preset_config("FetchSlide-v4"), preset_config("FetchPush-v4")
    assert (slide.learner.batch_size, slide.learner.num_learners) == (push.learner.batch_size, 2) == (1024, 2)
    assert slide.sampler.her_k_unmoved == push.sampler.her_k_unmoved == 0  # the manipulation recipe's HER rule
    assert (slide.learner.gamma, slide.sim.randomization.enabled) == (0.98, False)
    assert (push.learner.gamma, push.sim.randomization.enabled) == (0.95, True)
    user = _cli_config(capsys, "--task", "FetchSlide-v4", "--set", "sim.randomization.enabled=true")
    assert user["sim"]["randomization"]["enabled"] is True  # the user's --set wins
    # Slide first in a multi-task run: its preset picks the recipe, but gamma and the dynamics
    # measured for Slide alone take the manipulation recipe's gamma and the default randomization
    multi = _cli_config(capsys, "--tasks", "FetchSlide-v4,FetchReach-v4")
    assert (multi["learner"]["gamma"], multi["sim"]["randomization"]["enabled"]) == (0.95, True)
    assert multi["learner"]["batch_size"] == 1024  # the dense multi-task batch (MULTITASK_BATCH)


METAWORLD_ALONE = {  # the measured recipe of a Meta-World task trained alone, as `fleetrl config` resolves it
    "sim.reward": "shaped",
    "sampler.her_k": 0,
    "learner.gamma": 0.99,
    "sampler.demo_episodes": 100,
    "model.critic_norm": "layer",
    "learner.batch_size": 1024,
    "sampler.max_env_steps_per_update": 4.0,
    "learner.autocast": "auto",
    "learner.num_learners": 2,
    "aggregator.grads_per_step": 1,
    "learner.max_grad_staleness": 2,
    "learner.min_replay_transitions": 2000,
}


def _field(config: dict, dotted: str):
    return functools.reduce(lambda section, name: section[name], dotted.split("."), config)


def test_every_meta_world_task_of_the_registry_has_a_preset():
    metaworld = [name for name, spec in TASKS.items() if not spec.is_fetch]
    assert len(metaworld) == 10 and all(name in TASK_PRESETS for name in metaworld)


@pytest.mark.parametrize("task", ["MetaWorld-push-v3", "MetaWorld-door-open-v3"])
def test_a_meta_world_task_alone_trains_its_shaped_reward_with_demonstrations_at_push_s_batch(capsys, task):
    alone = _cli_config(capsys, "--task", task)
    assert (alone["preset"], alone["sim"]["task"]) == (task, task)
    assert {dotted: _field(alone, dotted) for dotted in METAWORLD_ALONE} == METAWORLD_ALONE
    # none of the Fetch manipulation recipe: no epsilon exploration, HER's rule for unmoved objects left alone
    defaults = RunConfig()
    assert alone["sampler"]["random_action_prob"] == defaults.sampler.random_action_prob == 0.0
    assert alone["sampler"]["her_k_unmoved"] == defaults.sampler.her_k_unmoved
    RunConfig.from_json(json.dumps(alone)).validate()
    # the user's --set still wins: demonstrations off, the rest of the recipe stays
    off = _cli_config(capsys, "--task", task, "--set", "sampler.demo_episodes=0")
    assert off["sampler"]["demo_episodes"] == 0
    assert {d: _field(off, d) for d in METAWORLD_ALONE if d != "sampler.demo_episodes"} == {
        d: v for d, v in METAWORLD_ALONE.items() if d != "sampler.demo_episodes"
    }
    sparse = _cli_config(capsys, "--task", task, "--set", 'sim.reward="sparse"', "--set", "sampler.her_k=4")
    assert (sparse["sim"]["reward"], sparse["sampler"]["her_k"]) == ("sparse", 4)


# The Meta-World tasks' presets give a multi-task run nothing; a run of Meta-World tasks only takes
# METAWORLD_MULTITASK from the multi-task recipe instead (tests below), whatever TASK_PRESETS holds.
MULTI_TASK_RUNS = [
    ("mt10",),
    ("mt10", "--set", 'model.kind="moe"'),
    ("mt10", "--set", 'sim.reward="shaped"', "--set", "sampler.her_k=0", "--set", "learner.gamma=0.99"),
    ("FetchPush-v4,FetchReach-v4,MetaWorld-reach-v3,MetaWorld-push-v3",),
    ("FetchPush-v4,FetchReach-v4,MetaWorld-reach-v3,MetaWorld-push-v3", "--set", 'model.kind="moe"'),
    ("MetaWorld-push-v3,FetchPush-v4",),
    ("MetaWorld-door-open-v3,FetchSlide-v4,FetchPickAndPlace-v4",),
]


@pytest.mark.parametrize("run", MULTI_TASK_RUNS, ids=lambda run: " ".join(run))
def test_a_multi_task_run_takes_nothing_of_the_meta_world_presets(capsys, monkeypatch, run):
    tasks, *sets = run
    sets += ["--set", 'run_dir="runs/same"']  # the default run_dir holds the second it was resolved at
    resolved = _cli_config(capsys, "--tasks", tasks, *sets)
    fetch_only = {name: preset for name, preset in TASK_PRESETS.items() if name.startswith("Fetch")}
    monkeypatch.setattr("fleet.cli.presets.TASK_PRESETS", fetch_only)
    assert resolved == _cli_config(capsys, "--tasks", tasks, *sets)  # the preset's name too


def test_a_set_of_fetch_and_meta_world_tasks_keeps_its_multi_task_recipe_and_name(capsys):
    for moe, name in (((), "multi-task"), (("--set", 'model.kind="moe"'), "multi-task MoE")):
        four = _cli_config(capsys, "--tasks", "FetchPush-v4,FetchReach-v4,MetaWorld-reach-v3,MetaWorld-push-v3", *moe)
        assert four["preset"] == f"FetchPush-v4 + {name}"
        assert (four["sim"]["reward"], four["sampler"]["demo_episodes"], four["model"]["critic_norm"]) == (
            "sparse",
            0,
            "none",
        )
        assert four["learner"]["gamma"] == TASK_PRESETS["FetchPush-v4"]["learner.gamma"]  # the manipulation recipe's
        assert four["sampler"]["random_action_prob"] == TASK_PRESETS["FetchPush-v4"]["sampler.random_action_prob"]
        assert (four["learner"]["batch_size"], four["sampler"]["max_env_steps_per_update"]) == (1024, 4.0)
    # a Meta-World task first does not pick the base: the first Fetch task with a preset does
    assert _cli_config(capsys, "--tasks", "MetaWorld-push-v3,FetchPush-v4")["preset"] == "FetchPush-v4 + multi-task"
    assert _cli_config(capsys, "--tasks", "MetaWorld-push-v3,FetchReach-v4")["preset"] == "multi-task"


MOE = ("--set", 'model.kind="moe"')
STATE_ROUTED = (*MOE, "--set", 'model.router="state"')


@pytest.mark.parametrize(
    "tasks,sets,name,batch",
    [
        ("mt10", (), "Meta-World multi-task", 1024),
        ("mt10", MOE, "Meta-World multi-task MoE", 1024),
        ("mt10", STATE_ROUTED, "Meta-World multi-task", 256),  # the batch as any state-routed MoE's
        ("MetaWorld-push-v3,MetaWorld-door-open-v3", (), "Meta-World multi-task", 1024),
        ("MetaWorld-door-open-v3,MetaWorld-reach-v3", MOE, "Meta-World multi-task MoE", 1024),
    ],
)
def test_a_run_of_meta_world_tasks_only_takes_the_meta_world_multi_task_recipe(capsys, tasks, sets, name, batch):
    run = _cli_config(capsys, "--tasks", tasks, *sets)
    assert METAWORLD_MULTITASK == {
        "sim.reward": "shaped",
        "sampler.her_k": 0,
        "learner.gamma": 0.99,
        "sampler.demo_episodes": 100,
        "model.critic_norm": "layer",
    }
    assert {dotted: _field(run, dotted) for dotted in METAWORLD_MULTITASK} == METAWORLD_MULTITASK
    assert all(_differs(run, dotted) for dotted in METAWORLD_MULTITASK)
    assert run["preset"] == name
    assert all(_field(run, dotted) == value for dotted, value in MULTITASK.items())  # the multi-task recipe stays
    assert (run["learner"]["batch_size"], run["learner"]["min_replay_transitions"]) == (batch, 2000)
    assert run["sampler"]["random_action_prob"] == RunConfig().sampler.random_action_prob  # nothing of Fetch's
    RunConfig.from_json(json.dumps(run)).validate()  # an expert and a shaped reward for every task


@pytest.mark.parametrize(
    "tasks",
    [
        "MetaWorld-push-v3,FetchPush-v4",
        "FetchReach-v4,MetaWorld-reach-v3",
        "MetaWorld-window-close-v3,MetaWorld-drawer-close-v3,FetchPush-v4",  # a Fetch task last
        "FetchPush-v4,FetchReach-v4,MetaWorld-reach-v3,MetaWorld-push-v3",
    ],
)
@pytest.mark.parametrize("sets", [(), MOE], ids=["dense", "moe"])
def test_a_run_with_a_fetch_task_takes_none_of_the_meta_world_multi_task_recipe(capsys, tasks, sets):
    run = _cli_config(capsys, "--tasks", tasks, *sets)
    assert not any(_field(run, dotted) == value for dotted, value in METAWORLD_MULTITASK.items()), run
    assert (run["sim"]["reward"], run["sampler"]["her_k"]) == ("sparse", RunConfig().sampler.her_k)
    assert "Meta-World" not in run["preset"]
    RunConfig.from_json(json.dumps(run)).validate()


def test_the_users_set_wins_over_the_meta_world_multi_task_recipe(capsys):
    off = _cli_config(capsys, "--tasks", "mt10", *MOE, "--set", "sampler.demo_episodes=0")
    assert off["sampler"]["demo_episodes"] == 0
    rest = {dotted: value for dotted, value in METAWORLD_MULTITASK.items() if dotted != "sampler.demo_episodes"}
    assert {dotted: _field(off, dotted) for dotted in rest} == rest  # the rest of the recipe stays
    assert off["preset"] == "Meta-World multi-task MoE"
    sparse = _cli_config(capsys, "--tasks", "mt10", "--set", 'sim.reward="sparse"', "--set", "sampler.her_k=4")
    assert (sparse["sim"]["reward"], sparse["sampler"]["her_k"], sparse["sampler"]["demo_episodes"]) == (
        "sparse",
        4,
        100,
    )
    mine = _cli_config(capsys, "--tasks", "mt10", "--set", "learner.gamma=0.98", "--set", 'model.critic_norm="none"')
    assert (mine["learner"]["gamma"], mine["model"]["critic_norm"]) == (0.98, "none")
    for config in (off, sparse, mine):
        RunConfig.from_json(json.dumps(config)).validate()


def test_config_changed_lists_the_meta_world_multi_task_recipe(capsys):
    assert main(["config", "--tasks", "mt10", *MOE, "--changed"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert "preset = 'Meta-World multi-task MoE'  [default '']" in out
    for line in (
        "sim.reward = 'shaped'  [default 'sparse']",
        "sampler.her_k = 0  [default 4]",
        "learner.gamma = 0.99  [default 0.95]",
        "sampler.demo_episodes = 100  [default 0]",
        "model.critic_norm = 'layer'  [default 'none']",
    ):
        assert line in out, out
