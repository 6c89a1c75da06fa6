"""NumpyActor (samplers, evaluator) computes the same policy as the torch actor the learners train."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from foundation.policy import LOG_STD_MAX, LOG_STD_MIN, NORM_CLIP, ModelSpec, NumpyActor
from nets.models import SACModel, build_actor

SPECS = [
    ModelSpec(obs_dim=10, goal_dim=3, act_dim=4, hidden_sizes=(32, 16)),
    ModelSpec(obs_dim=25, goal_dim=3, act_dim=4, hidden_sizes=(64,)),
    ModelSpec(obs_dim=2, goal_dim=1, act_dim=1, hidden_sizes=(8, 8, 8)),
]


def _model_and_actor(spec: ModelSpec, seed: int) -> tuple[SACModel, NumpyActor, np.ndarray]:
    torch.manual_seed(seed)
    rng = np.random.default_rng(seed)
    model = SACModel(spec)
    # Larger-than-init weights so the outputs span the tanh and log_std clip ranges.
    model.set_flat("actor", (model.get_flat("actor") * 3.0).astype(np.float32))
    mean = rng.normal(0.0, 2.0, spec.input_dim)
    std = rng.uniform(0.05, 3.0, spec.input_dim)
    obs_norm = np.concatenate([mean, std]).astype(np.float32)
    model.set_flat("obs_norm", obs_norm)
    actor = NumpyActor(spec, model.get_flat("actor"), model.get_flat("obs_norm"))
    inputs = (mean + std * rng.normal(0.0, 3.0, (64, spec.input_dim))).astype(np.float32)
    return model, actor, inputs


@pytest.mark.parametrize("spec", SPECS, ids=lambda s: f"{s.input_dim}-{s.hidden_sizes}-{s.act_dim}")
@pytest.mark.parametrize("seed", [0, 1])
def test_numpy_actor_matches_torch_actor(spec, seed):
    model, actor, inputs = _model_and_actor(spec, seed)
    x = torch.from_numpy(inputs)
    with torch.no_grad():
        mean_t, log_std_t = model.actor(x)
        action_t = model.actor.deterministic(x)
    mean, log_std = actor.forward(inputs)
    np.testing.assert_allclose(mean, mean_t.numpy(), atol=1e-5, rtol=1e-5)
    np.testing.assert_allclose(log_std, log_std_t.numpy(), atol=1e-5, rtol=1e-5)
    np.testing.assert_allclose(actor.deterministic(inputs), action_t.numpy(), atol=1e-5)
    # The checks above exercise the normalizer clip and the log_std clamp, not just the middle.
    normalized = (inputs - actor.mean) / actor.std
    assert np.abs(normalized).max() > NORM_CLIP
    assert log_std.min() == pytest.approx(LOG_STD_MIN) or log_std.max() == pytest.approx(LOG_STD_MAX)


def test_numpy_actor_matches_build_actor_and_samples_in_range():
    spec = SPECS[0]
    model, actor, inputs = _model_and_actor(spec, 3)
    rebuilt = build_actor(spec, model.get_flat("actor"), model.get_flat("obs_norm"))
    with torch.no_grad():
        np.testing.assert_allclose(
            actor.deterministic(inputs), rebuilt.deterministic(torch.from_numpy(inputs)), atol=1e-5
        )
    a = actor.sample(inputs, np.random.default_rng(0))
    b = actor.sample(inputs, np.random.default_rng(0))
    c = actor.sample(inputs, np.random.default_rng(1))
    assert a.shape == (len(inputs), spec.act_dim) and a.dtype == np.float32
    assert np.all(np.abs(a) <= 1.0)
    np.testing.assert_array_equal(a, b)
    assert not np.allclose(a, c)


def test_sample_spread_follows_log_std():
    spec = ModelSpec(obs_dim=1, goal_dim=1, act_dim=1, hidden_sizes=(4,))
    flat = np.zeros(spec.actor_size(), np.float32)
    flat[-1] = -3.0  # last output bias: log_std = -3 -> std 0.05; mean bias 0
    actor = NumpyActor(spec, flat, np.array([0, 0, 1, 1], np.float32))
    draws = actor.sample(np.zeros((20_000, 2), np.float32), np.random.default_rng(0))[:, 0]
    assert np.arctanh(draws).std() == pytest.approx(np.exp(-3.0), rel=0.05)
    assert np.arctanh(draws).mean() == pytest.approx(0.0, abs=0.01)


@pytest.mark.parametrize("spec", SPECS, ids=lambda s: str(s.hidden_sizes))
def test_actor_size_equals_torch_parameter_count(spec):
    model = SACModel(spec)
    assert spec.actor_size() == sum(p.numel() for p in model.actor.parameters())
    assert spec.actor_size() == model.group_sizes()["actor"]
    assert model.group_sizes()["obs_norm"] == 2 * spec.input_dim


@pytest.mark.parametrize(
    "actor_delta,norm_delta,message",
    [
        (-1, 0, "actor flat vector shape"),
        (1, 0, "actor flat vector shape"),
        (0, -1, "obs_norm flat vector shape"),
        (0, 1, "obs_norm flat vector shape"),
    ],
)
def test_wrong_flat_sizes_raise_value_error(actor_delta, norm_delta, message):
    spec = SPECS[0]
    actor_flat = np.zeros(spec.actor_size() + actor_delta, np.float32)
    obs_norm = np.ones(2 * spec.input_dim + norm_delta, np.float32)
    with pytest.raises(ValueError, match=message):
        NumpyActor(spec, actor_flat, obs_norm)


def test_two_dimensional_actor_flat_is_rejected():
    spec = SPECS[0]
    with pytest.raises(ValueError, match="actor flat vector shape"):
        NumpyActor(spec, np.zeros((1, spec.actor_size()), np.float32), np.ones(2 * spec.input_dim, np.float32))


@pytest.mark.parametrize("spec", SPECS, ids=lambda s: str(s.hidden_sizes))
def test_model_spec_json_roundtrip(spec):
    back = ModelSpec.from_json(spec.to_json())
    assert back == spec
    assert isinstance(back.hidden_sizes, tuple)
    assert back.actor_size() == spec.actor_size()


def test_a_tqc_run_widens_only_its_critics_and_an_older_spec_reads_as_one_output_per_critic():
    import json

    from foundation.config import RunConfig, with_overrides
    from foundation.policy import model_spec
    from sim.registry import get_task

    task = get_task("FetchReach-v4")
    sac = model_spec(RunConfig(), task)
    tqc = model_spec(with_overrides(RunConfig(), ['learner.algo="tqc"', "learner.tqc.quantiles=7"]), task)
    assert (sac.critic_quantiles, tqc.critic_quantiles) == (1, 7)
    assert tqc.actor_size() == sac.actor_size()  # samplers, evaluator and export see the same actor
    older = json.loads(sac.to_json())
    del older["critic_quantiles"]
    assert ModelSpec.from_json(json.dumps(older)) == sac
