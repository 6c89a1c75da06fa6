"""Export a checkpoint's deterministic policy to ONNX for the NPU controllers.

    report = export_onnx("runs/r1/checkpoints", "policy.onnx")        # static batch 1, opset 17
    report.input_name, report.input_shape, report.output_shape       # 'obs_goal', (1, 13), (1, 4)

The graph: obs_goal float32 [batch, obs_dim + goal_dim] (observation ++ desired_goal, in that
order) -> action float32 [batch, act_dim] = tanh(mean), normalizer included, no sampling.

Shapes are static by default (batch 1): NPU compilers plan memory and tile kernels ahead of
time and reject or fall back to the host CPU on symbolic dims, and a 120 Hz controller runs one
robot's observation per tick anyway. `batch_size=None` gives a dynamic batch axis for host-side
use (the op audit then has to be told `require_static_shapes=False`).
"""

from __future__ import annotations

import io
import os
import pathlib
import warnings
from dataclasses import dataclass
from typing import TYPE_CHECKING

import onnx
import torch

from deploy_npu.freeze import TaskInput, freeze_policy
from foundation.checkpoint import CheckpointSource, PolicyCheckpoint, load_policy_checkpoint
from foundation.config import ConfigError
from nets.models import ModelSpec

if TYPE_CHECKING:
    from deploy_npu.routing import RoutingTable

INPUT_NAME = "obs_goal"
OUTPUT_NAME = "action"
DYNAMIC_BATCH = "batch"
MIN_OPSET = 13  # Split/Squeeze/Unsqueeze take their axes as inputs from 13 on; the audit assumes that form


@dataclass(frozen=True)
class ExportReport:
    """What was written and what it expects; shapes use None for a dynamic batch axis."""

    onnx_path: pathlib.Path
    checkpoint_version: int
    spec: ModelSpec
    opset: int
    batch_size: int | None
    input_dim: int = 0  # the graph's input width (a multi-task run's task: its own); 0 = spec.input_dim

    input_name = INPUT_NAME
    output_name = OUTPUT_NAME

    @property
    def input_shape(self) -> tuple[int | None, int]:
        return (self.batch_size, self.input_dim or self.spec.input_dim)

    @property
    def output_shape(self) -> tuple[int | None, int]:
        return (self.batch_size, self.spec.act_dim)


def trace_to_onnx(module: torch.nn.Module, input_dim: int, opset: int, batch_size: int | None) -> onnx.ModelProto:
    buffer = io.BytesIO()
    dynamic_axes = {INPUT_NAME: {0: DYNAMIC_BATCH}, OUTPUT_NAME: {0: DYNAMIC_BATCH}} if batch_size is None else None
    with warnings.catch_warnings(), torch.no_grad():
        # dynamo=False: the torch.export-based exporter (torch's default since 2.9) needs
        # onnxscript, which is not a fleetrl dependency; the TorchScript exporter gives this MLP
        # the same static graph. It warns that it is deprecated on every call: silence only that.
        warnings.filterwarnings("ignore", message=".*legacy TorchScript-based ONNX export", category=DeprecationWarning)
        warnings.filterwarnings("ignore", message="The feature will be removed", category=DeprecationWarning)
        torch.onnx.export(
            module,
            (torch.zeros(batch_size or 1, input_dim),),
            buffer,  # type: ignore[arg-type]  # typed str | PathLike, but the TorchScript exporter writes file-likes
            dynamo=False,
            opset_version=opset,
            input_names=[INPUT_NAME],
            output_names=[OUTPUT_NAME],
            dynamic_axes=dynamic_axes,
            do_constant_folding=True,
        )
    return onnx.load_from_string(buffer.getvalue())


def export_onnx(
    checkpoint: CheckpointSource,
    out_path: str | os.PathLike,
    *,
    opset: int = 17,
    batch_size: int | None = 1,
    routing: RoutingTable | None = None,
    task_input: TaskInput | None = None,
) -> ExportReport:
    """Write the checkpoint's deterministic policy as ONNX at `out_path`, checked by onnx.checker.

    `checkpoint` is a ckpt_<version>.pt path, a directory of them (newest wins) or an
    AggregatorCore.state() dict. The file is written atomically (temporary name, then rename),
    and carries the checkpoint version and model spec in its metadata_props. A multi-task
    run's policy is exported for one task (`task_input`), on that task's own input.
    """
    if opset < MIN_OPSET:
        raise ConfigError(
            f"opset ({opset}) must be >= {MIN_OPSET}: the op audit reads axes as opset-13 inputs", field="opset"
        )
    if batch_size is not None and batch_size < 1:
        raise ConfigError(
            f"batch_size ({batch_size}) must be >= 1, or None for a dynamic batch axis", field="batch_size"
        )
    ckpt = load_policy_checkpoint(checkpoint)
    input_dim = task_input.input_dim if task_input is not None else ckpt.spec.input_dim
    model = trace_to_onnx(freeze_policy(ckpt, routing, task_input), input_dim, opset, batch_size)
    props = {"fleetrl.task": task_input.name} if task_input is not None else {}
    path = write_model(model, ckpt, out_path, routing, props)
    return ExportReport(path, ckpt.version, ckpt.spec, opset, batch_size, input_dim)


def write_model(
    model: onnx.ModelProto,
    ckpt: PolicyCheckpoint,
    out_path: str | os.PathLike,
    routing: RoutingTable | None = None,
    props: dict[str, str] | None = None,
) -> pathlib.Path:
    """Stamp the graph with where it came from, check it, and write it atomically."""
    model.doc_string = "fleetrl deterministic policy: action = tanh(mean(normalize(observation ++ desired_goal)))"
    onnx.helper.set_model_props(
        model,
        {
            "fleetrl.checkpoint_version": str(ckpt.version),
            "fleetrl.model_spec": ckpt.spec.to_json(),
            "fleetrl.input_layout": "observation ++ desired_goal",
            **({"fleetrl.routing": routing.to_json()} if routing is not None else {}),
            **(props or {}),
        },
    )
    # full_check also runs strict shape inference, so a graph whose shapes do not resolve fails here.
    onnx.checker.check_model(model, full_check=True)
    out_path = pathlib.Path(out_path)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    tmp = out_path.with_name(out_path.name + ".tmp")
    onnx.save(model, tmp)
    os.replace(tmp, out_path)
    return out_path
