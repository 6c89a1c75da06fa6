"""Optional int8: onnxruntime static quantization of an exported policy, with its own figures.

    report = quantize_int8("policy.onnx", "policy.int8.onnx", calibration_rows)
    report.onnx_path, report.audit.passed
    int8_beside("envelope/graphs/FetchPush-v4-120hz.onnx", get_task("FetchPush-v4"), seed=0)  # ...-120hz.int8.onnx

Static quantization (QDQ format, int8 weights and activations, per-channel weights) with the
activation ranges calibrated on real inputs of the task (observation ++ goal rows from the
nominal env). NPUs run int8 matrix units several times faster than float, but the policy's
actions move: the deploy check reports the int8 graph's parity against the float torch policy
and its own closed-loop success, beside the float graph's, and gates neither.
"""

from __future__ import annotations

import contextlib
import logging
import os
import pathlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from deploy_npu.audit import NPU_OPS, AuditReport, OpAuditError, audit_onnx

if TYPE_CHECKING:
    from sim.registry import TaskSpec

INT8_OPS = NPU_OPS | {"QuantizeLinear", "DequantizeLinear"}  # the QDQ pairs around each Gemm
CALIBRATION_ROWS = 256  # real inputs of the nominal task that int8_beside calibrates on


@dataclass(frozen=True)
class Int8Report:
    onnx_path: pathlib.Path
    audit: AuditReport
    max_abs_error: float  # |int8 action - float torch action| over the parity inputs
    num_inputs: int
    success_rate: float  # closed loop in the nominal task, as the float graph's
    episodes: int
    p50_ms: float  # per-call latency, single-threaded onnxruntime CPU, as the float graph's
    p99_ms: float


class _Rows:
    """onnxruntime's CalibrationDataReader over rows of the graph's input."""

    def __init__(self, name: str, rows: np.ndarray, batch: int) -> None:
        self._batches = iter([{name: rows[i : i + batch]} for i in range(0, len(rows) - batch + 1, batch)])

    def get_next(self):
        return next(self._batches, None)


def quantize_int8(fp32_path: str | os.PathLike, int8_path: str | os.PathLike, calibration: np.ndarray) -> pathlib.Path:
    """Write the int8 (QDQ) version of the static-batch graph at fp32_path, calibrated on rows."""
    from onnxruntime.quantization import QuantFormat, QuantType, quantize_static

    from deploy_npu.parity import OnnxPolicy

    policy = OnnxPolicy(fp32_path)
    batch = policy.static_batch or 1
    rows = np.asarray(calibration, np.float32)
    if len(rows) < batch:
        raise ValueError(f"calibration: {len(rows)} rows, the graph's batch is {batch}")
    int8_path = pathlib.Path(int8_path)
    with _without_pre_processing_advice():
        quantize_static(
            str(fp32_path),
            str(int8_path),
            _Rows(policy.input_name, rows, batch),
            quant_format=QuantFormat.QDQ,
            activation_type=QuantType.QInt8,
            weight_type=QuantType.QInt8,
            per_channel=True,
        )
    return int8_path


PRE_PROCESSING_ADVICE = "pre-processing before quantization"  # in both of quantize_static's warnings


class _DropPreProcessingAdvice(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return PRE_PROCESSING_ADVICE not in record.getMessage()


@contextlib.contextmanager
def _without_pre_processing_advice() -> Iterator[None]:
    """quantize_static warns twice on the root logger that the graph was not pre-processed
    (quant_pre_process: symbolic shape inference, for dynamic shapes, and graph optimization, for
    fusions such as Conv + BatchNormalization). The exported actor has static shapes, which
    quantize_static's own ONNX shape inference reads, and no nodes that fuse: on the dense and MoE
    actors pre-processing only turns the Clip bounds' Constant nodes into initializers, and the QDQ
    pairs sit around the same nodes with the same int8 actions. So the advice is dropped, on the
    root logger and for this call only; every other record passes."""
    root = logging.getLogger()
    advice = _DropPreProcessingAdvice()
    root.addFilter(advice)
    try:
        yield
    finally:
        root.removeFilter(advice)


def int8_beside(fp32_path: str | os.PathLike, task: TaskSpec, seed: int) -> pathlib.Path:
    """The int8 version of the float graph at fp32_path, written beside it as <name>.int8.onnx and
    calibrated on CALIBRATION_ROWS rows of `task`'s nominal env (parity.env_inputs, seeded by
    `seed`): the graph the robustness envelope and the agreement check drive."""
    from deploy_npu.parity import env_inputs

    fp32_path = pathlib.Path(fp32_path)
    return quantize_int8(fp32_path, fp32_path.with_suffix(".int8.onnx"), env_inputs(task, CALIBRATION_ROWS, seed))


def audit_int8(path: pathlib.Path, static: bool) -> AuditReport:
    try:
        return audit_onnx(path, allowed_ops=INT8_OPS, require_static_shapes=static)
    except OpAuditError as exc:
        return exc.report
