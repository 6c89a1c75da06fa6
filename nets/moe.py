"""Mixture-of-experts layers that compute only the routed experts (docs/architecture.md).

    layer = MoELinear(fan_in, fan_out, experts=32, top_k=2, gate_dim=8)
    y = layer(x, gate_in)                              # state router: rows grouped by expert
    layout = TaskLayout.of(task)                       # task router: rows sorted by task once
    hs = layer.task_forward(hs, embeds, layout.place)  # ... each task's k experts mixed into one Linear
    y = layer.masked_forward(x, gate_in)               # every expert, masked: what export traces

nets/models.py builds actors and critics from these (Body).
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import nn
from torch.nn import functional as F


def exporting() -> bool:
    """True while torch traces or exports a module (ONNX's TorchScript tracer, torch.export,
    torch.compile): MoE layers then take their static, masked form."""
    return torch.jit.is_tracing() or torch.compiler.is_compiling()


class _TakeExperts(torch.autograd.Function):
    """experts[idx] whose gradient is sparse along the expert axis: backward touches the experts
    read, not all E (a dense gather's gradient is E zero-filled experts, then a scatter: 35% of a
    32-expert update measured here). Like nn.Embedding(sparse=True), for any trailing shape."""

    @staticmethod
    def forward(ctx, experts: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(idx)
        ctx.shape = experts.shape
        # index_select, not experts[idx]: one row copy per expert where advanced indexing walks
        # every element (a [32, 128, 128] gather of 8 experts: 28 against 150 us here)
        return experts.index_select(0, idx.reshape(-1)).view(*idx.shape, *experts.shape[1:])

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        (idx,) = ctx.saved_tensors
        # Coalesced here (an expert read twice, by two tasks, summed once): later norms and
        # flattening then take the gradient as it is.
        experts, slot = torch.unique(idx.reshape(-1), return_inverse=True)
        values = grad.new_zeros(len(experts), *ctx.shape[1:]).index_add_(0, slot, grad.reshape(-1, *ctx.shape[1:]))
        return torch.sparse_coo_tensor(
            experts.unsqueeze(0), values, ctx.shape, is_coalesced=True, check_invariants=False
        ), None


def route_top_k(logits: torch.Tensor, k: int, shared: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """(logits, indices) of the k experts each row is routed to: its k largest logits, or with
    `shared`, experts 0..shared-1 whatever their logits and the k - shared largest of the rest
    (foundation/policy.py's top_k_gates routes alike). The gates are a softmax over these logits."""
    if not shared:
        return logits.topk(k, dim=-1)
    rest = logits[..., shared:].topk(k - shared, dim=-1)
    first = torch.arange(shared, device=logits.device).expand(*logits.shape[:-1], shared)
    idx = torch.cat([first, rest.indices + shared], dim=-1)
    return torch.cat([logits[..., :shared], rest.values], dim=-1), idx


def take_experts(experts: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
    """experts[idx], with a gradient sparse over the experts (_TakeExperts)."""
    return _TakeExperts.apply(experts, idx)


def stacked_linear(weight: torch.Tensor, bias: torch.Tensor, index: int) -> nn.Linear:
    """Entry `index` of stacked layers (weight [n, out, in], bias [n, out]) as a plain Linear: an
    expert of a MoELinear, a task's output layer of TaskHeads."""
    fan_out, fan_in = weight.shape[1:]
    linear = nn.Linear(fan_in, fan_out)
    with torch.no_grad():
        linear.weight.copy_(weight[index])
        linear.bias.copy_(bias[index])
    return linear


class MoELinear(nn.Module):
    """`experts` Linear layers mixed per row by a gate: softmax over its top_k logits, 0 for the
    rest. `last_gates` keeps the newest training batch's gate weights [batch, experts] (and
    `last_logits`) for load metrics and the balancing loss; the task router's form also keeps
    `last_task_logits` [tasks present, experts], one routing per task (None in the other forms).

    Three forms, equal to float rounding (tests/test_moe.py checks values and gradients):
    - `forward`: rows grouped by expert, each expert multiplies only its rows (the state router);
    - `task_forward`: one routing per task (the task router): each task's k experts are mixed
      into one weight first, sum_j g_j (x W_j + b_j) = x (sum_j g_j W_j) + sum_j g_j b_j, so a
      row costs one Linear of this width whatever `experts` and `top_k` are;
    - `masked_forward`: every expert runs and is masked (one batched einsum): static shapes and
      no data-dependent control flow, what export traces. Costs `experts` Linears per row
      (measured before the sparse forms: 8 experts 8.3x a dense update, 32 experts 35x)."""

    def __init__(self, fan_in: int, fan_out: int, experts: int, top_k: int, gate_dim: int, shared: int = 0) -> None:
        super().__init__()
        if not 0 <= shared < top_k:
            raise ValueError(f"shared experts ({shared}) must be in 0..top_k - 1 ({top_k - 1})")
        self.top_k = top_k
        self.shared = shared  # experts 0..shared-1: in every input's top_k (route_top_k)
        bound = 1.0 / fan_in**0.5  # nn.Linear's default init, per expert
        self.weight = nn.Parameter(torch.empty(experts, fan_out, fan_in).uniform_(-bound, bound))
        self.bias = nn.Parameter(torch.empty(experts, fan_out).uniform_(-bound, bound))
        self.gate = nn.Linear(gate_dim, experts)
        self._last_gates: torch.Tensor | None = None
        self._last_logits: torch.Tensor | None = None
        self.last_task_logits: torch.Tensor | None = None
        # The task router's newest routing, per task (gates [tasks, experts]) and each row's
        # task place: last_gates and last_logits spread it over the rows only when read.
        self._task_gates: torch.Tensor | None = None
        self._task_rows: torch.Tensor | None = None
        # model.gate_grad false: the task router's mix is a constant to the task losses (the
        # balancing loss still reaches the gates through last_task_logits).
        self.gate_grad = True

    @property
    def last_gates(self) -> torch.Tensor | None:
        """The newest training batch's gate weights per row [batch, experts] (None before one)."""
        if self._last_gates is None and self._task_gates is not None:
            self._last_gates = self._task_gates[self._task_rows]
        return self._last_gates

    @property
    def last_logits(self) -> torch.Tensor | None:
        if self._last_logits is None and self.last_task_logits is not None:
            self._last_logits = self.last_task_logits[self._task_rows]
        return self._last_logits

    def task_load(self) -> tuple[torch.Tensor, torch.Tensor] | None:
        """The task router's newest routing without spreading it over rows: (gates [tasks
        present, experts], rows per task [tasks present]); None for the other forms."""
        if self._task_gates is None or self._task_rows is None:
            return None
        counts = torch.bincount(self._task_rows, minlength=len(self._task_gates))
        return self._task_gates, counts

    def route(self, gate_in: torch.Tensor) -> torch.Tensor:
        """Gate weights [batch, experts]: softmax over each row's top_k logits, 0 elsewhere."""
        return self._gates(self.logits(gate_in))

    def logits(self, gate_in: torch.Tensor) -> torch.Tensor:
        """The gate's logits, in float32 under bf16 autocast too (the Switch Transformer's
        "selective precision"): routing must be the one samplers, the evaluator and export
        compute in float32. Two logits 0.001 apart are one bfloat16 value, and a bf16 router
        then picks another expert: the learner trains an expert the actors never run, and the
        task routed there is forgotten (docs/architecture.md, "Routing that settles"). A gate
        is gate_dim x experts: small beside an expert."""
        with torch.autocast(gate_in.device.type, enabled=False):
            return self.gate(gate_in.float())

    def _gates(self, logits: torch.Tensor) -> torch.Tensor:
        if self.shared:
            chosen = torch.zeros_like(logits, dtype=torch.bool).scatter(-1, self._top_k(logits)[1], True)
            return torch.softmax(logits.masked_fill(~chosen, float("-inf")), dim=-1)
        kth = logits.topk(self.top_k, dim=-1).values[..., -1:]
        return torch.softmax(logits.masked_fill(logits < kth, float("-inf")), dim=-1)

    def _top_k(self, logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(logits, experts) of each row's top_k (route_top_k with this layer's shared experts)."""
        return route_top_k(logits, self.top_k, self.shared)

    def _routed(self, gate_in: torch.Tensor) -> torch.Tensor:
        """Gates of `gate_in` (one row per batch row); kept for metrics in training."""
        logits = self.logits(gate_in)
        gates = self._gates(logits)
        if self.training:  # an exported (eval) module stores nothing
            self._keep(_last_gates=gates, _last_logits=logits, last_task_logits=None, _task_gates=None, _task_rows=None)
        return gates

    def masked_forward(self, x: torch.Tensor, gate_in: torch.Tensor) -> torch.Tensor:
        gates = self._routed(gate_in)
        experts = torch.einsum("bi,eoi->beo", x, self.weight) + self.bias
        return torch.einsum("be,beo->bo", gates, experts)

    def forward(self, x: torch.Tensor, gate_in: torch.Tensor) -> torch.Tensor:
        if exporting():
            return self.masked_forward(x, gate_in)
        gates = self._routed(gate_in)
        rows, experts = gates.nonzero(as_tuple=True)  # every (row, expert) slot routed
        order = torch.argsort(experts, stable=True)
        rows, experts = rows[order], experts[order]
        used, counts = torch.unique_consecutive(experts, return_counts=True)
        # unbind, not weight[e] per expert: each select's backward would fill a whole zero copy
        weights, biases = take_experts(self.weight, used).unbind(0), take_experts(self.bias, used).unbind(0)
        chunks = x[rows].split(counts.tolist())
        out = torch.cat([F.linear(c, w, b) for c, w, b in zip(chunks, weights, biases, strict=True)])
        out = out * gates[rows, experts].unsqueeze(-1)
        return out.new_zeros(len(x), self.weight.shape[1]).index_add(0, rows, out)  # out: bf16 under autocast

    def task_weights(self, g: torch.Tensor, idx: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Per routing (a row of `idx` [n, k] experts with gates `g` [n, k]): its experts mixed
        into one Linear, (weight [n, out, in], bias [n, out]); only those experts are read."""
        n, (fan_out, fan_in) = len(idx), self.weight.shape[1:]
        weight = take_experts(self.weight, idx).view(n, self.top_k, -1)
        bias = take_experts(self.bias, idx)
        g = g.unsqueeze(1)  # [n, 1, k] @ [n, k, ...]: one batched matmul, no permuted copies
        return torch.bmm(g, weight).view(n, fan_out, fan_in), torch.bmm(g, bias).view(n, fan_out)

    def task_forward(self, chunks: list[torch.Tensor], embeds: torch.Tensor, rows: torch.Tensor) -> list[torch.Tensor]:
        """The task router's form: chunks[i], the rows of task i (embedding `embeds[i]`), through
        that task's mixed Linear. `rows` [batch] maps the batch's rows to their task's place
        (for the metrics only)."""
        return mixed_forward(chunks, self.task_mix(embeds, rows))

    def task_mix(self, embeds: torch.Tensor, rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Each task's k experts mixed into one Linear (weight [tasks, out, in], bias [tasks,
        out]) for the tasks of `embeds`; in training, keeps this routing for the metrics."""
        logits = self.logits(embeds)
        top, idx = self._top_k(logits)  # ties at the k-th logit (measure zero): k kept
        g = torch.softmax(top, dim=-1)  # = the masked softmax over all experts, at the top k
        if self.training:  # per task; spread over the rows only if last_gates is read
            gates = torch.zeros_like(logits).scatter(-1, idx, g.detach())
            self._keep(_task_gates=gates, last_task_logits=logits, _task_rows=rows, _last_gates=None, _last_logits=None)
        return self.task_weights(g if self.gate_grad else g.detach(), idx)

    def _keep(self, **routing: torch.Tensor | None) -> None:
        """Store routing state as plain attributes: nn.Module.__setattr__ checks every tensor
        against parameters, buffers and submodules (7% of a 32-expert update, 5 per mix)."""
        self.__dict__.update(routing)


def mixed_forward(chunks: list[torch.Tensor], mix: tuple[torch.Tensor, torch.Tensor]) -> list[torch.Tensor]:
    """chunks[i], task i's rows, through task i's mixed Linear (MoELinear.task_mix's (weight, bias))."""
    weight, bias = mix
    return [torch.addmm(b, h, w.t()) for h, w, b in zip(chunks, weight.unbind(0), bias.unbind(0), strict=True)]


class TaskLayout(NamedTuple):
    """A batch's rows by task: the tasks present (sorted), each row's place among them, the
    rows in task order (stable) and how many each task has."""

    present: torch.Tensor
    place: torch.Tensor
    order: torch.Tensor
    counts: list[int]

    @staticmethod
    def of(task: torch.Tensor) -> TaskLayout:
        # One update runs 8 bodies on the same batch.task: computed once, for the newest tensor.
        global _newest_layout
        if _newest_layout is not None and _newest_layout[0] is task and _newest_layout[1] == task._version:
            return _newest_layout[2]
        present, place, counts = torch.unique(task, return_inverse=True, return_counts=True)
        layout = TaskLayout(present, place, torch.argsort(place, stable=True), counts.tolist())
        _newest_layout = (task, task._version, layout)  # the version: a tensor changed in place misses
        return layout


_newest_layout: tuple[torch.Tensor, int, TaskLayout] | None = None
