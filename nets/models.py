"""Goal-conditioned SAC networks and their flat, versionable parameter groups.

Weights travel between roles as one flat float32 vector per group, in a fixed order:

    group          module                      who needs it
    actor          SquashedGaussianActor        samplers, evaluator, learners, export
    critic         TwinCritic                   learners
    critic_target  TwinCritic (Polyak copy)     learners
    log_alpha      temperature (log), per task     learners
                   with ModelSpec.task_alpha
    obs_norm       input mean and std           everyone that runs a network

Inputs (observation ++ goal) are standardized with running statistics before every network:
Fetch mixes positions of about 1 m with dt-scaled velocities of about 1e-3, and without this
SAC+HER needed over 10x more updates on FetchReach here (measured: 25% success after 4k
updates unnormalized, 100% after 475 normalized). The statistics are versioned with the
weights, so actors, critics and the exported ONNX all see the same transform.

`ModelSpec` (foundation/policy.py) is the whole recipe to rebuild the modules on any host.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import numpy as np
import torch
from torch import nn

from foundation.policy import (  # noqa: F401 - re-exported for the learner side
    ACTOR_GROUPS,
    GRADIENT_GROUPS,
    GROUPS,
    LOG_STD_MAX,
    LOG_STD_MIN,
    ModelSpec,
)
from nets.moe import MoELinear, TaskLayout, exporting, mixed_forward, stacked_linear
from nets.normalizer import Normalizer, norm_from_stats, norm_stats  # noqa: F401 - re-exported: the public model
from nets.renorm import renorm_mlp, set_renorm
from nets.twin import twin_forward


def mlp(in_dim: int, hidden: tuple[int, ...], out_dim: int, layer_norm: bool = False) -> nn.Sequential:
    """Linear, ReLU per hidden width, then the output Linear; with `layer_norm`, a LayerNorm
    between every hidden Linear and its ReLU (model.critic_norm 'layer')."""
    layers: list[nn.Module] = []
    for width in hidden:
        layers += [nn.Linear(in_dim, width), *([nn.LayerNorm(width)] if layer_norm else []), nn.ReLU()]
        in_dim = width
    layers.append(nn.Linear(in_dim, out_dim))
    return nn.Sequential(*layers)


class Body(nn.Module):
    """The hidden layers and the output layer of an actor or critic, dense or MoE (spec.kind).
    A MoE body gates every hidden layer on the normalized input ++ the task's embedding (or, with
    router "task", on the embedding alone). A critic's body (`critic`) takes the critics'
    normalization of `spec`: CrossQ's batch renorm (critic_renorm, dense only), or a LayerNorm
    after every hidden Linear, before its ReLU (critic_norm 'layer', as RLPD's critics: the last
    hidden features, and so Q, stay bounded however far an input lies from the data)."""

    def __init__(self, spec: ModelSpec, in_dim: int, out_dim: int, critic: bool = False) -> None:
        super().__init__()
        self.moe = spec.kind == "moe"
        self.task_routed = spec.router == "task"
        layer_norm = critic and spec.critic_norm == "layer"
        if not self.moe:
            if critic and spec.critic_renorm:
                self.net = renorm_mlp(in_dim, spec.hidden_sizes, out_dim)
            else:
                self.net = mlp(in_dim, spec.hidden_sizes, out_dim, layer_norm)
            return
        self.task_embed = nn.Parameter(torch.randn(spec.tasks, spec.task_embed_dim) * 0.1)
        dims = [in_dim, *spec.hidden_sizes]
        self.hidden = nn.ModuleList(
            MoELinear(i, o, spec.experts, spec.top_k, spec.gate_dim, spec.shared_experts)
            for i, o in zip(dims[:-1], dims[1:], strict=True)
        )
        self.norms = nn.ModuleList(nn.LayerNorm(o) for o in dims[1:]) if layer_norm else None
        self.out: nn.Linear | TaskHeads = (
            TaskHeads(spec.heads, dims[-1], out_dim) if spec.heads > 1 else nn.Linear(dims[-1], out_dim)
        )

    def forward(self, x: torch.Tensor, state: torch.Tensor, task: torch.Tensor | None = None) -> torch.Tensor:
        """`x` the layer input, `state` the normalized obs ++ goal the gates see, `task` [batch]
        task ids (None: task 0). Float32 out, under bf16 autocast too: what follows (the tanh
        squash's log-probability, the TD target) needs float32's range and precision."""
        return self._forward(x, state, task).float()

    def _forward(self, x: torch.Tensor, state: torch.Tensor, task: torch.Tensor | None) -> torch.Tensor:
        if not self.moe:
            return self.net(x)
        if self.task_routed and not exporting():
            return self._task_routed(x, task)
        gate_in = self.gate_input(state, task)
        for depth, layer in enumerate(self.hidden):
            x = torch.relu(self.hidden_norm(depth, layer(x, gate_in)))
        if isinstance(self.out, TaskHeads):
            return self.out(x, task if task is not None else torch.zeros(len(x), dtype=torch.long))
        return self.out(x)

    def _task_routed(self, x: torch.Tensor, task: torch.Tensor | None) -> torch.Tensor:
        """The batch's rows sorted by task once for all layers; each layer mixes every task's k
        experts into one Linear and runs each task's rows through its own, unpadded: a batch
        drawn by success shares (0.45 of its rows one task's, 0.1 another's) costs what an
        even one does (padding every task to the largest cost 1.1-1.2x a 1024-row update here)."""
        layout = TaskLayout.of(task if task is not None else torch.zeros(len(x), dtype=torch.long))
        chunks = list(x[layout.order].split(layout.counts))
        for depth, mix in enumerate(self.task_mixes(layout)):
            chunks = [torch.relu(self.hidden_norm(depth, h)) for h in mixed_forward(chunks, mix)]
        if isinstance(self.out, TaskHeads):
            out = torch.cat([self.out.head_forward(h, int(t)) for h, t in zip(chunks, layout.present, strict=True)])
        else:
            out = self.out(torch.cat(chunks))
        return out.new_empty(out.shape).index_copy(0, layout.order, out)

    def task_mixes(self, layout: TaskLayout) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Each MoE layer's mixed Linear per task of `layout` (MoELinear.task_mix). Inside
        `one_mix_per_update` they are made once per layout, with autograd on whatever the
        caller's mode, and reused by every pass of the update (the weights do not change
        within one): SAC runs the actor and the critics twice each on the same batch."""
        cache = self.__dict__.get("_mix_cache")
        if cache is None:
            embeds = self.task_embed[layout.present]
            return [layer.task_mix(embeds, layout.place) for layer in self.moe_layers()]
        if cache and cache[0] is layout:
            return cache[1]
        with torch.enable_grad():  # a first use under no_grad (the TD target) must not cut the graph
            embeds = self.task_embed[layout.present]
            mixes = [layer.task_mix(embeds, layout.place) for layer in self.moe_layers()]
        self.__dict__["_mix_cache"] = (layout, mixes)
        return mixes

    def hidden_norm(self, depth: int, h: torch.Tensor) -> torch.Tensor:
        """Hidden layer `depth`'s output through its LayerNorm (critic_norm 'layer'), or as it is."""
        return h if self.norms is None else self.norms[depth](h)

    def head(self, task: int) -> nn.Linear:
        """Task `task`'s output layer as a plain Linear (export: a frozen task's head)."""
        return self.out.linear(task) if isinstance(self.out, TaskHeads) else self.out

    def gate_input(self, state: torch.Tensor, task: torch.Tensor | None = None) -> torch.Tensor:
        """What every gate sees: the normalized state ++ the task's embedding (None: task 0); with
        router "task", the embedding alone."""
        embed = self.task_embed[task] if task is not None else self.task_embed[0].expand(len(state), -1)
        return embed if self.task_routed else torch.cat([state, embed], dim=-1)

    def moe_layers(self) -> list[MoELinear]:
        return [layer for layer in self.hidden if isinstance(layer, MoELinear)] if self.moe else []


def _task_routed_bodies(module: nn.Module) -> list[Body]:
    """The task-routed MoE bodies in `module`, found once (its tree does not change)."""
    found = module.__dict__.get("_task_routed_bodies")
    if found is None:
        found = [m for m in module.modules() if isinstance(m, Body) and m.moe and m.task_routed]
        module.__dict__["_task_routed_bodies"] = found
    return found


@contextlib.contextmanager
def one_mix_per_update(*modules: nn.Module) -> Iterator[None]:
    """Within: every task-routed MoE Body of `modules` mixes its experts once per batch layout
    and reuses the mix (Body.task_mixes); the weights must not change inside. Training only:
    an exported or traced module takes the masked form and never reads the cache."""
    bodies = [body for module in modules for body in _task_routed_bodies(module)]
    for body in bodies:
        body.__dict__["_mix_cache"] = ()
    try:
        yield
    finally:
        for body in bodies:
            body.__dict__["_mix_cache"] = None


class TaskHeads(nn.Module):
    """One output layer per task (model.task_heads, multi-head MT-SAC): weight [tasks, out, in]."""

    def __init__(self, tasks: int, in_dim: int, out_dim: int) -> None:
        super().__init__()
        layers = [nn.Linear(in_dim, out_dim) for _ in range(tasks)]  # each initialized as a Linear
        self.weight = nn.Parameter(torch.stack([layer.weight.detach() for layer in layers]))
        self.bias = nn.Parameter(torch.stack([layer.bias.detach() for layer in layers]))

    def head_forward(self, x: torch.Tensor, task: int) -> torch.Tensor:
        return torch.nn.functional.linear(x, self.weight[task], self.bias[task])

    def forward(self, x: torch.Tensor, task: torch.Tensor) -> torch.Tensor:
        """Each row through its task's layer (rows [B, in], task [B])."""
        return torch.einsum("bi,boi->bo", x, self.weight[task]) + self.bias[task]

    def linear(self, task: int) -> nn.Linear:
        return stacked_linear(self.weight, self.bias, task)


class SquashedGaussianActor(nn.Module):
    """pi(a | s, g) = tanh(N(mu, sigma)); actions lie in (-1, 1) like Fetch's action space."""

    def __init__(self, spec: ModelSpec) -> None:
        super().__init__()
        self.norm = Normalizer.for_spec(spec)
        self.body = Body(spec, spec.input_dim, 2 * spec.act_dim)

    def forward(self, obs_goal: torch.Tensor, task: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        x = self.norm(obs_goal)
        mean, log_std = self.body(x, x, task).chunk(2, dim=-1)
        return mean, log_std.clamp(LOG_STD_MIN, LOG_STD_MAX)

    def sample(self, obs_goal: torch.Tensor, task: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Reparameterized action and its log-probability (SAC paper, appendix C, eq. 21)."""
        mean, log_std = self(obs_goal, task)
        normal = torch.distributions.Normal(mean, log_std.exp())
        pre_tanh = normal.rsample()
        action = torch.tanh(pre_tanh)
        log_prob = normal.log_prob(pre_tanh) - torch.log1p(-action.pow(2) + 1e-6)
        return action, log_prob.sum(-1)

    def deterministic(self, obs_goal: torch.Tensor, task: torch.Tensor | None = None) -> torch.Tensor:
        mean, _ = self(obs_goal, task)
        return torch.tanh(mean)


class TwinCritic(nn.Module):
    """Q1, Q2(s, g, a): the min of two critics curbs overestimation (TD3, Fujimoto et al. 2018).
    With spec.critic_quantiles > 1 (algo 'tqc') each predicts that many quantiles of the return
    [batch, quantiles] instead of its mean [batch]."""

    def __init__(self, spec: ModelSpec) -> None:
        super().__init__()
        self.norm = Normalizer.for_spec(spec)
        self.quantiles = spec.critic_quantiles
        self.q1 = Body(spec, spec.input_dim + spec.act_dim, spec.critic_quantiles, critic=True)
        self.q2 = Body(spec, spec.input_dim + spec.act_dim, spec.critic_quantiles, critic=True)
        self.fused = True  # a task-routed MoE's pair in one pass (nets/twin.py); False: one after the other

    def forward(
        self, obs_goal: torch.Tensor, action: torch.Tensor, task: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        state = self.norm(obs_goal)
        x = torch.cat([state, action], dim=-1)
        q1, q2 = (
            twin_forward(self.q1, self.q2, x, state, task)
            if self.fused
            else (self.q1(x, state, task), self.q2(x, state, task))
        )
        return (q1.squeeze(-1), q2.squeeze(-1)) if self.quantiles == 1 else (q1, q2)


class SACModel(nn.Module):
    """Every network SAC needs, with flat-vector access per group."""

    def __init__(self, spec: ModelSpec, init_log_alpha: float = 0.0) -> None:
        super().__init__()
        self.spec = spec
        self.actor = SquashedGaussianActor(spec)
        self.critic = TwinCritic(spec)
        self.critic_target = TwinCritic(spec)
        self.critic_target.load_state_dict(self.critic.state_dict())
        self.critic_target.requires_grad_(False)
        self.log_alpha = nn.Parameter(torch.full((spec.alpha_rows,), init_log_alpha, dtype=torch.float32))

    def train_gates(self, on: bool) -> SACModel:
        """model.gate_grad: whether the task losses reach the task router's gates (training only:
        routing and outputs are the same either way)."""
        for module in self.modules():
            if isinstance(module, MoELinear):
                module.gate_grad = on
        return self

    def batch_renorm(self, momentum: float, warmup: int) -> SACModel:
        """learner.crossq.momentum and learner.crossq.warmup on the critics' batch renorm layers
        (algo 'crossq'; nothing for a model without them)."""
        set_renorm(self, momentum, warmup)
        return self

    def fuse_critics(self, on: bool) -> SACModel:
        """learner.fused_critics: a task-routed MoE's twin critics in one pass (nets/twin.py)."""
        self.critic.fused = self.critic_target.fused = on
        return self

    def group_parameters(self, group: str) -> list[torch.Tensor]:
        if group == "log_alpha":
            return [self.log_alpha]
        if group == "obs_norm":
            return [self.actor.norm.mean, self.actor.norm.std]
        # The module tree never changes after construction (set_flat swaps a parameter's data,
        # not the parameter), so each group's list is walked once: every update asks for two.
        cache = self.__dict__.setdefault("_group_params", {})
        if group not in cache:
            cache[group] = tuple(getattr(self, group).parameters())
        return list(cache[group])

    def expert_parameters(self, group: str) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """(weight [E, out, in], bias [E, out]) of every MoE layer of `group` ([] for a dense
        model or a group without networks): what the aggregator's lazy expert steps slice."""
        module = getattr(self, group, None) if group in ("actor", "critic", "critic_target") else None
        if module is None:
            return []
        return [(m.weight, m.bias) for m in module.modules() if isinstance(m, MoELinear)]

    def get_flat(self, group: str) -> np.ndarray:
        params = self.group_parameters(group)
        return torch.nn.utils.parameters_to_vector(params).detach().cpu().numpy().copy()

    def set_flat(self, group: str, flat: np.ndarray, share: bool = False) -> None:
        """Load a group's flat vector. With `share`, CPU parameters become views of `flat` itself
        when it is a writable float32 array (no copy): the caller hands it over and changes it no
        more (a learner's snapshots, each its own copy; copying the 2.2M values of a 4-task MoE
        each version was 6% of its learner's time). Otherwise the values are copied in."""
        if group == "obs_norm":
            for module in (self.actor, self.critic, self.critic_target):
                module.norm.load_flat(flat)
            return
        params = self.group_parameters(group)
        expected = sum(p.numel() for p in params)
        if flat.shape != (expected,):
            raise ValueError(f"group {group!r}: flat vector shape {flat.shape}, expected ({expected},)")
        writable = flat.dtype == np.float32 and flat.flags.writeable  # a snapshot's own copy: no second one
        source = torch.from_numpy(flat if writable else np.array(flat, np.float32))
        share = share and writable and all(p.device.type == "cpu" for p in params)
        offset = 0
        with torch.no_grad():  # copy_ in place: parameters stay on their device (cpu or cuda)
            for p in params:
                part = source[offset : offset + p.numel()].view_as(p)
                if share:
                    p.data = part
                else:
                    p.copy_(part)
                offset += p.numel()

    def group_sizes(self) -> dict[str, int]:
        return {g: sum(p.numel() for p in self.group_parameters(g)) for g in GROUPS}


def build_actor(spec: ModelSpec, flat: np.ndarray, obs_norm: np.ndarray) -> SquashedGaussianActor:
    """An actor alone, loaded from its flat vectors (samplers, evaluator, export)."""
    actor = SquashedGaussianActor(spec)
    actor.norm.load_flat(obs_norm)
    expected = sum(p.numel() for p in actor.parameters())
    if flat.shape != (expected,):
        raise ValueError(f"actor flat vector shape {flat.shape}, expected ({expected},)")
    with torch.no_grad():
        torch.nn.utils.vector_to_parameters(torch.from_numpy(np.array(flat, np.float32)), actor.parameters())
    return actor.eval()
