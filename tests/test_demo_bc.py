"""The Q-filtered behaviour cloning of demonstration rows (learner/demos.py), alone and through one
update's gradients of every algorithm, dense and multi-task MoE."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from foundation.config import RunConfig, with_overrides
from foundation.config_algos import ALGOS
from foundation.policy import ModelSpec, model_spec
from learner.algorithm import Batch, Objective
from learner.algos import build_algorithm
from learner.demos import BC_TARGET_BOUND, demo_bc, q_filtered_bc
from learner.gradients import Hyperparams, compute_gradients
from nets.models import SACModel
from sim.tasks import TaskSet


def _actions(rows: int = 6, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    rng = np.random.default_rng(seed)
    policy = torch.tensor(rng.uniform(-1, 1, (rows, 4)), dtype=torch.float32, requires_grad=True)
    return policy, torch.tensor(rng.uniform(-0.9, 0.9, (rows, 4)), dtype=torch.float32)  # inside the clamp


def test_only_demonstration_rows_the_critic_prefers_are_cloned_averaged_over_the_batch():
    policy, demo_action = _actions()
    demo = torch.tensor([1.0, 1.0, 1.0, 0.0, 0.0, 1.0])
    q_demo = torch.tensor([2.0, -1.0, 0.5, 9.0, 9.0, 3.0])
    q_policy = torch.tensor([1.0, 0.0, 0.5, 0.0, 0.0, 2.0])  # row 2 ties: a tie is not a preference
    term = q_filtered_bc(policy, demo_action, demo, q_demo, q_policy, coef=2.0)
    kept = torch.tensor([1.0, 0.0, 0.0, 0.0, 0.0, 1.0])  # rows 3 and 4 prefer their action but are no demonstrations
    error = ((policy - demo_action) ** 2).sum(-1)
    assert term.loss.item() == pytest.approx(2.0 * (kept * error).sum().item() / 6)
    assert (term.share.item(), term.passed.item()) == (pytest.approx(4 / 6), pytest.approx(2 / 4))
    term.loss.backward()
    assert policy.grad is not None
    expected = (2.0 * 2 * (policy - demo_action) * kept[:, None] / 6).detach()
    np.testing.assert_allclose(policy.grad.numpy(), expected.numpy(), rtol=1e-6)


def test_a_demonstrated_action_at_the_bound_is_cloned_toward_the_clamped_target():
    policy = torch.tensor([[BC_TARGET_BOUND, -BC_TARGET_BOUND, 0.5, 0.0]], requires_grad=True)
    demo_action = torch.tensor([[1.0, -1.0, 0.5, 0.0]])  # a scripted expert's clipped action
    term = q_filtered_bc(policy, demo_action, torch.ones(1), torch.ones(1), torch.zeros(1), coef=1.0)
    assert term.loss.item() == 0.0  # already at the target: nothing left to clone
    term.loss.backward()
    assert policy.grad is not None and not policy.grad.any()


def test_cloning_a_saturated_expert_leaves_a_tanh_actor_finite():
    """Gradient descent on the pre-squash mean toward an expert's +-1 settles at atanh(bound)
    rather than growing without limit."""
    mu = torch.zeros(1, 4, requires_grad=True)
    demo_action = torch.tensor([[1.0, -1.0, 1.0, -1.0]])
    optimizer = torch.optim.SGD([mu], lr=1.0)
    for _ in range(3000):
        optimizer.zero_grad()
        q_filtered_bc(torch.tanh(mu), demo_action, torch.ones(1), torch.ones(1), torch.zeros(1), 1.0).loss.backward()
        optimizer.step()
    settled = float(np.arctanh(BC_TARGET_BOUND))
    np.testing.assert_allclose(mu.detach().abs().numpy(), settled, rtol=1e-2)


def test_without_demonstration_rows_the_term_is_zero_and_so_is_its_gradient():
    policy, demo_action = _actions()
    term = q_filtered_bc(policy, demo_action, torch.zeros(6), torch.full((6,), 5.0), torch.zeros(6), coef=1.0)
    assert (term.loss.item(), term.share.item(), term.passed.item()) == (0.0, 0.0, 0.0)
    term.loss.backward()
    assert policy.grad is not None and not policy.grad.any()


def test_the_gradient_reaches_the_actor_and_neither_the_critics_nor_the_stored_actions():
    spec = ModelSpec(obs_dim=3, goal_dim=2, act_dim=4, hidden_sizes=(16,))
    torch.manual_seed(0)
    model = SACModel(spec)
    batch = _batch(spec, demo_every=2)
    action = batch.action.clone().requires_grad_(True)
    batch = dataclasses.replace(batch, action=action)
    algorithm = build_algorithm(RunConfig().learner)
    term = demo_bc(model, batch, 1.0, _prefers_every_other_demonstration)
    assert (term.share.item(), term.passed.item()) == (0.5, 0.5)
    term.loss.backward()
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in model.actor.body.parameters())
    assert all(p.grad is None for p in model.critic.parameters()) and action.grad is None
    real = demo_bc(model, batch, 1.0, algorithm.value)  # the algorithm's own critics, read without gradient
    real.loss.backward()
    assert all(p.grad is None for p in model.critic.parameters())


def _prefers_every_other_demonstration(model, obs_goal, action, task) -> torch.Tensor:
    """A critic stub for demo_bc's one pass over [demonstrated; policy's] actions: it values the
    demonstrated action of rows 0 and 1 of every 4 at 1, everything else at 0."""
    rows = len(obs_goal) // 2
    return torch.cat([(torch.arange(rows) % 4 < 2).float(), torch.zeros(rows)])


def _batch(spec: ModelSpec, rows: int = 64, demo_every: int = 0, tasks: int = 0, seed: int = 0) -> Batch:
    rng = np.random.default_rng(seed)
    obs = rng.normal(size=(rows, spec.obs_dim)).astype(np.float32)
    if tasks:  # the task one-hot ends the observation
        obs[:, -tasks:] = np.eye(tasks)[np.arange(rows) % tasks]
    goal = rng.normal(size=(rows, spec.goal_dim))
    demo = (np.arange(rows) % demo_every == 0) if demo_every else None
    return Batch.from_numpy(
        obs, goal, rng.uniform(-1, 1, (rows, spec.act_dim)), -(rng.random(rows) < 0.5).astype(np.float32),
        obs, np.zeros(rows), task=np.arange(rows) % tasks if tasks else None, demo=demo,
    )  # fmt: skip


MODELS = [(algo, "dense") for algo in ALGOS] + [("sac", "moe"), ("tqc", "moe")]


@pytest.mark.parametrize("algo,kind", MODELS, ids=[f"{a}-{k}" for a, k in MODELS])
def test_every_algorithm_adds_the_term_to_its_actor_gradient_alone_and_reports_it(algo, kind):
    """The same batch with and without behaviour cloning: the critics' and temperature's gradients
    are the same, the actor's differs, and the learner reports the term (multi-task MoE: the rows'
    tasks route both critics' passes)."""
    overrides = [f'learner.algo="{algo}"', "learner.hidden_sizes=[32, 32]", "learner.tqc.quantiles=5"]
    overrides += ["sampler.demo_episodes=1", 'sim.task="MetaWorld-reach-v3"']
    if kind == "moe":
        overrides += ['model.kind="moe"', "model.experts=4", 'sim.tasks=["MetaWorld-reach-v3","MetaWorld-push-v3"]']
    config = with_overrides(RunConfig(), overrides).validate()
    spec = model_spec(config, TaskSet.for_run(config))  # a multi-task run: padded, one embedding row per task
    batch = _batch(spec, demo_every=3, tasks=2 if kind == "moe" else 0)
    results = {}
    for coef in (0.0, 1.0):
        torch.manual_seed(0)
        model = SACModel(spec, init_log_alpha=-1.0)
        torch.manual_seed(1)  # the same reparameterized actions in both updates
        hp = dataclasses.replace(Hyperparams.for_run(config, 4), demo_bc_coef=coef)
        results[coef] = compute_gradients(model, batch, hp)
    plain, cloned = results[0.0], results[1.0]
    np.testing.assert_array_equal(cloned.grads["critic"], plain.grads["critic"])
    np.testing.assert_array_equal(cloned.grads["log_alpha"], plain.grads["log_alpha"])
    assert not np.allclose(cloned.grads["actor"], plain.grads["actor"])
    assert cloned.metrics["loss/actor"] == pytest.approx(plain.metrics["loss/actor"])  # the RL part alone
    assert cloned.metrics["demo/share"] == plain.metrics["demo/share"] == pytest.approx(22 / 64)
    assert 0.0 <= cloned.metrics["demo/q_filter_pass"] <= 1.0 and cloned.metrics["loss/bc"] >= 0.0
    assert "loss/bc" not in plain.metrics  # demo_bc_coef 0: demonstrations are plain replay rows


def test_a_run_without_demonstrations_computes_no_term():
    config = with_overrides(RunConfig(), ["learner.demo_bc_coef=3.0"]).validate()
    hp = Hyperparams.for_run(config, 4)
    assert (hp.demos, hp.demo_bc_coef) == (False, 0.0)
    spec = ModelSpec(obs_dim=3, goal_dim=2, act_dim=4, hidden_sizes=(16,))
    torch.manual_seed(0)
    result = compute_gradients(SACModel(spec), _batch(spec, demo_every=2), hp)
    assert not {"demo/share", "loss/bc"} & set(result.metrics)
    assert Hyperparams(Objective(0.95, -4.0)).demo_bc_coef == 0.0
