"""Learner efficiency: SAC updates per CPU-second of the real learner process ÷ a bare torch loop.

    python3 benchmarks/learner_throughput.py [--task FetchPush-v4] [--seconds 60] [--json out.json]

One invocation measures, on the same machine:

(a) bare: `learner.sac.compute_gradients` plus an in-process Adam step on in-memory random
    batches of the task's shapes (same ModelSpec, batch size and torch threads as the
    learner): updates per CPU-second of this process. Half before (b), half after.
(b) the real learner: a LocalRedisCluster, buffer, aggregator and one sampler started by
    fleet.launch.LocalFleet with the task's preset, then the learner process: it samples
    from Redis, computes gradients on the newest weights and pushes them to the aggregator.
    Updates are the aggregator's applied gradients over the window (exact, from its Stats);
    CPU-seconds are the learner process's own (psutil), so load from the other roles on a
    2-core machine changes the ratio little. The learner's phase timers (heartbeat) show
    where its time goes.

Figures come LAST; the ratio is the result (issue goal >= 0.9). Absolute rates are context.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import pathlib
import shutil
import signal
import sys
import tempfile
import time
from contextlib import closing

import numpy as np
import psutil
import torch
from common import result_record, write_result  # benchmarks/common.py (this script's folder)

from aggregator.client import AggregatorClient
from fleet.launch import LocalFleet
from fleet.presets import preset_config
from fleet.watchdog import Watchdog
from foundation.config import RunConfig, with_overrides
from foundation.policy import model_spec
from learner.models import GRADIENT_GROUPS, SACModel
from learner.sac import Batch, SACHyperparams, compute_gradients
from sim.registry import get_task

WARMUP_UPDATES = 200
START_TIMEOUT_SEC = 180.0


def bare_updates_per_cpu_sec(config: RunConfig, seconds: float) -> float:
    """compute_gradients + Adam on one in-memory batch, as fast as it goes; per CPU-second."""
    torch.set_num_threads(config.learner.torch_threads)
    task = get_task(config.sim.task)
    spec = model_spec(config, task)
    model = SACModel(spec)
    hp = SACHyperparams.for_run(config, task.act_dim)
    optim = {g: torch.optim.Adam(model.group_parameters(g), lr=1e-3) for g in GRADIENT_GROUPS}
    rng = np.random.default_rng(0)
    n = config.learner.batch_size

    def cols(*shape: int) -> np.ndarray:
        return rng.standard_normal(shape).astype(np.float32)

    batch = Batch.from_numpy(
        cols(n, task.obs_dim),
        cols(n, task.goal_dim),
        np.tanh(cols(n, task.act_dim)),
        -np.ones(n, np.float32),
        cols(n, task.obs_dim),
        np.zeros(n, np.float32),
    )
    updates, cpu0, deadline = 0, time.process_time(), time.monotonic() + seconds
    while time.monotonic() < deadline:
        result = compute_gradients(model, batch, hp)
        for g in GRADIENT_GROUPS:
            flat = torch.from_numpy(result.grads[g])
            offset = 0
            for p in model.group_parameters(g):
                p.grad = flat[offset : offset + p.numel()].view_as(p)
                offset += p.numel()
            optim[g].step()
        updates += 1
    return updates / (time.process_time() - cpu0)


def _learner_cpu(pid: int) -> float:
    t = psutil.Process(pid).cpu_times()
    return t.user + t.system


def _thread_cpu(pid: int) -> dict[str, float]:
    """CPU-seconds per OS thread of the learner, keyed 'comm/tid' (which thread costs what)."""
    out = {}
    for t in psutil.Process(pid).threads():
        with contextlib.suppress(OSError):
            comm = pathlib.Path(f"/proc/{pid}/task/{t.id}/comm").read_text().strip()
            out[f"{comm}/{t.id}"] = t.user_time + t.system_time
    return out


def _heartbeat(run_dir: pathlib.Path) -> dict:
    with contextlib.suppress(OSError, ValueError):
        return json.loads((run_dir / "heartbeats" / "learner-0.json").read_text())
    return {}


def measure_learner(config: RunConfig, run_dir: pathlib.Path, seconds: float) -> dict:
    """Start the fleet (one learner), wait for WARMUP_UPDATES, then measure over `seconds`."""
    fleet = LocalFleet(config, started_at=time.monotonic())
    cluster = fleet.make_cluster()
    with closing(cluster), Watchdog(run_dir / "logs", stop_grace_sec=5.0) as dog:
        fleet.prepare()
        _, aggregator = fleet.start_roles(dog, cluster, learners=True, evaluator=False, max_restarts=0)
        pid = dog.pids()["learner-0"]
        with AggregatorClient(aggregator, security=fleet.security) as agg:
            deadline = time.monotonic() + START_TIMEOUT_SEC
            while agg.stats().gradients_applied < WARMUP_UPDATES:
                dog.poll()
                if time.monotonic() > deadline:
                    raise TimeoutError(f"learner made < {WARMUP_UPDATES} updates in {START_TIMEOUT_SEC}s")
                time.sleep(0.5)
            beat0, cpu0, t0 = _heartbeat(run_dir), _learner_cpu(pid), time.monotonic()
            threads0 = _thread_cpu(pid)
            applied0 = agg.stats().gradients_applied
            time.sleep(seconds)
            applied1 = agg.stats().gradients_applied
            beat1, cpu1, t1 = _heartbeat(run_dir), _learner_cpu(pid), time.monotonic()
            threads1 = _thread_cpu(pid)
        LocalFleet.stop_roles(dog)
    updates = applied1 - applied0
    phases0, phases1 = beat0.get("phase_sec", {}), beat1.get("phase_sec", {})
    pushed = beat1.get("counters", {}).get("pushed", 0) - beat0.get("counters", {}).get("pushed", 0)
    phase_ms = {k: 1e3 * (v - phases0.get(k, 0.0)) / max(pushed, 1) for k, v in phases1.items()}
    return {
        "updates": updates,
        "window_sec": t1 - t0,
        "learner_cpu_sec": cpu1 - cpu0,
        "updates_per_sec": updates / (t1 - t0),
        "updates_per_cpu_sec": updates / max(cpu1 - cpu0, 1e-9),
        "phase_ms_per_update": {k: round(v, 3) for k, v in sorted(phase_ms.items())},
        "thread_cpu_ms_per_update": {
            k: round(1e3 * (v - threads0.get(k, 0.0)) / max(updates, 1), 3)
            for k, v in sorted(threads1.items())
            if v - threads0.get(k, 0.0) > 0.01
        },
    }


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--task", default="FetchPush-v4", help="task name; its preset sets the learner's shapes")
    p.add_argument("--seconds", type=float, default=60.0, help="window of (b); (a) runs half before, half after")
    p.add_argument("--set", action="append", default=[], help="config override section.field=value (repeatable)")
    p.add_argument("--run-dir", help="config, logs, heartbeats of (b); default: a temporary directory")
    p.add_argument("--json", help="write the raw result (figures, commit, command) here")
    args = p.parse_args(argv)
    if args.seconds <= 0:
        p.error(f"--seconds {args.seconds}: must be > 0")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    run_dir = pathlib.Path(args.run_dir or tempfile.mkdtemp(prefix="fleetrl-learner-bench-"))
    overrides = ["run_id=bench", f"run_dir={json.dumps(str(run_dir))}", *args.set]
    config = with_overrides(preset_config(args.task), overrides).validate()
    print(f"[a] bare loop, {args.seconds / 2:.0f}s", file=sys.stderr)
    bare_before = bare_updates_per_cpu_sec(config, args.seconds / 2)
    print(f"[b] learner in the fleet, {args.seconds:.0f}s window, run dir {run_dir}", file=sys.stderr)
    learner = measure_learner(config, run_dir, args.seconds)
    bare_after = bare_updates_per_cpu_sec(config, args.seconds / 2)
    if not args.run_dir:
        shutil.rmtree(run_dir, ignore_errors=True)
    bare = (bare_before + bare_after) / 2
    figures = {
        "task": args.task,
        "batch_size": config.learner.batch_size,
        "hidden_sizes": list(config.learner.hidden_sizes),
        "torch_threads": config.learner.torch_threads,
        "bare_updates_per_cpu_sec": {"before": round(bare_before, 2), "after": round(bare_after, 2)},
        "learner": learner,
        "ratio": learner["updates_per_cpu_sec"] / bare,
    }
    if args.json:
        write_result(result_record("learner_throughput", figures), args.json)
    print(f"\nlearner phases (wall ms per update): {learner['phase_ms_per_update']}")
    print(f"learner threads (CPU ms per update): {learner['thread_cpu_ms_per_update']}")
    print(f"learner wall rate: {learner['updates_per_sec']:.1f} updates/s over {learner['window_sec']:.0f}s")
    print(f"\n=== learner throughput: {args.task}, batch {config.learner.batch_size} ===")
    print(f"bare loop updates per CPU-s:          {bare:10.1f}  (before {bare_before:.1f}, after {bare_after:.1f})")
    print(f"learner process updates per CPU-s:    {learner['updates_per_cpu_sec']:10.1f}")
    print(f"ratio learner / bare:                 {figures['ratio']:10.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
