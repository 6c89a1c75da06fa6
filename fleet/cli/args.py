"""The `fleetrl` argument parser, one function per subcommand; fleet/cli/main.py runs what it parses.

    args = build_parser("fleetrl ...").parse_args(argv)

Building it imports nothing heavy (no torch, onnxruntime, matplotlib or deploy_npu), so every
`--help` answers at once; `fleet`, `report` and `export` add their own arguments
(fleet/cli/fleet_cmds.py, fleet/report/render.py, fleet/cli/export_args.py). Every page shows
the defaults, an example, the error format and the exit codes (fleet/cli/help.py).
"""

from __future__ import annotations

import argparse
from typing import Any

from fleet.cli.help import Parser, epilog, package_version, page

SERVICES = ("buffer", "aggregator")  # roles that serve gRPC: they take listen and advertise addresses


def add_common(p: argparse.ArgumentParser) -> None:
    """--config, --set and their shorthands: how every subcommand that builds a RunConfig takes it."""
    p.add_argument("--config", help="RunConfig JSON (as written to <run_dir>/config.json); default: built-in")
    p.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="SECTION.FIELD=VALUE",
        help="override one config field, value parsed as JSON (repeatable)",
    )
    p.add_argument("--task", help="shorthand for --set sim.task=TASK")
    p.add_argument(
        "--tasks",
        metavar="TASK,TASK,...",
        help="a multi-task run (sim.tasks; the first task names the run; the first with a preset picks it)",
    )
    p.add_argument("--run-id", help="shorthand for --set run_id=ID")


def build_parser(description: str) -> argparse.ArgumentParser:
    """Every subcommand, in the order `fleetrl --help` lists them."""
    parser = Parser(prog="fleetrl", description=description, epilog=epilog("fleetrl"))
    parser.add_argument("--version", action="version", version=f"fleetrl {package_version()}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="SUBCOMMAND")
    _add_train(sub)
    _add_config(sub)
    _add_redis_cluster(sub)
    _add_roles(sub)
    _add_certs(sub)
    from fleet.cli.fleet_cmds import add_fleet_parser

    add_fleet_parser(sub, add_common)
    _add_evaluate(sub)
    report = sub.add_parser("report", **page("report", "one HTML page (PNG plots beside it) comparing run directories"))
    from fleet.report.render import add_arguments as add_report_arguments  # matplotlib loads only when writing

    add_report_arguments(report)
    _add_deploy_check(sub)
    from fleet.cli.export_args import add_export_arguments

    export = sub.add_parser(
        "export", **page("export", "freeze a checkpoint into ONNX and check it for an NPU controller")
    )
    add_export_arguments(export)
    return parser


def _add_train(sub: Any) -> None:
    train = sub.add_parser("train", **page("train", "train with a complete local fleet (Redis Cluster included)"))
    add_common(train)
    train.add_argument("--run-dir", help="where the run writes (default: runs/<task>-<timestamp>)")
    train.add_argument(
        "--resume",
        metavar="RUN_DIR",
        help="continue a stopped or crashed run: its config, weights, optimizer, version and replay buffer (with "
        "buffer.durable; off, the buffer starts empty); --max-wall-sec and max_env_steps count the whole run",
    )
    train.add_argument("--samplers", type=int, help="shorthand for --set sampler.num_samplers=N")
    train.add_argument("--learners", type=int, help="shorthand for --set learner.num_learners=N")
    train.add_argument("--target-success", type=float, help="stop once evaluation success reaches this")
    train.add_argument("--max-wall-sec", type=float, help="stop after this many seconds")
    train.add_argument("--seed", type=int, help="seed of samplers and initial weights")
    train.add_argument(
        "--redis-replicas",
        type=int,
        default=0,
        metavar="N",
        help="replicas per Redis primary: one takes over when its primary dies; acks then wait for a replica "
        "(buffer.replicas_to_ack=1 unless --set gives it), so a primary's death loses no acked transition",
    )
    train.add_argument(
        "--mode",
        choices=("async", "sync"),
        default="async",
        help="async: the fleet; sync: the same code in one process that alternates collecting and "
        "training, at the same updates per env step (the baseline of benchmarks/async_vs_sync.py)",
    )


def _add_config(sub: Any) -> None:
    cfg = sub.add_parser(
        "config", **page("config", "print every config field with its help line, only those changed, or the JSON")
    )
    add_common(cfg)
    cfg.add_argument("--json", action="store_true", help="print the resolved RunConfig as JSON (for --config)")
    cfg.add_argument("--changed", action="store_true", help="print only the fields that differ from the defaults")


def _add_redis_cluster(sub: Any) -> None:
    cluster = sub.add_parser("redis-cluster", **page("redis-cluster", "run a local Redis Cluster until Ctrl-C"))
    cluster.add_argument("--primaries", type=int, default=3, help="primary nodes (a Redis Cluster needs at least 3)")
    cluster.add_argument(
        "--host", default="127.0.0.1", help="address the nodes bind and announce (reachable by others)"
    )
    cluster.add_argument(
        "--ports", help="comma-separated fixed ports, one per node, primaries then replicas (default: free ones)"
    )
    cluster.add_argument(
        "--replicas",
        type=int,
        default=0,
        help="replicas per primary: one takes over when its primary fails (with buffer.replicas_to_ack=1, "
        "no acked transition is lost)",
    )
    cluster.add_argument("--appendonly", action="store_true", help="persist every write (AOF) to the nodes' folders")
    cluster.add_argument(
        "--no-password", action="store_true", help="nodes without a password (default: a fresh one, printed once)"
    )
    cluster.add_argument(
        "--join",
        metavar="HOST:PORT,...",
        help="start nothing: form these running nodes (names or IPs, primaries first) into one cluster with "
        "--replicas, logged in with FLEETRL_REDIS_PASSWORD, and exit (what a Kubernetes Job of "
        "`fleet render` runs)",
    )
    cluster.add_argument("--redis-user", default="fleetrl", help="--join: the nodes' ACL user")


def _add_roles(sub: Any) -> None:
    """buffer, aggregator, learner, sampler, evaluator: one process of a role, given the
    addresses of the services it needs."""
    for role, needs in (
        ("buffer", ("redis",)),
        ("aggregator", ()),
        ("learner", ("redis", "aggregator")),
        ("sampler", ("buffer", "aggregator")),
        ("evaluator", ("buffer", "aggregator")),
    ):
        p = sub.add_parser(role, **page(role, f"run one {role} process"))
        add_common(p)
        for need in needs:
            p.add_argument(f"--{need}", required=True, help=f"address(es) of the {need}, host:port[,host:port]")
        p.add_argument("--id", type=int, default=0, help="index of this process within its role")
        if role in SERVICES:  # each role's help lists only the flags it reads
            p.add_argument("--port", type=int, default=0, help="port to serve on, on 127.0.0.1")
            p.add_argument("--listen", help="HOST:PORT to serve on (0.0.0.0 for every interface)")
            p.add_argument("--advertise", help="HOST:PORT other hosts reach this service at (default: --listen)")
            p.add_argument("--ready-file", help="write the bound address here once serving")
        if role == "aggregator":
            p.add_argument("--run-dir", help="checkpoints and TensorBoard go here")
        p.add_argument("--heartbeat", help="heartbeat JSON file the watchdog reads")
        p.add_argument("--metrics", metavar="HOST:PORT", help="serve Prometheus metrics here (default: none)")
        if role in ("sampler", "learner"):
            p.add_argument("--ack-log", help="folder for the ack ledger: one JSON line per acked push")


def _add_certs(sub: Any) -> None:
    certs = sub.add_parser("certs", **page("certs", "make a self-signed TLS certificate set for a fleet"))
    certs.add_argument("--out", required=True, help="folder for ca.pem, ca.key, fleet.pem, fleet.key")
    certs.add_argument("--hosts", default="", help="comma-separated host names and IPs the services listen on")
    certs.add_argument("--days", type=int, default=365, help="validity in days")


def _add_evaluate(sub: Any) -> None:
    evaluate = sub.add_parser("evaluate", **page("evaluate", "score a run's last checkpoint on held-out episodes"))
    evaluate.add_argument("run_dir", help="a run directory (its config.json and newest checkpoint)")
    evaluate.add_argument("--checkpoint", help="a ckpt_<version>.pt file instead of the run's newest")
    evaluate.add_argument("--episodes", type=int, default=50, help="deterministic episodes, never cut short")
    evaluate.add_argument(
        "--first-seed",
        type=int,
        help="episode seeds start here instead of the run's eval.seed, the evaluator's own: a fresh held-out set "
        "for a checkpoint chosen by the evaluator's scores",
    )
    evaluate.add_argument("--json", action="store_true", help="print the result as JSON")
    evaluate.add_argument(
        "--weights",
        choices=("live", "swa", "swa_plain"),
        default="live",
        help="the live actor, or a weight average the checkpoint holds (aggregator.swa)",
    )
    evaluate.add_argument(
        "--why",
        action="store_true",
        help="classify every failed episode by what happened (Push, PickAndPlace, Slide): a table, its JSON and "
        "a plot in RUN_DIR/why/",
    )
    evaluate.add_argument("--out", metavar="DIR", help="--why: write the JSON and plot here (default: RUN_DIR/why/)")


def _add_deploy_check(sub: Any) -> None:
    check = sub.add_parser(
        "deploy-check",
        **page("deploy-check", "run a run's exported policy as a fixed-rate controller in the randomized sim"),
    )
    check.add_argument("run_dir", help="a run directory (its config.json and newest checkpoint)")
    check.add_argument("--hz", type=float, default=120.0, help="controller ticks per simulated second")
    check.add_argument("--delay-ms", type=float, default=10.0, help="actuation delay, rounded to whole ticks")
    check.add_argument("--episodes", type=int, default=20, help="episodes for the ONNX and for the torch policy")
    check.add_argument("--seed", type=int, default=0, help="first episode seed")
    check.add_argument(
        "--onnx",
        help="where to write the graph (default: RUN_DIR/deploy/policy.onnx); a multi-task run's: a folder, one "
        "<task>.onnx per task (default: RUN_DIR/deploy/)",
    )
    check.add_argument("--json", help="also write every task's figures here (JSON), for CI and benchmarks/results")
    check.add_argument(
        "--no-retime",
        dest="retime",
        action="store_false",
        help="run a policy trained at another rate as it is; by default its velocity inputs are re-timed to the "
        "units it was trained on (deploy_npu/retime.py)",
    )
    check.add_argument(
        "--nominal",
        action="store_true",
        help="drive the nominal task; by default domain randomization is on with the run's ranges, also for a run "
        "that trained without it (sim.randomization.enabled false)",
    )
    check.add_argument(
        "--sweep",
        action="store_true",
        help="the robustness envelope instead: every axis past the training range, one at a time, around "
        "--hz and --delay-ms (RUN_DIR/envelope/)",
    )
    check.add_argument("--axes", metavar="AXIS,AXIS,...", help="--sweep only these axes (default: every axis)")
    check.add_argument("--int8", action="store_true", help="--sweep the int8 graph beside the float one")
    check.add_argument("--workers", type=int, help="--sweep worker processes (default: one per core)")
    check.add_argument(
        "--ranges-from",
        metavar="RUN_DIR|CONFIG_JSON",
        help="--sweep the scale axes at multiples of this run's training ranges (its config.json, or a RunConfig "
        "JSON: `fleetrl config --task T --json` for a preset's) instead of RUN_DIR's own, so runs trained on "
        "different ranges meet the same points",
    )
