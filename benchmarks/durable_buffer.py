"""Ingest throughput with the durable replay buffer ÷ the throwaway one.

    python3 benchmarks/durable_buffer.py [--seconds 20] [--samplers 4] [--repeats 3] [--json out.json]

Each arm starts the local Redis Cluster `fleetrl train` starts (LocalFleet.make_cluster, the
run's password included): buffer.durable on keeps the nodes in a run directory with their
append-only files, off keeps them in a temporary directory with no persistence. An in-process
IngestServer stores what `--samplers` IngestClient threads push: FetchPush-shaped batches of
250 transitions (one episode with HER copies), back to back, for `--seconds`, with no flow
control. Arms alternate (harness.py); each repeat starts from an empty buffer.

Printed last: acked transitions per second, the Redis nodes' CPU (percent of one core) and,
for the durable arm, the append-only files' bytes per stored transition; then durable ÷
throwaway, repeat by repeat and as the median.
"""

from __future__ import annotations

import argparse
import dataclasses
import pathlib
import statistics
import sys
import tempfile
import threading
import time

import numpy as np
from harness import (  # benchmarks/harness.py (this script's folder)
    CpuMeter,
    median_figures,
    paired_ratios,
    print_table,
    repeats_arg,
    result_record,
    run_interleaved,
    write_result,
)
from push_latency import _batch  # a FetchPush-shaped batch of random rows

from buffer.ingest_client import IngestClient
from buffer.service import IngestServer
from buffer.storage import TemporalStorage
from fleet.launch.local_fleet import LocalFleet
from foundation.config import RunConfig, with_overrides
from sim.registry import get_task

TASK = "FetchPush-v4"
ROWS = 250  # one 50-step episode stored with 4 HER copies per step
WARMUP_SEC = 2.0  # connections opened and caches warm before the count starts


def _push_until(address: str, sampler_id: int, deadline: float, counted_from: float, acked: list[int]) -> None:
    """One sampler: push batches back to back until `deadline`; adds the rows acked after
    `counted_from` to `acked[sampler_id]`."""
    task = get_task(TASK)
    rng = np.random.default_rng(sampler_id)
    batches = [_batch(task.schema(), ROWS, rng) for _ in range(8)]
    with IngestClient(address, sampler_id=sampler_id + 1, run_id="bench") as ingest:
        seq = 0
        while time.monotonic() < deadline:
            seq += 1
            ingest.push(batches[seq % 8], seq=seq, policy_version=0, task_id=task.task_id, env_steps=50)
            if time.monotonic() >= counted_from:
                acked[sampler_id] += ROWS


def measure(durable: bool, seconds: float, samplers: int) -> dict[str, float | None]:
    """One arm once: acked transitions per second through a fresh cluster and ingest server."""
    with tempfile.TemporaryDirectory(prefix="fleetrl-durable-") as tmp:
        overrides = [f'run_dir="{tmp}/run"', 'run_id="bench"', f"buffer.durable={str(durable).lower()}"]
        config = with_overrides(RunConfig(), overrides)
        fleet = LocalFleet(config, started_at=time.monotonic())
        schema = get_task(TASK).schema()
        with fleet.make_cluster() as cluster:
            client = cluster.client()
            storage = TemporalStorage(client, "bench", schema, config.buffer)
            meter = CpuMeter({f"redis-{port}": pid for (_, port), pid in zip(cluster.nodes, cluster.pids, strict=True)})
            task_ids = (get_task(TASK).task_id,)
            with IngestServer(
                storage, task_ids=task_ids, schema=schema, run_id="bench", config=config.buffer
            ) as server:
                acked = [0] * samplers
                start = time.monotonic()
                counted_from, deadline = start + WARMUP_SEC, start + WARMUP_SEC + seconds
                threads = [
                    threading.Thread(target=_push_until, args=(server.address, i, deadline, counted_from, acked))
                    for i in range(samplers)
                ]
                for thread in threads:
                    thread.start()
                time.sleep(WARMUP_SEC)
                meter.start()
                for thread in threads:
                    thread.join()
                cpu = meter.stop()
            client.close()
        stored = sum(acked)
        aof = sum(p.stat().st_size for p in pathlib.Path(tmp, "run", "redis").glob("node*/appendonlydir/*"))
    return {
        "transitions_per_sec": round(stored / seconds, 1),
        "redis_cpu_pct": round(sum(v for k, v in cpu.items() if k.startswith("redis-")), 1),
        "aof_bytes_per_transition": round(aof / stored, 1) if durable and stored else None,
    }


@dataclasses.dataclass(frozen=True)
class Result:
    runs: dict
    medians: dict
    ratios: list[float]


def compare(seconds: float, samplers: int, repeats: int) -> Result:
    arms = {
        "throwaway": lambda _repeat: measure(False, seconds, samplers),
        "durable": lambda _repeat: measure(True, seconds, samplers),
    }
    runs = run_interleaved(arms, repeats)
    ratios = [round(r, 3) for r in paired_ratios(runs, "durable", "throwaway", "transitions_per_sec")]
    return Result(runs, median_figures(runs), ratios)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seconds", type=float, default=20.0, help="pushing time counted per arm and repeat")
    p.add_argument("--samplers", type=int, default=4, help="IngestClient threads pushing at once")
    p.add_argument("--repeats", type=repeats_arg, default=3)
    p.add_argument("--json", help="write the raw result here")
    args = p.parse_args(argv)
    if args.seconds <= 0 or args.samplers < 1:
        p.error(f"--seconds ({args.seconds}) must be > 0 and --samplers ({args.samplers}) >= 1")
    result = compare(args.seconds, args.samplers, args.repeats)
    median_ratio = statistics.median(result.ratios) if result.ratios else None
    if args.json:
        figures = {"task": TASK, "rows_per_push": ROWS, "seconds": args.seconds, "samplers": args.samplers}
        figures |= {"runs": result.runs, "medians": result.medians, "ratios": result.ratios}
        write_result(result_record("durable_buffer", figures | {"median_ratio": median_ratio}), args.json)
    print_table(f"ingest of {args.samplers} samplers, medians of {args.repeats}", result.medians)
    print(f"durable ÷ throwaway transitions/s, repeat by repeat: {result.ratios}; median {median_ratio}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
