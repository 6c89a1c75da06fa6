"""The chaos soak: learning under a random fault every N seconds, with loss accounting.

    python3 benchmarks/chaos_soak.py [--task FetchPush-v4] [--seed 0] [--every 60] [--stop-sec 5]
                                     [--max-wall-sec 1800] [--target-success 0.9] [--no-faults]
                                     [--plan 'SIGKILL aggregator,...'] [--hosts local|netns] [--net-fault-sec 5,20]
                                     [--set section.field=value ...]
                                     [--run-dir DIR] [--out R.json]

Starts `fleetrl train`'s local fleet (fleet/chaos/soak.py: a Redis replica per primary,
buffer.replicas_to_ack=1, two samplers, one learner, ack ledgers on both) and, every `--every`
seconds, a fault picked by a generator seeded with `--seed` from: SIGKILL and SIGSTOP (SIGCONT
after `--stop-sec`) of every role process, and SIGKILL of a Redis primary (fleet/chaos/faults.py). With
`--hosts netns` (root, iproute2) the samplers run in a network namespace of their own joined to
the services by a veth pair, and three network faults join the menu (fleet/chaos/network.py): a
partition of the sampler host or of the services' host (its end of the link down for 5-20 s), and
a slow link (netem: 50-200 ms delay, 1-10% loss, for 5-20 s) where the kernel has netem. Faults
that cannot be injected are listed under not_available, with why. It runs until the evaluator's target or
`--max-wall-sec`, then audits from both ends (fleet/chaos/audit.py): acked batches (the samplers'
ledgers) against the rows in Redis, acked gradients (the learner's ledger) against the history
of the weights, and versions reused. `--no-faults` runs the same fleet without faults (the
baseline a soak's wall-clock to target is divided by). Prints the fault table and the audit LAST;
exit status 1 when anything acked was lost or doubled, a gradient applied twice or a version
reused.
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys

from harness import print_table, result_record, write_result  # benchmarks/harness.py (this script's folder)

from fleet.chaos.faults import Fault
from fleet.chaos.netns import NetnsError
from fleet.chaos.network import NetFaultRanges
from fleet.chaos.soak import HOSTS, SoakResult, run_soak, soak_config
from fleet.cli.presets import preset_config
from foundation.config import RunConfig


def config_from(args: argparse.Namespace) -> RunConfig:
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    arm = "nofaults" if args.no_faults else f"every{args.every:g}"
    run_dir = args.run_dir or f"runs/chaos-{args.task}-{arm}-seed{args.seed}-{stamp}"
    overrides = [
        f"sampler.num_samplers={args.samplers}",
        "learner.num_learners=1",
        f"sampler.seed={args.seed}",
        f"aggregator.seed={args.seed}",
        f"target_success={args.target_success}",
        f"max_wall_sec={args.max_wall_sec}",
        f"run_dir={json.dumps(run_dir)}",
        *args.set,
    ]
    return soak_config(preset_config(args.task), overrides)


def problems(result: SoakResult) -> int:
    """Acked data lost or doubled, gradients applied twice, versions reused, and acked gradients
    rolled back past what the aggregator's restarts allow (a due checkpoint not written) (goal: 0)."""
    b, g = result.batches, result.gradients
    if b is None or g is None:
        return 1
    beyond = max(0, g.rolled_back - result.rollback_bound)
    return b.lost + b.doubled + b.acked_twice + g.applied_twice + g.acked_twice + g.versions_reused + beyond


def print_soak(result: SoakResult) -> None:
    """The fault table, then whether the target was reached and what the audit found."""
    columns = ["fault", "target", "pid", "recovered_sec", "restarts"]  # pid: none for a network fault
    print_table("faults", {f"{f['at_sec']:.1f} s": f for f in result.faults}, columns)
    s = result.summary
    reached = f"{s.wall_sec_to_target:.0f}s" if s.reached_target and s.wall_sec_to_target else "no"
    print(
        f"\n{s.task}: target {s.target_success:.0%} reached: {reached} ({s.stop_reason}); faults {len(result.faults)}"
    )
    if result.batches is not None:
        b = result.batches
        print(
            f"batches: acked {b.acked_batches} ({b.acked_env_steps} env steps, {b.acked_transitions} transitions), "
            f"stored {b.stored_transitions} transitions; lost {b.lost}, doubled {b.doubled}, "
            f"evicted windows {result.evicted_windows}"
        )
    if result.gradients is not None:
        g = result.gradients
        print(
            f"gradients: acked {g.acked} (applied {g.acked_applied}, in the weights' history {g.in_history}, "
            f"rolled back by aggregator crashes {g.rolled_back} of at most {result.rollback_bound}); "
            f"history steps {g.history_steps}; "
            f"applied twice {g.applied_twice}; versions reused {g.versions_reused}"
        )
    for fault, why in result.not_available.items():
        print(f"not injected: {fault}: {why}")
    for error in result.errors:
        print(f"error: {error}")


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--task", default="FetchPush-v4")
    p.add_argument("--seed", type=int, default=0, help="the run's seed and the fault generator's")
    p.add_argument("--every", type=float, default=60.0, help="seconds between faults")
    p.add_argument("--first", type=float, help="seconds before the first fault (default: --every)")
    p.add_argument("--stop-sec", type=float, default=5.0, help="SIGSTOP lasts this long, then SIGCONT")
    p.add_argument("--samplers", type=int, default=2)
    p.add_argument("--max-wall-sec", type=float, default=1800.0)
    p.add_argument("--target-success", type=float, default=0.9)
    p.add_argument("--no-faults", action="store_true", help="the same fleet without faults (the baseline arm)")
    p.add_argument(
        "--plan",
        help="these faults in this order instead of random ones, e.g. 'SIGKILL aggregator,SIGSTOP sampler-1,"
        "SIGKILL redis-primary'; with --hosts netns also 'PARTITION sampler-host', 'PARTITION services-host', "
        "'SLOW link'",
    )
    p.add_argument(
        "--hosts",
        choices=HOSTS,
        default="local",
        help="local: every role on loopback; netns: the samplers on a network namespace of their own (root, "
        "iproute2), with partitions and a slow link among the faults",
    )
    p.add_argument(
        "--net-fault-sec",
        default="5,20",
        metavar="LOW,HIGH",
        help="--hosts netns: a partition or a slow link lasts a uniform draw from this range, then is undone",
    )
    p.add_argument("--set", action="append", default=[], help="section.field=value (JSON), after the soak's own")
    p.add_argument("--run-dir")
    p.add_argument("--out", help="write the raw result (JSON) here")
    return p


def soak(args: argparse.Namespace) -> SoakResult:
    """Run the soak the arguments describe (faults at random, planned, or none) and audit it."""
    plan = [Fault(*item.split()) for item in args.plan.split(",")] if args.plan else None
    every = 0.0 if args.no_faults else args.every
    low, high = net_fault_sec(args)
    net_ranges = NetFaultRanges(down_sec=(low, high), slow_sec=(low, high))
    return run_soak(config_from(args), every, args.seed, stop_sec=args.stop_sec, first_sec=args.first, plan=plan,
                    hosts=args.hosts, net_ranges=net_ranges)  # fmt: skip


def net_fault_sec(args: argparse.Namespace) -> tuple[float, float]:
    low, high = (float(x) for x in args.net_fault_sec.split(","))
    return low, high


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        result = soak(args)
    except NetnsError as err:  # no namespace, link or qdisc here: say why, start nothing
        print(f"chaos_soak: {err}", file=sys.stderr)
        return 2
    figures = {
        "task": args.task,
        "seed": args.seed,
        "every_sec": None if args.no_faults else args.every,
        "stop_sec": args.stop_sec,
        "plan": args.plan,
        "hosts": args.hosts,
        "net_fault_sec": list(net_fault_sec(args)),
        **result.as_dict(),
        "problems": problems(result),
    }
    if args.out:
        write_result(result_record("chaos_soak", figures), args.out)
    print_soak(result)
    return 0 if problems(result) == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
