"""Aggregator under many weight subscribers: PushGradients latency, memory and threads.

    python3 benchmarks/aggregator_scale.py [--task FetchPush-v4] [--subscribers 8,32,128]
                                           [--learners 8] [--pushes 400] [--out R.json]

Starts a real `fleetrl aggregator` process (the task's real model, `--learners` gradients per
step), then for each subscriber count opens that many WatchWeights streams from helper
processes (like samplers: actor weights, at most every `--interval` s) and has `--learners`
threads push real-sized gradients, each waiting for its ack (as learners do). Reports per
count: PushGradients p50/p99 latency, the aggregator's resident memory and thread count,
and the versions the subscribers received per second.

Prints LAST the ratios against the smallest count (goal at 128 vs 8: p99 <= 2x, memory
<= 1.5x); the threads column shows streams hold no thread each.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import sys
import tempfile
import threading
import time

import numpy as np
import psutil
from harness import result_record, write_result  # benchmarks/harness.py (this script's folder)

from aggregator.client import AggregatorClient, GradientPush
from fleet.launch.local_fleet import free_port
from foundation.config import RunConfig, with_overrides
from foundation.policy import ACTOR_GROUPS, GRADIENT_GROUPS, ModelSpec
from nets.models import SACModel, norm_stats
from sim.registry import get_task

WATCH_PROCESSES = 4  # subscribers are spread over this many helper processes


def _watchers(address: str, count: int, interval: float, stop, received) -> None:
    """A helper process holding `count` WatchWeights streams until `stop` is set."""
    with AggregatorClient(address) as agg:
        streams = [agg.watch(f"bench-{os.getpid()}-{i}", ACTOR_GROUPS, interval) for i in range(count)]
        while not stop.is_set():
            time.sleep(0.2)
            received.value = sum(s.received for s in streams)
        for s in streams:
            s.close()


def _sizes(task: str) -> dict[str, int]:
    spec_task = get_task(task)
    model = SACModel(ModelSpec(spec_task.obs_dim, spec_task.goal_dim, spec_task.act_dim, (256, 256)))
    return {g: n for g, n in model.group_sizes().items() if g in GRADIENT_GROUPS}


def measure(address: str, pid: int, args: argparse.Namespace, subscribers: int, sizes: dict[str, int], dims: int):
    ctx = mp.get_context("spawn")
    stop = ctx.Event()
    counters = [ctx.Value("q", 0) for _ in range(WATCH_PROCESSES)]
    share = [subscribers // WATCH_PROCESSES + (i < subscribers % WATCH_PROCESSES) for i in range(WATCH_PROCESSES)]
    helpers = [
        ctx.Process(target=_watchers, args=(address, n, args.interval, stop, c))
        for n, c in zip(share, counters, strict=True)
    ]
    for h in helpers:
        h.start()
    agg_proc = psutil.Process(pid)
    with AggregatorClient(address) as probe:
        deadline = time.monotonic() + 120
        while probe.stats().subscribers < subscribers:
            if time.monotonic() > deadline:
                raise RuntimeError(f"only {probe.stats().subscribers} of {subscribers} subscribers connected")
            time.sleep(0.2)
    latencies: list[float] = []
    lock = threading.Lock()
    per_learner = args.pushes // args.learners
    rng = np.random.default_rng(0)
    grads = {g: (rng.standard_normal(n) * 1e-3).astype(np.float32) for g, n in sizes.items()}
    stats = norm_stats(rng.normal(size=(256, dims)))

    def learner(index: int) -> None:
        with AggregatorClient(address) as agg:
            for _ in range(per_learner):
                version = agg.stats().version
                push = GradientPush(index, version, grads, stats, batch_size=256)
                start = time.perf_counter()
                agg.push_gradients(push)
                with lock:
                    latencies.append(time.perf_counter() - start)

    received_before = sum(c.value for c in counters)
    start = time.monotonic()
    threads = [threading.Thread(target=learner, args=(i,)) for i in range(args.learners)]
    for t in threads:
        t.start()
    peak_rss = 0
    while any(t.is_alive() for t in threads):
        peak_rss = max(peak_rss, agg_proc.memory_info().rss)
        time.sleep(0.1)
    elapsed = time.monotonic() - start
    row = {
        "subscribers": subscribers,
        "push_p50_ms": round(1000 * float(np.percentile(latencies, 50)), 2),
        "push_p99_ms": round(1000 * float(np.percentile(latencies, 99)), 2),
        "aggregator_rss_mib": round(peak_rss / 2**20, 1),
        "aggregator_threads": agg_proc.num_threads(),
        "pushes_per_sec": round(len(latencies) / elapsed, 1),
        "versions_received_per_sec": round((sum(c.value for c in counters) - received_before) / elapsed, 1),
    }
    stop.set()
    for h in helpers:
        h.join(30)
    return row


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--task", default="FetchPush-v4")
    p.add_argument("--subscribers", default="8,32,128")
    p.add_argument("--learners", type=int, default=8)
    p.add_argument("--pushes", type=int, default=400, help="pushes per subscriber count, over all learners")
    p.add_argument("--interval", type=float, default=0.2, help="min_interval_sec of each stream (samplers' default)")
    p.add_argument("--out", help="write the raw result (JSON) here")
    args = p.parse_args(argv)
    counts = [int(c) for c in args.subscribers.split(",")]
    config = with_overrides(RunConfig(), [f'sim.task="{args.task}"', f"learner.num_learners={args.learners}"])
    task = get_task(args.task)
    sizes, dims = _sizes(args.task), task.obs_dim + task.goal_dim
    port = free_port()
    with tempfile.TemporaryDirectory() as tmp:
        config_path = os.path.join(tmp, "config.json")
        with open(config_path, "w") as f:
            f.write(config.to_json())
        import subprocess

        env = {**os.environ, "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1"}
        agg = subprocess.Popen([sys.executable, "-m", "fleet.cli.main", "aggregator", "--config", config_path,
                                "--port", str(port)], env=env)  # fmt: skip
        address = f"127.0.0.1:{port}"
        try:
            with AggregatorClient(address) as probe:
                deadline = time.monotonic() + 60
                while True:
                    try:
                        probe.stats()
                        break
                    except Exception:  # noqa: BLE001 - not up yet
                        if time.monotonic() > deadline or agg.poll() is not None:
                            raise
                        time.sleep(0.2)
            rows = []
            for n in counts:
                rows.append(measure(address, agg.pid, args, n, sizes, dims))
                print(rows[-1], flush=True)
        finally:
            agg.terminate()
            agg.wait(30)
    base = rows[0]
    ratios = {
        f"p99_{r['subscribers']}_vs_{base['subscribers']}": round(r["push_p99_ms"] / base["push_p99_ms"], 2)
        for r in rows[1:]
    } | {
        f"rss_{r['subscribers']}_vs_{base['subscribers']}": round(
            r["aggregator_rss_mib"] / base["aggregator_rss_mib"], 2
        )
        for r in rows[1:]
    }
    if args.out:
        write_result(
            result_record("aggregator_scale", {"rows": rows, "ratios": ratios, "learners": args.learners}), args.out
        )
    print(f"\n{'subscribers':>11} {'p50 ms':>8} {'p99 ms':>8} {'RSS MiB':>8} {'threads':>8} {'versions/s recv':>16}")
    for r in rows:
        print(f"{r['subscribers']:>11} {r['push_p50_ms']:>8} {r['push_p99_ms']:>8} {r['aggregator_rss_mib']:>8} "
              f"{r['aggregator_threads']:>8} {r['versions_received_per_sec']:>16}")  # fmt: skip
    for name, value in ratios.items():
        print(f"{name}: {value}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
