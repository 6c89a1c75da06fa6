"""Sampler throughput: single-process env.step/s against env steps the real fleet acks per second.

    python3 benchmarks/sampler_throughput.py [--task FetchPush-v4] [--seconds 20] [--samplers 1]

One invocation measures, on the same machine and one after the other:

(a) single process: `env.step` of `sim.make_env(task, RandomizationConfig())` (the
    domain-randomized env every sampler builds) with uniform random actions, reset on
    episode end, after a short warm-up: the ceiling of one sampler process. Half of its
    `--seconds` run before (b) and half after, so a drift in the machine's load shows.
(b) end to end: a LocalRedisCluster, then `python -m fleet.cli.main buffer|aggregator|sampler`
    role processes started the way fleet.launch.local_fleet.LocalFleet starts them (no learner, no
    evaluator). Samplers run with `sampler.max_env_steps_per_update=0` (rate limiter off)
    and a `sampler.random_steps` they never reach, so they act with uniform random actions
    like (a): the same env work per step, without the actor's forward pass. The buffer's
    Stats are polled over a window after a warm-up: env steps acked (an ack means the rows
    are in Redis) and transitions acked (the buffer head; HER's k relabeled copies included).

The figures come LAST. Compare the ratio, which is taken within this one run; the absolute
rates depend on whatever else the machine runs (the CPU lines above the figures say how much
that was). With one sampler on a 2-core machine the sampler shares the CPUs with the ingest
service and three redis-server processes, so the ratio includes that contention.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import pathlib
import shutil
import signal
import sys
import tempfile
import time
from contextlib import closing
from dataclasses import asdict, dataclass
from typing import NamedTuple

from env_step_rate import SingleResult, measure_env_steps, per_unit  # this script's folder
from harness import CpuMeter, print_table, result_record, write_result  # benchmarks/harness.py (this script's folder)

from buffer.ingest_client import IngestClient
from fleet.launch.local_cluster import LocalRedisCluster
from fleet.launch.local_fleet import LocalFleet
from fleet.launch.watchdog import Watchdog
from foundation.config import RunConfig, with_overrides
from foundation.process import heartbeat_file

FIRST_ACK_TIMEOUT_SEC = 120.0
POLL_SEC = 0.5
NEVER_POLICY_STEPS = 10**12  # sampler.random_steps: the samplers act randomly for the whole run


@dataclass
class Figures:
    task: str
    samplers: int
    her_k: int
    single_env_steps_per_sec: float
    e2e_env_steps_per_sec: float
    e2e_transitions_per_sec: float
    ratio: float
    single_window_sec: float
    e2e_window_sec: float
    # Per CPU-second of the process(es) doing the env steps: less sensitive to other load.
    single_env_steps_per_cpu_sec: float
    e2e_env_steps_per_sampler_cpu_sec: float
    e2e_env_steps_per_fleet_cpu_sec: float  # CPU of samplers, buffer, redis and aggregator together
    cpu_ratio: float  # e2e_env_steps_per_sampler_cpu_sec / single_env_steps_per_cpu_sec

    @classmethod
    def of(cls, args: argparse.Namespace, her_k: int, single: SingleResult, e2e: dict) -> Figures:
        acked = e2e["env_steps_per_sec"]
        cpu = e2e["cpu"]
        sampler_cores = sum(v for k, v in cpu.items() if k.startswith("sampler")) / 100
        fleet_cores = sum(v for k, v in cpu.items() if k not in ("benchmark", "machine", "others")) / 100
        return cls(
            task=args.task,
            samplers=args.samplers,
            her_k=her_k,
            single_env_steps_per_sec=single.env_steps_per_sec,
            e2e_env_steps_per_sec=acked,
            e2e_transitions_per_sec=e2e["transitions_per_sec"],
            ratio=per_unit(acked, single.env_steps_per_sec),
            single_window_sec=single.window_sec,
            e2e_window_sec=e2e["window_sec"],
            single_env_steps_per_cpu_sec=single.env_steps_per_cpu_sec,
            e2e_env_steps_per_sampler_cpu_sec=per_unit(acked, sampler_cores),
            e2e_env_steps_per_fleet_cpu_sec=per_unit(acked, fleet_cores),
            cpu_ratio=per_unit(per_unit(acked, sampler_cores), single.env_steps_per_cpu_sec),
        )


def bench_config(task: str, samplers: int, run_dir: pathlib.Path, security: list[str] = ()) -> RunConfig:
    """The default RunConfig with the limiter off and random actions throughout."""
    overrides = [
        *security,
        f"sim.task={json.dumps(task)}",
        "run_id=bench",
        f"run_dir={json.dumps(str(run_dir))}",
        f"sampler.num_samplers={samplers}",
        "sampler.max_env_steps_per_update=0",
        f"sampler.random_steps={NEVER_POLICY_STEPS}",
    ]
    return with_overrides(RunConfig(), overrides).validate()


class Fleet:
    """Aggregator, buffer and samplers started by fleet.launch.local_fleet.LocalFleet itself (no learner,
    no evaluator, no restarts: a restart would spoil the measurement window)."""

    def __init__(self, local: LocalFleet, run_dir: pathlib.Path, dog: Watchdog, cluster: LocalRedisCluster) -> None:
        self.config, self.run_dir, self.dog, self.cluster = local.config, run_dir, dog, cluster
        self.local = local
        self.local.prepare()

    def start(self) -> str:
        """Start every role; returns the buffer address once buffer and aggregator serve."""
        buffer, _ = self.local.start_roles(self.dog, self.cluster, learners=False, evaluator=False, max_restarts=0)
        return buffer

    def pids(self) -> dict[str, int]:
        pids = {name: running.proc.pid for name, running in self.dog.roles.items()}
        pids.update({f"redis-{i}": pid for i, pid in enumerate(self.cluster.pids)})
        pids["benchmark"] = os.getpid()
        return pids

    def stop(self) -> None:
        LocalFleet.stop_roles(self.dog)

    def heartbeats(self) -> dict[str, dict]:
        """Each sampler's newest heartbeat JSON (phase timers, counters); missing ones left out."""
        paths = {
            f"sampler-{i}": heartbeat_file(self.run_dir, f"sampler-{i}")
            for i in range(self.config.sampler.num_samplers)
        }
        out = {}
        for name, path in paths.items():
            with contextlib.suppress(OSError, ValueError):
                out[name] = json.loads(pathlib.Path(path).read_text())
        return out


def _stats(ingest: IngestClient) -> tuple[float, int, int]:
    """(monotonic time, env steps acked, transitions stored) from one Stats call."""
    before = time.monotonic()
    stats = ingest.stats()
    return (before + time.monotonic()) / 2, stats.env_steps, stats.head


def measure_acked(fleet: Fleet, ingest: IngestClient, seconds: float, warmup_sec: float) -> dict:
    """Wait for the first ack, warm up, then count acks over `seconds`; returns rates and diagnostics."""
    deadline = time.monotonic() + FIRST_ACK_TIMEOUT_SEC
    while ingest.stats(wait_for_ready=True).env_steps == 0:
        fleet.dog.poll()
        if time.monotonic() > deadline:
            raise TimeoutError(f"no push acked after {FIRST_ACK_TIMEOUT_SEC}s; see {fleet.dog.log_dir}")
        time.sleep(0.1)
    print(f"[e2e] first batch acked; warming up {warmup_sec:.0f}s, then measuring {seconds:.0f}s", file=sys.stderr)
    time.sleep(warmup_sec)
    meter = CpuMeter(fleet.pids())
    beats0 = fleet.heartbeats()
    meter.start()
    t0, steps0, head0 = _stats(ingest)
    while time.monotonic() - t0 < seconds:
        fleet.dog.poll()
        time.sleep(min(POLL_SEC, max(0.0, seconds - (time.monotonic() - t0))))
    t1, steps1, head1 = _stats(ingest)
    cpu = meter.stop()
    window = t1 - t0
    return {
        "window_sec": window,
        "env_steps_per_sec": (steps1 - steps0) / window,
        "transitions_per_sec": (head1 - head0) / window,
        "cpu": cpu,
        "phases": sampler_phases(beats0, fleet.heartbeats()),
    }


def sampler_phases(before: dict[str, dict], after: dict[str, dict]) -> dict[str, dict[str, float]]:
    """Per sampler: share of wall time per heartbeat phase, and env steps made per second."""
    out = {}
    for name, b1 in after.items():
        b0 = before.get(name)
        if b0 is None or b1["time"] <= b0["time"]:
            continue
        wall = b1["time"] - b0["time"]
        shares = {p: (sec - b0["phase_sec"].get(p, 0.0)) / wall for p, sec in b1["phase_sec"].items()}
        shares["made_env_steps_per_sec"] = (b1["counters"]["env_steps"] - b0["counters"]["env_steps"]) / wall
        out[name] = shares
    return out


def print_diagnostics(before: SingleResult, after: SingleResult, e2e: dict) -> None:
    def fmt(cpu: dict[str, float]) -> str:
        return ", ".join(f"{k} {v:.0f}" for k, v in cpu.items())

    for when, single in (("before", before), ("after", after)):
        print(f"(a) {when} (b): {single.env_steps_per_sec:.1f} env.step/s; cpu, % of one core: {fmt(single.cpu)}")
    print(f"cpu during (b), % of one core: {fmt(e2e['cpu'])}")
    for name, shares in e2e["phases"].items():
        made = shares["made_env_steps_per_sec"]
        parts = ", ".join(f"{p} {100 * s:.0f}%" for p, s in shares.items() if p != "made_env_steps_per_sec")
        print(f"{name} heartbeat phases (share of wall time): {parts}; made {made:.0f} env steps/s")


def print_figures(f: Figures) -> None:
    her = f"{per_unit(f.e2e_transitions_per_sec, f.e2e_env_steps_per_sec):.2f} per env step, HER k={f.her_k} included"
    rows = [
        ("per CPU-second (context: less sensitive to other load than the rates below)", None, ""),
        ("  single-process env.step per CPU-s", f.single_env_steps_per_cpu_sec, ""),
        ("  end-to-end acked env steps per sampler CPU-s", f.e2e_env_steps_per_sampler_cpu_sec, f"{f.cpu_ratio:.3f}x"),
        ("  end-to-end acked env steps per fleet CPU-s", f.e2e_env_steps_per_fleet_cpu_sec, "all roles + redis"),
        ("single-process env.step/s", f.single_env_steps_per_sec, f"{f.single_window_sec:.1f}s"),
        ("end-to-end env steps acked/s", f.e2e_env_steps_per_sec, f"{f.e2e_window_sec:.1f}s"),
        ("end-to-end transitions acked/s", f.e2e_transitions_per_sec, her),
        (
            "ratio transitions acked/s / env.step/s",
            per_unit(f.e2e_transitions_per_sec, f.single_env_steps_per_sec),
            "relabeled copies count: up to her_k + 1 per sampler",
        ),
        ("ratio end-to-end / single-process", f.ratio, "env steps acked/s over env.step/s, like for like"),
    ]
    print(f"\n=== sampler throughput: {f.task}, {f.samplers} sampler(s), uniform random actions in both ===")
    for label, value, note in rows:
        figure = "" if value is None else f"{value:10.3f}" if label.startswith("ratio") else f"{value:10.1f}"
        print(f"{label + ':':48s}{figure}" + (f"   ({note})" if note else ""))


SECURITY_MODES = {
    "on": [],  # what a user gets: a token on every RPC, a Redis password (no TLS unless configured)
    "off": ["security.enabled=false"],
}


def tls_overrides(run_dir: pathlib.Path) -> list[str]:
    """Token, Redis password and TLS with a fresh certificate set (fleetrl certs)."""
    from foundation.certs import make_certs

    paths = make_certs(run_dir / "certs", hosts=[])
    return [
        f"security.tls_cert={json.dumps(str(paths['fleet.pem']))}",
        f"security.tls_key={json.dumps(str(paths['fleet.key']))}",
        f"security.tls_ca={json.dumps(str(paths['ca.pem']))}",
    ]


def run_e2e(args: argparse.Namespace, run_dir: pathlib.Path, security: list[str] = ()) -> tuple[RunConfig, dict]:
    config = bench_config(args.task, args.samplers, run_dir, security)
    local = LocalFleet(config, started_at=time.monotonic())
    cluster = local.make_cluster()
    with closing(cluster), Watchdog(run_dir / "logs", stop_grace_sec=5.0) as dog:  # roles stop before redis
        fleet = Fleet(local, run_dir, dog, cluster)
        buffer = fleet.start()
        print(f"[e2e] fleet up: redis {cluster.addresses}, buffer {buffer}", file=sys.stderr)
        with IngestClient(buffer, sampler_id=0, run_id=config.run_id, security=local.security) as ingest:
            result = measure_acked(fleet, ingest, args.seconds, args.warmup_sec)
        fleet.stop()
    return config, result


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--task", default="FetchPush-v4", help="task name from sim/registry.py")
    p.add_argument("--seconds", type=float, default=20.0, help="measurement window of (a) and of (b)")
    p.add_argument("--samplers", type=int, default=1, help="sampler processes in (b)")
    p.add_argument("--warmup-sec", type=float, default=5.0, help="(b): after the first ack, before measuring")
    p.add_argument("--run-dir", help="config, logs, heartbeats of (b); default: a temporary directory")
    p.add_argument("--json", help="also write the figures here as JSON")
    p.add_argument(
        "--compare-security",
        action="store_true",
        help="also run (b) with security off and with token + TLS, and print acked env steps/s on ÷ off",
    )
    args = p.parse_args(argv)
    if args.seconds <= 0 or args.samplers < 1 or args.warmup_sec < 0:
        got = f"--seconds {args.seconds}, --samplers {args.samplers}, --warmup-sec {args.warmup_sec}"
        p.error(f"{got}: need --seconds > 0 (the window), --samplers >= 1, --warmup-sec >= 0")
    return args


class Measured(NamedTuple):
    single: SingleResult  # (a), both halves
    config: RunConfig
    e2e: dict  # (b) with the default security
    security: dict[str, float] | None  # --compare-security: acked env steps/s per mode


def measure(args: argparse.Namespace, run_dir: pathlib.Path) -> Measured:
    """(a) in halves around (b): a drift in the machine's load shows as a gap between the halves
    instead of skewing the ratio one way."""
    half = args.seconds / 2
    print(f"[a] single process: {args.task} env.step, {half:.0f}s before and after (b)", file=sys.stderr)
    before = measure_env_steps(args.task, half, warmup_sec=min(2.0, half))
    print(f"[e2e] starting fleet in {run_dir}", file=sys.stderr)
    config, e2e = run_e2e(args, run_dir)
    security = compare_security(args, run_dir) if args.compare_security else None
    after = measure_env_steps(args.task, half, warmup_sec=min(1.0, half), seed=1)
    print_diagnostics(before, after, e2e)
    return Measured(SingleResult.combine(before, after), config, e2e, security)


def print_security(default: float, security: dict[str, float]) -> None:
    on, off = security["token_tls"], security["off"]
    rows = {
        "security off": {"env steps acked/s": off},
        "token + Redis password (the default)": {"env steps acked/s": default, "over off": per_unit(default, off)},
        "token + TLS": {"env steps acked/s": on, "over off": per_unit(on, off)},
    }
    print_table("security", rows)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    # SIGTERM unwinds like Ctrl-C: the `with` blocks stop every role and redis node.
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    run_dir = pathlib.Path(args.run_dir or tempfile.mkdtemp(prefix="fleetrl-bench-"))
    ok = False
    try:
        measured = measure(args, run_dir)
        ok = True
    except KeyboardInterrupt:
        print("interrupted; every process stopped", file=sys.stderr)
        ok = True
        return 130
    finally:
        if not ok:  # a role failed or timed out: its log says why
            print(f"logs kept in {run_dir / 'logs'}", file=sys.stderr)
        elif not args.run_dir:
            shutil.rmtree(run_dir, ignore_errors=True)
    e2e, security = measured.e2e, measured.security
    figures = Figures.of(args, measured.config.sampler.her_k, measured.single, e2e)
    if args.json:
        payload = {**asdict(figures), "cpu_single": measured.single.cpu, "cpu_e2e": e2e["cpu"], "phases": e2e["phases"]}
        if security is not None:
            payload["security_env_steps_per_sec"] = {**security, "default": e2e["env_steps_per_sec"]}
        write_result(result_record("sampler_throughput", payload), args.json)
    print_figures(figures)
    if security is not None:
        print_security(e2e["env_steps_per_sec"], security)
    return 0


def compare_security(args: argparse.Namespace, run_dir: pathlib.Path) -> dict[str, float]:
    """(b) again with security off, then with token + TLS; acked env steps/s of each."""
    rates = {}
    for name, overrides in (("off", SECURITY_MODES["off"]), ("token_tls", tls_overrides(run_dir))):
        sub = run_dir / f"security-{name}"
        sub.mkdir(parents=True, exist_ok=True)
        print(f"[e2e] security {name}", file=sys.stderr)
        _, result = run_e2e(args, sub, overrides)
        rates[name] = result["env_steps_per_sec"]
    return rates


if __name__ == "__main__":
    sys.exit(main())
