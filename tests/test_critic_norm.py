"""model.critic_norm 'layer': a LayerNorm after every hidden Linear of both critics, before its
ReLU (nets/models.py, nets/twin.py), from the config to one update's gradients and the
aggregator's step. Small networks, fast on CPU."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest
import torch

from aggregator.core import AggregatorCore
from aggregator.sparse import ExpertSegments
from foundation.config import AggregatorConfig, ConfigError, RunConfig, tasks_overrides, with_overrides
from foundation.policy import GRADIENT_GROUPS, GROUPS, ModelSpec, model_spec
from learner.gradients import Hyperparams, compute_gradients
from nets.models import Body, SACModel, TwinCritic
from sim.registry import get_task
from sim.tasks import TaskSet
from tests.test_demo_bc import _batch

DENSE = ModelSpec(obs_dim=4, goal_dim=2, act_dim=2, hidden_sizes=(16, 8), critic_norm="layer")
MOE = dataclasses.replace(DENSE, kind="moe", experts=4, top_k=2, tasks=3, router="task")
SPECS = {"dense": DENSE, "moe-state": dataclasses.replace(MOE, router="state"), "moe-task": MOE}


def _layer_norms(module: torch.nn.Module) -> list[torch.nn.LayerNorm]:
    return [m for m in module.modules() if isinstance(m, torch.nn.LayerNorm)]


def _norm_ranges(model: SACModel, group: str) -> list[tuple[int, int]]:
    """Where the LayerNorm parameters of `group` lie in its flat vector."""
    norm_ids = {id(p) for m in _layer_norms(getattr(model, group)) for p in m.parameters()}
    ranges, at = [], 0
    for p in model.group_parameters(group):
        if id(p) in norm_ids:
            ranges.append((at, at + p.numel()))
        at += p.numel()
    return ranges


def _head(body: Body) -> torch.nn.Linear:
    """A body's output layer (one for every task: no task heads here)."""
    head = body.out if body.moe else body.net[-1]
    assert isinstance(head, torch.nn.Linear)
    return head


@pytest.mark.parametrize("kind", SPECS)
def test_each_critic_body_normalizes_every_hidden_layer_and_the_actor_none(kind):
    spec = SPECS[kind]
    model = SACModel(spec)
    assert not _layer_norms(model.actor)
    for body in (model.critic.q1, model.critic.q2, model.critic_target.q1, model.critic_target.q2):
        assert [m.normalized_shape for m in _layer_norms(body)] == [(16,), (8,)]
    if kind == "dense":  # Linear, LayerNorm, ReLU per hidden layer, then the output Linear
        kinds = [type(m).__name__ for m in model.critic.q1.net]
        assert kinds == ["Linear", "LayerNorm", "ReLU", "Linear", "LayerNorm", "ReLU", "Linear"]
    plain = SACModel(dataclasses.replace(spec, critic_norm="none"))
    assert not _layer_norms(plain)


@pytest.mark.parametrize("fused", [False, True])
@pytest.mark.parametrize("kind", SPECS)
def test_the_last_layer_norm_feeds_the_relu_and_then_the_output_layer(kind, fused):
    """With every LayerNorm's scale 0, a critic's output no longer depends on its input: its
    output bias when the shifts are -1 (the ReLU zeroes them), bias + the row sums of the output
    weight when they are +1. So each norm sits between its hidden layer and the ReLU, on every
    path: dense, state-routed, task-routed, fused or not."""
    torch.manual_seed(0)
    critic = TwinCritic(SPECS[kind])
    critic.fused = fused
    with torch.no_grad():
        for body, shift in ((critic.q1, -1.0), (critic.q2, 1.0)):
            for norm in _layer_norms(body):
                norm.weight.zero_()
                norm.bias.fill_(shift)
    rows = 12
    obs_goal, action = torch.randn(rows, DENSE.input_dim) * 3, torch.rand(rows, DENSE.act_dim) * 2 - 1
    q1, q2 = critic(obs_goal, action, torch.arange(rows) % 3)
    assert q1.shape == q2.shape == (rows,)
    head1, head2 = _head(critic.q1), _head(critic.q2)
    torch.testing.assert_close(q1, head1.bias.expand(rows).detach())
    torch.testing.assert_close(q2, (head2.weight.sum() + head2.bias).expand(rows).detach())


@pytest.mark.parametrize("kind", SPECS)
def test_quantile_critics_with_layer_norm_keep_their_shapes(kind):
    spec = dataclasses.replace(SPECS[kind], critic_quantiles=5)
    critic = TwinCritic(spec)
    q1, q2 = critic(torch.randn(7, spec.input_dim), torch.zeros(7, spec.act_dim), torch.arange(7) % 3)
    assert q1.shape == q2.shape == (7, 5)


@pytest.mark.parametrize("kind", SPECS)
def test_the_critic_groups_grow_by_the_norms_scale_and_shift_and_round_trip_flat(kind):
    spec = SPECS[kind]
    torch.manual_seed(0)
    model, plain = SACModel(spec), SACModel(dataclasses.replace(spec, critic_norm="none"))
    sizes, plain_sizes = model.group_sizes(), plain.group_sizes()
    grown = 2 * 2 * sum(spec.hidden_sizes)  # two critics, a scale and a shift per hidden unit
    assert sizes["critic"] - plain_sizes["critic"] == sizes["critic_target"] - plain_sizes["critic_target"] == grown
    assert {g: sizes[g] for g in ("actor", "log_alpha", "obs_norm")} == {
        g: plain_sizes[g] for g in ("actor", "log_alpha", "obs_norm")
    }
    np.testing.assert_array_equal(model.get_flat("critic_target"), model.get_flat("critic"))
    x, action, task = torch.randn(5, spec.input_dim), torch.zeros(5, spec.act_dim), torch.arange(5) % 3
    before = model.critic(x, action, task)[0].detach()
    flat = np.random.default_rng(0).normal(0, 0.3, sizes["critic"]).astype(np.float32)
    model.set_flat("critic", flat)
    np.testing.assert_array_equal(model.get_flat("critic"), flat)
    assert all(np.any(flat[a:b] != model.get_flat("critic_target")[a:b]) for a, b in _norm_ranges(model, "critic"))
    assert not torch.allclose(model.critic(x, action, task)[0], before)
    copy = SACModel(spec)
    copy.set_flat("critic", model.get_flat("critic"))
    torch.testing.assert_close(copy.critic(x, action, task)[0], model.critic(x, action, task)[0], rtol=0, atol=0)


def _q_max(body: Body, x: torch.Tensor) -> float:
    with torch.no_grad():
        return float(body(x, x).abs().max())


def test_a_layer_normed_critic_stays_bounded_however_far_its_input_lies():
    """A LayerNorm's output does not change with its input's scale, so past the first layer a
    critic sees inputs 1000x and 1e6x too large much as it sees normal ones, and its Q stays
    under |w_out| sqrt(width) + |b_out| (a unit-scale LayerNorm's output has norm sqrt(width)
    and the ReLU only shrinks it). A plain ReLU critic is positively homogeneous far out: its Q
    grows about as the input does."""
    torch.manual_seed(0)
    spec = dataclasses.replace(DENSE, hidden_sizes=(64, 64))
    normed, plain = TwinCritic(spec).q1, TwinCritic(dataclasses.replace(spec, critic_norm="none")).q1
    x = torch.randn(256, spec.input_dim + spec.act_dim)
    head = _head(normed)
    bound = float(head.weight.detach().norm() * 64**0.5 + head.bias.detach().abs())
    near = _q_max(normed, x)
    for scale in (1e3, 1e6):
        far = _q_max(normed, scale * x)
        assert far <= bound and far <= 2 * near, (scale, far, near, bound)
    assert _q_max(plain, 1e3 * x) >= 300 * _q_max(plain, x)


@pytest.mark.parametrize("algo", ["sac", "tqc"])
@pytest.mark.parametrize("kind", ["dense", "moe"])
def test_one_update_with_layer_normed_critics_fills_every_group_and_trains_the_norms(algo, kind):
    overrides = [f'learner.algo="{algo}"', "learner.hidden_sizes=[32, 32]", "learner.tqc.quantiles=5"]
    overrides.append('model.critic_norm="layer"')
    if kind == "moe":
        overrides += [
            'model.kind="moe"',
            "model.experts=4",
            *tasks_overrides(["MetaWorld-reach-v3", "MetaWorld-push-v3"]),
        ]
    config = with_overrides(RunConfig(), overrides).validate()
    spec = model_spec(config, TaskSet.for_run(config))
    assert spec.critic_norm == "layer"
    torch.manual_seed(0)
    model = SACModel(spec, init_log_alpha=-1.0)
    before = {g: model.get_flat(g) for g in GROUPS}
    result = compute_gradients(model, _batch(spec, tasks=2 if kind == "moe" else 0), Hyperparams.for_run(config, 4))
    sizes = model.group_sizes()
    for group, grad in result.grads.items():
        assert grad.shape == (sizes[group],) and np.all(np.isfinite(grad)) and np.abs(grad).max() > 0, group
    ranges = _norm_ranges(model, "critic")
    assert len(ranges) == 2 * 2 * 2  # two critics, two hidden layers, a scale and a shift each
    assert all(np.abs(result.grads["critic"][a:b]).max() > 0 for a, b in ranges)
    for group, weights in before.items():
        np.testing.assert_array_equal(model.get_flat(group), weights, err_msg=group)
    assert np.isfinite(result.metrics["loss/critic"])


def test_the_lazy_expert_step_moves_the_norms_and_a_restored_core_continues_as_the_original():
    """The aggregator steps a task-routed MoE's LayerNorm parameters with the weights every
    version touches (they are no expert's), and its checkpoint restores them with their Adam state."""
    spec = dataclasses.replace(MOE, task_heads=True, hidden_sizes=(16, 16))
    config = AggregatorConfig(lr=1e-2, tau=0.25, seed=0)
    stats = np.concatenate([[8.0], np.zeros(2 * spec.input_dim)] * spec.norm_rows).astype(np.float32)
    hp = Hyperparams.for_run(RunConfig(), spec.act_dim)

    def gradient(core: AggregatorCore, seed: int) -> dict[str, np.ndarray]:
        model = SACModel(spec)
        for group, flat in core.weights().items():
            model.set_flat(group, flat)
        torch.manual_seed(seed)
        return compute_gradients(model, _batch(spec, rows=24, tasks=3, seed=seed), hp).grads

    first = AggregatorCore(spec, config, grads_per_step=1, max_staleness=1)
    ranges = _norm_ranges(SACModel(spec), "critic")
    always = ExpertSegments(SACModel(spec), GRADIENT_GROUPS).always["critic"]
    assert all(any(a <= start and end <= b for a, b in always) for start, end in ranges)
    start = first.weights()["critic"]
    first.submit(0, gradient(first, 0), stats, batch_size=24)
    assert all(np.any(first.weights()["critic"][a:b] != start[a:b]) for a, b in ranges)
    restored = AggregatorCore(spec, dataclasses.replace(config, seed=9), grads_per_step=1, max_staleness=1)
    restored.load_state(first.state())
    g = gradient(first, 1)
    first.submit(1, g, stats, batch_size=24)
    restored.submit(1, {k: v.copy() for k, v in g.items()}, stats, batch_size=24)
    for group in GROUPS:
        np.testing.assert_array_equal(restored.weights()[group], first.weights()[group], err_msg=group)
    plain = AggregatorCore(dataclasses.replace(spec, critic_norm="none"), config, grads_per_step=1, max_staleness=1)
    with pytest.raises(ValueError, match="does not match"):
        plain.load_state(first.state())


def test_the_config_reaches_the_spec_and_refuses_a_bad_value_or_crossq_by_name():
    config = with_overrides(RunConfig(), ['model.critic_norm="layer"']).validate()
    assert model_spec(config, get_task("FetchReach-v4")).critic_norm == "layer"
    assert model_spec(RunConfig(), get_task("FetchReach-v4")).critic_norm == "none"  # off by default
    with pytest.raises(ConfigError, match=r"model.critic_norm \('batch'\) must be one of 'none', 'layer'") as err:
        with_overrides(RunConfig(), ['model.critic_norm="batch"']).validate()
    assert err.value.field == "model.critic_norm"
    crossq = ['learner.algo="crossq"', 'model.critic_norm="layer"']
    with pytest.raises(
        ConfigError, match=r"model.critic_norm \('layer'\) must be 'none' with learner.algo 'crossq'"
    ) as err:
        with_overrides(RunConfig(), crossq).validate()
    assert err.value.field == "model.critic_norm"


def test_a_spec_from_before_the_field_has_plain_critics_and_a_bad_one_is_refused():
    old = json.loads(DENSE.to_json())
    del old["critic_norm"]
    assert ModelSpec.from_json(json.dumps(old)).critic_norm == "none"
    assert ModelSpec.from_json(DENSE.to_json()) == DENSE
    with pytest.raises(ValueError, match="critic_norm 'batch'"):
        dataclasses.replace(DENSE, critic_norm="batch")
    with pytest.raises(ValueError, match="critic_norm must be 'none' with critic_renorm"):
        dataclasses.replace(DENSE, critic_renorm=True)
