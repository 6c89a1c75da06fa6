"""A policy trained at one control rate run at another: its velocity inputs re-timed.

    ckpt = retimed(ckpt, task, trained_hz=25, hz=120)     # then export_onnx(ckpt, ...) as ever

Fetch's velocities are per decision (sim/rate.py): at 120 Hz a policy trained at 25 Hz reads
them about 1/3.8 as large as it learned for the same motion. Multiplying those columns by the
measured factor (sim/rate.py velocity_scale) gives it its own units back. The factor goes into
the input normalizer, (f x - mean) / std = (x - mean / f) / (std / f), so the exported graph has
the same ops and the controller does nothing new: the torch policy of the same checkpoint and
the ONNX graph agree, as without re-timing.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from foundation.checkpoint import PolicyCheckpoint
from sim.rate import velocity_columns, velocity_scale
from sim.registry import TaskSpec


def retime_factor(task: TaskSpec, trained_hz: float, hz: float) -> float:
    """What `task`'s velocities per decision at `hz` are multiplied by to read as at `trained_hz`
    (sim/rate.py velocity_scale, measured once per process and rate)."""
    if trained_hz <= 0 or hz <= 0:
        raise ValueError(f"control rates must be > 0, got trained {trained_hz}, controller {hz}")
    return velocity_scale(task.gym_id, hz) / velocity_scale(task.gym_id, trained_hz)


def retimed(ckpt: PolicyCheckpoint, task: TaskSpec, trained_hz: float, hz: float, place: int = 0) -> PolicyCheckpoint:
    """`ckpt` with `task`'s velocity columns re-timed from `hz` to `trained_hz` in its input
    normalizer (the row of task `place` in a multi-task run with per-task statistics). A Fetch task
    only; the same checkpoint when the rates are equal."""
    if trained_hz == hz:
        return ckpt
    if not task.is_fetch:
        raise ValueError(f"{task.name}: only Fetch tasks are re-timed (sim/rate.py)")
    factor = retime_factor(task, trained_hz, hz)
    spec = ckpt.spec
    mean, std = (part.copy() for part in spec.split_norm(ckpt.obs_norm))
    row, columns = spec.norm_row(place), velocity_columns(task.obs_dim)  # a task's own columns lead its padded input
    mean[row, columns] /= factor
    std[row, columns] /= factor
    return dataclasses.replace(ckpt, obs_norm=np.concatenate([mean.ravel(), std.ravel()]).astype(np.float32))
