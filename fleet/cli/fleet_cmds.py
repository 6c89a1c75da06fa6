"""`fleetrl fleet up|check|render` and `fleetrl redis-cluster --join`: the multi-host commands.

    fleetrl fleet check fleet.yaml                  # the plan: roles, ports to open, derived settings
    fleetrl fleet render fleet.yaml --out k8s       # Kubernetes manifests (fleet/launch/k8s.py)
    fleetrl fleet up fleet.yaml --host services     # this host's share, until the fleet stops
    fleetrl fleet slurm fleet.yaml --submit         # the whole fleet as one Slurm job (fleet/launch/slurm.py)

The spec's format: docs/fleet-spec.md. fleet/cli/args.py defines every other subcommand's arguments
(and calls add_fleet_parser); fleet/cli/main.py parses the command line and hands these here.
The config resolves as for every other subcommand (fleet/cli/resolve.py): the spec's `config`
under this host's --set.
"""

from __future__ import annotations

import argparse
import logging
import os
import pathlib
import sys
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from fleet.cli.help import page

if TYPE_CHECKING:
    from fleet.launch.spec_model import FleetSpec, HostSpec
    from foundation.config import RunConfig


def add_fleet_parser(sub: Any, common: Callable[[argparse.ArgumentParser], None]) -> None:
    """The `fleet` command and its subcommands; `common` adds --config/--set/--task."""
    fleet = sub.add_parser("fleet", **page("fleet", "a fleet over several hosts from one spec (docs/fleet-spec.md)"))
    fleet_sub = fleet.add_subparsers(dest="fleet_command", required=True, metavar="FLEET_COMMAND")
    spec_help = "fleet spec YAML: hosts, their addresses and roles (format: docs/fleet-spec.md)"
    up = fleet_sub.add_parser(
        "up", **page("fleet up", "start and supervise this host's roles from a fleet spec until the fleet stops")
    )
    up.add_argument("spec", help=spec_help)
    up.add_argument(
        "--host", required=True, help="which host of the spec this is; 'auto' in a Slurm job step (SLURM_PROCID)"
    )
    up.add_argument(
        "--until-signal",
        action="store_true",
        help="on the aggregator's host: run past the target and the caps, until SIGTERM or Ctrl-C",
    )
    common(up)
    slurm = fleet_sub.add_parser(
        "slurm",
        **page("fleet slurm", "write (with --submit, sbatch) a Slurm job running the whole fleet, a node per host"),
    )
    slurm.add_argument("spec", help=spec_help)
    slurm.add_argument("--submit", action="store_true", help="submit the script with sbatch (default: write it only)")
    slurm.add_argument("--out", default="", help="the script's path (default: <run_dir>/fleet.sbatch)")
    slurm.add_argument("--cpus-per-task", type=int, default=0, help="CPUs per host (default: one per role process)")
    slurm.add_argument("--time", type=int, default=0, help="time limit in minutes (default: max_wall_sec + 10)")
    slurm.add_argument("--partition", default="", help="sbatch --partition (default: the cluster's default)")
    slurm.add_argument("--sbatch-arg", action="append", default=[], help="another #SBATCH line, e.g. --account=lab")
    common(slurm)
    check = fleet_sub.add_parser(
        "check", **page("fleet check", "check a fleet spec; print each host's roles, the ports to open, the settings")
    )
    check.add_argument("spec", help=spec_help)
    common(check)
    render = fleet_sub.add_parser(
        "render", **page("fleet render", "write a fleet spec as Kubernetes manifests (untested on a cluster)")
    )
    render.add_argument("spec", help=spec_help)
    render.add_argument("--k8s", action="store_true", help="Kubernetes manifests: the one format, also without it")
    render.add_argument("--out", default="k8s", help="folder for the manifests")
    render.add_argument("--image", default="fleetrl:latest", help="container image built from the repo's Dockerfile")
    render.add_argument("--namespace", default="default", help="namespace of every object")
    common(render)


def redis_join(args: argparse.Namespace) -> int:
    """Form running nodes into one cluster once every one answers (CLUSTER MEET takes IPs)."""
    import socket

    from fleet.launch.cluster_admin import form_cluster, nodes_answer
    from foundation.transport import REDIS_PASSWORD_ENV, Security, parse_addresses

    auth = Security(redis_user=args.redis_user, redis_password=os.environ.get(REDIS_PASSWORD_ENV, ""))
    deadline = time.monotonic() + 300.0
    while True:
        try:
            nodes = [(socket.gethostbyname(host), port) for host, port in parse_addresses(args.join)]
            if nodes_answer(nodes, auth):
                break
        except OSError:  # a pod's name is published once it runs
            pass
        if time.monotonic() > deadline:
            raise TimeoutError(f"--join: not every node of {args.join} answered within 300 s")
        time.sleep(1.0)
    form_cluster(nodes, auth, replicas=args.replicas)
    print(f"cluster of {len(nodes)} nodes ok ({args.replicas} replicas per primary)", flush=True)
    return 0


def run_fleet(args: argparse.Namespace) -> int:
    """`fleet up`, `fleet check`, `fleet render`, `fleet slurm`: the spec, its config resolved as
    the CLI resolves every config (the spec's task preset under its config and this host's --set)."""
    from fleet.cli.resolve import config_request, resolve_config
    from fleet.launch.spec import FleetHost, load_spec
    from foundation.process import setup_logging, stop_event

    spec = load_spec(args.spec)
    config = spec.config(resolve_config(config_request(args, before=spec.overrides)))
    if args.fleet_command == "check":
        return _check(args, spec, config)
    if args.fleet_command == "render":
        return _render(args, spec, config)
    if args.fleet_command == "slurm":
        return _slurm(args, spec, config, args.set)
    host = args.host
    if host == "auto":
        from fleet.launch.slurm import place_from_env

        spec, host = place_from_env(spec)  # every host at its node's address; CPUs Slurm's
    else:
        _check_cpus(args.spec, spec, host)
    setup_logging(f"fleet-{host}")
    if not config.security.enabled:
        logging.getLogger("fleetrl").warning("security.enabled is false: whoever reaches these ports is in the fleet")
    FleetHost(spec, host, config, stop_event()).run(until_signal=args.until_signal)
    return 0


def _check_cpus(path: str, spec: FleetSpec, host: str | None = None) -> None:
    """ConfigError naming the file and line of a `cpus` entry beyond its host's CPUs: with `host`
    (the host this process runs, `fleet up`), that host's against this machine's CPUs; without,
    every host at this machine's address (the others' CPUs are not known here)."""
    from fleet.launch.spec_checks import check_cpus, is_this_machine
    from fleet.launch.spec_schema import key_lines

    cpus = os.cpu_count() or 1  # `cpus` are CPU numbers, as taskset takes them

    def limit(h: HostSpec) -> int | None:
        return cpus if (h.name == host if host else is_this_machine(h.address)) else None

    check_cpus(spec, path, key_lines(pathlib.Path(path).read_text()), limit)


def _check(args: argparse.Namespace, spec: FleetSpec, config: RunConfig) -> int:
    """`fleet check`: refuse what cannot run, warn of what would run without a point, print the plan."""
    from fleet.launch.spec_checks import spec_warnings
    from fleet.launch.spec_plan import plan_lines

    _check_cpus(args.spec, spec)
    for warning in spec_warnings(spec, args.spec):
        print(f"fleetrl fleet check: warning: {warning}", file=sys.stderr)
    print(f"{args.spec}: ok")
    print("\n".join(plan_lines(spec, config)))
    return 0


def _render(args: argparse.Namespace, spec: FleetSpec, config: RunConfig) -> int:
    """`fleet render`: the manifests' paths, then what to run to start the fleet."""
    from fleet.launch.k8s import next_steps, write_manifests

    for path in write_manifests(spec, config, args.out, image=args.image, namespace=args.namespace):
        print(path)
    print("\nnext steps:")
    print("\n".join(f"  {step}" for step in next_steps(spec, config, args.out, args.namespace)))
    return 0


def _slurm(args: argparse.Namespace, spec: FleetSpec, config: RunConfig, overrides: list[str]) -> int:
    """`fleet slurm`: the batch script, and with --submit the job (fresh secrets when none are set)."""
    import secrets

    from fleet.launch.slurm import SbatchOptions, sbatch_script, submit
    from fleet.launch.spec_checks import check_cpus
    from fleet.launch.spec_schema import key_lines
    from foundation.transport import REDIS_PASSWORD_ENV, TOKEN_ENV

    if args.cpus_per_task:  # under Slurm `cpus` are positions within the task's CPUs
        lines = key_lines(pathlib.Path(args.spec).read_text())
        check_cpus(spec, args.spec, lines, lambda host: args.cpus_per_task)

    host_args = [arg for item in overrides for arg in ("--set", item)]  # every host resolves the config as here
    config_path = str(pathlib.Path(args.config).resolve()) if args.config else None
    shorthands = {"--config": config_path, "--task": args.task, "--tasks": args.tasks, "--run-id": args.run_id}
    for flag, value in shorthands.items():
        if value:
            host_args += [flag, value]
    options = SbatchOptions(args.cpus_per_task, args.time, args.partition, tuple(args.sbatch_arg), tuple(host_args))
    script = sbatch_script(spec, pathlib.Path(args.spec), config.max_wall_sec, options)
    out = pathlib.Path(args.out or pathlib.Path(spec.run_dir) / "fleet.sbatch")
    out.parent.mkdir(parents=True, exist_ok=True)
    pathlib.Path(spec.run_dir).mkdir(parents=True, exist_ok=True)  # sbatch opens its --output there
    out.write_text(script)
    print(script, end="")
    print(f"# written to {out}", flush=True)
    if not args.submit:
        print(f"# submit it with: sbatch {out}")
        return 0
    env = dict(os.environ)
    sec = config.security
    for var, file in ((TOKEN_ENV, sec.token_file), (REDIS_PASSWORD_ENV, sec.redis_password_file)):
        if sec.enabled and not (env.get(var) or file):  # every task inherits sbatch's environment
            env[var] = secrets.token_urlsafe(32)
            print(f"# {var} was not set: a fresh one goes to this job's environment only")
    job = submit(out, env)
    print(f"submitted job {job}: output in {pathlib.Path(spec.run_dir).resolve()}/slurm-{job}.out", flush=True)
    return 0
