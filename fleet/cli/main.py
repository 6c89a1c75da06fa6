"""`fleetrl` command line: the only place that parses arguments.

    fleetrl train --task FetchReach-v4            # whole local fleet, live progress, run dir
    fleetrl config [--changed]                    # every config field with its help line (or only the changed)
    fleetrl redis-cluster                         # a local Redis Cluster until Ctrl-C
    fleetrl buffer     --config C --redis R [--port P]
    fleetrl aggregator --config C [--port P] [--run-dir D]
    fleetrl learner    --config C --redis R --aggregator A [--id N]
    fleetrl sampler    --config C --buffer B --aggregator A [--id N]
    fleetrl evaluator  --config C --buffer B --aggregator A
    fleetrl export     RUN_DIR [--out policy.onnx]               # the run's newest checkpoint as ONNX, checked
    fleetrl evaluate   RUN_DIR [--episodes 50]                  # score the run's last checkpoint
    fleetrl deploy-check RUN_DIR --hz 120 [--delay-ms 10]      # the exported policy as a 120 Hz controller
    fleetrl fleet up   fleet.yaml --host NAME                   # this host's share of a multi-host fleet
    fleetrl fleet check fleet.yaml                              # roles, ports to open, derived settings
    fleetrl fleet render fleet.yaml [--out DIR]                 # Kubernetes manifests from the spec
    fleetrl report     RUN_DIR [RUN_DIR ...] [--out HTML]       # curves, updates/s, CPU per role
    fleetrl certs      --out DIR [--hosts H1,H2]                 # a self-signed TLS set for a fleet

Each role subcommand takes the addresses of the services it needs, so the same fleet can be
spread over hosts: start `redis-cluster` (or point at your own cluster), then the buffer and
aggregator, then as many samplers and learners as you like, all with the same --config.

Each subcommand has one handler in HANDLERS (fleet/cli/commands.py holds most); an error is
printed as `fleetrl <subcommand>: error: <message>` and exits 2 for a user's mistake, 1 for a
failed run, 130 on Ctrl-C (fleet/cli/help.py's EXIT_CODES, shown by every --help).
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from fleet.cli.args import SERVICES, build_parser

if TYPE_CHECKING:
    from foundation.role import Role

ROLES = ("buffer", "aggregator", "learner", "sampler", "evaluator")


def _role(args: argparse.Namespace) -> int:
    """One process of a role, with the addresses of the services it needs (the one role shape: foundation/role.py)."""
    from fleet.cli.resolve import config_request, resolve_config
    from foundation.process import Heartbeat, die_with_parent, setup_logging, stop_event
    from foundation.transport import Security

    config = resolve_config(config_request(args)).validate()
    setup_logging(f"{args.command}-{args.id}")
    die_with_parent()
    stop = stop_event()
    security = Security.from_config(config.security)  # the token and Redis password (files or env)
    if args.metrics:
        from foundation.metrics import RoleMetrics
        from foundation.process import use_metrics

        try:
            use_metrics(RoleMetrics(f"{args.command}-{args.id}", args.metrics))
        except OSError as err:  # a taken port costs the metrics, never the role
            logging.getLogger("fleetrl").warning("no Prometheus metrics on %s: %s", args.metrics, err)
    role, endpoints = _role_entry(args)
    # Services beat every second, workers every two (a heartbeat costs a file write).
    heartbeat = Heartbeat(args.heartbeat, interval_sec=1.0 if args.command in SERVICES else 2.0)
    role(config, args.id, endpoints, security, stop, heartbeat)
    return 0


def _role_entry(args: argparse.Namespace) -> tuple[Role[Any], object]:
    """The role's entry point and its endpoints, from the command line (imports only that role)."""
    if args.command == "buffer":
        from buffer.service import IngestEndpoints, run_ingest_service

        listen, advertise = _listen(args)  # only the services take --listen/--advertise/--port
        return run_ingest_service, IngestEndpoints(listen, args.redis, advertise, args.ready_file)
    if args.command == "aggregator":
        from aggregator.service import AggregatorEndpoints, run_aggregator

        listen, advertise = _listen(args)
        return run_aggregator, AggregatorEndpoints(listen, advertise, args.ready_file, args.run_dir)
    if args.command == "learner":
        from learner.worker import LearnerEndpoints, run_learner

        return run_learner, LearnerEndpoints(args.aggregator, args.redis, args.ack_log)
    if args.command == "sampler":
        from sampler.worker import SamplerEndpoints, run_sampler

        return run_sampler, SamplerEndpoints(args.buffer, args.aggregator, args.ack_log)
    from sampler.evaluator import EvaluatorEndpoints, run_evaluator

    return run_evaluator, EvaluatorEndpoints(args.buffer, args.aggregator)


def _listen(args: argparse.Namespace) -> tuple[str, str | None]:
    """(listen, advertise) of a service from --listen/--advertise, or --port on loopback."""
    listen = args.listen or f"127.0.0.1:{args.port}"
    return listen, args.advertise


def _certs(args: argparse.Namespace) -> int:
    from foundation.certs import main as certs_main  # cryptography loads only here

    return certs_main(args)


def _report(args: argparse.Namespace) -> int:
    from fleet.report.render import main as report_main  # matplotlib loads only here

    return report_main(args)


def _fleet(args: argparse.Namespace) -> int:
    from fleet.cli import fleet_cmds

    return fleet_cmds.run_fleet(args)


def _command(name: str) -> Callable[[argparse.Namespace], int]:
    """fleet/cli/commands.py's `name`, imported at the call: parsing and --help load no config (nor numpy)."""

    def handler(args: argparse.Namespace) -> int:
        from fleet.cli import commands

        run: Callable[[argparse.Namespace], int] = getattr(commands, name)
        return run(args)

    return handler


HANDLERS: dict[str, Callable[[argparse.Namespace], int]] = {
    "train": _command("train"),
    "config": _command("config"),
    "redis-cluster": _command("redis_cluster"),
    **dict.fromkeys(ROLES, _role),
    "certs": _certs,
    "fleet": _fleet,
    "evaluate": _command("evaluate"),
    "report": _report,
    "deploy-check": _command("deploy_check"),
    "export": _command("export"),
}


def command_name(args: argparse.Namespace) -> str:
    """The subcommand as the user typed it: "train", "fleet check"."""
    sub = getattr(args, "fleet_command", None)
    return f"{args.command} {sub}" if sub else args.command


def main(argv: list[str] | None = None) -> int:
    """Parse, dispatch by HANDLERS, and print any error as `fleetrl <subcommand>: error: <message>`."""
    args = build_parser(__doc__.split("\n\n")[0]).parse_args(sys.argv[1:] if argv is None else argv)
    from foundation.errors import FleetrlError

    def fail(message: object, status: int) -> int:
        print(f"fleetrl {command_name(args)}: error: {message}", file=sys.stderr)
        return status

    try:
        return HANDLERS[args.command](args)
    except FleetrlError as err:  # every error fleetrl raises on purpose: bad input 2, a failed run 1
        return fail(err, err.exit_status)
    except BrokenPipeError:  # the reader stopped early (`fleetrl config | head`): nothing more to say
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1
    except (TimeoutError, OSError) as err:  # the machine or the network failed the command
        return fail(err, 1)
    except KeyboardInterrupt:
        return fail("interrupted", 130)


if __name__ == "__main__":
    sys.exit(main())
