"""`fleetrl export`: export a checkpoint's policy to ONNX and run every deploy check on it.

    fleetrl export --checkpoint runs/r1/checkpoints --out policy.onnx --episodes 5
    fleetrl export --checkpoint runs/mt/checkpoints --out deploy/     # a multi-task run: one graph
        per task (<task>.onnx, on the task's own input) and multitask.onnx (task one-hot input)
    fleetrl export --checkpoint ... --task FetchPush-v4 --task FetchReach-v4 --out deploy/
    fleetrl export --checkpoint runs/r1/checkpoints --out policy.onnx --hz 120   # a 120 Hz controller: a
        policy trained at 25 Hz gets its velocity inputs re-timed (deploy_npu/retime.py)

Every ONNX file gets a manifest beside it (<file>.manifest.json): tasks, input and output
spec, normalizer, routing, weight version, check figures and the file's sha256.

fleet/cli/main.py mounts this as a subcommand:

    sub = subparsers.add_parser("export", help="export a policy to ONNX and check it for the NPU")
    deploy_npu.cli.add_arguments(sub)
    sub.set_defaults(handler=deploy_npu.cli.run)        # run(args) -> exit status

Exit status: 0 all checks pass, 1 a check failed (the report says which), 2 bad input.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import pathlib
import sys
from collections.abc import Sequence

from deploy_npu.pipeline import DeployCheckConfig, export_and_check
from foundation.checkpoint import WEIGHT_CHOICES, load_policy_checkpoint
from foundation.config import ConfigError
from foundation.errors import FleetrlError

_DEFAULTS = DeployCheckConfig()


def _help(name: str) -> str:
    return DeployCheckConfig.__dataclass_fields__[name].metadata["help"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the export subcommand's options to `parser`."""
    parser.add_argument("--checkpoint", required=True, help="ckpt_<version>.pt file, or a directory (newest wins)")
    parser.add_argument(
        "--out",
        required=True,
        help="ONNX file to write; a directory when several tasks are exported (--task twice, or a multi-task run), "
        "and for one task an existing directory or a path ending in / gets <task>.onnx",
    )
    parser.add_argument("--episodes", type=int, default=_DEFAULTS.episodes, help=_help("episodes"))
    parser.add_argument(
        "--task",
        action="append",
        help="task the policy acts in (repeatable; default: the checkpoint's task(s), else the one whose dims fit)",
    )
    parser.add_argument("--opset", type=int, default=_DEFAULTS.opset, help=_help("opset"))
    parser.add_argument("--batch-size", type=int, default=_DEFAULTS.batch_size, help="static batch of the graph")
    parser.add_argument(
        "--dynamic-batch", action="store_true", help="dynamic batch axis instead (host use; not NPU-ready)"
    )
    parser.add_argument("--tolerance", type=float, default=_DEFAULTS.tolerance, help=_help("tolerance"))
    parser.add_argument("--latency-calls", type=int, default=_DEFAULTS.latency_calls, help=_help("latency_calls"))
    parser.add_argument(
        "--budget-ms",
        type=float,
        default=_DEFAULTS.budget_ms,
        help=_help("budget_ms") + " (your controller's tick; the check fails above it)",
    )
    parser.add_argument("--seed", type=int, default=_DEFAULTS.seed, help=_help("seed"))
    parser.add_argument("--weights", choices=WEIGHT_CHOICES, default=_DEFAULTS.weights, help=_help("weights"))
    parser.add_argument("--int8", action="store_true", help=_help("int8"))
    parser.add_argument("--hz", type=float, default=_DEFAULTS.control_hz, help=_help("control_hz"))
    parser.add_argument("--trained-hz", type=float, default=_DEFAULTS.trained_hz, help=_help("trained_hz"))


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


def run(args: argparse.Namespace) -> int:
    """Run the checks, print the report; return the exit status."""
    try:
        reports = _export_all(args)
    except (FileNotFoundError, FleetrlError) as exc:  # a missing file or bad input (CheckpointError, ConfigError, ...)
        print(f"fleetrl export: error: {exc}", file=sys.stderr)
        return 2
    for report in reports:
        print(report.summary())
    return 0 if all(report.passed for report in reports) else 1


def _export_all(args: argparse.Namespace) -> list:
    """One file for one task; with several tasks (or a multi-task run), `--out` is a directory
    of <task>.onnx files, plus multitask.onnx for a multi-task run."""
    config = config_from_args(args)
    ckpt = load_policy_checkpoint(args.checkpoint, config.weights)
    multi = len(ckpt.task_names) > 1
    if not multi and len(args.task or []) <= 1:
        target = pathlib.Path(args.out)
        if target.is_dir() or str(args.out).endswith(("/", os.sep)):  # a folder: <folder>/<task>.onnx, as for several
            target = target / f"{config.task or (ckpt.task_names or ['policy'])[0]}.onnx"
        return [export_and_check(ckpt, target, config)]
    out = pathlib.Path(args.out)
    if out.suffix == ".onnx":
        raise ConfigError(f"--out {out}: several tasks export to a directory, not one .onnx file", field="out")
    names = args.task or ckpt.task_names
    reports = [export_and_check(ckpt, out / f"{name}.onnx", dataclasses.replace(config, task=name)) for name in names]
    if multi and config.control_hz:  # re-timing is per task: each task's rows, its own velocity columns
        print("fleetrl export: multitask.onnx is not written with --hz; the per-task graphs are", file=sys.stderr)
    elif multi:
        from deploy_npu.multitask import export_multitask

        reports.append(export_multitask(ckpt, out / "multitask.onnx", config))
    return reports


def main(argv: Sequence[str] | None = None) -> int:
    """Stand-alone entry point: `python3 -m deploy_npu.cli --checkpoint ... --out ...`."""
    parser = argparse.ArgumentParser(prog="fleetrl export", description=__doc__.splitlines()[0])
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
