"""What a task-routed MoE's experts learned: read exactly from the weights."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from foundation.policy import ModelSpec
from foundation.routing_stats import expert_routing, layer_routing
from nets.models import SACModel

SPEC = ModelSpec(7, 3, 2, hidden_sizes=(16, 12), kind="moe", experts=8, top_k=2, tasks=3, router="task")
NAMES = ["a", "b", "c"]


@pytest.mark.parametrize("critic_norm", ["none", "layer"])
@pytest.mark.parametrize("task_heads", [False, True], ids=["one-head", "task-heads"])
def test_each_networks_routing_is_what_its_gates_choose_for_each_task(task_heads, critic_norm):
    # heads and the critics' LayerNorms: a longer flat layout to read past
    spec = dataclasses.replace(SPEC, task_heads=task_heads, critic_norm=critic_norm)
    torch.manual_seed(1)
    model = SACModel(spec)
    with torch.no_grad():  # spread the tasks apart, as training does
        for body in (model.actor.body, model.critic.q1, model.critic.q2):
            body.task_embed.normal_(0.0, 3.0)
    groups = {"actor": model.get_flat("actor"), "critic": model.get_flat("critic")}
    routing = expert_routing(spec, groups, NAMES)
    assert set(routing) == {"actor", "critic.q1", "critic.q2"}
    bodies = {"actor": model.actor.body, "critic.q1": model.critic.q1, "critic.q2": model.critic.q2}
    for net, body in bodies.items():
        assert set(routing[net]) == {"l0", "l1"}
        for i, layer in enumerate(body.moe_layers()):
            with torch.no_grad():
                gates = layer.route(body.task_embed).numpy()
            for t, name in enumerate(NAMES):
                row = routing[net][f"l{i}"]["tasks"][name]
                assert set(row["experts"]) == set(np.flatnonzero(gates[t]).tolist())
                np.testing.assert_allclose(row["gates"], np.sort(gates[t][gates[t] > 0])[::-1], atol=1e-4)


def test_overlap_is_one_for_tasks_routed_alike_and_zero_for_disjoint_ones_and_load_is_measured():
    gates = np.zeros((3, 8), np.float32)
    gates[0, [0, 1]] = [0.7, 0.3]
    gates[1, [0, 1]] = [0.7, 0.3]
    gates[2, [4, 5]] = [0.5, 0.5]
    row = layer_routing(gates, NAMES)
    assert row["overlap"] == {"a|b": pytest.approx(1.0), "a|c": 0.0, "b|c": 0.0}
    assert row["tasks"]["a"] == {"experts": [0, 1], "gates": [0.7, 0.3]}
    assert row["experts_used"] == 4
    load = np.array([2, 2, 0, 0, 1, 1, 0, 0], float)
    assert row["load_max_over_mean"] == pytest.approx(load.max() / load.mean(), abs=1e-4)
    assert row["load_std_over_mean"] == pytest.approx(load.std() / load.mean(), abs=1e-4)


def test_dense_and_state_routed_models_have_no_task_routing_and_a_wrong_layout_is_refused():
    dense = ModelSpec(7, 3, 2, tasks=3)
    assert expert_routing(dense, {"actor": np.zeros(dense.actor_size(), np.float32)}, NAMES) == {}
    state = ModelSpec(7, 3, 2, kind="moe", tasks=3, router="state")
    assert expert_routing(state, {"actor": np.zeros(state.actor_size(), np.float32)}, NAMES) == {}
    with pytest.raises(ValueError, match="layout reads"):
        expert_routing(SPEC, {"actor": np.zeros(SPEC.actor_size() + 1, np.float32)}, NAMES)
    with pytest.raises(ValueError, match="2 task names"):
        expert_routing(SPEC, {"actor": np.zeros(SPEC.actor_size(), np.float32)}, NAMES[:2])
