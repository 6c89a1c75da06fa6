"""`fleetrl export`: export a checkpoint's policy to ONNX and run every deploy check on it.

    fleetrl export --checkpoint runs/r1/checkpoints --out policy.onnx --episodes 5

fleetrl/cli.py mounts this as a subcommand:

    sub = subparsers.add_parser("export", help="export a policy to ONNX and check it for the NPU")
    deploy_npu.cli.add_arguments(sub)
    sub.set_defaults(handler=deploy_npu.cli.run)        # run(args) -> exit status

Exit status: 0 all checks pass, 1 a check failed (the report says which), 2 bad input.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from deploy_npu.freeze import CheckpointError
from deploy_npu.pipeline import DeployCheckConfig, export_and_check

_DEFAULTS = DeployCheckConfig()


def _help(name: str) -> str:
    return DeployCheckConfig.__dataclass_fields__[name].metadata["help"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the export subcommand's options to `parser`."""
    parser.add_argument("--checkpoint", required=True, help="ckpt_<version>.pt file, or a directory (newest wins)")
    parser.add_argument("--out", required=True, help="path of the ONNX file to write")
    parser.add_argument("--episodes", type=int, default=_DEFAULTS.episodes, help=_help("episodes"))
    parser.add_argument("--task", help="task the policy acts in (default: the only registered task whose dims fit)")
    parser.add_argument("--opset", type=int, default=_DEFAULTS.opset, help=_help("opset"))
    parser.add_argument("--batch-size", type=int, default=_DEFAULTS.batch_size, help="static batch of the graph")
    parser.add_argument(
        "--dynamic-batch", action="store_true", help="dynamic batch axis instead (host use; not NPU-ready)"
    )
    parser.add_argument("--tolerance", type=float, default=_DEFAULTS.tolerance, help=_help("tolerance"))
    parser.add_argument("--latency-calls", type=int, default=_DEFAULTS.latency_calls, help=_help("latency_calls"))
    parser.add_argument("--seed", type=int, default=_DEFAULTS.seed, help=_help("seed"))


def config_from_args(args: argparse.Namespace) -> DeployCheckConfig:
    return DeployCheckConfig(
        task=args.task,
        opset=args.opset,
        batch_size=None if args.dynamic_batch else args.batch_size,
        tolerance=args.tolerance,
        latency_calls=args.latency_calls,
        episodes=args.episodes,
        seed=args.seed,
    )


def run(args: argparse.Namespace) -> int:
    """Run the checks, print the report; return the exit status."""
    try:
        report = export_and_check(args.checkpoint, args.out, config_from_args(args))
    except (FileNotFoundError, CheckpointError, ValueError) as exc:
        print(f"fleetrl export: error: {exc}", file=sys.stderr)
        return 2
    print(report.summary())
    return 0 if report.passed else 1


def main(argv: Sequence[str] | None = None) -> int:
    """Stand-alone entry point: `python3 -m deploy_npu.cli --checkpoint ... --out ...`."""
    parser = argparse.ArgumentParser(prog="fleetrl export", description=__doc__.splitlines()[0])
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
