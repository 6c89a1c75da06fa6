"""Shared wire types: numpy <-> proto Tensor, and the transition batch column schema.

This is the one small module of shared types that every role may import (with
fleetrl.config and the generated protos). It holds no role's logic.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from fleetrl.proto import fleetrl_pb2 as pb

ALLOWED_DTYPES = ("float32",)
MAX_ABS_VALUE = 1e6  # observations, goals and rewards beyond this are a sender's bug (and break learners)
ACTION_LIMIT = 1.0 + 1e-5  # actions are tanh-squashed into [-1, 1]


def cap(text: str, limit: int = 60) -> str:
    """A client's value as an error may echo it: bounded, so details stay far below gRPC's limits."""
    return text if len(text) <= limit else f"{text[: limit - 15]}... ({len(text)} chars)"


class WireError(ValueError):
    """A message does not match its contract. `field` names the offending field."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field


def to_tensor(name: str, array: np.ndarray) -> pb.Tensor:
    array = np.ascontiguousarray(array)
    return pb.Tensor(name=name, dtype=str(array.dtype), shape=list(array.shape), data=array.tobytes())


def from_tensor(tensor: pb.Tensor, field: str = "tensor") -> np.ndarray:
    """Decode a Tensor, checking dtype and that the byte count matches the shape."""
    where = f"{field}[{cap(tensor.name)}]"
    if tensor.dtype not in ALLOWED_DTYPES:
        raise WireError(f"{where}.dtype", f"{cap(tensor.dtype)!r} is not one of {ALLOWED_DTYPES}")
    if len(tensor.shape) > 4 or any(d < 0 for d in tensor.shape):
        raise WireError(f"{where}.shape", f"{cap(str(list(tensor.shape)))}: at most 4 dimensions, none negative")
    dtype = np.dtype(tensor.dtype)
    expected = math.prod(tensor.shape) * dtype.itemsize  # Python ints: [2**32, 2**32] does not wrap to 0
    if len(tensor.data) != expected:
        raise WireError(f"{where}.data", f"{len(tensor.data)} bytes, shape {list(tensor.shape)} needs {expected}")
    return np.frombuffer(tensor.data, dtype=dtype).reshape(tuple(tensor.shape))


@dataclass(frozen=True)
class TransitionSchema:
    """Column layout of one task's transitions; fixed per task, so records are fixed-size."""

    obs_dim: int
    goal_dim: int
    act_dim: int

    COLUMNS = ("obs", "goal", "action", "reward", "next_obs", "done")

    def column_dims(self) -> dict[str, int]:
        """Width of each column (0 = a scalar per transition)."""
        return {
            "obs": self.obs_dim,
            "goal": self.goal_dim,
            "action": self.act_dim,
            "reward": 0,
            "next_obs": self.obs_dim,
            "done": 0,
        }

    @property
    def row_floats(self) -> int:
        return sum(max(d, 1) for d in self.column_dims().values())


@dataclass
class Transitions:
    """Columnar float32 transitions (leading dim N) of one task."""

    obs: np.ndarray
    goal: np.ndarray
    action: np.ndarray
    reward: np.ndarray
    next_obs: np.ndarray
    done: np.ndarray

    def __len__(self) -> int:
        return int(self.reward.shape[0])

    def columns(self) -> dict[str, np.ndarray]:
        return {name: getattr(self, name) for name in TransitionSchema.COLUMNS}

    def pack(self) -> np.ndarray:
        """Rows of float32 in schema column order, shape [N, row_floats]."""
        n = len(self)
        return np.concatenate([np.asarray(c, dtype=np.float32).reshape(n, -1) for c in self.columns().values()], axis=1)

    @classmethod
    def unpack(cls, rows: np.ndarray, schema: TransitionSchema) -> Transitions:
        out, start = {}, 0
        for name, dim in schema.column_dims().items():
            width = max(dim, 1)
            block = rows[:, start : start + width]
            out[name] = block[:, 0] if dim == 0 else block
            start += width
        return cls(**out)

    @classmethod
    def concat(cls, parts: list[Transitions]) -> Transitions:
        return cls(**{name: np.concatenate([getattr(p, name) for p in parts]) for name in TransitionSchema.COLUMNS})


def batch_to_proto(
    transitions: Transitions,
    *,
    run_id: str,
    sampler_id: int,
    seq: int,
    policy_version: int,
    task_id: int,
    env_steps: int,
    episodes: int = 0,
    successes: int = 0,
    incarnation: int = 0,
) -> pb.TransitionBatch:
    return pb.TransitionBatch(
        run_id=run_id,
        sampler_id=sampler_id,
        seq=seq,
        policy_version=policy_version,
        task_id=task_id,
        num_transitions=len(transitions),
        env_steps=env_steps,
        episodes=episodes,
        successes=successes,
        incarnation=incarnation,
        columns=[to_tensor(name, np.asarray(a, np.float32)) for name, a in transitions.columns().items()],
    )


def batch_from_proto(batch: pb.TransitionBatch, schema: TransitionSchema) -> Transitions:
    """Decode and validate every column against the schema; raises WireError naming the field."""
    n = batch.num_transitions
    if n == 0:
        raise WireError("num_transitions", "0: an empty batch carries nothing to store")
    by_name: dict[str, np.ndarray] = {}
    for i, tensor in enumerate(batch.columns):
        if tensor.name in by_name:
            raise WireError(f"columns[{i}].name", f"duplicate column {cap(tensor.name)!r}")
        if tensor.name not in schema.column_dims():
            unknown = sorted({c.name for c in batch.columns} - set(schema.column_dims()))
            shown = [cap(u, 30) for u in unknown[:3]]
            more = f" and {len(unknown) - 3} more" if len(unknown) > 3 else ""
            raise WireError("columns", f"unknown column(s) {shown}{more}; expected {list(schema.column_dims())}")
        by_name[tensor.name] = from_tensor(tensor, "columns")
    dims = schema.column_dims()
    for name, dim in dims.items():
        if name not in by_name:
            raise WireError("columns", f"missing column {name!r}")
        expected = (n,) if dim == 0 else (n, dim)
        got = by_name[name].shape
        if got != expected:
            raise WireError(f"columns[{name}].shape", f"{list(got)}, expected {list(expected)}")
        _check_values(name, by_name[name])
    return Transitions(**by_name)


def _check_values(name: str, values: np.ndarray) -> None:
    """Finite, and within what the column can mean: done is 0 or 1, actions in [-1, 1]."""
    where = f"columns[{name}].data"
    if not np.all(np.isfinite(values)):
        raise WireError(where, "contains NaN or inf")
    if name == "done" and not np.all((values == 0) | (values == 1)):
        raise WireError(where, f"must be 0 or 1, got {float(values[(values != 0) & (values != 1)][0]):g}")
    limit = ACTION_LIMIT if name == "action" else MAX_ABS_VALUE
    worst = float(np.abs(values).max(initial=0.0))
    if worst > limit:
        raise WireError(where, f"magnitude {worst:g} beyond {limit:g}")
