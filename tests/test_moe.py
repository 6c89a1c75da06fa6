"""Mixture-of-experts networks: torch and numpy agree, shapes are static."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest
import torch

from foundation.policy import ModelSpec, NumpyActor, top_k_gates
from learner.algorithm import Batch, Objective
from learner.gradients import Hyperparams, compute_gradients
from nets.models import SACModel, norm_stats
from nets.moe import MoELinear

MOE = ModelSpec(obs_dim=5, goal_dim=3, act_dim=2, hidden_sizes=(16, 16), kind="moe", experts=4, top_k=2, tasks=3)


def _model(spec: ModelSpec = MOE) -> SACModel:
    torch.manual_seed(0)
    model = SACModel(spec)
    rng = np.random.default_rng(0)
    norm = np.concatenate([rng.normal(size=spec.input_dim), rng.uniform(0.5, 2.0, spec.input_dim)])
    model.set_flat("obs_norm", norm.astype(np.float32))
    return model


@pytest.mark.parametrize(
    ("router", "experts", "shared"),
    [("state", 4, 0), ("state", 32, 0), ("task", 32, 0), ("state", 6, 1), ("task", 32, 1)],
)
def test_the_numpy_actor_matches_the_torch_moe_actor_for_every_task(router, experts, shared):
    spec = dataclasses.replace(MOE, router=router, experts=experts, top_k=2 + shared, shared_experts=shared)
    model = _model(spec)
    flat = model.get_flat("actor")
    assert flat.shape == (spec.actor_size(),)
    actor = NumpyActor(spec, flat, model.get_flat("obs_norm"))
    x = np.random.default_rng(1).normal(size=(32, spec.input_dim)).astype(np.float32)
    for task in range(spec.tasks):
        with torch.no_grad():
            mean, log_std = model.actor(torch.from_numpy(x), torch.full((32,), task))
        np_mean, np_log_std = actor.forward(x, task)
        np.testing.assert_allclose(np_mean, mean.numpy(), rtol=1e-4, atol=1e-5)
        np.testing.assert_allclose(np_log_std, log_std.numpy(), rtol=1e-4, atol=1e-5)
    assert not np.allclose(actor.forward(x, 0)[0], actor.forward(x, 1)[0])  # the task embedding matters


def test_gates_are_a_softmax_over_exactly_the_top_k_experts():
    logits = np.random.default_rng(2).normal(size=(100, 8)).astype(np.float32)
    gates = top_k_gates(logits, 3)
    assert ((gates > 0).sum(axis=1) == 3).all()
    np.testing.assert_allclose(gates.sum(axis=1), 1.0, rtol=1e-6)
    top = np.argsort(-logits, axis=1)[:, :3]
    assert (np.take_along_axis(gates, top, axis=1) > 0).all()
    layer = MoELinear(4, 6, experts=8, top_k=3, gate_dim=5)
    layer(torch.randn(100, 4), torch.from_numpy(np.random.default_rng(3).normal(size=(100, 5)).astype(np.float32)))
    assert layer.last_gates is not None and ((layer.last_gates > 0).sum(dim=1) == 3).all()


def test_the_moe_actor_exports_with_static_shapes_and_no_data_dependent_ops():
    model = _model()
    example = (torch.randn(4, MOE.input_dim), torch.zeros(4, dtype=torch.long))
    program = torch.export.export(model.actor.eval(), example)  # fails on data-dependent control flow
    ops = {str(node.target) for node in program.graph.nodes if node.op == "call_function"}
    assert not {op for op in ops if "nonzero" in op or "masked_select" in op or "index_put" in op}, ops


def test_sac_gradients_flow_through_experts_gates_and_task_embeddings():
    model = _model()
    rng = np.random.default_rng(4)
    n = 64

    def cols(width: int) -> np.ndarray:
        return rng.normal(size=(n, width)).astype(np.float32)

    batch = Batch.from_numpy(cols(5), cols(3), np.tanh(cols(2)), -np.ones(n, np.float32), cols(5), np.zeros(n))
    result = compute_gradients(model, batch, Hyperparams(Objective(gamma=0.95, target_entropy=-2.0)))
    assert result.grads["actor"].shape == (MOE.actor_size(),)
    assert all(np.isfinite(g).all() for g in result.grads.values())
    layer = model.actor.body.moe_layers()[0]
    grads = torch.autograd.grad(model.actor(batch.obs_goal)[0].sum(), [layer.gate.weight, model.actor.body.task_embed])
    assert all(g.abs().sum() > 0 for g in grads)  # the router and the embedding learn
    assert norm_stats(batch.obs_goal.numpy()).shape == (1 + 2 * MOE.input_dim,)


def test_a_spec_from_before_the_moe_fields_is_dense_and_a_bad_one_is_refused():
    old = json.dumps({"obs_dim": 5, "goal_dim": 3, "act_dim": 2, "hidden_sizes": [16]})
    assert ModelSpec.from_json(old) == ModelSpec(5, 3, 2, (16,))
    assert ModelSpec.from_json(MOE.to_json()) == MOE
    with pytest.raises(ValueError, match="model kind 'sparse'"):
        ModelSpec(5, 3, 2, kind="sparse")
    with pytest.raises(ValueError, match="top_k \\(9\\) must be in 1..experts \\(8\\)"):
        ModelSpec(5, 3, 2, kind="moe", top_k=9)
    assert ModelSpec.from_json(MOE.to_json()).shared_experts == 0  # older specs: none
    for bad in (dict(kind="moe", top_k=2, shared_experts=2), dict(kind="dense", shared_experts=1)):
        with pytest.raises(ValueError, match="shared_experts"):
            ModelSpec(5, 3, 2, **bad)


def _batch(n: int = 64, seed: int = 4) -> Batch:
    rng = np.random.default_rng(seed)

    def cols(width: int) -> np.ndarray:
        return rng.normal(size=(n, width)).astype(np.float32)

    return Batch.from_numpy(cols(5), cols(3), np.tanh(cols(2)), -np.ones(n, np.float32), cols(5), np.zeros(n))


def test_the_balancing_loss_is_one_when_even_and_grows_as_one_pair_takes_every_input():
    from nets.balance import balance_loss, expert_load

    torch.manual_seed(0)
    layer = MoELinear(4, 6, experts=8, top_k=2, gate_dim=5)
    x, gate_in = torch.randn(4000, 4), torch.randn(4000, 5)
    with torch.no_grad():
        layer.gate.weight.zero_()
        layer.gate.bias.copy_(torch.tensor([5.0, 5.0, 0, 0, 0, 0, 0, 0]))
    layer(x, gate_in)
    p = np.exp(5.0) / (2 * np.exp(5.0) + 6)  # the two favoured experts' gate probability
    assert balance_loss([layer]).item() == pytest.approx(8 * 2 * 0.5 * p, rel=1e-4)  # experts 0, 1 take it all
    load = expert_load([layer], "moe/actor")
    assert load["moe/actor/l0/share_e0"] == 0.5 and load["moe/actor/l0/load_max_over_mean"] == pytest.approx(4.0)
    with torch.no_grad():
        layer.gate.bias.zero_()
        layer.gate.weight.normal_(0.0, 0.3)  # weak gates: each expert about as likely
    layer(x, gate_in)
    assert balance_loss([layer]).item() == pytest.approx(1.0, abs=0.1)


def _task_routed_layer(bias_rows: list[list[float]]) -> tuple[MoELinear, torch.Tensor]:
    """A task-routed layer of 8 experts (top-2) whose task t has gate logits bias_rows[t], run
    on a batch of uneven task shares; returns it and its gate bias (to differentiate)."""
    from nets.moe import TaskLayout

    layer = MoELinear(4, 6, experts=8, top_k=2, gate_dim=len(bias_rows))
    embeds = torch.eye(len(bias_rows))
    with torch.no_grad():  # gate(embeds[t]) = bias + weight[:, t]: the logits of task t
        layer.gate.bias.zero_()
        layer.gate.weight.copy_(torch.tensor(bias_rows).t())
    task = torch.tensor([0] * 70 + [t for t in range(1, len(bias_rows)) for _ in range(10)])
    layout = TaskLayout.of(task)
    chunks = list(torch.randn(len(task), 4)[layout.order].split(layout.counts))
    layer.task_forward(chunks, embeds[layout.present], layout.place)
    return layer, layer.gate.weight


def test_the_task_routers_balancing_loss_is_flat_once_tasks_hold_their_own_experts():
    """Switch's loss cannot be met by 1-2 tasks on 8 experts, and its gradient kept swapping
    their experts. Counted in tasks, a task alone, or tasks on disjoint experts, get no
    balancing gradient at all, whatever their share of the rows; tasks sharing an expert are
    pushed apart, and only the shared expert's logits are pushed down."""
    from nets.balance import balance_loss

    alone, weight = _task_routed_layer([[3.0, 2.0, 0, 0, 0, 0, 0, 0]])
    loss = balance_loss([alone])
    assert loss.item() == 1.0
    assert torch.autograd.grad(loss, weight)[0].abs().max().item() == 0.0

    apart, weight = _task_routed_layer([[3.0, 2.0, 0, 0, 0, 0, 0, 0], [0, 0, 3.0, 2.0, 0, 0, 0, 0]])
    loss = balance_loss([apart])  # 70% of the rows are task 0's: rows would call it overloaded
    assert loss.item() == 1.0
    assert torch.autograd.grad(loss, weight)[0].abs().max().item() == 0.0

    shared, weight = _task_routed_layer([[3.0, 2.0, 0, 0, 0, 0, 0, 0], [3.0, 0, 2.0, 0, 0, 0, 0, 0]])
    loss = balance_loss([shared])
    assert loss.item() > 1.0
    grad = torch.autograd.grad(loss, weight)[0]  # [experts, tasks]: d loss / d logit
    assert (grad[0] > 0).all()  # descent lowers expert 0's logit for both tasks
    assert (grad[1:] <= 0).all()


def test_the_task_routers_expert_load_counts_rows_per_task_without_per_row_tensors():
    """The task router keeps one routing per task; the load metrics weigh each task's experts
    by its rows (70/10/10 here) as the per-row gates would, and nothing per row is built for
    them (a training forward used to spread gates and logits over every row, every layer)."""
    from nets.balance import expert_load

    rows = [[3.0, 2.0, 0, 0, 0, 0, 0, 0], [0, 0, 3.0, 2.0, 0, 0, 0, 0], [3.0, 0, 0, 0, 2.0, 0, 0, 0]]
    layer, _ = _task_routed_layer(rows)
    load = expert_load([layer], "moe/actor")
    assert layer._last_gates is None and layer._last_logits is None
    per_row = ((layer.last_gates > 0).float().mean(0) / layer.top_k).tolist()  # spread over the 90 rows now
    shares = [load[f"moe/actor/l0/share_e{e}"] for e in range(8)]
    np.testing.assert_allclose(shares, per_row, rtol=1e-6)
    np.testing.assert_allclose(shares, [80 / 180, 70 / 180, 10 / 180, 10 / 180, 10 / 180, 0, 0, 0], rtol=1e-6)
    assert layer.last_logits is not None and torch.equal(layer.last_logits[0], layer.last_task_logits[0])


def test_adam_on_the_balancing_loss_keeps_a_lone_tasks_experts_where_switchs_loss_swaps_them():
    from nets.balance import balance_loss

    def chosen_after(loss_of) -> set[int]:
        torch.manual_seed(0)
        layer, weight = _task_routed_layer([[3.0, 2.0, 1.5, 1.0, 0, 0, 0, 0]])
        optim = torch.optim.Adam(layer.gate.parameters(), lr=1e-2)  # Adam: any gradient, a full step
        for _ in range(300):
            optim.zero_grad()
            loss_of(layer).backward()
            optim.step()
            layer.task_forward([torch.randn(8, 4)], torch.eye(1), torch.zeros(8, dtype=torch.long))
        return set(layer.gate(torch.eye(1)).topk(2).indices[0].tolist())

    def switch(layer: MoELinear) -> torch.Tensor:  # the form every router used before
        share = (layer.last_gates > 0).float().mean(0) / layer.top_k
        return 8 * (share * torch.softmax(layer.last_logits, dim=-1).mean(0)).sum()

    assert chosen_after(switch) != {0, 1}  # the churn this loss had
    assert chosen_after(lambda layer: balance_loss([layer])) == {0, 1}


def test_without_gate_grad_the_task_losses_leave_the_routers_alone_and_nothing_else_changes():
    spec = dataclasses.replace(MOE, router="task", experts=8)
    names = [n for n, p in _model(spec).actor.named_parameters() for _ in range(p.numel())]
    router = np.array([".gate." in n or n.endswith("task_embed") for n in names])

    def actor_grads(gate_grad: bool, balance_coef: float):
        torch.manual_seed(7)  # the same action noise every time
        model = _model(spec).train_gates(gate_grad)
        hp = Hyperparams(Objective(0.95, -2.0), balance_coef=balance_coef, router_decay=0.0)
        return compute_gradients(model, _batch(), hp)

    learned, fixed = actor_grads(True, 0.0), actor_grads(False, 0.0)
    assert np.abs(learned.grads["actor"][router]).max() > 0
    assert np.abs(fixed.grads["actor"][router]).max() == 0.0
    np.testing.assert_allclose(fixed.grads["actor"][~router], learned.grads["actor"][~router], rtol=1e-5, atol=1e-7)
    assert fixed.metrics["loss/actor"] == learned.metrics["loss/actor"]


def test_router_decay_scales_the_balancing_gradient_which_reaches_only_the_routers():
    from learner.gradients import compute_gradients

    model, batch = _model(), _batch()

    def grads_of(*args):  # the same action noise every time
        torch.manual_seed(7)
        return compute_gradients(*args)

    plain = grads_of(model, batch, Hyperparams(Objective(0.95, -2.0), balance_coef=0.0))
    decayed = grads_of(model, batch, Hyperparams(Objective(0.95, -2.0), balance_coef=1.0, router_decay=1e6))
    full = grads_of(model, batch, Hyperparams(Objective(0.95, -2.0), balance_coef=1.0, router_decay=0.0))
    assert decayed.metrics["moe/actor_beta"] == 0.0 and full.metrics["moe/actor_beta"] == 1.0
    np.testing.assert_allclose(decayed.grads["actor"], plain.grads["actor"], rtol=1e-5, atol=1e-7)
    # With beta = 1 the balancing gradient is there, on gate weights and the task embedding only.
    moved = np.abs(full.grads["actor"] - plain.grads["actor"]) > 1e-7
    names = [n for n, p in model.actor.named_parameters() for _ in range(p.numel())]
    assert moved.any()
    assert {n for n, m in zip(names, moved, strict=True) if m} <= {
        "body.task_embed",
        *(f"body.hidden.{i}.gate.{w}" for i in range(2) for w in ("weight", "bias")),
    }
    assert full.metrics["moe/actor/l0/load_std_over_mean"] >= 0.0
    assert full.metrics["moe/actor/l1/load_max_over_mean"] >= 1.0


REACH_MOE = ModelSpec(10, 3, 4, (32, 32), kind="moe", experts=4, top_k=2)


def _reach_checkpoint(favour: tuple[int, int] | None = None) -> dict:
    """A MoE AggregatorCore state with FetchReach's dims; `favour`: gates that always pick those
    two experts with equal weight (state-independent routing)."""
    from aggregator.core import AggregatorCore
    from foundation.config import AggregatorConfig

    core = AggregatorCore(REACH_MOE, AggregatorConfig(seed=1), 1, 1, "FetchReach-v4")
    state = core.state()
    if favour is not None:
        model = SACModel(REACH_MOE)
        model.set_flat("actor", state["weights"]["actor"])
        with torch.no_grad():
            for layer in model.actor.body.moe_layers():
                layer.gate.weight.zero_()
                layer.gate.bias.fill_(-3.0)
                layer.gate.bias[list(favour)] = 3.0
        state["weights"]["actor"] = model.get_flat("actor")
    return state


def test_routing_that_never_depends_on_the_state_freezes_exactly():
    from deploy_npu.freeze import reference_actor
    from deploy_npu.routing import FrozenRoutingPolicy, freeze_routing
    from foundation.checkpoint import load_policy_checkpoint

    ckpt = load_policy_checkpoint(_reach_checkpoint(favour=(2, 3)))
    states = np.random.default_rng(5).normal(size=(300, 13)).astype(np.float32)
    table = freeze_routing(reference_actor(ckpt), "FetchReach-v4", states)
    assert [set(layer.experts) for layer in table.layers] == [{2, 3}, {2, 3}]
    assert table.agreement == 1.0 and all(layer.gates == pytest.approx((0.5, 0.5)) for layer in table.layers)
    assert table.action_error_max < 1e-5
    frozen = FrozenRoutingPolicy(reference_actor(ckpt), table)
    assert len(frozen.experts) == 4  # two per layer: the unselected experts are not in the network


def test_a_task_routed_moe_routes_every_state_of_a_task_alike_and_its_frozen_table_is_exact():
    from deploy_npu.routing import freeze_routing

    spec = dataclasses.replace(MOE, router="task")
    assert spec.gate_dim == spec.task_embed_dim
    assert ModelSpec.from_json(spec.to_json()) == spec
    model = _model(spec)
    actor = NumpyActor(spec, model.get_flat("actor"), model.get_flat("obs_norm"))
    x = np.random.default_rng(1).normal(size=(64, spec.input_dim)).astype(np.float32)
    for task in range(spec.tasks):
        with torch.no_grad():
            mean, _ = model.actor(torch.from_numpy(x), torch.full((64,), task))
        np.testing.assert_allclose(actor.forward(x, task)[0], mean.numpy(), rtol=1e-4, atol=1e-5)
        gates = [layer.last_gates for layer in model.actor.body.moe_layers()]
        assert all(torch.equal(g, g[:1].expand_as(g)) for g in gates)  # one routing for the whole task
        table = freeze_routing(model.actor, f"task-{task}", x, task)
        assert table.agreement == 1.0 and table.action_error_max < 1e-5
    with pytest.raises(ValueError, match="router 'bogus'"):
        dataclasses.replace(MOE, router="bogus")


def test_fleetrl_export_freezes_a_moe_policys_routing_into_a_graph_the_audit_passes(tmp_path):
    import onnx

    from deploy_npu.pipeline import DeployCheckConfig, export_and_check

    config = DeployCheckConfig(
        task="FetchReach-v4", episodes=1, calibration_episodes=2, latency_calls=200, random_inputs=64, env_inputs=64
    )
    report = export_and_check(_reach_checkpoint(), tmp_path / "moe.onnx", config)
    assert report.audit.passed, report.summary()
    assert "TopK" not in report.audit.op_histogram and report.audit.op_histogram["Gemm"] == 2 * 2 + 1
    assert report.parity.passed and report.parity.max_abs_error <= 1e-5, report.summary()
    routing = report.routing
    assert routing is not None and routing.states == 2 * 50 and 0.0 <= routing.agreement <= 1.0
    assert np.isfinite(routing.action_error_max) and "agreement" in report.summary()
    props = {p.key: p.value for p in onnx.load(tmp_path / "moe.onnx").metadata_props}
    assert json.loads(props["fleetrl.routing"])["layers"][0]["experts"] == list(routing.layers[0].experts)


# Sparse expert compute. The masked form (every expert, masked) is the
# reference: the sparse forms must give the same values and the same gradients.


def _masked(body, x: torch.Tensor, state: torch.Tensor, task: torch.Tensor) -> torch.Tensor:
    gate_in = body.gate_input(state, task)
    for layer in body.hidden:
        x = torch.relu(layer.masked_forward(x, gate_in))
    return body.out(x)


@pytest.mark.parametrize("shared", [0, 1])
@pytest.mark.parametrize("router", ["state", "task"])
@pytest.mark.parametrize("counts", [(20, 20, 20), (5, 0, 40), (1, 1, 1)])
def test_sparse_experts_match_the_masked_form_in_values_and_gradients(router, counts, shared):
    spec = dataclasses.replace(MOE, router=router, experts=6, top_k=2, shared_experts=shared)
    model = _model(spec)
    body = model.critic.q1
    rng = np.random.default_rng(7)
    task = torch.from_numpy(rng.permutation(np.repeat(np.arange(3), counts)))
    x = torch.from_numpy(rng.normal(size=(len(task), spec.input_dim + spec.act_dim)).astype(np.float32))
    state = x[:, : spec.input_dim]
    params = [p for p in body.parameters() if p.requires_grad]
    outputs = []
    for forward in (body, lambda *a: _masked(body, *a)):
        out = forward(x, state, task)
        grads = torch.autograd.grad(
            (out * torch.linspace(-1, 1, len(out)).unsqueeze(-1)).sum(), params, allow_unused=True
        )
        dense = [
            torch.zeros_like(p) if g is None else (g.to_dense() if g.is_sparse else g)
            for g, p in zip(grads, params, strict=True)
        ]
        outputs.append((out.detach(), dense))
    (sparse_out, sparse_grads), (masked_out, masked_grads) = outputs
    torch.testing.assert_close(sparse_out, masked_out, atol=1e-5, rtol=1e-5)
    for (name, _), g, ref in zip(body.named_parameters(), sparse_grads, masked_grads, strict=True):
        torch.testing.assert_close(g, ref, atol=1e-5, rtol=1e-5, msg=name)
    assert sum(float(g.abs().sum()) for g in sparse_grads) > 0


def test_a_task_routed_expert_gradient_touches_only_the_experts_its_tasks_chose():
    spec = dataclasses.replace(MOE, router="task", experts=16, top_k=2)
    body = _model(spec).actor.body
    layer = body.moe_layers()[0]
    x = torch.randn(12, spec.input_dim)
    task = torch.tensor([0, 2] * 6)
    (grad,) = torch.autograd.grad(body(x, x, task).sum(), [layer.weight])
    assert grad.is_sparse
    chosen = set(layer.route(body.task_embed[[0, 2]]).nonzero()[:, 1].tolist())
    assert set(grad.coalesce().indices()[0].tolist()) == chosen and len(chosen) <= 4


def test_a_task_tensor_changed_in_place_is_laid_out_anew():
    spec = dataclasses.replace(MOE, router="task")
    body = _model(spec).actor.body
    x = torch.randn(6, spec.input_dim)
    task = torch.tensor([0, 0, 0, 1, 1, 1])
    first = body(x, x, task).detach().clone()
    task[:] = torch.tensor([2, 2, 2, 2, 1, 1])
    torch.testing.assert_close(body(x, x, task), _masked(body, x, x, task))
    assert not torch.allclose(first, body(x, x, task))


@pytest.mark.parametrize("router", ["task", "state"])
def test_under_bf16_autocast_the_learner_routes_as_the_float32_actors_do(router):
    """Learners train under bf16 autocast (learner.autocast); samplers, the evaluator and export
    run float32. Two gate logits 0.0009 apart are one bfloat16 value (8 significant bits), so a
    bf16 router may pick the other expert: the learner would then train an expert the actors
    never run (FetchReach is then forgotten in a 4-task run). The gates compute in float32."""
    torch.manual_seed(0)
    layer = MoELinear(6, 5, experts=4, top_k=2, gate_dim=3)
    with torch.no_grad():
        layer.gate.weight.zero_()
        layer.gate.bias.copy_(torch.tensor([2.0, 0.5, 0.5009, -1.0]))  # float32's top 2: experts 0 and 2
    layer.train()
    x, gate_in = torch.randn(8, 6), torch.randn(8, 3)
    routed = []
    for bf16 in (False, True):
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            if router == "task":
                layer.task_forward([x], gate_in[:1], torch.zeros(8, dtype=torch.long))
                logits = layer.last_task_logits
            else:
                layer(x, gate_in)
                logits = layer.last_logits
        assert logits.dtype == torch.float32
        routed.append((layer.last_gates > 0).nonzero()[:, 1].view(-1, 2).sort(dim=1).values)
    assert (routed[0] == torch.tensor([0, 2])).all()
    assert torch.equal(routed[1], routed[0])


# Shared experts (model.shared_experts): the first S experts of a layer are among every input's
# top_k whatever the gate says, so every task of a task-routed MoE trains them.


def test_shared_experts_are_in_every_inputs_top_k_in_torch_and_numpy_alike():
    from nets.moe import route_top_k

    logits = np.random.default_rng(9).normal(size=(200, 8)).astype(np.float32)
    logits[:100, 0] = -10.0  # the shared expert's logit the smallest: chosen all the same
    gates = top_k_gates(logits, 3, shared=1)
    assert (gates[:, 0] > 0).all() and ((gates > 0).sum(axis=1) == 3).all()
    np.testing.assert_allclose(gates.sum(axis=1), 1.0, rtol=1e-6)
    top_rest = np.argsort(-logits[:, 1:], axis=1)[:, :2] + 1  # the routed two: the largest of the rest
    assert (np.take_along_axis(gates, top_rest, axis=1) > 0).all()
    values, idx = route_top_k(torch.from_numpy(logits), 3, shared=1)
    assert (idx[:, 0] == 0).all() and torch.equal(values, torch.from_numpy(logits).gather(-1, idx))
    layer = MoELinear(4, 6, experts=8, top_k=3, gate_dim=5, shared=1)
    np.testing.assert_allclose(layer._gates(torch.from_numpy(logits)).numpy(), gates, rtol=1e-6, atol=1e-7)
    assert torch.equal(route_top_k(torch.from_numpy(logits), 3)[1], torch.from_numpy(logits).topk(3).indices)
    with pytest.raises(ValueError, match="shared experts \\(2\\)"):
        MoELinear(4, 6, experts=8, top_k=2, gate_dim=5, shared=2)


def test_every_task_trains_the_shared_expert_and_only_its_own_routed_ones():
    spec = dataclasses.replace(MOE, router="task", experts=16, top_k=2, shared_experts=1)
    body = _model(spec).actor.body
    layer = body.moe_layers()[0]
    x = torch.randn(12, spec.input_dim)
    own = {}
    for t in range(spec.tasks):
        (grad,) = torch.autograd.grad(body(x, x, torch.full((12,), t)).sum(), [layer.weight])
        own[t] = set(grad.coalesce().indices()[0].tolist())
        assert 0 in own[t] and len(own[t]) == 2  # the shared expert and one routed
    routed = [own[t] - {0} for t in range(spec.tasks)]
    assert all(r and 0 not in r for r in routed)


def test_the_balancing_loss_leaves_shared_experts_out():
    """Every task holds the shared expert: counted, it would be overloaded and its logits pushed
    down for ever (it cannot be left). Tasks whose routed experts are disjoint get no balancing
    gradient, as without shared experts."""
    from nets.balance import balance_loss
    from nets.moe import TaskLayout

    layer = MoELinear(4, 6, experts=8, top_k=2, gate_dim=2, shared=1)
    with torch.no_grad():  # task t's logits: row t; both favour expert 0 (shared), then 1 and 2
        layer.gate.bias.zero_()
        layer.gate.weight.copy_(torch.tensor([[5.0, 3.0, 0, 0, 0, 0, 0, 0], [5.0, 0, 3.0, 0, 0, 0, 0, 0]]).t())
    task = torch.tensor([0] * 30 + [1] * 10)
    layout = TaskLayout.of(task)
    layer.task_forward(list(torch.randn(40, 4)[layout.order].split(layout.counts)), torch.eye(2), layout.place)
    assert (layer._task_gates[:, 0] > 0).all()
    loss = balance_loss([layer])
    assert loss.item() == 1.0
    assert torch.autograd.grad(loss, layer.gate.weight)[0].abs().max().item() == 0.0


def test_a_task_routed_moe_with_a_shared_expert_freezes_exactly_and_its_stats_name_it():
    from deploy_npu.routing import freeze_routing
    from foundation.routing_stats import expert_routing

    spec = dataclasses.replace(MOE, router="task", experts=8, top_k=2, shared_experts=1)
    assert ModelSpec.from_json(spec.to_json()) == spec
    model = _model(spec)
    x = np.random.default_rng(1).normal(size=(64, spec.input_dim)).astype(np.float32)
    routing = expert_routing(spec, {"actor": model.get_flat("actor")}, ["a", "b", "c"])
    for task, name in enumerate("abc"):
        table = freeze_routing(model.actor, name, x, task)
        assert table.agreement == 1.0 and table.action_error_max < 1e-5
        assert 0 in table.layers[0].experts
        assert set(routing["actor"]["l0"]["tasks"][name]["experts"]) == set(table.layers[0].experts)
    assert all(v > 0 for v in routing["actor"]["l0"]["overlap"].values())  # every pair shares expert 0
