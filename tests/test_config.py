"""RunConfig: defaults, cross-field checks, JSON roundtrip, CLI overrides, help lines."""

from __future__ import annotations

import dataclasses
import json
import typing

import pytest

from foundation.config import ConfigError, RunConfig, help_lines, with_overrides


def test_defaults_validate_and_validate_returns_self():
    config = RunConfig()
    assert config.validate() is config


# One row per cross-field check: (overrides that break it, text the ConfigError must contain).
BAD_CONFIGS: list[tuple[list[str], str]] = [
    (["buffer.window_size_transitions=0"], "buffer.window_size_transitions (0) must be >= 1"),
    (
        ["buffer.window_size_transitions=100", "buffer.capacity_transitions=199"],
        "buffer.capacity_transitions (199) must be >= 2 * window_size_transitions",
    ),
    (["sampler.num_samplers=0"], "sampler.num_samplers (0) must be >= 1"),
    (["learner.num_learners=0"], "learner.num_learners (0) must be >= 1"),
    (["learner.batch_size=0", "learner.min_replay_transitions=0"], "learner.batch_size (0) must be >= 1"),
    (
        ["learner.batch_size=64", "learner.min_replay_transitions=63"],
        "learner.min_replay_transitions (63) must be >= learner.batch_size",
    ),
    (["learner.max_grad_staleness=-1"], "learner.max_grad_staleness (-1) must be >= 0"),
    (["learner.gamma=1.0"], "learner.gamma (1.0) must be in (0, 1)"),
    (["learner.gamma=0"], "learner.gamma (0.0) must be in (0, 1)"),
    (["aggregator.tau=0"], "aggregator.tau (0.0) must be in (0, 1]"),
    (["aggregator.tau=1.5"], "aggregator.tau (1.5) must be in (0, 1]"),
    (["aggregator.lr_final=-1e-4"], "aggregator.lr_final (-0.0001) must be >= 0"),
    (["aggregator.lr_final=1e-4"], "aggregator.lr_decay_end (0) must be > aggregator.lr_decay_start >= 0"),
    (
        ["aggregator.lr_final=1e-4", "aggregator.lr_decay_start=500", "aggregator.lr_decay_end=400"],
        "aggregator.lr_decay_end (400) must be > aggregator.lr_decay_start >= 0",
    ),
    (["aggregator.lr=0"], "aggregator.lr (0.0) must be > 0"),
    (["aggregator.checkpoint_every_versions=0"], "aggregator.checkpoint_every_versions (0) must be >= 1"),
    (["eval.episodes=0"], "eval.episodes (0) must be >= 1"),
    (["target_success=1.01"], "target_success (1.01) must be in [0, 1]"),
    (["target_success=-0.5"], "target_success (-0.5) must be in [0, 1]"),
    (["sampler.her_k=-1"], "sampler.her_k (-1) must be >= 0"),
    (["sampler.max_env_steps_per_update=-1"], "sampler.max_env_steps_per_update (-1.0) must be >= 0"),
    (["sampler.random_action_prob=1.5"], "sampler.random_action_prob (1.5) must be in [0, 1]"),
    (
        ["model.task_heads=true", 'model.kind="dense"'],
        "model.task_heads (True) must be false unless model.kind is 'moe' with model.router 'task'",
    ),
    (
        ["model.task_heads=true", 'model.kind="moe"', 'model.router="state"'],
        "model.task_heads (True) must be false unless model.kind is 'moe' with model.router 'task'",
    ),
    (
        ["model.gate_grad=false", 'model.kind="moe"', 'model.router="state"'],
        "model.gate_grad (False) must be true unless model.kind is 'moe' with model.router 'task'",
    ),
    (["model.critic_norm=batch"], "model.critic_norm ('batch') must be one of 'none', 'layer'"),
    (
        ["learner.algo=crossq", "model.critic_norm=layer"],
        "model.critic_norm ('layer') must be 'none' with learner.algo 'crossq': its critics batch-renormalize",
    ),
    (["learner.device=tpu"], "learner.device ('tpu') must be one of 'auto', 'cpu', 'cuda'"),
    (["learner.algo=tqx"], "learner.algo ('tqx') must be one of sac, tqc, crossq"),
    (["learner.algo=ddpg"], "learner.algo ('ddpg') must be one of sac, tqc, crossq"),
    (["learner.tqc.quantiles=0"], "learner.tqc.quantiles (0) must be >= 1"),
    (["learner.tqc.drop=25"], "learner.tqc.drop (25) must be in 0..learner.tqc.quantiles - 1"),
    (["learner.tqc.drop=-1"], "learner.tqc.drop (-1) must be in 0..learner.tqc.quantiles - 1"),
    (["learner.crossq.momentum=0"], "learner.crossq.momentum (0.0) must be in (0, 1]"),
    (["learner.crossq.warmup=-1"], "learner.crossq.warmup (-1) must be >= 0"),
    (["learner.n_step=0"], "learner.n_step (0) must be in 1..10 (Fetch episodes are 50 steps)"),
    (["learner.n_step=11"], "learner.n_step (11) must be in 1..10 (Fetch episodes are 50 steps)"),
    (["eval.curve_episodes=0"], "eval.curve_episodes (0) must be in [1, eval.episodes]"),
    (["eval.curve_episodes=51"], "eval.curve_episodes (51) must be in [1, eval.episodes]"),
    (["eval.min_interval_sec=61"], "eval.min_interval_sec (61.0) must be in [0, eval.max_interval_sec]"),
    (["eval.interval_run_fraction=-0.1"], "eval.interval_run_fraction (-0.1) must be >= 0"),
    (["eval.max_core_share=1.5"], "eval.max_core_share (1.5) must be in [0, 1] (0 = no bound)"),
    (["sim.reward=dense"], "sim.reward ('dense') must be one of ('sparse', 'shaped')"),
    (
        ["sim.reward=shaped", "sampler.her_k=0"],
        "sim.reward ('shaped') must be 'sparse' for a run with FetchReach-v4: only Meta-World tasks have a shaped",
    ),
    (
        [
            "sim.reward=shaped",
            "sampler.her_k=0",
            'sim.tasks=["MetaWorld-push-v3","FetchPush-v4"]',
            "sim.task=MetaWorld-push-v3",
        ],
        "sim.reward ('shaped') must be 'sparse' for a run with FetchPush-v4: only Meta-World",
    ),
    (
        ["sim.reward=shaped", "sim.task=MetaWorld-push-v3"],
        "sampler.her_k (4) must be 0 with sim.reward 'shaped': a shaped reward cannot be recomputed",
    ),
    (["sampler.demo_episodes=-1"], "sampler.demo_episodes (-1) must be >= 0 (0 = no demonstrations)"),
    (["learner.demo_bc_coef=-0.5"], "learner.demo_bc_coef (-0.5) must be >= 0 (0 = demonstrations are plain"),
    (
        ["sampler.demo_episodes=2"],
        "sampler.demo_episodes (2) must be 0 for a run with FetchReach-v4: only Meta-World tasks have a scripted",
    ),
    (
        [
            "sampler.demo_episodes=2",
            'sim.tasks=["MetaWorld-push-v3","FetchPush-v4","FetchSlide-v4"]',
            "sim.task=MetaWorld-push-v3",
        ],
        "sampler.demo_episodes (2) must be 0 for a run with FetchPush-v4, FetchSlide-v4: only Meta-World",
    ),
    (["sim.grasped_start=1.5", "sim.task=FetchPickAndPlace-v4"], "sim.grasped_start (1.5) must be in [0, 1]"),
    (["sim.grasped_start=-0.1", "sim.task=FetchPickAndPlace-v4"], "sim.grasped_start (-0.1) must be in [0, 1]"),
    (
        ["sim.grasped_start=0.5", "sim.task=FetchPush-v4"],
        "sim.grasped_start (0.5) must be 0 for a run of FetchPush-v4: only a task whose gripper can grasp "
        "(FetchPickAndPlace-v4) takes it",
    ),
    (
        ["sim.grasped_start=0.5", 'sim.tasks=["FetchReach-v4","FetchSlide-v4"]'],
        "sim.grasped_start (0.5) must be 0 for a run of FetchReach-v4, FetchSlide-v4: only a task whose gripper",
    ),
    (
        ['sim.tasks=["FetchPush-v4","FetchReach-v4"]'],  # sim.task left at its default, FetchReach-v4
        "sim.task ('FetchReach-v4') must be sim.tasks[0] ('FetchPush-v4') when sim.tasks is set: the run trains "
        "sim.tasks and is named and reported after sim.task; --tasks sets both",
    ),
    (
        ["sim.task=FetchRaech-v4"],
        "sim.task ('FetchRaech-v4') must be a registered task; did you mean 'FetchReach-v4'? valid: FetchPickAndPlace",
    ),
]


@pytest.mark.parametrize("overrides,message", BAD_CONFIGS, ids=[" ".join(r[0]) for r in BAD_CONFIGS])
def test_each_cross_field_check_names_field_and_value(overrides, message):
    config = with_overrides(RunConfig(), overrides)  # parsing alone accepts it
    with pytest.raises(ConfigError) as err:
        config.validate()
    assert message in str(err.value)


@pytest.mark.parametrize(
    "overrides",
    [
        ["buffer.window_size_transitions=100", "buffer.capacity_transitions=200"],
        ["learner.batch_size=64", "learner.min_replay_transitions=64"],
        ["aggregator.tau=1", "target_success=0", "sampler.her_k=0", "learner.max_grad_staleness=0"],
        ["sim.reward=shaped", "sim.task=MetaWorld-push-v3", "sampler.her_k=0"],
        [
            "sim.reward=shaped",
            "sampler.her_k=0",
            'sim.tasks=["MetaWorld-push-v3","MetaWorld-door-open-v3"]',
            "sim.task=MetaWorld-push-v3",
        ],
        ["sampler.demo_episodes=2", "sim.task=MetaWorld-push-v3", "learner.demo_bc_coef=0"],
        [
            "sampler.demo_episodes=1",
            'sim.tasks=["MetaWorld-reach-v3","MetaWorld-push-v3"]',
            "sim.task=MetaWorld-reach-v3",
        ],
        ["sampler.demo_episodes=0", "learner.demo_bc_coef=0"],  # a Fetch task: no demonstrations asked
        ["model.critic_norm=layer", "learner.algo=tqc", "model.kind=moe"],
        ["model.critic_norm=none", "learner.algo=crossq"],
        ["sim.grasped_start=1", "sim.task=FetchPickAndPlace-v4"],
        [
            "sim.grasped_start=0.5",
            'sim.tasks=["FetchPush-v4","FetchPickAndPlace-v4"]',  # its Pick envs only
            "sim.task=FetchPush-v4",
        ],
        ["sim.grasped_start=0", "sim.task=FetchPush-v4"],
        ['sim.tasks=["FetchReach-v4","FetchPush-v4"]'],  # the default sim.task is sim.tasks[0]
    ],
)
def test_boundary_values_validate(overrides):
    with_overrides(RunConfig(), overrides).validate()


def test_json_roundtrip_is_equal_including_tuples_and_none(tmp_path):
    config = with_overrides(
        RunConfig(),
        [
            "run_id=abc",
            "learner.hidden_sizes=[64, 32, 16]",
            "learner.target_entropy=-2.5",
            "sim.randomization.mass_scale=[0.5, 2]",
            "sim.randomization.action_latency_steps=[1, 3]",
            "eval.randomize=true",
        ],
    )
    back = RunConfig.from_json(config.to_json())
    assert back == config
    assert back.learner.hidden_sizes == (64, 32, 16)
    assert back.sim.randomization.mass_scale == (0.5, 2.0)
    assert RunConfig.from_json(RunConfig().to_json()) == RunConfig()
    path = tmp_path / "config.json"
    path.write_text(config.to_json())
    assert RunConfig.load(path) == config


def test_from_json_rejects_unknown_field():
    with pytest.raises(ConfigError, match="unknown config field LearnerConfig.nope"):
        RunConfig.from_json('{"learner": {"nope": 1}}')


def test_a_run_directory_with_flat_algorithm_fields_loads_into_the_sections():
    """A config.json that kept the algorithm's fields flat in the learner (and DDPG's, which no
    algorithm here reads) loads with their values in learner.tqc and learner.crossq."""
    flat = json.loads(RunConfig().to_json())
    for section in ("sac", "tqc", "crossq"):
        del flat["learner"][section]
    flat["learner"].update(algo="tqc", tqc_quantiles=7, tqc_drop=1, crossq_momentum=0.5, crossq_warmup=3, action_l2=1.0)
    flat["sampler"]["action_noise_std"] = 0.2
    config = RunConfig.from_json(json.dumps(flat)).validate()
    assert (config.learner.tqc.quantiles, config.learner.tqc.drop) == (7, 1)
    assert (config.learner.crossq.momentum, config.learner.crossq.warmup) == (0.5, 3)
    assert config.learner.algorithm() == config.learner.tqc


def test_an_algorithm_field_by_its_flat_name_is_refused_as_unknown():
    with pytest.raises(ConfigError, match="unknown config field 'learner.tqc_quantiles'"):
        with_overrides(RunConfig(), ["learner.tqc_quantiles=7"])


def test_every_algorithm_has_a_section_and_each_field_a_help_line_of_one_terminal_line():
    from foundation.config_algos import ALGOS

    learner = RunConfig().learner
    for name in ALGOS:
        section = dataclasses.replace(learner, algo=name).algorithm()
        assert section is getattr(learner, name) and section.critics().outputs >= 1
        for f in dataclasses.fields(section):
            assert 0 < len(f.metadata["help"]) <= 100, (name, f.name)
    with pytest.raises(ConfigError, match=r"learner.algo \('tqx'\) must be one of sac, tqc, crossq"):
        dataclasses.replace(learner, algo="tqx").algorithm()


def test_overrides_parse_json_values_tuples_none_and_plain_strings():
    config = with_overrides(
        RunConfig(),
        [
            "learner.batch_size=32",
            "aggregator.lr=3e-4",
            "aggregator.tau=1",  # an int where a float is expected is widened
            "sampler.mlock=false",
            "learner.hidden_sizes=[8, 8]",
            "learner.target_entropy=null",
            "run_dir=/tmp/some dir",  # not JSON: taken as a string
            "sim.task=FetchPush-v4",
        ],
    )
    assert config.learner.batch_size == 32
    assert config.aggregator.lr == pytest.approx(3e-4)
    assert config.aggregator.tau == 1.0 and isinstance(config.aggregator.tau, float)
    assert config.sampler.mlock is False
    assert config.learner.hidden_sizes == (8, 8)
    assert config.learner.target_entropy is None
    assert config.run_dir == "/tmp/some dir"
    assert config.sim.task == "FetchPush-v4"
    entropy = with_overrides(config, ["learner.target_entropy=-3"])
    assert entropy.learner.target_entropy == -3.0
    # the input config is frozen and untouched
    assert RunConfig().learner.batch_size == 256


# One row per bad override: (override, text the ConfigError must contain).
BAD_OVERRIDES: list[tuple[str, str]] = [
    ("learner.batch_size", "must look like section.field=value"),
    ("learner.nope=1", "unknown config field 'learner.nope'"),
    ("nosuch.batch_size=1", "unknown config section 'nosuch.batch_size'"),
    ("run_id.x=1", "unknown config section 'run_id.x'"),
    ("nope=1", "unknown config field 'nope'"),
    ("learner.batch_size=1.5", "LearnerConfig.batch_size must be an integer, got 1.5"),
    ("learner.batch_size=true", "LearnerConfig.batch_size must be an integer, got True"),
    ("learner.batch_size=abc", "LearnerConfig.batch_size must be an integer, got 'abc'"),
    ("aggregator.lr=fast", "AggregatorConfig.lr must be a number, got 'fast'"),
    ("sampler.mlock=1", "SamplerConfig.mlock must be true or false, got 1"),
    ("learner.hidden_sizes=64", "LearnerConfig.hidden_sizes must be a list, got 64"),
    ("learner.hidden_sizes=[64, 1.5]", "LearnerConfig.hidden_sizes must be an integer, got 1.5"),
    ("run_id=5", "RunConfig.run_id must be a string, got 5"),
    ("learner=3", "RunConfig.learner must be an object, got 3"),
    ("learner.target_entropy=low", "LearnerConfig.target_entropy must be a number, got 'low'"),
    (
        "learner.batchsize=3",
        "unknown config field 'learner.batchsize'; did you mean 'batch_size'? valid: algo, autocast, batch_size,",
    ),
    ("lerner.batch_size=3", "unknown config section 'lerner.batch_size'; did you mean 'learner'?"),
]


@pytest.mark.parametrize("override,message", BAD_OVERRIDES, ids=[r[0] for r in BAD_OVERRIDES])
def test_bad_overrides_name_the_field(override, message):
    with pytest.raises(ConfigError) as err:
        with_overrides(RunConfig(), [override])
    assert message in str(err.value)


def _leaf_fields(cls: typing.Any, prefix: str = "") -> list[str]:
    names = []
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        if dataclasses.is_dataclass(hints[f.name]):
            names += _leaf_fields(hints[f.name], prefix + f.name + ".")
        else:
            names.append(prefix + f.name)
    return names


def test_help_lines_cover_every_field_with_default_and_help():
    lines = help_lines()
    fields = _leaf_fields(RunConfig)
    assert len(fields) > 40
    assert [line.split(" = ", 1)[0] for line in lines] == fields
    for line in lines:
        default, _, help_text = line.split(" = ", 1)[1].partition("  # ")
        assert default and help_text.strip(), line
    assert "learner.batch_size = 256  # transitions per gradient" in lines
    assert "sim.randomization.mass_scale = (0.8, 1.2)  # per episode: object body mass scale" in lines


def test_every_help_line_fits_one_terminal_line():
    """`fleetrl config` prints `name = value  # help`; a field's reasoning lives in the docs."""
    too_long = [line for line in help_lines() if len(line.partition("  # ")[2]) > 100]
    assert not too_long, "help lines over 100 characters:\n" + "\n".join(too_long)


@pytest.mark.parametrize(
    "override,message",
    [
        ("sim.randomization.mass_scale=[0.5]", "RandomizationConfig.mass_scale must be a list of 2"),
        (
            "sim.randomization.action_latency_steps=[0, 1, 2]",
            "RandomizationConfig.action_latency_steps must be a list of 2",
        ),
    ],
)
def test_fixed_length_tuples_check_their_length(override, message):
    with pytest.raises(ConfigError, match=message):
        with_overrides(RunConfig(), [override])


@pytest.mark.parametrize(
    "override,message",
    [
        ("aggregator.keep_checkpoints=0", "aggregator.keep_checkpoints (0) must be >= 1"),
        ("aggregator.grads_per_step=-1", "aggregator.grads_per_step (-1) must be >= 0"),
        ("sampler.weights_interval_sec=-1", "sampler.weights_interval_sec (-1.0) must be >= 0"),
    ],
)
def test_validate_catches_values_that_fail_later_in_a_role(override, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        with_overrides(RunConfig(), [override]).validate()
