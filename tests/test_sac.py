"""The algorithms' losses (learner/algos/) and the gradients of an update (learner/gradients.py):
pure functions, fast on CPU."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from foundation.config import RunConfig, with_overrides
from learner.algorithm import Batch, Objective
from learner.algos.crossq import CrossQ
from learner.algos.sac import critic_loss
from learner.algos.tqc import TQC, quantile_huber_loss
from learner.algos.tqc import critic_loss as tqc_critic_loss
from learner.gradients import Hyperparams, compute_gradients
from nets.models import GRADIENT_GROUPS, GROUPS, ModelSpec, SACModel, norm_stats

SPEC = ModelSpec(obs_dim=4, goal_dim=2, act_dim=2, hidden_sizes=(32, 32))
HP = Hyperparams(Objective(gamma=0.9, target_entropy=-2.0))


def _batch(n: int = 64, seed: int = 0, spec: ModelSpec = SPEC) -> Batch:
    rng = np.random.default_rng(seed)
    obs = rng.normal(size=(n, spec.obs_dim))
    goal = rng.normal(size=(n, spec.goal_dim))
    return Batch.from_numpy(
        obs,
        goal,
        rng.uniform(-1, 1, (n, spec.act_dim)),
        -(rng.random(n) < 0.5).astype(np.float32),
        obs + rng.normal(0, 0.1, obs.shape),
        (rng.random(n) < 0.1).astype(np.float32),
    )


def _model(seed: int = 0) -> SACModel:
    torch.manual_seed(seed)
    return SACModel(SPEC, init_log_alpha=-1.0)


def _all_weights(model: SACModel) -> dict[str, np.ndarray]:
    return {g: model.get_flat(g) for g in GROUPS}


def test_gradients_are_finite_flat_vectors_of_the_group_sizes():
    model = _model()
    batch = _batch()
    result = compute_gradients(model, batch, HP)
    sizes = model.group_sizes()
    assert set(result.grads) == set(GRADIENT_GROUPS)
    for group, grad in result.grads.items():
        assert grad.dtype == np.float32
        assert grad.shape == (sizes[group],)
        assert np.all(np.isfinite(grad))
        assert np.abs(grad).max() > 0, group
    np.testing.assert_allclose(result.norm_stats, norm_stats(batch.obs_goal.numpy()), rtol=1e-6)
    assert result.norm_stats[0] == 64
    for key in ("loss/critic", "loss/actor", "loss/alpha", "alpha"):
        assert np.isfinite(result.metrics[key])
    assert result.metrics["alpha"] == pytest.approx(np.exp(-1.0), rel=1e-6)


def test_compute_gradients_changes_no_weights_and_leaves_no_grad():
    model = _model()
    before = _all_weights(model)
    compute_gradients(model, _batch(), HP)
    after = _all_weights(model)
    for group in GROUPS:
        np.testing.assert_array_equal(after[group], before[group], err_msg=group)
    assert all(p.grad is None for p in model.parameters())


def test_critic_gradient_is_the_gradient_of_the_critic_loss_alone():
    batch = _batch()
    model = _model()
    torch.manual_seed(7)  # critic_loss samples next actions: same seed, same samples
    result = compute_gradients(model, batch, HP)
    torch.manual_seed(7)
    params = model.group_parameters("critic")
    expected = torch.autograd.grad(critic_loss(model, batch, HP.objective), params)
    expected_flat = torch.cat([g.reshape(-1) for g in expected]).numpy()
    np.testing.assert_allclose(result.grads["critic"], expected_flat, rtol=1e-5, atol=1e-7)


def test_actor_gradient_ignores_critic_target_and_critic_gradient_ignores_actor_loss():
    # The actor loss reads the critic, never the target critic: scrambling the target changes
    # the critic's gradient but must leave the actor's and alpha's gradients untouched.
    batch = _batch()
    model = _model()
    torch.manual_seed(3)
    base = compute_gradients(model, batch, HP)
    rng = np.random.default_rng(0)
    target = model.get_flat("critic_target")
    model.set_flat("critic_target", (target + rng.normal(0, 0.5, target.shape)).astype(np.float32))
    torch.manual_seed(3)
    moved = compute_gradients(model, batch, HP)
    np.testing.assert_allclose(moved.grads["actor"], base.grads["actor"], rtol=1e-6, atol=1e-8)
    np.testing.assert_allclose(moved.grads["log_alpha"], base.grads["log_alpha"], rtol=1e-6)
    assert not np.allclose(moved.grads["critic"], base.grads["critic"])


def _target(model: SACModel, batch: Batch, objective: Objective) -> torch.Tensor:
    """The TD target critic_loss regresses to: recovered from the loss of zero-output critics."""
    zero = model.get_flat("critic") * 0
    model.set_flat("critic", zero)  # Q1 = Q2 = 0, so loss = 2 * mean(target^2) per row
    targets = []
    for i in range(len(batch.reward)):
        row = Batch(
            *(t[i : i + 1] for t in (batch.obs_goal, batch.action, batch.reward, batch.next_obs_goal, batch.done))
        )
        with torch.no_grad():
            loss = critic_loss(model, row, objective)
        targets.append(torch.sqrt(loss / 2))  # |target|
    return torch.stack(targets)


@pytest.mark.parametrize("shift", [+50.0, -50.0])
def test_clip_return_keeps_targets_in_the_return_range(shift):
    gamma = 0.9
    batch = _batch(n=32)
    model = _model()
    # Push the target critics far outside [-1/(1-gamma), 0] through their last bias.
    for q in (model.critic_target.q1, model.critic_target.q2):
        with torch.no_grad():
            q.net[-1].bias.fill_(shift)
    clipped = _target(model, batch, Objective(gamma=gamma, target_entropy=-2.0, clip_return=True))
    # Targets lie in [-10, 0], so |target| <= 1/(1-gamma); with shift -50 they sit on the bound.
    assert torch.all(clipped <= 1.0 / (1.0 - gamma) + 1e-5)
    unclipped = _target(model, batch, Objective(gamma=gamma, target_entropy=-2.0, clip_return=False))
    assert torch.all(unclipped > 1.0 / (1.0 - gamma) + 1.0)
    if shift < 0:
        np.testing.assert_allclose(clipped.numpy(), 1.0 / (1.0 - gamma), rtol=1e-5)
    else:
        assert torch.all(clipped == 0)


def _reach_dataset(n: int, rng: np.random.Generator) -> tuple[np.ndarray, ...]:
    """1-D point reaching: obs = position, goal = target, next = pos + 0.1*a; reward 0 on reach."""
    obs = rng.uniform(-1, 1, (n, 1))
    goal = rng.uniform(-1, 1, (n, 1))
    action = rng.uniform(-1, 1, (n, 1))
    next_obs = obs + 0.1 * action
    reward = -(np.abs(next_obs - goal)[:, 0] > 0.05).astype(np.float32)
    return obs, goal, action, reward, next_obs, np.zeros(n, np.float32)


@pytest.fixture
def one_thread():
    """Tiny networks: one intra-op thread is fastest and does not fight a busy host."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def test_a_few_hundred_sac_steps_reduce_the_critic_loss(one_thread):
    spec = ModelSpec(obs_dim=1, goal_dim=1, act_dim=1, hidden_sizes=(32, 32))
    hp = Hyperparams(Objective(gamma=0.5, target_entropy=-1.0))
    torch.manual_seed(0)
    rng = np.random.default_rng(0)
    model = SACModel(spec, init_log_alpha=-3.0)
    data = _reach_dataset(2048, rng)
    optims = {g: torch.optim.Adam(model.group_parameters(g), lr=3e-3) for g in GRADIENT_GROUPS}

    def critic_loss_on_all() -> float:
        torch.manual_seed(123)
        with torch.no_grad():
            return critic_loss(model, Batch.from_numpy(*data), hp.objective).item()

    initial = critic_loss_on_all()
    for _ in range(200):
        idx = rng.integers(0, len(data[0]), 64)
        result = compute_gradients(model, Batch.from_numpy(*(a[idx] for a in data)), hp)
        for group, optim in optims.items():
            optim.zero_grad()
            for param, grad in zip(
                model.group_parameters(group),
                torch.from_numpy(result.grads[group]).split([p.numel() for p in model.group_parameters(group)]),
                strict=True,
            ):
                param.grad = grad.reshape(param.shape).clone()
            optim.step()
        with torch.no_grad():
            for t, s in zip(model.critic_target.parameters(), model.critic.parameters(), strict=True):
                t.mul_(0.95).add_(s, alpha=0.05)
    final = critic_loss_on_all()
    assert final < 0.25 * initial, (initial, final)


def _share_moving_toward_the_goal(model: SACModel, hp: Hyperparams, groups: tuple[str, ...]) -> float:
    """Train `model` 400 steps on the 1-D reach dataset (Adam on `groups`, Polyak targets), then
    the share of far goals its deterministic action moves toward."""
    rng = np.random.default_rng(0)
    data = _reach_dataset(4096, rng)
    optims = {g: torch.optim.Adam(model.group_parameters(g), lr=3e-3) for g in groups}
    for _ in range(400):
        idx = rng.integers(0, len(data[0]), 128)
        result = compute_gradients(model, Batch.from_numpy(*(a[idx] for a in data)), hp)
        for group, optim in optims.items():
            params = model.group_parameters(group)
            grads = torch.from_numpy(result.grads[group]).split([p.numel() for p in params])
            for param, grad in zip(params, grads, strict=True):
                param.grad = grad.reshape(param.shape).clone()
            optim.step()
        with torch.no_grad():
            for t, s in zip(model.critic_target.parameters(), model.critic.parameters(), strict=True):
                t.mul_(0.95).add_(s, alpha=0.05)
    obs, goal = rng.uniform(-1, 1, (512, 1)), rng.uniform(-1, 1, (512, 1))
    far = np.abs(goal - obs)[:, 0] > 0.2
    with torch.no_grad():
        action = model.actor.deterministic(Batch.from_numpy(obs, goal, obs, obs[:, 0], obs, obs[:, 0]).obs_goal)
    toward = np.sign(action.numpy()[:, 0]) == np.sign((goal - obs)[:, 0])
    return float(toward[far].mean())


@pytest.mark.parametrize("kind", ["dense", "moe-task", "moe-state"])
def test_bf16_autocast_gradients_are_float32_and_point_where_float32_ones_do(kind):
    spec = SPEC
    if kind != "dense":
        spec = dataclasses.replace(SPEC, kind="moe", experts=4, top_k=2, tasks=3, router=kind.split("-")[1])
    batch = _batch(256, spec=spec)
    if kind != "dense":
        batch = dataclasses.replace(batch, task=torch.arange(256) % 3)
    torch.manual_seed(0)
    model = SACModel(spec, init_log_alpha=-1.0)
    results = {}
    for autocast in ("off", "bf16"):
        torch.manual_seed(1)  # the same actor samples in both
        results[autocast] = compute_gradients(model, batch, dataclasses.replace(HP, autocast=autocast))
    for group in ("actor", "critic"):
        full, half = results["off"].grads[group], results["bf16"].grads[group]
        assert half.dtype == np.float32 and np.all(np.isfinite(half))
        cosine = float(full @ half / (np.linalg.norm(full) * np.linalg.norm(half)))
        assert cosine > 0.95, (group, cosine)
        assert not np.array_equal(full, half)  # bf16 really ran: rounding shows


AMD_BF16 = "processor\t: 0\nflags\t\t: fpu sse2 avx2 avx512f avx512_bf16 avx512_vnni\n"
XEON_NO_BF16 = "processor\t: 0\nflags\t\t: fpu sse2 avx2 avx512f avx512bw avx512_vnni\n"
ARM_BF16 = "processor\t: 0\nFeatures\t: fp asimd sve bf16 i8mm\n"


def test_autocast_auto_is_bf16_only_on_a_cpu_learner_with_bf16_instructions():
    from foundation.cpu import has_bf16
    from learner.gradients import resolve_autocast

    assert has_bf16(AMD_BF16) and has_bf16(ARM_BF16) and not has_bf16(XEON_NO_BF16) and not has_bf16("")
    assert not has_bf16("model name\t: avx512_bf16 marketing\n")  # flags lines only
    assert resolve_autocast("auto", "cpu", AMD_BF16) == "bf16"
    assert resolve_autocast("auto", "cpu", XEON_NO_BF16) == "off"
    assert resolve_autocast("auto", "cuda", AMD_BF16) == "off"
    for explicit in ("off", "bf16"):  # the user's explicit choice stands on every CPU
        assert resolve_autocast(explicit, "cpu", XEON_NO_BF16) == explicit
        assert resolve_autocast(explicit, "cpu", AMD_BF16) == explicit
    config = with_overrides(RunConfig(), ['learner.autocast="auto"', 'learner.device="cpu"'])
    assert Hyperparams.for_run(config, 4).autocast == ("bf16" if has_bf16() else "off")  # this machine's


def _task_batch(spec: ModelSpec, task: np.ndarray, seed: int = 0) -> Batch:
    """A multi-task batch: obs ending with each row's task one-hot, rows' task places."""
    rng = np.random.default_rng(seed)
    n = len(task)
    obs = rng.normal(size=(n, spec.obs_dim))
    obs[:, -spec.tasks :] = np.eye(spec.tasks)[task]
    return Batch.from_numpy(
        obs, rng.normal(size=(n, spec.goal_dim)), rng.uniform(-1, 1, (n, spec.act_dim)),
        -(rng.random(n) < 0.5).astype(np.float32), obs.copy(), np.zeros(n, np.float32), task=task,
    )  # fmt: skip


@pytest.mark.parametrize("kind", ["dense", "moe"])
def test_one_temperature_per_task_moves_only_with_its_own_rows(kind):
    spec = ModelSpec(obs_dim=7, goal_dim=2, act_dim=2, hidden_sizes=(16, 16), kind=kind, tasks=3, task_alpha=True)
    assert spec.alpha_rows == 3 and dataclasses.replace(spec, task_alpha=False).alpha_rows == 1
    torch.manual_seed(0)
    model = SACModel(spec, init_log_alpha=-1.0)
    with torch.no_grad():
        model.log_alpha.copy_(torch.tensor([-1.0, -2.0, -3.0]))
    task = np.array([0, 2] * 32)  # no row of task 1
    result = compute_gradients(model, _task_batch(spec, task), HP)
    grad = result.grads["log_alpha"]
    assert grad.shape == (3,) and grad[1] == 0.0 and grad[0] != 0.0 and grad[2] != 0.0
    # rows of one task: its temperature does what the one shared temperature did, exactly
    only = np.full(64, 2)
    torch.manual_seed(1)
    per_task = compute_gradients(model, _task_batch(spec, only), HP)
    shared = SACModel(dataclasses.replace(spec, task_alpha=False), init_log_alpha=-3.0)
    shared.load_state_dict({k: v for k, v in model.state_dict().items() if k != "log_alpha"}, strict=False)
    torch.manual_seed(1)
    one = compute_gradients(shared, _task_batch(spec, only), HP)
    assert per_task.grads["log_alpha"][[0, 1]].tolist() == [0.0, 0.0]
    np.testing.assert_allclose(per_task.grads["log_alpha"][2], one.grads["log_alpha"][0], rtol=1e-5)
    for group in ("actor", "critic"):
        np.testing.assert_allclose(per_task.grads[group], one.grads[group], rtol=1e-4, atol=1e-7)
    assert result.metrics["alpha"] == pytest.approx(np.exp([-1.0, -2.0, -3.0]).mean(), rel=1e-6)
    assert result.metrics["alpha/task1"] == pytest.approx(np.exp(-2.0), rel=1e-6)


@pytest.mark.parametrize("kind", ["dense", "moe"])
def test_gradients_written_into_reused_buffers_equal_fresh_ones_as_the_task_mix_changes(kind):
    """A learner writes each gradient into one of two buffer sets in turn; a set's MoE parts
    clear only the experts the last gradient there touched. Batches whose tasks (so experts)
    change from one gradient to the next must still read exactly like fresh vectors."""
    from nets.flat import GradientBuffers

    spec = ModelSpec(obs_dim=7, goal_dim=2, act_dim=2, hidden_sizes=(16, 16), kind=kind, tasks=3, experts=6)
    torch.manual_seed(0)
    model = SACModel(spec, init_log_alpha=-1.0)
    buffers = GradientBuffers()
    mixes = [[0, 1, 2], [2], [0], [1, 2], [0, 1], [2]]  # each set sees tasks leave and come back
    kept = []
    for i, tasks in enumerate(mixes):
        batch = _task_batch(spec, np.resize(tasks, 48), seed=i)
        torch.manual_seed(i)
        fresh = compute_gradients(model, batch, HP)
        torch.manual_seed(i)
        reused = compute_gradients(model, batch, HP, out=buffers.next())
        for group in fresh.grads:
            np.testing.assert_array_equal(reused.grads[group], fresh.grads[group])
        kept.append(reused.grads["critic"])
    assert np.shares_memory(kept[0], kept[2]) and not np.shares_memory(kept[0], kept[1])  # two sets, in turn


TQC_SPEC = dataclasses.replace(SPEC, critic_quantiles=5)
TQC_HP = Hyperparams(Objective(gamma=0.9, target_entropy=-2.0), TQC(drop=1))


def test_quantile_huber_loss_is_its_definition_pair_by_pair():
    rng = np.random.default_rng(0)
    current, target = rng.normal(size=(3, 4)) * 2, rng.normal(size=(3, 5)) * 2
    expected = []
    for row in range(3):
        for m in range(4):
            tau = (m + 0.5) / 4
            for k in range(5):
                d = target[row, k] - current[row, m]
                huber = 0.5 * d * d if abs(d) <= 1 else abs(d) - 0.5
                expected.append(abs(tau - (d < 0)) * huber)
    got = quantile_huber_loss(torch.tensor(current), torch.tensor(target))
    assert got.item() == pytest.approx(float(np.mean(expected)), rel=1e-12)


def test_tqc_targets_are_both_target_critics_atoms_but_the_largest(monkeypatch):
    torch.manual_seed(0)
    model = SACModel(TQC_SPEC, init_log_alpha=-1.0)
    batch = _batch(8, spec=TQC_SPEC)
    z1 = -torch.arange(5.0).repeat(8, 1)  # 0, -1, ..., -4
    z2 = -torch.arange(5.0).repeat(8, 1) - 0.5  # -0.5, ..., -4.5
    log_prob = torch.full((8,), 2.0)
    monkeypatch.setattr(model.critic_target, "forward", lambda *a, **k: (z1, z2))
    monkeypatch.setattr(model.actor, "sample", lambda *a, **k: (torch.zeros(8, 2), log_prob))
    loss = tqc_critic_loss(model, batch, Objective(gamma=0.9, target_entropy=-2.0, clip_return=False), drop=1)
    kept = torch.tensor([-4.5, -4.0, -3.5, -3.0, -2.5, -2.0, -1.5, -1.0])  # 0 and -0.5 dropped (1 per critic)
    alpha = np.exp(-1.0)
    target = batch.reward[:, None] + 0.9 * (1 - batch.done[:, None]) * (kept - alpha * 2.0)
    q1, q2 = model.critic(batch.obs_goal, batch.action)
    assert q1.shape == (8, 5)
    expected = quantile_huber_loss(q1, target) + quantile_huber_loss(q2, target)
    assert loss.item() == pytest.approx(expected.item(), rel=1e-6)


def test_tqc_gradients_fill_every_group_and_its_critics_predict_quantiles():
    torch.manual_seed(0)
    model = SACModel(TQC_SPEC, init_log_alpha=-1.0)
    sac = SACModel(SPEC).group_sizes()
    result = compute_gradients(model, _batch(spec=TQC_SPEC), TQC_HP)
    sizes = model.group_sizes()
    for group, grad in result.grads.items():
        assert grad.shape == (sizes[group],) and np.all(np.isfinite(grad)) and np.abs(grad).max() > 0, group
    # Only the critics' output layers widen: 32 inputs + 1 bias per extra quantile, per critic.
    assert sizes["critic"] - sac["critic"] == 2 * 4 * (32 + 1)
    assert sizes["actor"] == sac["actor"]


def test_a_few_hundred_tqc_steps_learn_to_move_toward_the_goal(one_thread):
    spec = ModelSpec(obs_dim=1, goal_dim=1, act_dim=1, hidden_sizes=(32, 32), critic_quantiles=10)
    hp = Hyperparams(Objective(gamma=0.5, target_entropy=-1.0), TQC(drop=1))
    torch.manual_seed(0)
    toward = _share_moving_toward_the_goal(SACModel(spec, init_log_alpha=-3.0), hp, tuple(GRADIENT_GROUPS))
    assert toward > 0.9, toward


def test_a_few_hundred_crossq_steps_learn_to_move_toward_the_goal(one_thread):
    spec = ModelSpec(obs_dim=1, goal_dim=1, act_dim=1, hidden_sizes=(32, 32), critic_renorm=True)
    hp = Hyperparams(Objective(gamma=0.5, target_entropy=-1.0), CrossQ())
    torch.manual_seed(0)
    model = SACModel(spec, init_log_alpha=-3.0).batch_renorm(momentum=0.01, warmup=200)  # renormalizes half the run
    toward = _share_moving_toward_the_goal(model, hp, tuple(GRADIENT_GROUPS))
    # Slower than SAC on this toy (seeds 0-2: 0.74, 0.90, 0.86 against SAC's 0.91, 0.91, 1.00);
    # with the critics' batch statistics and running ones out of step it stays at chance (0.5).
    assert toward > 0.65, toward


def test_n_step_rows_bootstrap_with_gamma_to_the_n_and_clip_to_the_one_step_return_range():
    gamma, n = 0.9, 3
    batch = _batch(n=16)
    model = _model()
    for q in (model.critic_target.q1, model.critic_target.q2):
        with torch.no_grad():
            q.net[-1].bias.fill_(-3.0)
    targets = []
    for hp in (
        Objective(gamma=gamma, target_entropy=-2.0, n_step=n, clip_return=False),
        Objective(gamma=gamma**n, target_entropy=-2.0, clip_return=False),
    ):
        torch.manual_seed(7)  # the same next actions
        targets.append(_target(_model_like(model), batch, hp))
    torch.testing.assert_close(targets[0], targets[1])
    assert Objective(gamma=gamma, target_entropy=-2.0, n_step=n).discount == pytest.approx(gamma**n)
    # An n-step return of rewards in [-1, 0] still lies in [-1/(1-gamma), 0]: the clip keeps gamma's bound.
    for q in (model.critic_target.q1, model.critic_target.q2):
        with torch.no_grad():
            q.net[-1].bias.fill_(-50.0)
    clipped = _target(model, batch, Objective(gamma=gamma, target_entropy=-2.0, n_step=n))
    assert clipped.max().item() == pytest.approx(1.0 / (1.0 - gamma), rel=1e-5)


def _model_like(model: SACModel) -> SACModel:
    copy = _model()
    copy.load_state_dict(model.state_dict())
    return copy


@pytest.mark.parametrize(
    "extra,hp",
    [
        ({}, HP),
        ({"task_heads": True, "task_alpha": True}, HP),
        ({}, TQC_HP),
        ({}, dataclasses.replace(HP, autocast="bf16")),
    ],
)
def test_one_mix_per_update_gives_the_gradients_of_mixing_in_every_pass(monkeypatch, extra, hp):
    """compute_gradients mixes each MoE layer's experts once per update and reuses the mix in every
    pass (nets.models.one_mix_per_update): the same gradients, routers' balancing part and
    metrics as mixing anew in each pass, the first use (the TD target, under no_grad) included."""
    import contextlib

    import learner.gradients as gradients

    quantiles = isinstance(hp.algorithm, TQC) and {"critic_quantiles": 5} or {}
    spec = ModelSpec(
        obs_dim=7, goal_dim=2, act_dim=2, hidden_sizes=(16, 16), kind="moe", tasks=3, experts=6,
        router="task", **extra, **quantiles,
    )  # fmt: skip
    torch.manual_seed(0)
    model = SACModel(spec, init_log_alpha=-1.0)
    with torch.no_grad():  # targets off the online critics, so the target mix differs from theirs
        for p in model.critic_target.parameters():
            p.add_(torch.randn_like(p) * 0.1)
    batch = _task_batch(spec, np.resize([0, 2, 2, 1, 0], 40), seed=3)
    results = []
    for cached in (True, False):
        if not cached:
            monkeypatch.setattr(gradients, "one_mix_per_update", lambda *m: contextlib.nullcontext())
        torch.manual_seed(1)
        results.append(compute_gradients(model, batch, hp))
    torch.manual_seed(1)  # learner.mix_once false: the same as no cache at all
    results.append(compute_gradients(model, batch, dataclasses.replace(hp, mix_once=False)))
    for group in results[1].grads:
        np.testing.assert_array_equal(results[2].grads[group], results[1].grads[group])
    results.pop()
    with_cache, without = results
    for group in without.grads:
        assert np.abs(without.grads[group]).max() > 0, group
        np.testing.assert_allclose(with_cache.grads[group], without.grads[group], rtol=1e-6, atol=1e-7, err_msg=group)
    assert with_cache.metrics.keys() == without.metrics.keys()
    for key, value in without.metrics.items():
        assert with_cache.metrics[key] == pytest.approx(value, rel=1e-6, abs=1e-7), key
    for body in (model.actor.body, model.critic.q1, model.critic_target.q2):
        assert body.__dict__["_mix_cache"] is None  # off again after the update


@pytest.mark.parametrize("algo", ["sac", "tqc"])
def test_compiled_losses_give_the_eager_gradients(algo):
    """learner.compile: the dense losses under torch.compile, forward and backward, and the actor's
    and temperature's gradients from one backward: the eager gradients to float rounding."""
    spec, hp = (TQC_SPEC, TQC_HP) if algo == "tqc" else (SPEC, HP)
    torch.manual_seed(0)
    model = SACModel(spec, init_log_alpha=-1.0)
    batch = _batch(n=64, spec=spec)
    results = []
    for compiled in (False, True):
        torch.manual_seed(5)
        results.append(compute_gradients(model, batch, dataclasses.replace(hp, compile=compiled)))
    for group in results[0].grads:
        np.testing.assert_allclose(results[1].grads[group], results[0].grads[group], rtol=1e-4, atol=1e-6)
    for key in ("loss/critic", "loss/actor", "loss/alpha"):
        assert results[1].metrics[key] == pytest.approx(results[0].metrics[key], rel=1e-5)
    from torch._dynamo.utils import counters

    assert counters["stats"]["unique_graphs"] > 0  # compiled, not a silent eager fallback
