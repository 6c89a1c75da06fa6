"""What a task-routed MoE's experts learned: per network, layer and task, the experts chosen.

    routing = expert_routing(spec, {"actor": actor_flat, "critic": critic_flat}, task_names)
    routing["actor"]["l0"]["tasks"]["FetchPush-v4"]   # {"experts": [7, 21], "gates": [0.6, 0.4]}
    routing["actor"]["l0"]["overlap"]["FetchPush-v4|FetchReach-v4"]   # 0.0: no expert shared

With router "task" a task's routing is a function of the weights alone (its embedding through
each layer's gate), so this reads it exactly from a checkpoint, without states. Per layer:
- `tasks`: each task's top_k experts, largest gate first, and their gates;
- `overlap`: for each pair of tasks, sum_e min(share_a[e], share_b[e]), a task's share of an
  expert being its gate there: 1 when two tasks route alike, 0 when they share no expert;
- `load_std_over_mean`, `load_max_over_mean`: the experts' load summed over the tasks (0 and
  1 when every expert carries the same; max/mean = experts / (tasks x top_k) at best when fewer
  slots than experts, as here: 4 tasks x 2 of 32).
A state-routed MoE's routing depends on the state: its per-batch load is in summary.json
`expert_load` instead.
"""

from __future__ import annotations

import itertools
from typing import Any

import numpy as np

from foundation.policy import ModelSpec, top_k_gates


def _gates_per_layer(
    spec: ModelSpec, flat: np.ndarray, in_dim: int, out_dim: int, bodies: int, norms: bool = False
) -> list[list[np.ndarray]]:
    """Per body: each hidden layer's gates [tasks, experts] read from a group's flat vector
    (layout: per body, the task embedding, per layer expert weights, biases, gate weight, gate
    bias, then with `norms` (a critic under model.critic_norm 'layer') each hidden layer's
    LayerNorm weight and bias, then the output Linear; nets/models.py Body)."""
    start, out = 0, []

    def take(*shape: int) -> np.ndarray:
        nonlocal start
        size = int(np.prod(shape))
        start += size
        return flat[start - size : start].reshape(shape)

    dims = [in_dim, *spec.hidden_sizes]
    for _ in range(bodies):
        embed, layers = take(spec.tasks, spec.task_embed_dim), []
        for fan_in, fan_out in zip(dims[:-1], dims[1:], strict=True):
            take(spec.experts, fan_out, fan_in)
            take(spec.experts, fan_out)
            gw, gb = take(spec.experts, spec.gate_dim), take(spec.experts)
            layers.append(top_k_gates(embed @ gw.T + gb, spec.top_k, spec.shared_experts))
        for width in spec.hidden_sizes if norms else ():
            take(2, width)  # the LayerNorm's weight and bias
        take(spec.heads, out_dim, dims[-1])  # the output layer(s): one per task with task_heads
        take(spec.heads, out_dim)
        out.append(layers)
    if start != flat.size:
        raise ValueError(f"flat vector of {flat.size} values, the spec's layout reads {start}")
    return out


def layer_routing(gates: np.ndarray, names: list[str]) -> dict[str, Any]:
    """One layer's routing from its gates [tasks, experts] (rows sum to 1)."""
    tasks = {}
    for name, row in zip(names, gates, strict=True):
        chosen = [int(e) for e in np.argsort(-row) if row[e] > 0]
        tasks[name] = {"experts": chosen, "gates": [round(float(row[e]), 4) for e in chosen]}
    overlap = {
        f"{a}|{b}": round(float(np.minimum(gates[i], gates[j]).sum()), 4)
        for (i, a), (j, b) in itertools.combinations(enumerate(names), 2)
    }
    load = (gates > 0).sum(axis=0).astype(np.float64)
    mean = max(load.mean(), 1e-12)
    return {
        "tasks": tasks,
        "overlap": overlap,
        "experts_used": int((load > 0).sum()),
        "load_std_over_mean": round(float(load.std() / mean), 4),
        "load_max_over_mean": round(float(load.max() / mean), 4),
    }


def expert_routing(spec: ModelSpec, groups: dict[str, np.ndarray], names: list[str]) -> dict[str, Any]:
    """Per network ("actor", "critic.q1", "critic.q2": those whose group is given) and layer
    ("l0", ...): layer_routing. {} for a dense or state-routed spec."""
    if spec.kind != "moe" or spec.router != "task":
        return {}
    if len(names) != spec.tasks:
        raise ValueError(f"{len(names)} task names for a spec of {spec.tasks} tasks")
    nets: dict[str, list[np.ndarray]] = {}
    if "actor" in groups:
        (nets["actor"],) = _gates_per_layer(spec, groups["actor"], spec.input_dim, 2 * spec.act_dim, 1)
    if "critic" in groups:
        norms = spec.critic_norm == "layer"
        q1, q2 = _gates_per_layer(spec, groups["critic"], spec.input_dim + spec.act_dim, 1, 2, norms)
        nets["critic.q1"], nets["critic.q2"] = q1, q2
    return {net: {f"l{i}": layer_routing(g, names) for i, g in enumerate(layers)} for net, layers in nets.items()}
