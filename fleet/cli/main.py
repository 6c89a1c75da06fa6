"""`fleetrl` command line: the only place that parses arguments.

    fleetrl train --task FetchReach-v4            # whole local fleet, live progress, run dir
    fleetrl config                                # every config field with its help line
    fleetrl redis-cluster                         # a local Redis Cluster until Ctrl-C
    fleetrl buffer     --config C --redis R [--port P]
    fleetrl aggregator --config C [--port P] [--run-dir D]
    fleetrl learner    --config C --redis R --aggregator A [--id N]
    fleetrl sampler    --config C --buffer B --aggregator A [--id N]
    fleetrl evaluator  --config C --buffer B --aggregator A
    fleetrl export     --checkpoint CKPT --out policy.onnx
    fleetrl evaluate   RUN_DIR [--episodes 50]                  # score the run's last checkpoint
    fleetrl deploy-check RUN_DIR --hz 120 [--delay-ms 10]      # the exported policy as a 120 Hz controller
    fleetrl fleet up   fleet.yaml --host NAME                   # this host's share of a multi-host fleet
    fleetrl fleet check fleet.yaml                              # roles, ports to open, derived settings
    fleetrl fleet render --k8s fleet.yaml [--out DIR]           # Kubernetes manifests from the spec
    fleetrl report     RUN_DIR [RUN_DIR ...] [--out HTML]       # curves, updates/s, CPU per role
    fleetrl certs      --out DIR [--hosts H1,H2]                 # a self-signed TLS set for a fleet

Each role subcommand takes the addresses of the services it needs, so the same fleet can be
spread over hosts: start `redis-cluster` (or point at your own cluster), then the buffer and
aggregator, then as many samplers and learners as you like, all with the same --config.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import logging
import pathlib
import sys
import time
from typing import TYPE_CHECKING, Any

from fleet.cli.args import build_parser

if TYPE_CHECKING:
    from foundation.role import Role

STARTED_AT = time.monotonic()  # wall-clock figures count from the command's start


def _config(args: argparse.Namespace):
    from fleet.cli.presets import preset_for
    from foundation.config import RunConfig, with_overrides

    overrides = list(args.set)
    shorthands = {
        "task": "sim.task",
        "run_id": "run_id",
        "samplers": "sampler.num_samplers",
        "learners": "learner.num_learners",
        "target_success": "target_success",
        "max_wall_sec": "max_wall_sec",
    }
    for attr, dotted in shorthands.items():
        value = getattr(args, attr, None)
        if value is not None:
            overrides.append(f"{dotted}={json.dumps(value)}")
    if getattr(args, "tasks", None):
        tasks = [t.strip() for t in args.tasks.split(",") if t.strip()]
        overrides += [f"sim.tasks={json.dumps(tasks)}", f"sim.task={json.dumps(tasks[0])}"]
    if getattr(args, "seed", None) is not None:
        overrides += [f"sampler.seed={args.seed}", f"aggregator.seed={args.seed}"]
    if getattr(args, "run_dir", None) and args.command == "train":
        overrides.append(f"run_dir={json.dumps(args.run_dir)}")
    if args.config:  # a resolved config (presets included) from `fleetrl config --json`
        return with_overrides(RunConfig.load(args.config), overrides)
    # The presets go under the overrides, so a user's --set always wins; what the user set
    # (the tasks, the model) picks them.
    return with_overrides(preset_for(with_overrides(RunConfig(), overrides), overrides), overrides)


def _train(args: argparse.Namespace) -> int:
    import dataclasses

    from fleet.launch.local_fleet import LocalFleet

    if args.resume:
        run_dir = pathlib.Path(args.resume)
        if not (run_dir / "config.json").exists():
            from foundation.config import ConfigError

            raise ConfigError(f"--resume {run_dir}: no config.json there (not a run directory)")
        args.config = str(run_dir / "config.json")  # the run's own config; --set still overrides
        args.run_dir = str(run_dir)
    if args.redis_replicas < 0 or (args.redis_replicas and args.mode == "sync"):
        from foundation.config import ConfigError

        raise ConfigError(
            f"--redis-replicas ({args.redis_replicas}) must be >= 0, and 0 with --mode sync (which starts no Redis)"
        )
    if args.redis_replicas and not any(s.startswith("buffer.replicas_to_ack=") for s in args.set):
        args.set.append("buffer.replicas_to_ack=1")  # as a fleet spec's redis_replicas does
    config = _config(args)
    from foundation.acting import check_keep_dims
    from sim.tasks import TaskSet

    # a bad task list, or an option the task's actions cannot take, fails here, not in every role
    check_keep_dims(config.sampler.random_keep_dims, TaskSet.for_run(config).act_dim)
    _check_control_rate(config, TaskSet.for_run(config))
    if not args.run_dir and not any(s.startswith("run_dir=") for s in args.set):
        stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
        config = dataclasses.replace(config, run_dir=f"runs/{config.sim.task}-{stamp}")
    if args.mode == "sync":
        if args.resume:
            from foundation.config import ConfigError

            raise ConfigError("--resume continues a fleet run; --mode sync starts afresh")
        from fleet.launch.sync import run_sync
        from foundation.process import stop_event

        summary = run_sync(config, STARTED_AT, stop_event())
    else:
        summary = LocalFleet(config, started_at=STARTED_AT, redis_replicas=args.redis_replicas).run()
    print(f"\n{summary.stop_reason}")
    if summary.reached_target:
        print(
            f"reached {summary.target_success:.0%} evaluation success in {summary.wall_sec_to_target:.1f}s "
            f"and {summary.env_steps_to_target} env steps (version {summary.version_to_target})"
        )
    holds = "checkpoints/, tb/ for TensorBoard, logs/" if summary.mode == "async" else "evals.jsonl, checkpoints/"
    print(f"results: {summary.run_dir} (summary.json, {holds})")
    return 0 if summary.reached_target or "interrupted" in summary.stop_reason else 1


def _check_control_rate(config, tasks) -> None:
    """sim.control_hz every task of the run can run at (sim/registry.py), checked before any role starts."""
    from foundation.config import ConfigError
    from sim.registry import control_rate_problem

    for spec in tasks.tasks:
        if problem := control_rate_problem(spec, config.sim.control_hz):
            raise ConfigError(problem, field="sim.control_hz")


def _role(args: argparse.Namespace) -> int:
    from foundation.process import Heartbeat, die_with_parent, setup_logging, stop_event
    from foundation.transport import Security

    config = _config(args).validate()
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
    heartbeat = Heartbeat(args.heartbeat, interval_sec=1.0 if args.command in ("buffer", "aggregator") else 2.0)
    role(config, args.id, endpoints, security, stop, heartbeat)  # the one role shape: foundation/role.py
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


def _redis_cluster(args: argparse.Namespace) -> int:
    import secrets

    from fleet.launch.local_cluster import LocalRedisCluster
    from foundation.process import stop_event
    from foundation.transport import Security

    if args.join:
        from fleet.cli.fleet_cmds import redis_join

        return redis_join(args)
    stop = stop_event()
    ports = [int(p) for p in args.ports.split(",")] if args.ports else None
    password = "" if args.no_password else secrets.token_urlsafe(32)
    auth = Security(redis_user="fleetrl", redis_password=password)
    try:
        cluster = LocalRedisCluster(
            args.primaries, host=args.host, ports=ports, appendonly=args.appendonly, auth=auth, replicas=args.replicas
        )
    except ValueError as err:
        from foundation.config import ConfigError

        raise ConfigError(str(err)) from err
    with cluster:
        print(cluster.addresses, flush=True)
        if password:
            print(f"export FLEETRL_REDIS_PASSWORD={password}   # every role that reaches these nodes", flush=True)
        stop.wait()
    return 0


def _evaluate(args: argparse.Namespace) -> int:
    from foundation.config import ConfigError, RunConfig
    from sampler.evaluator import score_checkpoint

    run_dir = pathlib.Path(args.run_dir)
    if not (run_dir / "config.json").exists():
        raise ConfigError(f"{run_dir}: no config.json there (not a run directory)")
    if args.episodes < 1:
        raise ConfigError(f"--episodes: {args.episodes} < 1")
    if args.first_seed is not None and args.first_seed < 0:
        raise ConfigError(f"--first-seed: {args.first_seed} < 0")
    config = RunConfig.load(str(run_dir / "config.json"))
    if args.first_seed is not None:
        config = dataclasses.replace(config, eval=dataclasses.replace(config.eval, seed=args.first_seed))
    source = args.checkpoint or run_dir / "checkpoints"
    version, result = score_checkpoint(source, config, args.episodes, args.weights)
    outcome = {
        "run_dir": str(run_dir),
        "version": version,
        "weights": args.weights,
        "first_seed": config.eval.seed,
        "episodes": result.episodes,
        "success_rate": result.success_rate,
        "mean_return": result.mean_return,
        **({"task_success": result.task_success} if result.task_success else {}),
    }
    if args.json:
        print(json.dumps(outcome))
    else:
        print(f"version {version}: success {result.success_rate:.2f} over {result.episodes} episodes")
    return 0


def _listen(args: argparse.Namespace) -> tuple[str, str | None]:
    """(listen, advertise) of a service from --listen/--advertise, or --port on loopback."""
    listen = args.listen or f"127.0.0.1:{args.port}"
    return listen, args.advertise


def _deploy_check(args: argparse.Namespace) -> int:
    from deploy_npu.controller import controller_checks

    reports, skipped = controller_checks(
        args.run_dir, hz=args.hz, delay_ms=args.delay_ms, episodes=args.episodes, seed=args.seed,
        onnx_path=args.onnx, retime=args.retime, nominal=args.nominal,
    )  # fmt: skip
    print("\n\n".join([report.summary() for report in reports] + [f"skipped    {t}: {w}" for t, w in skipped.items()]))
    if args.json:
        settings = {"run_dir": args.run_dir, "hz": args.hz, "delay_ms": args.delay_ms, "seed": args.seed}
        settings |= {"retime": args.retime, "nominal": args.nominal}
        rows = [dataclasses.asdict(r) | {"passed": r.passed} for r in reports]
        out = settings | {"tasks": rows, "skipped": skipped}
        pathlib.Path(args.json).write_text(json.dumps(out, indent=1) + "\n")
    return 0 if reports and all(report.passed for report in reports) else 1


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    export_args = bool(argv) and argv[0] == "export"
    args = build_parser(__doc__.split("\n\n")[0], export_args).parse_args(argv)
    from foundation.config import help_lines
    from foundation.errors import FleetrlError

    try:
        if args.command == "train":
            return _train(args)
        if args.command == "config":
            config = _config(args).validate()
            print(config.to_json() if args.json else "\n".join(help_lines(config)))
            return 0
        if args.command == "redis-cluster":
            return _redis_cluster(args)
        if args.command == "certs":
            from foundation.certs import main as certs_main  # cryptography loads only here

            return certs_main(args)
        if args.command == "report":
            from fleet.report.render import main as report_main

            return report_main(args)
        if args.command == "export":
            from deploy_npu.cli import run

            return run(args)
        if args.command == "deploy-check":
            return _deploy_check(args)
        if args.command == "evaluate":
            return _evaluate(args)
        if args.command == "fleet":
            from fleet.cli.fleet_cmds import run_fleet

            return run_fleet(args, _config)
        return _role(args)
    except FleetrlError as err:  # every error fleetrl raises on purpose: bad input 2, a failed run 1
        label = f"{err.label}: " if err.label else ""
        print(f"fleetrl: {label}{err}", file=sys.stderr)
        return err.exit_status
    except TimeoutError as err:
        print(f"fleetrl: {err}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
