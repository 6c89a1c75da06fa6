"""Layered trajectory-aware weight averaging of the actor (aggregator/swa.py) and its plumbing."""

from __future__ import annotations

import numpy as np
import pytest

from aggregator.swa import LayeredSWA, actor_parts
from foundation.policy import ModelSpec

MOE = ModelSpec(3, 2, 2, (4, 4), kind="moe", experts=3, top_k=2, tasks=2, task_embed_dim=2)
DENSE = ModelSpec(3, 2, 2, (4,))


def _const(spec: ModelSpec, value: float) -> np.ndarray:
    return np.full(spec.actor_size(), value, np.float32)


def test_the_parts_cover_routers_and_every_expert_once():
    router, experts = actor_parts(MOE)
    flat = np.concatenate([router, *[idx for layer in experts for idx in layer]])
    assert len(flat) == len(set(flat.tolist()))  # disjoint
    shared = MOE.actor_size() - len(flat)
    assert shared == 4 * 2 * 2 + 2 * 2  # only the output layer is shared
    assert len(experts) == 2 and all(len(layer) == 3 for layer in experts)
    assert len(router) == 2 * 2 + 2 * (3 * (5 + 2) + 3)  # task embedding + each layer's gate


def test_a_version_scored_below_the_average_is_not_admitted():
    swa = LayeredSWA(DENSE)
    assert swa.average() is None
    assert swa.offer(1, _const(DENSE, 1.0), score=0.5)
    swa.scored(0.5)
    assert not swa.offer(2, _const(DENSE, 9.0), score=0.4)  # worse than the average: left out
    assert swa.offer(3, _const(DENSE, 3.0), score=0.5)  # as good: in
    np.testing.assert_allclose(swa.average(), 2.0)
    assert swa.versions == [1, 3] and (swa.offered, swa.admitted) == (3, 2)
    plain = LayeredSWA(DENSE, mode="plain")
    for version, (value, score) in enumerate([(1.0, 0.5), (9.0, 0.0), (3.0, 0.5)]):
        plain.scored(0.5)
        assert plain.offer(version, _const(DENSE, value), score)  # plain SWA takes every version
    np.testing.assert_allclose(plain.average(), 13.0 / 3, rtol=1e-6)


def test_routers_follow_the_short_window_and_experts_their_activation():
    swa = LayeredSWA(MOE, router_window=2, expert_window=4)
    router, experts = actor_parts(MOE)
    # version i has every weight = i; expert 0 of layer 0 is active only in versions 1 and 2
    shares = {i: [np.array([1.0 if i in (1, 2) else 0.0, 0.5, 0.5]), np.array([0.3, 0.3, 0.4])] for i in range(1, 6)}
    for i in range(1, 6):
        swa.offer(i, _const(MOE, float(i)), score=1.0, shares=shares[i])
    average = swa.average()
    assert swa.versions == [2, 3, 4, 5]  # the long window keeps 4
    np.testing.assert_allclose(average[router], (4 + 5) / 2)  # routers: the newest 2
    np.testing.assert_allclose(average[experts[0][0]], 2.0)  # only version 2 of the window used it
    np.testing.assert_allclose(average[experts[0][1]], 3.5)  # evenly active: the window's mean
    shared = np.setdiff1d(np.arange(MOE.actor_size()), np.concatenate([router, *experts[0], *experts[1]]))
    np.testing.assert_allclose(average[shared], 3.5)


def test_bad_arguments_are_refused():
    with pytest.raises(ValueError, match="'plain' or 'layered'"):
        LayeredSWA(DENSE, mode="off")
    with pytest.raises(ValueError, match="router_window"):
        LayeredSWA(DENSE, router_window=5, expert_window=3)
    with pytest.raises(ValueError, match="actor flat vector shape"):
        LayeredSWA(DENSE).offer(1, np.zeros(3, np.float32), 1.0)


def test_export_takes_the_average_only_when_it_scored_above_the_live_policy():
    from aggregator.core import AggregatorCore
    from foundation.checkpoint import CheckpointError, load_policy_checkpoint
    from foundation.config import AggregatorConfig

    spec = ModelSpec(10, 3, 4, (16,))
    state = AggregatorCore(spec, AggregatorConfig(), 1, 1, "FetchReach-v4").state()
    live = state["weights"]["actor"]
    with pytest.raises(CheckpointError, match="holds no swa weight average"):
        load_policy_checkpoint(state, "swa")
    assert load_policy_checkpoint(state).weights == "live"
    average = live + 1.0
    state["swa"] = {"actor": average, "score": 0.8, "live_score": 0.5}
    best = load_policy_checkpoint(state)
    assert best.weights == "swa" and np.array_equal(best.actor, average)
    assert load_policy_checkpoint(state, "live").weights == "live"
    state["swa"]["score"] = 0.4
    assert load_policy_checkpoint(state).weights == "live"
    assert np.array_equal(load_policy_checkpoint(state, "swa").actor, average)
