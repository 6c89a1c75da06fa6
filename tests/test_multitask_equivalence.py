"""A multi-task run, seen from one task, computes what a single-task run of that task computes.

The multi-task path pads each task's observation to the widest, appends a task one-hot
(sim/tasks.py), keeps a normalizer row and, with model.task_alpha, a temperature per task. With
the single-task weights copied in (zero weights on the one-hot columns) and one task's rows, the
gradients and the actions must be the single-task ones: what is left to differ between the two
runs is then only what they learn from, not how: a task learning slower inside a multi-task
run is not the learner's or the actor's arithmetic.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from foundation.policy import ModelSpec, NumpyActor
from learner.algorithm import Batch, Objective
from learner.algos.sac import SAC
from learner.algos.tqc import TQC
from learner.gradients import Hyperparams, compute_gradients
from nets.models import SACModel

OBS, GOAL, ACT, TASKS, PLACE = 25, 3, 4, 2, 1  # FetchPush's widths; it is the run's second task


def _specs(quantiles: int = 1) -> tuple[ModelSpec, ModelSpec]:
    single = ModelSpec(OBS, GOAL, ACT, (64, 64), critic_quantiles=quantiles)
    multi = ModelSpec(
        OBS + TASKS, GOAL, ACT, (64, 64), tasks=TASKS, task_norm=True, task_alpha=True, critic_quantiles=quantiles
    )
    return single, multi


def _widen(w: torch.Tensor) -> torch.Tensor:
    """A single-task first-layer weight [out, obs ++ goal (++ action)] at the multi-task input:
    zero columns where the one-hot sits, between the observation and the goal."""
    out = torch.zeros(w.shape[0], w.shape[1] + TASKS)
    out[:, :OBS], out[:, OBS + TASKS :] = w[:, :OBS], w[:, OBS:]
    return out


def _narrow(g: torch.Tensor) -> torch.Tensor:
    return torch.cat([g[:, :OBS], g[:, OBS + TASKS :]], dim=1)


def _pair(rng: np.random.Generator, quantiles: int = 1) -> tuple[SACModel, SACModel]:
    single_spec, multi_spec = _specs(quantiles)
    torch.manual_seed(0)
    single, multi = SACModel(single_spec, init_log_alpha=-1.5), SACModel(multi_spec)
    with torch.no_grad():
        for ps, pm in zip(single.parameters(), multi.parameters(), strict=True):
            if ps.shape == pm.shape:
                pm.copy_(ps)
            elif ps.dim() == 2:
                pm.copy_(_widen(ps))
            else:  # log_alpha: one per task
                pm.copy_(ps.expand_as(pm))
        multi.critic_target.load_state_dict(multi.critic.state_dict())
    dim = OBS + GOAL
    mean, std = rng.normal(0, 1, dim).astype(np.float32), rng.uniform(0.2, 2, dim).astype(np.float32)
    single.set_flat("obs_norm", np.concatenate([mean, std]))
    wide = multi_spec.input_dim
    means, stds = np.zeros((TASKS, wide), np.float32), np.ones((TASKS, wide), np.float32)
    means[PLACE, :OBS], means[PLACE, OBS + TASKS :] = mean[:OBS], mean[OBS:]
    stds[PLACE, :OBS], stds[PLACE, OBS + TASKS :] = std[:OBS], std[OBS:]
    multi.set_flat("obs_norm", np.concatenate([means.ravel(), stds.ravel()]))
    return single, multi


def _padded(obs: np.ndarray) -> np.ndarray:
    out = np.zeros((len(obs), OBS + TASKS), np.float32)
    out[:, :OBS], out[:, OBS + PLACE] = obs, 1.0
    return out


def _rows(rng: np.random.Generator, n: int = 128) -> dict[str, np.ndarray]:
    return {
        "obs": rng.normal(1, 0.5, (n, OBS)).astype(np.float32),
        "goal": rng.normal(1, 0.2, (n, GOAL)).astype(np.float32),
        "action": rng.uniform(-1, 1, (n, ACT)).astype(np.float32),
        "reward": -(rng.random(n) < 0.7).astype(np.float32),
        "next_obs": rng.normal(1, 0.5, (n, OBS)).astype(np.float32),
        "done": np.zeros(n, np.float32),
    }


@pytest.mark.parametrize("algo", ["sac", "tqc"])
def test_one_tasks_rows_give_the_single_task_gradients(algo: str) -> None:
    rng = np.random.default_rng(3)
    single, multi = _pair(rng, quantiles=5 if algo == "tqc" else 1)
    r = _rows(rng)
    one = Batch.from_numpy(r["obs"], r["goal"], r["action"], r["reward"], r["next_obs"], r["done"])
    task = np.full(len(r["reward"]), PLACE)
    wide = Batch.from_numpy(
        _padded(r["obs"]), r["goal"], r["action"], r["reward"], _padded(r["next_obs"]), r["done"], task=task
    )
    hp = Hyperparams(Objective(gamma=0.95, target_entropy=-4.0), TQC(drop=1) if algo == "tqc" else SAC())
    torch.manual_seed(1)
    got_single = compute_gradients(single, one, hp)
    torch.manual_seed(1)
    got_multi = compute_gradients(multi, wide, hp)
    for key in ("loss/critic", "loss/actor"):
        assert got_multi.metrics[key] == pytest.approx(got_single.metrics[key], rel=1e-6)
    for group in ("actor", "critic"):
        flat_s, flat_m = got_single.grads[group], got_multi.grads[group]
        at_s = at_m = 0
        for ps, pm in zip(getattr(single, group).parameters(), getattr(multi, group).parameters(), strict=True):
            gs = torch.from_numpy(flat_s[at_s : at_s + ps.numel()]).view_as(ps)
            gm = torch.from_numpy(flat_m[at_m : at_m + pm.numel()]).view_as(pm)
            at_s, at_m = at_s + ps.numel(), at_m + pm.numel()
            torch.testing.assert_close(_narrow(gm) if gm.shape != gs.shape else gm, gs, atol=1e-6, rtol=1e-5)
    # the task's own temperature moves as the shared one would; the other's not at all
    alpha_s, alpha_m = got_single.grads["log_alpha"], got_multi.grads["log_alpha"]
    assert alpha_m[PLACE] == pytest.approx(alpha_s[0], rel=1e-5)
    assert alpha_m[1 - PLACE] == 0.0


def test_the_padded_actor_acts_as_the_single_task_one() -> None:
    rng = np.random.default_rng(4)
    single, multi = _pair(rng)
    r = _rows(rng, 64)
    x_single = np.concatenate([r["obs"], r["goal"]], axis=1)
    x_multi = np.concatenate([_padded(r["obs"]), r["goal"]], axis=1)
    acts = NumpyActor(single.spec, single.get_flat("actor"), single.get_flat("obs_norm"))
    actm = NumpyActor(multi.spec, multi.get_flat("actor"), multi.get_flat("obs_norm"))
    for got, want in zip(actm.forward(x_multi, PLACE), acts.forward(x_single), strict=True):
        np.testing.assert_allclose(got, want, atol=1e-5)
    with torch.no_grad():
        mean_t, _ = multi.actor(torch.from_numpy(x_multi), torch.full((64,), PLACE))
    np.testing.assert_allclose(mean_t.numpy(), acts.forward(x_single)[0], atol=1e-5)


def test_with_task_onehot_off_the_networks_do_not_read_it() -> None:
    """model.task_onehot false: the one-hot still picks the normalizer's row, but the networks
    see zeros there: whatever the weights on those columns, a task's rows give the single-task
    gradients and actions, and those weights get no gradient."""
    rng = np.random.default_rng(5)
    single, multi = _pair(rng)
    blind = SACModel(dataclasses.replace(multi.spec, task_onehot=False))
    blind.load_state_dict(multi.state_dict())
    blind.set_flat("obs_norm", multi.get_flat("obs_norm"))
    first = [blind.actor.body.net[0], blind.critic.q1.net[0], blind.critic.q2.net[0]]
    with torch.no_grad():
        for layer in first:  # weights on the one-hot columns that would move every output
            layer.weight[:, OBS : OBS + TASKS] = 3.0
    r = _rows(rng)
    one = Batch.from_numpy(r["obs"], r["goal"], r["action"], r["reward"], r["next_obs"], r["done"])
    task = np.full(len(r["reward"]), PLACE)
    wide = Batch.from_numpy(
        _padded(r["obs"]), r["goal"], r["action"], r["reward"], _padded(r["next_obs"]), r["done"], task=task
    )
    hp = Hyperparams(Objective(gamma=0.95, target_entropy=-4.0))
    torch.manual_seed(1)
    got_single = compute_gradients(single, one, hp)
    torch.manual_seed(1)
    got_blind = compute_gradients(blind, wide, hp)
    assert got_blind.metrics["loss/critic"] == pytest.approx(got_single.metrics["loss/critic"], rel=1e-6)
    assert got_blind.metrics["loss/actor"] == pytest.approx(got_single.metrics["loss/actor"], rel=1e-6)
    first_actor = got_blind.grads["actor"][: first[0].weight.numel()].reshape(first[0].weight.shape)
    assert np.all(first_actor[:, OBS : OBS + TASKS] == 0.0)
    x = np.concatenate([_padded(r["obs"]), r["goal"]], axis=1)
    numpy_actor = NumpyActor(blind.spec, blind.get_flat("actor"), blind.get_flat("obs_norm"))
    single_actor = NumpyActor(single.spec, single.get_flat("actor"), single.get_flat("obs_norm"))
    np.testing.assert_allclose(
        numpy_actor.forward(x, PLACE)[0],
        single_actor.forward(x[:, [*range(OBS), *range(OBS + TASKS, OBS + TASKS + GOAL)]])[0],
        atol=1e-5,
    )
    with torch.no_grad():
        mean_t, _ = blind.actor(torch.from_numpy(x), torch.full((len(x),), PLACE))
    np.testing.assert_allclose(mean_t.numpy(), numpy_actor.forward(x, PLACE)[0], atol=1e-5)


def test_task_heads_give_each_task_its_own_output_layer() -> None:
    """model.task_heads: a task's rows move only its own output layer (actor and critics), and the
    numpy actor the samplers use acts as the torch one, task by task."""
    spec = ModelSpec(
        OBS + TASKS, GOAL, ACT, (32, 32), kind="moe", experts=4, tasks=TASKS, router="task", task_heads=True
    )
    torch.manual_seed(0)
    model = SACModel(spec)
    rng = np.random.default_rng(6)
    r = _rows(rng, 64)
    task = np.full(64, PLACE)
    batch = Batch.from_numpy(
        _padded(r["obs"]), r["goal"], r["action"], r["reward"], _padded(r["next_obs"]), r["done"], task=task
    )
    got = compute_gradients(model, batch, Hyperparams(Objective(gamma=0.95, target_entropy=-4.0)))
    for group, heads in (("actor", [model.actor.body.out]), ("critic", [model.critic.q1.out, model.critic.q2.out])):
        params = list(getattr(model, group).parameters())
        flat, at = got.grads[group], 0
        for p in params:
            g = flat[at : at + p.numel()].reshape(p.shape)
            at += p.numel()
            if any(p is h.weight or p is h.bias for h in heads):
                assert np.all(g[1 - PLACE] == 0.0) and np.any(g[PLACE] != 0.0)
    x = np.concatenate([_padded(r["obs"]), r["goal"]], axis=1)
    actor = NumpyActor(spec, model.get_flat("actor"), model.get_flat("obs_norm"))
    for place in range(TASKS):
        with torch.no_grad():
            mean_t, log_std_t = model.actor(torch.from_numpy(x), torch.full((len(x),), place))
        mean_n, log_std_n = actor.forward(x, place)
        np.testing.assert_allclose(mean_n, mean_t.numpy(), atol=1e-5)
        np.testing.assert_allclose(log_std_n, log_std_t.numpy(), atol=1e-5)
    with torch.no_grad():  # the two heads differ: the same rows act differently per task
        assert not torch.allclose(model.actor.body.head(0).weight, model.actor.body.head(1).weight)
