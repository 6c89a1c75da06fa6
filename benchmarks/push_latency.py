"""Push latency of the ingest path, and the dedup state it leaves in Redis.

    python3 benchmarks/push_latency.py [--pushes 400] [--rows 250] [--json out.json]

Starts a 3-node LocalRedisCluster and an in-process IngestServer (real gRPC on loopback),
then one IngestClient pushes `--pushes` FetchPush-shaped batches of `--rows` transitions (one
episode with HER copies) one after another, timing each acked Push. Prints p50/p99 latency
and the bytes Redis holds for one sampler incarnation's dedup record (MEMORY USAGE) last.

To compare with another implementation of the ingest path, run the same script with that
checkout first on PYTHONPATH; the script only uses the IngestServer/IngestClient API both share.
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import NamedTuple

import numpy as np
from harness import print_table, result_record, write_result  # benchmarks/harness.py (this script's folder)

from buffer.ingest_client import IngestClient
from buffer.service import IngestServer
from buffer.storage import TemporalStorage
from fleet.launch.local_cluster import LocalRedisCluster
from foundation.config import BufferConfig
from foundation.wire import Transitions
from sim.registry import get_task

WARMUP_PUSHES = 10


def _batch(schema, rows: int, rng: np.random.Generator) -> Transitions:
    def cols(*shape: int) -> np.ndarray:
        return rng.uniform(-1, 1, shape).astype(np.float32)

    return Transitions(
        obs=cols(rows, schema.obs_dim),
        goal=cols(rows, schema.goal_dim),
        action=cols(rows, schema.act_dim),
        reward=-np.ones(rows, np.float32),
        next_obs=cols(rows, schema.obs_dim),
        done=np.zeros(rows, np.float32),
    )


class PushTimes(NamedTuple):
    seconds: list[float]  # each acked Push, in order
    dedup_bytes: int | None  # Redis's record of the sampler incarnation (None: an ingest path without one)


def time_pushes(pushes: int, rows: int) -> PushTimes:
    """One IngestClient pushes `pushes` FetchPush-shaped batches of `rows` into a 3-node cluster."""
    task = get_task("FetchPush-v4")
    schema, config = task.schema(), BufferConfig()
    rng = np.random.default_rng(0)
    batches = [_batch(schema, rows, rng) for _ in range(16)]
    latencies = []
    with LocalRedisCluster(3) as cluster:
        client = cluster.client()
        storage = TemporalStorage(client, "lat", schema, config)
        with (
            IngestServer(storage, task_ids=(task.task_id,), schema=schema, run_id="lat", config=config) as server,
            IngestClient(server.address, sampler_id=1, run_id="lat") as ingest,
        ):
            for seq in range(1, pushes + 1):
                start = time.perf_counter()
                ingest.push(batches[seq % 16], seq=seq, policy_version=0, task_id=task.task_id, env_steps=50)
                latencies.append(time.perf_counter() - start)
            incarnation = getattr(ingest, "incarnation", None)
        dedup_bytes = None
        if incarnation is not None and hasattr(storage, "dedup_bytes"):  # another checkout's ingest may have none
            from buffer.storage import PushKey

            dedup_bytes = storage.dedup_bytes(PushKey(1, incarnation, pushes))
        client.close()
    return PushTimes(latencies, dedup_bytes)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--pushes", type=int, default=400)
    p.add_argument("--rows", type=int, default=250, help="transitions per batch (50 env steps x 5 with HER k=4)")
    p.add_argument("--json", help="write the raw result here")
    args = p.parse_args(argv)
    if args.pushes <= WARMUP_PUSHES:
        p.error(f"--pushes {args.pushes}: must be > {WARMUP_PUSHES}, the untimed warm-up pushes")
    times = time_pushes(args.pushes, args.rows)
    ms = np.array(times.seconds[WARMUP_PUSHES:]) * 1e3  # the first pushes open connections and warm caches
    figures = {
        "pushes": args.pushes,
        "rows": args.rows,
        "p50_ms": round(float(np.percentile(ms, 50)), 3),
        "p99_ms": round(float(np.percentile(ms, 99)), 3),
        "dedup_bytes_per_incarnation": times.dedup_bytes,
    }
    if args.json:
        write_result(result_record("push_latency", figures), args.json)
    print_table(f"push latency over {len(ms)} acked pushes of {args.rows} transitions", {"Push": figures})
    print(f"dedup record of one sampler incarnation in Redis: {times.dedup_bytes} bytes")
    return 0


if __name__ == "__main__":
    sys.exit(main())
