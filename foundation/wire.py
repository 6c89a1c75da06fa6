"""Shared wire types: numpy <-> proto Tensor, and the transition batch column schema.

This is the one small module of shared types that every role may import (with
foundation.config and the generated protos). It holds no role's logic.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from foundation.errors import FleetrlError
from foundation.proto import fleetrl_pb2 as pb

ALLOWED_DTYPES = ("float32",)  # what every message may carry; gradients may also come as bfloat16
WIRE_DTYPES = ("float32", "bfloat16")
MAX_ABS_VALUE = 1e6  # observations, goals and rewards beyond this are a sender's bug (and break learners)
ACTION_LIMIT = 1.0 + 1e-5  # actions are tanh-squashed into [-1, 1]


def cap(text: str, limit: int = 60) -> str:
    """A client's value as an error may echo it: bounded, so details stay far below gRPC's limits."""
    return text if len(text) <= limit else f"{text[: limit - 15]}... ({len(text)} chars)"


class WireError(FleetrlError, ValueError):
    """A message does not match its contract. `field` names the offending field."""

    field: str  # always set: the offending field

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field


def to_tensor(name: str, array: np.ndarray, wire_dtype: str = "float32") -> pb.Tensor:
    """`wire_dtype` "bfloat16": float32 values rounded to their upper 16 bits (round to nearest
    even), half the bytes; what PyTorch DDP's bf16_compress_hook does to gradients."""
    array = np.ascontiguousarray(array)
    if wire_dtype == "bfloat16":
        data = bfloat16_bits(array).tobytes()
        return pb.Tensor(name=name, dtype=wire_dtype, shape=list(array.shape), data=data)
    return pb.Tensor(name=name, dtype=str(array.dtype), shape=list(array.shape), data=array.tobytes())


def bfloat16_bits(array: np.ndarray) -> np.ndarray:
    """float32 -> bfloat16 bit patterns (uint16), rounded to nearest even, as torch's .to(bfloat16)."""
    bits = np.ascontiguousarray(array, np.float32).view(np.uint32)
    return ((bits + (0x7FFF + ((bits >> 16) & 1))) >> 16).astype(np.uint16)


def from_tensor(tensor: pb.Tensor, field: str = "tensor", allowed: tuple[str, ...] = ALLOWED_DTYPES) -> np.ndarray:
    """Decode a Tensor, checking dtype (one of `allowed`) and that the byte count matches the
    shape. bfloat16 comes back as float32."""
    where = f"{field}[{cap(tensor.name)}]"
    if tensor.dtype not in allowed:
        raise WireError(f"{where}.dtype", f"{cap(tensor.dtype)!r} is not one of {allowed}")
    if len(tensor.shape) > 4 or any(d < 0 for d in tensor.shape):
        raise WireError(f"{where}.shape", f"{cap(str(list(tensor.shape)))}: at most 4 dimensions, none negative")
    itemsize = 2 if tensor.dtype == "bfloat16" else np.dtype(tensor.dtype).itemsize
    expected = math.prod(tensor.shape) * itemsize  # Python ints: [2**32, 2**32] does not wrap to 0
    if len(tensor.data) != expected:
        raise WireError(f"{where}.data", f"{len(tensor.data)} bytes, shape {list(tensor.shape)} needs {expected}")
    shape = tuple(tensor.shape)
    if tensor.dtype == "bfloat16":
        return (np.frombuffer(tensor.data, "<u2").astype(np.uint32) << 16).view(np.float32).reshape(shape)
    return np.frombuffer(tensor.data, dtype=np.dtype(tensor.dtype)).reshape(shape)


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
    demonstration: bool = False,
) -> pb.TransitionBatch:
    """One push's message; `demonstration` marks every row as an expert's (sampler.demo_episodes)."""
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
        demonstration=demonstration,
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
