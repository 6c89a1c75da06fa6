"""deploy_npu: checkpoint -> ONNX policy for the NPU controllers, and the checks it must pass.

    from deploy_npu import export_onnx, audit_onnx, OnnxPolicy, check_parity
    report = export_onnx("runs/r1/checkpoints", "policy.onnx")   # static batch 1, opset 17
    audit_onnx(report.onnx_path)                                  # raises OpAuditError if not NPU-ready

    freeze.py    checkpoint -> plain torch module (the seam the MoE routing freeze replaces)
    export.py    torch module -> ONNX file, onnx.checker
    audit.py     op allowlist, no control flow, static shapes
    parity.py    torch vs onnxruntime, latency vs the 120 Hz budget, closed loop in the sim
    pipeline.py  all of the above in one call; cli.py is `fleetrl export`

Reads checkpoints only; talks to no other role.
"""

from deploy_npu.audit import AuditReport, OpAuditError, audit_onnx
from deploy_npu.export import ExportReport, export_onnx
from deploy_npu.freeze import freeze_policy, reference_actor
from deploy_npu.parity import OnnxPolicy, check_parity, closed_loop, measure_latency
from deploy_npu.pipeline import DeployCheckConfig, DeployReport, export_and_check
from foundation.checkpoint import CheckpointError, PolicyCheckpoint, load_policy_checkpoint

__all__ = [
    "AuditReport",
    "CheckpointError",
    "DeployCheckConfig",
    "DeployReport",
    "ExportReport",
    "OnnxPolicy",
    "OpAuditError",
    "PolicyCheckpoint",
    "audit_onnx",
    "check_parity",
    "closed_loop",
    "export_and_check",
    "export_onnx",
    "freeze_policy",
    "load_policy_checkpoint",
    "measure_latency",
    "reference_actor",
]
