"""One ONNX graph for every task of a multi-task run, its routing table a constant indexed by task.

    report = export_multitask(ckpt, "out/multitask.onnx", DeployCheckConfig(episodes=5))

The graph's input is the run's padded input (sim/tasks.py): [the task's observation | zeros |
task one-hot | desired_goal]. The one-hot is the task-id input: every MoE layer takes its gates
from a constant table [tasks, experts] by one MatMul (one-hot @ table). No Gather, TopK or
branch: the graph computes the union of the experts any task selected and mixes them with
that row's gates (zero for the experts the task did not select). A dense policy's graph is its
network on the padded input.

The per-task graphs (`fleetrl export --task T`) are smaller and take the task's own input;
this one serves a controller that switches tasks without loading another model.
"""

from __future__ import annotations

import copy
import functools
import json
import operator
import os
from typing import cast

import numpy as np
import torch
from torch import nn

from deploy_npu.audit import OpAuditError, audit_onnx
from deploy_npu.export import ExportReport, trace_to_onnx, write_model
from deploy_npu.freeze import DeterministicPolicy, TaskInput, reference_actor
from deploy_npu.layers import expert_linear, mean_head
from deploy_npu.parity import ClosedLoopReport, OnnxPolicy, check_parity, drive, measure_latency, random_inputs
from deploy_npu.routing import RoutingTable, calibration_states, freeze_routing
from foundation.checkpoint import PolicyCheckpoint
from foundation.config import RandomizationConfig
from nets.models import SquashedGaussianActor, TaskHeads
from sim.tasks import TaskSet


class MultiTaskPolicy(nn.Module):
    """padded obs_goal [B, input_dim] -> tanh(mean) [B, act_dim], each row routed by its task one-hot."""

    def __init__(self, actor: SquashedGaussianActor, tasks: TaskSet, tables: list[RoutingTable] | None) -> None:
        super().__init__()
        self.norm = copy.deepcopy(actor.norm)
        self.one_hot = (tasks.obs_dim - len(tasks), tasks.obs_dim)  # its columns in the padded input
        self.dense = DeterministicPolicy(actor, tasks.act_dim) if tables is None else None
        self.layers = nn.ModuleList()  # per MoE layer: the experts any task selected
        self.tables: list[torch.Tensor] = []  # per MoE layer: gates [tasks, len(experts)]
        if tables is None:
            return
        for depth, layer in enumerate(actor.body.moe_layers()):
            used = sorted({e for table in tables for e in table.layers[depth].experts})
            gates = torch.zeros(len(tables), len(used))
            for t, table in enumerate(tables):
                route = table.layers[depth]
                for expert, gate in zip(route.experts, route.gates, strict=True):
                    gates[t, used.index(expert)] = gate
            self.layers.append(nn.ModuleList(expert_linear(layer, e) for e in used))
            self.tables.append(gates)
        # One output layer, or one per task (model.task_heads): each row's by its one-hot, as the routing.
        heads = len(tasks) if isinstance(actor.body.out, TaskHeads) else 1
        self.heads = nn.ModuleList(mean_head(actor.body.head(t)) for t in range(heads))

    def forward(self, obs_goal: torch.Tensor) -> torch.Tensor:
        if self.dense is not None:
            return self.dense(obs_goal)
        task = obs_goal[:, self.one_hot[0] : self.one_hot[1]]
        x = self.norm(obs_goal)
        for experts, table in zip(self.layers, self.tables, strict=True):
            gates = task @ table  # [B, experts]: the task's row of the routing table
            terms = [gates[:, j : j + 1] * expert(x) for j, expert in enumerate(cast(nn.ModuleList, experts))]
            x = torch.relu(functools.reduce(operator.add, terms))  # Adds: ReduceSum is not an NPU op
        if len(self.heads) == 1:
            return torch.tanh(self.heads[0](x))
        outs = [task[:, t : t + 1] * head(x) for t, head in enumerate(self.heads)]
        return torch.tanh(functools.reduce(operator.add, outs))


def _padded(policy: OnnxPolicy, task_input: TaskInput):
    """The multi-task graph as one task's controller: its own input, padded."""

    def act(x: np.ndarray) -> np.ndarray:
        return policy(task_input.pad(x[None]))[0]

    return act


def _frozen_tables(ckpt: PolicyCheckpoint, actor, tasks: TaskSet, config) -> list | None:
    """A MoE's routing frozen per task on fresh rollouts of that task (None for a dense policy)."""
    if ckpt.spec.kind != "moe":
        return None
    tables = []
    for index, task in enumerate(tasks.tasks):
        states = calibration_states(
            ckpt.spec, ckpt.actor, ckpt.obs_norm, task, config.calibration_episodes, config.seed, tasks
        )
        tables.append(freeze_routing(actor, task.name, states, task_index=index))
    return tables


def _closed_loop(policy: OnnxPolicy, tasks: TaskSet, config) -> ClosedLoopReport:
    """Successes of the graph, fed each task's padded input, over config.episodes nominal episodes per task."""
    successes = 0
    for index, task in enumerate(tasks.tasks):
        won, _ = drive(
            _padded(policy, TaskInput(tasks, index)), task, 0.0, RandomizationConfig(enabled=False),
            episodes=config.episodes, delay_ticks=0, seed=config.seed,
        )  # fmt: skip
        successes += won
    return ClosedLoopReport(tasks.label, config.episodes * len(tasks), successes)


def export_multitask(ckpt: PolicyCheckpoint, out_path: str | os.PathLike, config):
    """Export the multi-task graph and run every deploy check on it (per task where it acts):
    audit, parity against the dynamic policy's torch module on each task's states, latency,
    and closed-loop success in each task."""
    from deploy_npu.pipeline import DeployReport

    tasks = TaskSet.parse(ckpt.task or "")
    actor = reference_actor(ckpt)
    tables = _frozen_tables(ckpt, actor, tasks, config)
    module = MultiTaskPolicy(actor, tasks, tables).eval().requires_grad_(False)
    model = trace_to_onnx(module, ckpt.spec.input_dim, config.opset, config.batch_size)
    props = {"fleetrl.tasks": tasks.label, "fleetrl.input_layout": "padded: observation | zeros | task one-hot | goal"}
    if tables:  # every task's routing table, by task (a per-task graph carries its one table)
        props["fleetrl.routing"] = json.dumps({t.task: json.loads(t.to_json()) for t in tables}, sort_keys=True)
    path = write_model(model, ckpt, out_path, None, props)
    exported = ExportReport(path, ckpt.version, ckpt.spec, config.opset, config.batch_size)
    try:
        audit = audit_onnx(exported.onnx_path, require_static_shapes=config.batch_size is not None)
    except OpAuditError as exc:
        audit = exc.report
    policy = OnnxPolicy(exported.onnx_path)
    rows = []  # each task's own inputs, padded as its controller would feed them
    for index in range(len(tasks)):
        task_input = TaskInput(tasks, index)
        rows.append(
            task_input.pad(random_inputs(ckpt, config.random_inputs, config.seed + index, task_input.columns(), index))
        )
    parity = check_parity(policy, module, np.concatenate(rows), tolerance=config.tolerance)
    latency = measure_latency(policy, num_calls=config.latency_calls, budget_ms=config.budget_ms)
    loop = _closed_loop(policy, tasks, config)
    layout = f"padded: observation (zero-padded to {tasks.obs_dim - len(tasks)}) ++ task one-hot ({len(tasks)}) ++ goal"
    report = DeployReport(exported, audit, parity, latency, loop, None, layout, task_routing=tuple(tables or ()))
    report.write_manifest(ckpt, list(tasks.names))
    return report
