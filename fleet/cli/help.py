"""What every `fleetrl` help page shares: the defaults after each option, an example, the exit codes.

    parser = Parser(prog="fleetrl", epilog=epilog("fleetrl"))    # subparsers inherit the class
    sub.add_parser("train", **page("train", "train with a complete local fleet"))

The docs' CLI reference is generated from the parser, so what these pages say is what users read.
"""

from __future__ import annotations

import argparse
import pathlib
from importlib import metadata
from typing import Any

EXIT_CODES = """exit status:
  0    success
  1    a runtime failure: a check failed, a run missed its target, a process or the network failed
  2    a usage or config mistake: the message names the argument, field or file
  130  interrupted (Ctrl-C)"""
ERRORS = "errors: printed on stderr as `fleetrl <subcommand>: error: <message>`"

# One example per subcommand: what a new user types first.
EXAMPLES: dict[str, tuple[str, ...]] = {
    "fleetrl": ("fleetrl train --task FetchReach-v4", "fleetrl config --task FetchPush-v4 --changed"),
    "train": ("fleetrl train --task FetchPush-v4 --max-wall-sec 1800", "fleetrl train --resume runs/FetchPush-v4-X"),
    "config": (
        "fleetrl config --task FetchPush-v4 --changed",
        "fleetrl config --tasks FetchReach-v4,FetchPush-v4 --json",
    ),
    "redis-cluster": ("fleetrl redis-cluster --primaries 3 --replicas 1",),
    "buffer": ("fleetrl buffer --config run.json --redis 127.0.0.1:7000 --port 50051",),
    "aggregator": ("fleetrl aggregator --config run.json --port 50052 --run-dir runs/r1",),
    "learner": ("fleetrl learner --config run.json --redis 127.0.0.1:7000 --aggregator 127.0.0.1:50052",),
    "sampler": ("fleetrl sampler --config run.json --buffer 127.0.0.1:50051 --aggregator 127.0.0.1:50052 --id 1",),
    "evaluator": ("fleetrl evaluator --config run.json --buffer 127.0.0.1:50051 --aggregator 127.0.0.1:50052",),
    "certs": ("fleetrl certs --out certs --hosts 10.0.0.7,services.lab",),
    "fleet": ("fleetrl fleet check fleet.yaml", "fleetrl fleet up fleet.yaml --host services"),
    "fleet up": ("fleetrl fleet up fleet.yaml --host services",),
    "fleet slurm": ("fleetrl fleet slurm fleet.yaml --submit",),
    "fleet check": ("fleetrl fleet check fleet.yaml",),
    "fleet render": ("fleetrl fleet render fleet.yaml --out k8s", "kubectl apply -f k8s"),
    "evaluate": (
        "fleetrl evaluate runs/FetchPush-v4-X --episodes 100 --first-seed 100000",
        "fleetrl evaluate runs/FetchPickAndPlace-v4-X --why --episodes 100",
    ),
    "report": ("fleetrl report runs/a runs/b --out compare.html",),
    "deploy-check": (
        "fleetrl deploy-check runs/FetchPush-v4-X --hz 120 --delay-ms 10",
        "fleetrl deploy-check runs/FetchPush-v4-X --sweep --int8 --episodes 20",
        "fleetrl deploy-check runs/FetchPush-v4-Y --sweep --ranges-from runs/FetchPush-v4-X",
    ),
    "export": ("fleetrl export runs/FetchPush-v4-X", "fleetrl export runs/FetchPush-v4-X --out policy.onnx --hz 120"),
}


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter, argparse.RawDescriptionHelpFormatter):
    """Each option's default after its help, unless the help already says it or there is none
    (a flag, an option with no default); the epilog's lines as written."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        unset = action.default is None or action.default is False or action.default in ([], "")
        if "default" in text or "%(default)" in text or unset or action.default is argparse.SUPPRESS:
            return text
        return super()._get_help_string(action) or text


class Parser(argparse.ArgumentParser):
    """fleetrl's parser: the help formatter above; subparsers are made of this class too. Each
    parser leaves its own `usage_error` in the namespace (the innermost wins), so an argument no
    parser knew is refused by the subcommand's parser: `fleetrl evaluate: error: ...`."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("formatter_class", HelpFormatter)
        super().__init__(*args, **kwargs)
        self.set_defaults(usage_error=self.error)

    def parse_args(self, args: Any = None, namespace: Any = None) -> Any:
        parsed, unknown = self.parse_known_args(args, namespace)
        if unknown:
            parsed.usage_error(f"unrecognized arguments: {' '.join(unknown)}")
        return parsed


def epilog(name: str) -> str:
    """The example(s) for `name` ("train", "fleet check"), the error format and the exit codes."""
    lines = [f"  {line}" for line in EXAMPLES.get(name, ())]
    return "\n".join(["example:" if len(lines) == 1 else "examples:", *lines, "", ERRORS, EXIT_CODES])


def page(name: str, summary: str) -> dict[str, Any]:
    """add_parser's keywords for subcommand `name`: the summary as help and description, the epilog."""
    return {"help": summary, "description": summary, "epilog": epilog(name)}


def package_version() -> str:
    """fleetrl's version: the installed package's, else the checkout's pyproject.toml's."""
    try:
        return metadata.version("fleetrl")
    except metadata.PackageNotFoundError:
        pass
    import tomllib

    pyproject = pathlib.Path(__file__).resolve().parents[2] / "pyproject.toml"
    try:
        return str(tomllib.loads(pyproject.read_text())["project"]["version"])
    except (OSError, KeyError, tomllib.TOMLDecodeError):
        return "unknown"
