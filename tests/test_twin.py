"""nets/twin.py: both critics in one pass equal the two bodies one after the other."""

from __future__ import annotations

import pytest
import torch

from foundation.policy import ModelSpec
from nets import twin
from nets.models import TwinCritic


def _spec(kind: str, **kw) -> ModelSpec:
    base = dict(obs_dim=6, goal_dim=3, act_dim=2, hidden_sizes=(16, 8))
    if kind == "moe":
        base |= dict(kind="moe", experts=6, top_k=2, tasks=3, router="task")
    return ModelSpec(**(base | kw))


def _twins(spec: ModelSpec, rows: int, task: torch.Tensor | None):
    torch.manual_seed(0)
    critic = TwinCritic(spec)
    with torch.no_grad():  # biases and norm off their init, so every path shows
        for p in critic.parameters():
            p.add_(torch.randn_like(p) * 0.1)
    obs_goal = torch.randn(rows, spec.input_dim)
    action = torch.rand(rows, spec.act_dim) * 2 - 1
    outs, grads = [], []
    for fused in (False, True):
        critic.fused = fused
        q1, q2 = critic(obs_goal, action, task)
        loss = (q1**2).mean() + (3 * q2).mean()
        grads.append(torch.autograd.grad(loss, [p for p in critic.parameters() if p.requires_grad], allow_unused=True))
        outs.append((q1.detach(), q2.detach()))
    return outs, grads


@pytest.mark.parametrize(
    "kind,kw,task",
    [
        ("moe", {}, torch.tensor([2, 0, 2, 2, 1, 0, 2, 1, 2, 2, 0])),  # uneven, unsorted
        ("moe", {"task_heads": True}, torch.tensor([2, 0, 2, 2, 0, 0, 2, 2, 2, 2, 0])),  # task heads, task 1 absent
        ("moe", {"task_heads": True, "critic_quantiles": 4}, torch.tensor([1] * 11)),  # one task
        ("moe", {"critic_norm": "layer"}, torch.tensor([2, 0, 2, 2, 1, 0, 2, 1, 2, 2, 0])),  # each critic's LayerNorms
        ("moe", {"task_heads": True, "critic_quantiles": 4, "critic_norm": "layer"}, torch.tensor([0, 2] * 5 + [0])),
    ],
)
def test_the_fused_twin_critic_equals_its_two_bodies_in_values_and_gradients(kind, kw, task):
    (o1, o2), (g1, g2) = _twins(_spec(kind, **kw), 11, task)
    assert o1[0].shape == o2[0].shape and o1[1].shape == o2[1].shape
    for a, b in zip(o1 + g1, o2 + g2, strict=True):
        if a is None or b is None:
            assert a is None and b is None
            continue
        a, b = (t.to_dense() if t.is_sparse else t for t in (a, b))
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize(
    "kind,kw,fused_pass",
    [
        ("dense", {}, False),
        ("dense", {"critic_norm": "layer"}, False),
        ("moe", {"router": "state"}, False),
        ("moe", {}, True),
        ("moe", {"task_heads": True}, True),
        ("moe", {"critic_norm": "layer"}, True),
    ],
)
def test_only_a_task_routed_moe_takes_the_fused_pass(monkeypatch, kind, kw, fused_pass):
    """A dense pair (measured slower fused) and a state-routed MoE run the two bodies apart."""
    calls = []
    real = twin._task_routed
    monkeypatch.setattr(twin, "_task_routed", lambda *a: calls.append(1) or real(*a))
    spec = _spec(kind, **kw)
    critic = TwinCritic(spec)
    assert critic.fused
    task = torch.tensor([2, 0, 1, 2, 0])
    q1, q2 = critic(torch.randn(5, spec.input_dim), torch.zeros(5, spec.act_dim), task)
    assert q1.shape == q2.shape == (5,)
    assert len(calls) == (1 if fused_pass else 0)


def test_a_fused_twin_critic_keeps_each_layers_routing_for_the_metrics():
    spec = _spec("moe", task_heads=True)
    critic = TwinCritic(spec)
    task = torch.tensor([0, 2, 2, 0, 2])
    critic(torch.randn(5, spec.input_dim), torch.zeros(5, spec.act_dim), task)
    for body in (critic.q1, critic.q2):
        for layer in body.moe_layers():
            assert layer.last_gates is not None and layer.last_gates.shape == (5, spec.experts)
            assert (layer.last_gates > 0).sum(1).tolist() == [spec.top_k] * 5
