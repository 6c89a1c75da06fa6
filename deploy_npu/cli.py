"""`fleetrl export`: export a checkpoint's policy to ONNX and run every deploy check on it.

    fleetrl export runs/r1                              # the run's newest checkpoint -> runs/r1/deploy/<task>.onnx
    fleetrl export runs/r1 --out policy.onnx --episodes 5
    fleetrl export runs/mt --out deploy/                # a multi-task run: one graph per task
        (<task>.onnx, on the task's own input) and multitask.onnx (task one-hot input)
    fleetrl export --checkpoint runs/r1/checkpoints --out policy.onnx --hz 120   # a 120 Hz controller: a
        policy trained at 25 Hz gets its velocity inputs re-timed (deploy_npu/retime.py)

Every ONNX file gets a manifest beside it (<file>.manifest.json): tasks, input and output
spec, normalizer, routing, weight version, check figures and the file's sha256.

The arguments are defined in fleet/cli/export_args.py (so `--help` needs neither torch nor
onnxruntime); fleet/cli/commands.py checks the run directory and calls run(args, target).
Exit status: 0 all checks pass, 1 a check failed (the report says which); bad input raises a
FleetrlError, which the CLI prints with exit status 2.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import pathlib
import sys

from deploy_npu.pipeline import DeployCheckConfig, export_and_check
from foundation.checkpoint import load_policy_checkpoint
from foundation.config import ConfigError


def config_from_args(args: argparse.Namespace) -> DeployCheckConfig:
    return DeployCheckConfig(
        task=args.task[0] if args.task else None,
        opset=args.opset,
        batch_size=None if args.dynamic_batch else args.batch_size,
        tolerance=args.tolerance,
        latency_calls=args.latency_calls,
        budget_ms=args.budget_ms,
        episodes=args.episodes,
        seed=args.seed,
        weights=args.weights,
        int8=args.int8,
        control_hz=args.hz,
        trained_hz=args.trained_hz,
    )


@dataclasses.dataclass(frozen=True)
class ExportTarget:
    """What to export and where: a checkpoint file or folder (its newest), and the ONNX file or folder."""

    checkpoint: str
    out: str


def run(args: argparse.Namespace, target: ExportTarget) -> int:
    """Run the checks, print the report; return the exit status (bad input raises a FleetrlError)."""
    reports = _export_all(args, target)
    for report in reports:
        print(report.summary())
    return 0 if all(report.passed for report in reports) else 1


def _export_all(args: argparse.Namespace, paths: ExportTarget) -> list:
    """One file for one task; with several tasks (or a multi-task run), `--out` is a directory
    of <task>.onnx files, plus multitask.onnx for a multi-task run."""
    config = config_from_args(args)
    ckpt = load_policy_checkpoint(paths.checkpoint, config.weights)
    multi = len(ckpt.task_names) > 1
    if not multi and len(args.task or []) <= 1:
        target = pathlib.Path(paths.out)
        if target.is_dir() or paths.out.endswith(("/", os.sep)):  # a folder: <folder>/<task>.onnx, as for several
            target = target / f"{config.task or (ckpt.task_names or ['policy'])[0]}.onnx"
        return [export_and_check(ckpt, target, config)]
    out = pathlib.Path(paths.out)
    if out.suffix == ".onnx":
        raise ConfigError(f"--out {out}: several tasks export to a directory, not one .onnx file", field="out")
    names = args.task or ckpt.task_names
    reports = [export_and_check(ckpt, out / f"{name}.onnx", dataclasses.replace(config, task=name)) for name in names]
    if multi and config.control_hz:  # re-timing is per task: each task's rows, its own velocity columns
        print(
            "fleetrl export: warning: multitask.onnx is not written with --hz; the per-task graphs are", file=sys.stderr
        )
    elif multi:
        from deploy_npu.multitask import export_multitask

        reports.append(export_multitask(ckpt, out / "multitask.onnx", config))
    return reports
