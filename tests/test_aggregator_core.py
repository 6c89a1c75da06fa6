"""AggregatorCore (the aggregator's math) and its checkpoint files, without any network."""

from __future__ import annotations

import dataclasses
import os

import numpy as np
import pytest
import torch

from aggregator.core import AggregatorCore, GradientError
from foundation.checkpoint import (
    CheckpointError,
    checkpoint_path,
    latest_checkpoint,
    list_checkpoints,
    load_checkpoint,
    resolve_checkpoint,
    save_checkpoint,
)
from foundation.config import AggregatorConfig
from learner.algorithm import Batch, Objective
from learner.gradients import Hyperparams, compute_gradients
from nets.models import GRADIENT_GROUPS, GROUPS, ModelSpec, SACModel, norm_from_stats, norm_stats
from tests.test_aggregator_validation import BAD_GRADIENTS, BAD_NORM_STATS, SPEC

CONFIG = AggregatorConfig(lr=1e-2, tau=0.25, seed=0)


def make_core(grads_per_step: int = 1, max_staleness: int = 1, config: AggregatorConfig = CONFIG) -> AggregatorCore:
    return AggregatorCore(SPEC, config, grads_per_step=grads_per_step, max_staleness=max_staleness)


def grads(core: AggregatorCore, seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {g: rng.normal(size=core.sizes[g]).astype(np.float32) for g in GRADIENT_GROUPS}


def stats(seed: int, n: int = 16) -> np.ndarray:
    rng = np.random.default_rng(1000 + seed)
    return norm_stats(rng.normal(seed, 1.0 + seed, (n, SPEC.input_dim)))


def adam_steps(start: np.ndarray, gradients: list[np.ndarray], lr: float) -> np.ndarray:
    """A fresh torch Adam on one flat tensor, one step per gradient."""
    param = torch.nn.Parameter(torch.from_numpy(start.copy()))
    optim = torch.optim.Adam([param], lr=lr)
    for g in gradients:
        param.grad = torch.from_numpy(g.copy())
        optim.step()
    return param.detach().numpy()


def test_grads_per_step_two_steps_on_the_second_push_with_adam_on_the_mean():
    core = make_core(grads_per_step=2)
    before = core.weights()
    g1, g2 = grads(core, 1), grads(core, 2)
    first = core.submit(0, g1, stats(0), learner="a")
    assert (first.applied, first.stale, first.version) == (True, False, 0)
    for group in GROUPS:
        np.testing.assert_array_equal(core.weights()[group], before[group])
    second = core.submit(0, g2, stats(1), learner="b")
    assert (second.applied, second.stale, second.version) == (True, False, 1)
    after = core.weights()
    for group in GRADIENT_GROUPS:
        expected = adam_steps(before[group], [(g1[group] + g2[group]) / 2], CONFIG.lr)
        np.testing.assert_allclose(after[group], expected, rtol=1e-6, atol=1e-7)
        assert not np.allclose(after[group], before[group])


def test_successive_steps_follow_one_adam_optimizer():
    core = make_core()
    before = core.weights()
    pushes = [grads(core, s) for s in range(3)]
    for version, g in enumerate(pushes):
        assert core.submit(version, g, stats(version)).version == version + 1
    for group in GRADIENT_GROUPS:
        expected = adam_steps(before[group], [g[group] for g in pushes], CONFIG.lr)
        np.testing.assert_allclose(core.weights()[group], expected, rtol=1e-5, atol=1e-6)


def test_learning_rate_falls_on_a_line_between_the_decay_versions_and_stays_at_lr_final():
    config = dataclasses.replace(CONFIG, lr=1e-3, lr_final=1e-4, lr_decay_start=100, lr_decay_end=200)
    assert [config.lr_at(v) for v in (0, 100)] == [1e-3, 1e-3]
    assert config.lr_at(150) == pytest.approx(5.5e-4)
    assert [config.lr_at(v) for v in (200, 10**6)] == [1e-4, 1e-4]
    assert dataclasses.replace(config, lr_final=0.0).lr_at(10**6) == 1e-3  # off: lr throughout


def test_steps_past_the_decay_use_each_versions_learning_rate_in_one_adam():
    config = dataclasses.replace(CONFIG, lr_final=1e-3, lr_decay_start=0, lr_decay_end=2)
    core = make_core(config=config)
    before = core.weights()
    pushes = [grads(core, s) for s in range(4)]
    for version, g in enumerate(pushes):
        assert core.submit(version, g, stats(version)).version == version + 1
    rates = [config.lr_at(v) for v in range(4)]
    assert rates == [1e-2, pytest.approx(5.5e-3), 1e-3, 1e-3]
    for group in GRADIENT_GROUPS:
        param = torch.nn.Parameter(torch.from_numpy(before[group].copy()))
        optim = torch.optim.Adam([param], lr=1e-2)
        for lr, g in zip(rates, pushes, strict=True):
            optim.param_groups[0]["lr"] = lr
            param.grad = torch.from_numpy(g[group].copy())
            optim.step()
        np.testing.assert_allclose(core.weights()[group], param.detach().numpy(), rtol=1e-5, atol=1e-6)
        constant = adam_steps(before[group], [g[group] for g in pushes], CONFIG.lr)
        assert not np.allclose(core.weights()[group], constant)


def test_push_older_than_max_staleness_is_dropped_and_changes_nothing():
    core = make_core(max_staleness=1)
    for version in range(3):
        core.submit(version, grads(core, version), stats(version))
    before = core.weights()
    late = core.submit(1, grads(core, 9), stats(9))
    assert (late.applied, late.stale, late.version) == (False, True, 3)
    for group in GROUPS:
        np.testing.assert_array_equal(core.weights()[group], before[group])
    # exactly max_staleness behind is still used
    ok = core.submit(2, grads(core, 10), stats(10))
    assert (ok.applied, ok.stale, ok.version) == (True, False, 4)


def test_stale_push_does_not_count_towards_a_pending_step():
    core = make_core(grads_per_step=2, max_staleness=0)
    core.submit(0, grads(core, 0), stats(0), learner="a")
    core.submit(0, grads(core, 1), stats(1), learner="b")
    assert core.version == 1
    assert core.submit(0, grads(core, 2), stats(2), learner="a").stale
    assert core.submit(1, grads(core, 3), stats(3), learner="a").version == 1  # one pending, not two
    assert core.submit(1, grads(core, 4), stats(4), learner="b").version == 2


def test_base_version_ahead_of_the_aggregator_is_an_error():
    core = make_core()
    with pytest.raises(GradientError) as err:
        core.submit(1, grads(core, 0), stats(0))
    assert err.value.field == "base_version"
    assert "1 is ahead of the aggregator (0)" in str(err.value)
    assert core.version == 0


@pytest.mark.parametrize("case,mutate,field,message", BAD_GRADIENTS, ids=[r[0] for r in BAD_GRADIENTS])
def test_bad_gradients_raise_naming_the_field_and_change_nothing(case, mutate, field, message):
    core = make_core(grads_per_step=2)
    core.submit(0, grads(core, 0), stats(0), learner="a")  # one pending: a bad push must not complete the step
    before = core.weights()
    bad_grads, bad_stats = mutate(grads(core, 1), stats(1))
    with pytest.raises(GradientError) as err:
        core.submit(0, bad_grads, bad_stats, learner="b")
    assert err.value.field == field
    assert message in str(err.value)
    assert core.version == 0
    for group in GROUPS:
        np.testing.assert_array_equal(core.weights()[group], before[group])
    assert core.submit(0, grads(core, 2), stats(2), learner="b").version == 1


def test_target_critic_moves_by_tau_toward_the_critic_once_per_version():
    core = make_core(grads_per_step=2)
    start = core.weights()
    np.testing.assert_array_equal(start["critic_target"], start["critic"])
    target = start["critic_target"]
    for version in range(3):
        core.submit(version, grads(core, 2 * version), stats(0), learner="a")
        np.testing.assert_array_equal(core.weights()["critic_target"], target)  # pending: no move
        core.submit(version, grads(core, 2 * version + 1), stats(0), learner="b")
        critic = core.weights()["critic"]
        target = (1 - CONFIG.tau) * target + CONFIG.tau * critic
        np.testing.assert_allclose(core.weights()["critic_target"], target, rtol=1e-5, atol=1e-7)
    assert not np.allclose(core.weights()["critic_target"], core.weights()["critic"])


def test_obs_norm_is_mean_and_std_of_every_reported_batch():
    core = make_core(grads_per_step=2)
    np.testing.assert_array_equal(
        core.weights()["obs_norm"], np.concatenate([np.zeros(SPEC.input_dim), np.ones(SPEC.input_dim)])
    )
    rng = np.random.default_rng(0)
    batches = [rng.normal(3.0 * i, 0.5 + i, (20 + i, SPEC.input_dim)) for i in range(4)]
    for i, x in enumerate(batches):
        core.submit(core.version, grads(core, i), norm_stats(x), learner="ab"[i % 2])
    assert core.version == 2
    everything = np.concatenate(batches)
    norm = core.weights()["obs_norm"]
    np.testing.assert_allclose(norm[: SPEC.input_dim], everything.mean(0), rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(norm[SPEC.input_dim :], everything.std(0), rtol=1e-4)
    totals = sum(norm_stats(x).astype(np.float64) for x in batches)
    np.testing.assert_allclose(norm, norm_from_stats(totals, SPEC.input_dim), rtol=1e-6)


def test_obs_norm_std_has_a_floor_for_constant_inputs():
    core = make_core()
    core.submit(0, grads(core, 0), norm_stats(np.full((8, SPEC.input_dim), 2.0)))
    norm = core.weights()["obs_norm"]
    np.testing.assert_allclose(norm[: SPEC.input_dim], 2.0, rtol=1e-6)
    np.testing.assert_allclose(norm[SPEC.input_dim :], 0.01, rtol=1e-3)


def test_grads_per_step_below_one_is_refused():
    with pytest.raises(ValueError, match="grads_per_step"):
        make_core(grads_per_step=0)


def _advance(core: AggregatorCore, versions: int, seed: int) -> None:
    for i in range(versions):
        core.submit(core.version, grads(core, seed + i), stats(seed + i))


def test_state_roundtrip_preserves_version_weights_and_optimizer(tmp_path):
    core = make_core()
    _advance(core, 4, seed=0)
    save_checkpoint(tmp_path, core.state(), keep=3)
    restored = make_core(config=AggregatorConfig(lr=CONFIG.lr, tau=CONFIG.tau, seed=99))  # other init
    restored.load_state(load_checkpoint(tmp_path))
    assert restored.version == core.version == 4
    for group in GROUPS:
        np.testing.assert_array_equal(restored.weights()[group], core.weights()[group])
    _advance(core, 2, seed=50)
    _advance(restored, 2, seed=50)
    for group in GROUPS:
        np.testing.assert_array_equal(restored.weights()[group], core.weights()[group], err_msg=group)
    # A fresh Adam on the restored weights would step differently: the optimizer state matters.
    fresh = make_core()
    fresh.load_state({**load_checkpoint(tmp_path), "optim": make_core().state()["optim"]})
    _advance(fresh, 2, seed=50)
    assert not np.allclose(fresh.weights()["actor"], core.weights()["actor"])


def test_load_state_refuses_another_model_spec():
    other = AggregatorCore(ModelSpec(3, 2, 2, (16,)), CONFIG, grads_per_step=1, max_staleness=1)
    with pytest.raises(ValueError, match="does not match"):
        make_core().load_state(other.state())


def test_checkpoints_are_named_by_version_pruned_to_keep_and_loaded_newest_first(tmp_path):
    core = make_core()
    directory = tmp_path / "checkpoints"
    assert list_checkpoints(directory) == [] and latest_checkpoint(directory) is None
    saved = {}
    for _ in range(5):
        _advance(core, 1, seed=core.version)
        saved[core.version] = core.weights()["actor"]
        path = save_checkpoint(directory, core.state(), keep=2)
        assert path == checkpoint_path(directory, core.version) == directory / f"ckpt_{core.version:010d}.pt"
    assert [p.name for p in list_checkpoints(directory)] == ["ckpt_0000000004.pt", "ckpt_0000000005.pt"]
    assert sorted(os.listdir(directory)) == ["ckpt_0000000004.pt", "ckpt_0000000005.pt"]  # no .tmp left over
    assert latest_checkpoint(directory) == directory / "ckpt_0000000005.pt"
    assert resolve_checkpoint(directory) == directory / "ckpt_0000000005.pt"  # a folder: its newest
    assert resolve_checkpoint(directory / "ckpt_0000000004.pt") == directory / "ckpt_0000000004.pt"  # a file: itself
    (tmp_path / "none").mkdir()
    with pytest.raises(CheckpointError, match="none: no checkpoint"):
        resolve_checkpoint(tmp_path / "none")
    assert load_checkpoint(directory)["version"] == 5
    older = load_checkpoint(directory / "ckpt_0000000004.pt")
    assert older["version"] == 4
    np.testing.assert_array_equal(older["weights"]["actor"], saved[4])


def test_checkpoint_listing_orders_by_version_and_ignores_torn_and_foreign_files(tmp_path):
    core = make_core()
    for version in (9, 10, 123):
        core.version = version
        save_checkpoint(tmp_path, core.state(), keep=10)
    (tmp_path / "ckpt_0000000999.tmp").write_bytes(b"torn")  # a crash mid-write
    (tmp_path / "ckpt_5.pt").write_bytes(b"foreign")
    (tmp_path / "notes.txt").write_text("x")
    assert [p.name for p in list_checkpoints(tmp_path)] == [
        "ckpt_0000000009.pt",
        "ckpt_0000000010.pt",
        "ckpt_0000000123.pt",
    ]
    assert load_checkpoint(tmp_path)["version"] == 123


def test_loading_a_directory_without_checkpoints_names_it(tmp_path):
    with pytest.raises(FileNotFoundError, match="no checkpoint"):
        load_checkpoint(tmp_path)


def test_a_wild_gradient_is_clipped_and_cannot_poison_adam():
    core = make_core(config=AggregatorConfig(lr=1e-2, tau=0.25, seed=0, max_grad_norm=10.0))
    wild = {g: np.full(core.sizes[g], 1e30, np.float32) for g in GRADIENT_GROUPS}
    assert core.submit(0, wild, stats(0)).version == 1
    assert core.clipped == 1
    for g in GROUPS:
        assert np.all(np.isfinite(core.weights()[g]))
    # Adam's moments stayed finite: an ordinary gradient still moves the weights.
    before = core.weights()["critic"]
    core.submit(1, grads(core, 1), stats(1))
    assert np.all(np.isfinite(core.weights()["critic"])) and not np.allclose(core.weights()["critic"], before)


def test_two_near_float32_max_gradients_do_not_overflow_the_mean():
    core = make_core(grads_per_step=2)
    huge = {g: np.full(core.sizes[g], 3e38, np.float32) for g in GRADIENT_GROUPS}
    core.submit(0, huge, stats(0), learner="a")
    assert core.submit(0, huge, stats(1), learner="b").version == 1
    assert all(np.all(np.isfinite(w)) for w in core.weights().values())


def test_without_clipping_a_step_that_would_overflow_adam_is_skipped_and_counted():
    core = make_core(config=AggregatorConfig(lr=1e-2, tau=0.25, seed=0, max_grad_norm=0.0))
    before = core.weights()
    huge = {g: np.full(core.sizes[g], 3e38, np.float32) for g in GRADIENT_GROUPS}
    result = core.submit(0, huge, stats(0))
    assert (result.applied, core.version, core.steps_skipped) == (True, 0, 1)
    for g in GROUPS:
        np.testing.assert_array_equal(core.weights()[g], before[g])
    assert core.submit(0, grads(core, 1), stats(1)).version == 1  # and the next push steps as usual


def test_a_learners_next_gradient_closes_the_step_it_has_one_pending_in():
    """At most one gradient per learner per step: the fast learner's second closes the step
    with its first alone and opens the next; the straggler's joins that one. Both were computed
    on version 0 and land in the step from version 1: equally stale, equally weighted."""
    core = make_core(grads_per_step=2)
    start = core.weights()
    g = [grads(core, seed) for seed in range(3)]
    core.submit(0, g[0], stats(0), learner="fast", batch_size=16)
    second = core.submit(0, g[1], stats(1), learner="fast", batch_size=16)
    assert (second.applied, second.stale, core.version, core.repeat_steps) == (True, False, 1, 1)
    assert core.submit(0, g[2], stats(2), learner="slow", batch_size=48).version == 2
    for group in GRADIENT_GROUPS:
        steps = [g[0][group], ((g[1][group] + 3.0 * g[2][group].astype(np.float64)) / 4.0).astype(np.float32)]
        np.testing.assert_allclose(core.weights()[group], adam_steps(start[group], steps, CONFIG.lr), rtol=1e-5)


@pytest.mark.parametrize("case,mutate,message", BAD_NORM_STATS, ids=[r[0] for r in BAD_NORM_STATS])
def test_bad_normalizer_statistics_are_refused(case, mutate, message):
    core = make_core()
    bad = mutate(stats(0).astype(np.float64)).astype(np.float32)
    with pytest.raises(GradientError, match=message) as err:
        core.submit(0, grads(core, 0), bad, batch_size=16)
    assert err.value.field == "tensors[norm_stats].data"
    assert core.version == 0 and core.assembly.pending == 0


def _row_noise(self, sample_shape=torch.Size()):  # noqa: B008 - torch's own default
    """A reparameterized sample whose noise is a function of its row: a batch's gradient is then
    exactly the mean of its rows' gradients, however the batch is split."""
    return self.loc + self.scale * torch.sin(123.0 * self.loc.detach())


def _sac_gradient(core: AggregatorCore, spec: ModelSpec, rows: dict[str, np.ndarray]):
    model = SACModel(spec)
    for group, flat in core.weights().items():
        model.set_flat(group, flat)
    batch = Batch.from_numpy(**rows)
    return compute_gradients(model, batch, Hyperparams(Objective(gamma=0.95, target_entropy=-float(spec.act_dim))))


def _rows(spec: ModelSpec, n: int, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {
        "obs": rng.normal(size=(n, spec.obs_dim)),
        "goal": rng.normal(size=(n, spec.goal_dim)),
        "action": rng.uniform(-1, 1, (n, spec.act_dim)),
        "reward": -rng.integers(0, 2, n).astype(np.float64),
        "next_obs": rng.normal(size=(n, spec.obs_dim)),
        "done": np.zeros(n),
    }


def test_m_learners_of_batch_b_step_as_one_learner_of_batch_m_times_b_on_the_same_data(monkeypatch):
    """Real SAC gradients: two learners with 16 and 48 rows of a batch step the weights as one
    learner with all 64 rows (the mean is weighted by batch size); unweighted, they would not."""
    monkeypatch.setattr(torch.distributions.Normal, "rsample", _row_noise)
    spec = ModelSpec(obs_dim=3, goal_dim=2, act_dim=2, hidden_sizes=(16, 16))
    config = AggregatorConfig(lr=1e-3, seed=3)
    rows = _rows(spec, 64)
    part = [{k: v[:16] for k, v in rows.items()}, {k: v[16:] for k, v in rows.items()}]

    one = AggregatorCore(spec, config, grads_per_step=1, max_staleness=1)
    whole = _sac_gradient(one, spec, rows)
    one.submit(0, whole.grads, whole.norm_stats, "learner-0", batch_size=64)

    def two_learners(batch_sizes: tuple[int, int]) -> AggregatorCore:
        core = AggregatorCore(spec, config, grads_per_step=2, max_staleness=1)
        results = [_sac_gradient(core, spec, p) for p in part]
        for i, (result, size) in enumerate(zip(results, batch_sizes, strict=True)):
            core.submit(0, result.grads, result.norm_stats, f"learner-{i}", batch_size=size)
        return core

    two = two_learners((16, 48))
    assert one.version == two.version == 1
    for group in GROUPS:
        np.testing.assert_allclose(two.weights()[group], one.weights()[group], rtol=1e-5, atol=1e-7, err_msg=group)
    unweighted = two_learners((0, 0))  # sizes unknown (weight 1 each): the plain mean, not the same step
    assert not np.allclose(unweighted.weights()["critic"], one.weights()["critic"], rtol=1e-5, atol=1e-7)


def test_a_stale_gradient_weighs_less_in_the_step():
    config = AggregatorConfig(lr=1e-2, tau=0.25, seed=0, staleness_power=1.0)
    core = AggregatorCore(SPEC, config, grads_per_step=2, max_staleness=1)
    start = core.weights()
    g = [grads(core, seed) for seed in range(4)]
    core.submit(0, g[0], stats(0), learner="a", batch_size=16)
    core.submit(0, g[1], stats(1), learner="b", batch_size=16)
    core.submit(0, g[2], stats(2), learner="a", batch_size=16)  # one version behind: weight 16 / 2
    core.submit(1, g[3], stats(3), learner="b", batch_size=16)  # fresh: weight 16
    assert core.version == 2
    for group in GRADIENT_GROUPS:
        first = (g[0][group].astype(np.float64) + g[1][group]) / 2
        second = (0.5 * g[2][group].astype(np.float64) + g[3][group]) / 1.5
        expected = adam_steps(start[group], [first.astype(np.float32), second.astype(np.float32)], config.lr)
        np.testing.assert_allclose(core.weights()[group], expected, rtol=1e-5, atol=1e-6)


def test_a_step_short_of_k_closes_at_its_deadline_with_what_arrived():
    config = AggregatorConfig(lr=1e-2, tau=0.25, seed=0, step_deadline_ms=50.0)
    core = AggregatorCore(SPEC, config, grads_per_step=2, max_staleness=1)
    start = core.weights()
    g = grads(core, 1)
    assert not core.close_due()  # nothing pending
    core.submit(0, g, stats(0), learner="a", batch_size=16)
    opened = core.assembly.opened
    assert not core.close_due(now=opened + 0.049)
    assert core.version == 0
    assert core.close_due(now=opened + 0.051)  # the other learner never came
    assert (core.version, core.deadline_steps) == (1, 1)
    for group in GRADIENT_GROUPS:
        np.testing.assert_allclose(core.weights()[group], adam_steps(start[group], [g[group]], config.lr), rtol=1e-6)
    assert not core.close_due(now=opened + 10.0)  # the next step opens with its first gradient
    no_deadline = AggregatorCore(SPEC, AggregatorConfig(step_deadline_ms=0.0), grads_per_step=2, max_staleness=1)
    no_deadline.submit(0, grads(no_deadline, 1), stats(0), learner="a", batch_size=16)
    assert not no_deadline.close_due(now=no_deadline.assembly.opened + 1e6)


def test_checkpoints_keep_one_adam_state_per_group_and_restore_to_the_same_next_step():
    """One optimizer steps all groups; the checkpoint still holds one plain Adam state dict per
    group (the format older checkpoints have), and a restored core steps exactly as the original."""
    core = make_core()
    for seed in range(3):
        core.submit(core.version, grads(core, seed), stats(seed))
    state = core.state()
    for i, g in enumerate(GRADIENT_GROUPS):
        plain = torch.optim.Adam([torch.nn.Parameter(torch.zeros(core.sizes[g]))], lr=CONFIG.lr)
        plain.load_state_dict(state["optim"][g])  # loads into a one-parameter Adam, as it used to
        moments = plain.state_dict()["state"][0]["exp_avg"]
        assert torch.equal(moments, core.optimizer.adam.state_dict()["state"][i]["exp_avg"])
    restored = make_core()
    restored.load_state(state)
    for c in (core, restored):
        c.submit(c.version, grads(c, 9), stats(9))
    for g in GROUPS:
        np.testing.assert_array_equal(restored.weights()[g], core.weights()[g])


def test_one_learners_clipped_step_uses_its_exact_norm():
    # One learner's step takes its norm from the push's check (no second pass). Clipped to a norm
    # at which the elements are about Adam's eps (1e-8), the step depends on the gradient's scale,
    # so it matches the unclipped step of the exactly rescaled gradient only if that norm is right.
    config = AggregatorConfig(lr=1e-2, tau=0.25, seed=0, max_grad_norm=0.0)
    g = grads(make_core(), 3)
    norm = float(np.sqrt(sum(np.sum(v.astype(np.float64) ** 2) for v in g.values())))
    target = 1e-8 * np.sqrt(sum(v.size for v in g.values()))
    clipped = make_core(config=dataclasses.replace(config, max_grad_norm=target))
    rescaled = make_core(config=config)
    for step in range(3):
        clipped.submit(step, g, stats(step))
        rescaled.submit(step, {k: (v * (target / norm)).astype(np.float32) for k, v in g.items()}, stats(step))
    assert clipped.clipped == 3 and rescaled.clipped == 0
    for group in GROUPS:
        np.testing.assert_allclose(clipped.weights()[group], rescaled.weights()[group], rtol=1e-5, atol=1e-7)
    # ... and the comparison can tell: a norm off by 2x moves the weights elsewhere.
    off = make_core(config=config)
    for step in range(3):
        off.submit(step, {k: (v * (target / norm / 2)).astype(np.float32) for k, v in g.items()}, stats(step))
    assert not np.allclose(clipped.weights()["actor"], off.weights()["actor"], rtol=1e-5, atol=1e-7)
