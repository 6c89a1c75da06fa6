"""CrossQ (learner.algo 'crossq'): batch renormalization and the loss without target networks.
Pure functions on small networks, fast on CPU."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest
import torch

from foundation.config import ConfigError, RunConfig, with_overrides
from foundation.policy import ModelSpec, model_spec
from learner.algorithm import Objective
from learner.algos.crossq import CrossQ
from learner.algos.crossq import critic_loss as crossq_critic_loss
from learner.gradients import Hyperparams, compute_gradients
from nets.models import GRADIENT_GROUPS, SACModel
from nets.renorm import BatchRenorm, renorm_layers, running_statistics
from sim.registry import get_task
from tests.test_sac import _batch

SPEC = ModelSpec(obs_dim=4, goal_dim=2, act_dim=2, hidden_sizes=(32, 32), critic_renorm=True)  # test_sac.SPEC + renorm
HP = Hyperparams(Objective(gamma=0.9, target_entropy=-2.0), CrossQ())


def test_batch_renorm_in_warmup_is_batch_norm_and_moves_its_running_statistics():
    torch.manual_seed(0)
    x = torch.randn(64, 5) * 3 + 2
    layer, reference = BatchRenorm(5, momentum=0.1, warmup=10), torch.nn.BatchNorm1d(5, eps=1e-3, momentum=0.1)
    torch.testing.assert_close(layer(x), reference(x))
    torch.testing.assert_close(layer.running_mean, reference.running_mean)
    torch.testing.assert_close(layer.running_var, reference.running_var)  # the unbiased variance, as sb3-contrib's
    assert int(layer.steps) == 1


def test_batch_renorm_after_warmup_corrects_toward_the_running_statistics_with_constants_to_autograd():
    layer = BatchRenorm(3, momentum=0.5, warmup=0)
    with torch.no_grad():
        layer.running_mean.copy_(torch.tensor([1.0, 0.0, -100.0]))
        layer.running_var.copy_(torch.tensor([4.0, 1.0, 1.0]))
    x = torch.randn(256, 3, generator=torch.Generator().manual_seed(1), requires_grad=True)
    y = layer(x)
    mean, var = x.detach().mean(0), x.detach().var(0, unbiased=False)
    std, running_std = (var + 1e-3).sqrt(), (torch.tensor([4.0, 1.0, 1.0]) + 1e-3).sqrt()
    r = (std / running_std).clamp(1 / 3, 3)
    d = ((mean - torch.tensor([1.0, 0.0, -100.0])) / running_std).clamp(-5, 5)
    torch.testing.assert_close(y.detach(), (x.detach() - mean) / std * r + d)
    assert d[2].item() == pytest.approx(5.0)  # clipped: the batch lies 100 running stds away
    # r and d are constants: the gradient is batch norm's, scaled by r per feature
    y.sum().backward()
    bn = x.detach().clone().requires_grad_(True)
    ((bn - bn.mean(0)) / (bn.var(0, unbiased=False) + 1e-3).sqrt() * r).sum().backward()
    torch.testing.assert_close(x.grad, bn.grad)
    torch.testing.assert_close(layer.running_mean, torch.tensor([1.0, 0.0, -100.0]).lerp(mean, 0.5))
    torch.testing.assert_close(layer.running_var, torch.tensor([4.0, 1.0, 1.0]).lerp(x.detach().var(0), 0.5))


def test_batch_renorm_in_eval_mode_uses_only_its_running_statistics_and_keeps_them():
    layer = BatchRenorm(2)
    with torch.no_grad():
        layer.running_mean.copy_(torch.tensor([1.0, -1.0]))
        layer.running_var.copy_(torch.tensor([4.0, 0.25]))
        layer.weight.fill_(2.0)
    x = torch.tensor([[3.0, 0.0]])
    with running_statistics(layer):
        y = layer(x)
    assert layer.training and int(layer.steps) == 0
    torch.testing.assert_close(y, 2.0 * (x - layer.running_mean) / (layer.running_var + 1e-3).sqrt())


def test_crossq_critics_renormalize_and_the_actor_has_no_renorm():
    model = SACModel(SPEC)
    assert not renorm_layers(model.actor)
    assert len(renorm_layers(model.critic)) == 2 * 3  # per critic: the input and two hidden layers
    plain = SACModel(dataclasses.replace(SPEC, critic_renorm=False))
    # the scale and shift are critic parameters (they travel in its group): 2 x (6 + 32 + 32) x 2
    assert model.group_sizes()["critic"] - plain.group_sizes()["critic"] == 2 * 2 * (6 + 2 + 32 + 32)
    assert model.group_sizes()["actor"] == plain.group_sizes()["actor"]
    assert ModelSpec.from_json(SPEC.to_json()) == SPEC
    older = json_without(SPEC.to_json(), "critic_renorm")
    assert ModelSpec.from_json(older).critic_renorm is False


def json_without(text: str, key: str) -> str:
    data = json.loads(text)
    del data[key]
    return json.dumps(data)


def test_crossq_gradients_fill_every_group_and_never_read_the_target_critics():
    torch.manual_seed(0)
    model = SACModel(SPEC, init_log_alpha=-1.0)
    batch = _batch()
    torch.manual_seed(5)
    first = compute_gradients(model, batch, HP)
    for group in GRADIENT_GROUPS:
        grad = first.grads[group]
        assert np.all(np.isfinite(grad)) and np.abs(grad).max() > 0, group
    # the same update on a model whose target critics are garbage, from the same running statistics
    other = SACModel(SPEC, init_log_alpha=-1.0)
    other.load_state_dict(model.state_dict())  # buffers too: the same running statistics
    with torch.no_grad():
        for p in other.critic_target.parameters():
            p.fill_(123.0)
    model_stats = [layer.running_mean.clone() for layer in renorm_layers(model.critic)]
    torch.manual_seed(6)
    a = compute_gradients(model, batch, HP)
    torch.manual_seed(6)
    b = compute_gradients(other, batch, HP)
    for group in GRADIENT_GROUPS:
        np.testing.assert_allclose(a.grads[group], b.grads[group], rtol=1e-5, atol=1e-7)
    # one update moves the running statistics once: the critic loss's joint pass, not the actor's
    assert all(int(layer.steps) == 2 for layer in renorm_layers(model.critic))
    layers = renorm_layers(model.critic)
    assert any(not torch.equal(s, layer.running_mean) for s, layer in zip(model_stats, layers, strict=True))


def test_crossq_targets_come_from_the_joint_pass_over_both_halves(monkeypatch):
    torch.manual_seed(0)
    model = SACModel(SPEC, init_log_alpha=-1.0)
    batch = _batch(8)
    objective = dataclasses.replace(HP.objective, clip_return=False)
    next_action, log_prob = torch.zeros(8, 2), torch.full((8,), 2.0)
    monkeypatch.setattr(model.actor, "sample", lambda *a, **k: (next_action, log_prob))
    loss = crossq_critic_loss(model, batch, objective)
    # by hand: one pass over 16 rows in training mode (from the same starting statistics)
    fresh = SACModel(SPEC, init_log_alpha=-1.0)
    fresh.load_state_dict(model.state_dict())
    for layer in renorm_layers(fresh.critic):
        layer.running_mean.zero_()
        layer.running_var.fill_(1.0)
        layer.steps.zero_()
    q1, q2 = fresh.critic(torch.cat([batch.obs_goal, batch.next_obs_goal]), torch.cat([batch.action, next_action]))
    target = batch.reward + 0.9 * (1 - batch.done) * (torch.min(q1[8:], q2[8:]) - np.exp(-1.0) * 2.0)
    expected = ((q1[:8] - target) ** 2).mean() + ((q2[:8] - target) ** 2).mean()
    assert loss.item() == pytest.approx(expected.item(), rel=1e-5)
    # a batch norm over the current half alone gives another loss: the halves share statistics
    alone = SACModel(SPEC, init_log_alpha=-1.0)
    alone.load_state_dict(fresh.state_dict())
    q_alone, _ = alone.critic(batch.obs_goal, batch.action)
    assert not torch.allclose(q_alone, q1[:8])


def test_crossq_config_builds_renormalized_critics_and_refuses_a_moe_precisely():
    config = with_overrides(RunConfig(), ['learner.algo="crossq"']).validate()
    spec = model_spec(config, get_task("FetchReach-v4"))
    assert spec.critic_renorm and spec.critic_quantiles == 1
    assert not model_spec(RunConfig(), get_task("FetchReach-v4")).critic_renorm
    with pytest.raises(ConfigError, match=r"model.kind \('moe'\) must be 'dense' with learner.algo 'crossq'") as err:
        with_overrides(RunConfig(), ['learner.algo="crossq"', 'model.kind="moe"']).validate()
    assert err.value.field == "model.kind"
    with pytest.raises(ConfigError, match="learner.compile"):
        with_overrides(RunConfig(), ['learner.algo="crossq"', "learner.compile=true"]).validate()
    with pytest.raises(ConfigError, match="aggregator.adam_beta1"):
        with_overrides(RunConfig(), ["aggregator.adam_beta1=1.0"]).validate()
