"""The handlers of `fleetrl train`, `config`, `evaluate`, `deploy-check`, `export` and `redis-cluster`:
each takes the parsed arguments (never changing them) and returns the exit status.

    status = train(args)          # fleet/cli/main.py's HANDLERS maps each subcommand to one of these

Each handler imports only what its subcommand needs, so `--help` and the light subcommands start fast.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import pathlib
import time
from typing import TYPE_CHECKING

from fleet.cli.resolve import (
    config_request,
    existing_run_dir,
    last_checkpoint_dir,
    load_config,
    resolve_config,
    with_run_dir,
)
from foundation.config import ConfigError

if TYPE_CHECKING:
    from deploy_npu.envelope import SweepRanges
    from fleet.report.summary import Summary
    from foundation.config import RunConfig
    from sim.tasks import TaskSet

STARTED_AT = time.monotonic()  # wall-clock figures count from the command's start


@dataclasses.dataclass(frozen=True)
class TrainStart:
    """Where `train` starts from: a fresh run, or with --resume the run's own config and directory."""

    config_path: str | None  # None: the built-in defaults and the task's preset
    run_dir: str | None  # None: default_run_dir, unless --set names one


def _train_start(args: argparse.Namespace) -> TrainStart:
    if not args.resume:
        return TrainStart(args.config, args.run_dir)
    run_dir = existing_run_dir(args.resume)
    if args.mode == "sync":
        raise ConfigError("--resume continues a fleet run; --mode sync starts afresh", field="--resume")
    return TrainStart(str(run_dir / "config.json"), str(run_dir))  # --set still overrides


def train(args: argparse.Namespace) -> int:
    """A local fleet (or --mode sync) until the run stops; 0 when it reached its target or was interrupted."""
    if args.redis_replicas < 0 or (args.redis_replicas and args.mode == "sync"):
        raise ConfigError(
            f"--redis-replicas ({args.redis_replicas}) must be >= 0, and 0 with --mode sync (which starts no Redis)"
        )
    start = _train_start(args)
    after = [f"run_dir={json.dumps(start.run_dir)}"] if start.run_dir else []
    if args.redis_replicas and not any(s.startswith("buffer.replicas_to_ack=") for s in args.set):
        after.append("buffer.replicas_to_ack=1")  # as a fleet spec's redis_replicas does
    request = config_request(args, after=after, config_path=start.config_path)
    config = with_run_dir(resolve_config(request), request).validate()
    from sim.tasks import TaskSet

    _check_tasks(config, TaskSet.for_run(config))  # a bad task list fails here, not in every role
    if args.mode == "sync":
        from fleet.launch.sync import run_sync
        from foundation.process import stop_event

        summary = run_sync(config, STARTED_AT, stop_event())
    else:
        from fleet.launch.local_fleet import LocalFleet

        summary = LocalFleet(config, started_at=STARTED_AT, redis_replicas=args.redis_replicas).run()
    _print_outcome(summary)
    return 0 if summary.reached_target or "interrupted" in summary.stop_reason else 1


def _check_tasks(config: RunConfig, tasks: TaskSet) -> None:
    """The options the run's tasks cannot take, before any role starts: random_keep_dims beyond
    their actions, a sim.control_hz a task cannot run at (sim/registry.py), a flow-control
    tolerance smaller than one episode's push (buffer/ratelimit.py)."""
    from buffer.ratelimit import tolerance_problem
    from foundation.acting import check_keep_dims
    from sim.registry import control_rate_problem

    check_keep_dims(config.sampler.random_keep_dims, tasks.act_dim)
    if problem := tolerance_problem(config):
        raise ConfigError(problem, field="buffer.rate_tolerance_rows")
    for spec in tasks.tasks:
        if problem := control_rate_problem(spec, config.sim.control_hz):
            raise ConfigError(problem, field="sim.control_hz")


def _print_outcome(summary: Summary) -> None:
    print(f"\n{summary.stop_reason}")
    if summary.reached_target:
        print(
            f"reached {summary.target_success:.0%} evaluation success in {summary.wall_sec_to_target:.1f}s "
            f"and {summary.env_steps_to_target} env steps (version {summary.version_to_target})"
        )
    holds = "checkpoints/, tb/ for TensorBoard, logs/" if summary.mode == "async" else "evals.jsonl, checkpoints/"
    print(f"results: {summary.run_dir} (summary.json, {holds})")


def config(args: argparse.Namespace) -> int:
    """Every field with its help line (--changed: only those that differ from the defaults), or the JSON."""
    import shutil

    from foundation.config import config_changes, help_lines

    request = config_request(args)
    resolved = with_run_dir(resolve_config(request), request).validate()
    if args.json:
        print(resolved.to_json())
        return 0
    width = shutil.get_terminal_size((100, 24)).columns
    if args.changed:
        lines = [f"{c.name} = {c.value!r}  [default {c.default!r}]" for c in config_changes(resolved)]
        print("\n".join(lines) if lines else "(every field at its default)")
        return 0
    print("\n".join(help_lines(resolved, width=width)))
    return 0


def evaluate(args: argparse.Namespace) -> int:
    """Score the run's newest checkpoint (or --checkpoint) on held-out episodes; --why classifies the failures."""
    from sampler.evaluator import score_checkpoint

    run_dir = existing_run_dir(args.run_dir)
    why_out = None
    if args.why or args.out:
        from fleet.cli.why import out_dir

        why_out = out_dir(args, run_dir)  # a bad --out is refused before any episode runs
    if args.episodes < 1:
        raise ConfigError(f"--episodes: {args.episodes} < 1", field="--episodes")
    if args.first_seed is not None and args.first_seed < 0:
        raise ConfigError(f"--first-seed: {args.first_seed} < 0", field="--first-seed")
    run_config = load_config(run_dir / "config.json", "run directory's config")
    if args.first_seed is not None:
        run_config = dataclasses.replace(run_config, eval=dataclasses.replace(run_config.eval, seed=args.first_seed))
    source = _checkpoint(args.checkpoint) if args.checkpoint else last_checkpoint_dir(run_dir)
    if why_out is not None:  # --why
        from fleet.cli.why import why

        return why(args, run_dir, run_config, source, why_out)  # every failure classified (fleet/cli/why.py)
    version, result = score_checkpoint(source, run_config, args.episodes, args.weights)
    outcome = {
        "run_dir": str(run_dir),
        "version": version,
        "weights": args.weights,
        "first_seed": run_config.eval.seed,
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


def _checkpoint(path: str) -> pathlib.Path:
    if not pathlib.Path(path).exists():
        raise ConfigError(f"--checkpoint {path}: no such file or folder (a ckpt_<version>.pt or its folder)")
    return pathlib.Path(path)


def deploy_check(args: argparse.Namespace) -> int:
    """The run's exported policy as a fixed-rate controller; 0 when every task's check passed."""
    from deploy_npu.controller import controller_checks

    if args.ranges_from is not None and not args.sweep:
        raise ConfigError("--ranges-from is read only with --sweep (it sets the sweep's points)")
    ranges = None
    if args.sweep and args.ranges_from is not None:
        from deploy_npu.envelope import ranges_of

        ranges = ranges_of(args.ranges_from)
    last_checkpoint_dir(existing_run_dir(args.run_dir))
    if args.sweep:
        return _sweep(args, ranges)
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


def _sweep(args: argparse.Namespace, ranges: SweepRanges | None) -> int:
    """`deploy-check --sweep`: the robustness envelope of every task's controller (deploy_npu/envelope.py),
    its scale axes at multiples of `ranges` (None: the run's own)."""
    from deploy_npu.envelope import AXES
    from deploy_npu.envelope_run import SweepSetting, sweep

    axes = tuple(a.strip() for a in args.axes.split(",")) if args.axes else AXES
    setting = SweepSetting(
        hz=args.hz, delay_ms=args.delay_ms, episodes=args.episodes, seed=args.seed, int8=args.int8,
        workers=args.workers, axes=axes, ranges=ranges,
    )  # fmt: skip
    envelopes = sweep(args.run_dir, setting)
    print("\n\n".join(envelope.table() for envelope in envelopes))
    print(f"envelope: {pathlib.Path(args.run_dir) / 'envelope'} (<task>.json, <task>.png)")
    if args.json:
        pathlib.Path(args.json).write_text(json.dumps([dataclasses.asdict(e) for e in envelopes], indent=1) + "\n")
    return 0


def export(args: argparse.Namespace) -> int:
    """`fleetrl export RUN_DIR` (or --checkpoint): the graphs and their checks (deploy_npu/cli.py)."""
    from fleet.cli.resolve import check_task_name

    if bool(args.run_dir) == bool(args.checkpoint):
        raise ConfigError("export takes a run directory (RUN_DIR) or --checkpoint, exactly one of them")
    for task in args.task or ():
        check_task_name(task, "--task")
    if args.run_dir:
        source = last_checkpoint_dir(existing_run_dir(args.run_dir))
        out = args.out or str(pathlib.Path(args.run_dir) / "deploy") + "/"
    else:
        source = _checkpoint(args.checkpoint)
        if not args.out:
            raise ConfigError("--out is needed with --checkpoint (with RUN_DIR it defaults to RUN_DIR/deploy/)")
        out = args.out
    from deploy_npu.cli import ExportTarget, run

    return run(args, ExportTarget(str(source), out))


def redis_cluster(args: argparse.Namespace) -> int:
    """A local Redis Cluster until Ctrl-C, or with --join: form running nodes into one and exit."""
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
        raise ConfigError(str(err)) from err
    with cluster:
        print(cluster.addresses, flush=True)
        if password:
            print(f"export FLEETRL_REDIS_PASSWORD={password}   # every role that reaches these nodes", flush=True)
        stop.wait()
    return 0
