"""`fleetrl fleet up|check|render` and `fleetrl redis-cluster --join`: the multi-host commands.

    fleetrl fleet check fleet.yaml                  # the plan: roles, ports to open, derived settings
    fleetrl fleet render --k8s fleet.yaml --out k8s # Kubernetes manifests (fleet/launch/k8s.py)
    fleetrl fleet up fleet.yaml --host services     # this host's share, until the fleet stops
    fleetrl fleet slurm fleet.yaml --submit         # the whole fleet as one Slurm job (fleet/launch/slurm.py)

The spec's format: docs/fleet-spec.md. fleet/cli/args.py defines every other subcommand's arguments
(and calls add_fleet_parser); fleet/cli/main.py parses the command line and hands these here.
"""

from __future__ import annotations

import argparse
import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from fleet.launch.spec import FleetSpec
    from foundation.config import RunConfig


def add_fleet_parser(sub: Any, common: Callable[[argparse.ArgumentParser], None]) -> None:
    """The `fleet` command and its subcommands; `common` adds --config/--set/--task."""
    fleet = sub.add_parser("fleet", help="a fleet over several hosts from one spec (docs/fleet-spec.md)")
    fleet_sub = fleet.add_subparsers(dest="fleet_command", required=True)
    spec_help = "fleet spec YAML: hosts, their addresses and roles (format: docs/fleet-spec.md)"
    up = fleet_sub.add_parser(
        "up", help="start and supervise this host's roles from a fleet spec until the fleet stops (or Ctrl-C)"
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
        "slurm", help="write (and with --submit, sbatch) a Slurm job that runs the whole fleet, a node per host"
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
        "check", help="check a fleet spec; print each host's roles, the ports to open and the derived settings"
    )
    check.add_argument("spec", help=spec_help)
    common(check)
    render = fleet_sub.add_parser("render", help="write a fleet spec as Kubernetes manifests (untested on a cluster)")
    render.add_argument("spec", help=spec_help)
    render.add_argument("--k8s", action="store_true", required=True, help="Kubernetes manifests (the one format)")
    render.add_argument("--out", default="k8s", help="folder for the manifests (default: k8s)")
    render.add_argument("--image", default="fleetrl:latest", help="container image built from the repo's Dockerfile")
    render.add_argument("--namespace", default="default", help="namespace of every object")
    common(render)


def redis_join(args: argparse.Namespace) -> int:
    """Form running nodes into one cluster once every one answers (CLUSTER MEET takes IPs)."""
    import os
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


def run_fleet(args: argparse.Namespace, resolve: Callable[[argparse.Namespace], RunConfig]) -> int:
    """`fleet up`, `fleet check`, `fleet render`: the spec, its config resolved as the CLI does
    (`resolve`: the spec's task preset under its config and this host's --set)."""
    from fleet.launch.spec import FleetHost, FleetSpec
    from foundation.process import setup_logging, stop_event

    spec = FleetSpec.load(args.spec)
    host_overrides = list(args.set)
    args.set = [*spec.overrides, *args.set]  # the spec's config, then this host's own --set
    config = spec.config(resolve(args))  # the preset of the spec's task underneath
    if args.fleet_command == "check":
        from fleet.launch.spec_plan import plan_lines

        print(f"{args.spec}: ok")
        print("\n".join(plan_lines(spec, config)))
        return 0
    if args.fleet_command == "render":
        from fleet.launch.k8s import write_manifests

        for path in write_manifests(spec, config, args.out, image=args.image, namespace=args.namespace):
            print(path)
        return 0
    if args.fleet_command == "slurm":
        return _slurm(args, spec, config, host_overrides)
    if args.host == "auto":
        from fleet.launch.slurm import place_from_env

        spec, args.host = place_from_env(spec)  # every host at its node's address; CPUs Slurm's
    setup_logging(f"fleet-{args.host}")
    if not config.security.enabled:
        logging.getLogger("fleetrl").warning("security.enabled is false: whoever reaches these ports is in the fleet")
    FleetHost(spec, args.host, config, stop_event()).run(until_signal=args.until_signal)
    return 0


def _slurm(args: argparse.Namespace, spec: FleetSpec, config: RunConfig, overrides: list[str]) -> int:
    """`fleet slurm`: the batch script, and with --submit the job (fresh secrets when none are set)."""
    import os
    import pathlib
    import secrets

    from fleet.launch.slurm import SbatchOptions, sbatch_script, submit
    from foundation.transport import REDIS_PASSWORD_ENV, TOKEN_ENV

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
