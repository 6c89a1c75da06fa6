"""`fleetrl export`'s arguments, defined without importing deploy_npu (torch, onnxruntime), so
`fleetrl export --help` answers at once; deploy_npu/cli.py runs what they parse.

    export = sub.add_parser("export", ...)
    add_export_arguments(export)     # the defaults are DeployCheckConfig's (a test holds them equal)
"""

from __future__ import annotations

import argparse

WEIGHT_CHOICES = ("best", "live", "swa", "swa_plain")  # foundation.checkpoint.WEIGHT_CHOICES
CONTROLLER_HZ = 120.0  # deploy_npu.parity.CONTROLLER_HZ: the budget is one tick of it


def add_export_arguments(parser: argparse.ArgumentParser) -> None:
    """RUN_DIR (its newest checkpoint) or --checkpoint, --out, and the checks' settings."""
    parser.add_argument(
        "run_dir", nargs="?", help="a run directory: its newest checkpoint, graphs written to RUN_DIR/deploy/"
    )
    parser.add_argument(
        "--checkpoint", help="a ckpt_<version>.pt file, or a directory (newest wins), instead of RUN_DIR"
    )
    parser.add_argument(
        "--out",
        help="ONNX file to write (default: RUN_DIR/deploy/<task>.onnx); a directory when several tasks are exported "
        "(--task twice, or a multi-task run), and for one task an existing directory or a path ending in / gets "
        "<task>.onnx",
    )
    parser.add_argument(
        "--task",
        action="append",
        help="task the policy acts in (repeatable; default: the checkpoint's task(s), else the one whose dims fit)",
    )
    _add_check_arguments(parser)


def _add_check_arguments(parser: argparse.ArgumentParser) -> None:
    """The graph's shape and every check's settings: parity, latency, closed loop, int8, rate."""
    parser.add_argument("--episodes", type=int, default=5, help="closed-loop episodes in the nominal env (reported)")
    parser.add_argument("--opset", type=int, default=17, help="ONNX opset of the exported graph (>= 13)")
    parser.add_argument("--batch-size", type=int, default=1, help="static batch of the graph")
    parser.add_argument(
        "--dynamic-batch", action="store_true", help="dynamic batch axis instead (host use; not NPU-ready)"
    )
    parser.add_argument("--tolerance", type=float, default=1e-5, help="max |torch - onnx| action difference allowed")
    parser.add_argument("--latency-calls", type=int, default=1000, help="timed single-threaded onnxruntime calls")
    parser.add_argument(
        "--budget-ms",
        type=float,
        default=1000.0 / CONTROLLER_HZ,
        help="per-call p99 latency budget: your controller's tick; the check fails above it",
    )
    parser.add_argument("--seed", type=int, default=0, help="seed of parity inputs and closed-loop episode resets")
    parser.add_argument(
        "--weights",
        choices=WEIGHT_CHOICES,
        default="best",
        help="'live', 'swa' (the weight average), or 'best': the average when it scored above live",
    )
    parser.add_argument("--int8", action="store_true", help="also write <out>.int8.onnx (static quantization)")
    parser.add_argument(
        "--hz",
        type=float,
        default=0.0,
        help="the controller's rate (0: the policy's training rate); velocity inputs are re-timed to it",
    )
    parser.add_argument(
        "--trained-hz",
        type=float,
        default=0.0,
        help="the rate the policy was trained at (0: its run's sim.control_hz, else 25)",
    )
