"""Learner efficiency: SAC updates per CPU-second of the real learner process ÷ a bare torch loop.

    python3 benchmarks/learner_throughput.py [--task FetchPush-v4] [--seconds 60] [--json out.json]
    python3 benchmarks/learner_throughput.py --model dense --model moe-e8 --model moe-e32 [--seconds 10]

With --model, only the bare loop runs, once per named model on the 4-task set (FetchReach,
FetchPush, Meta-World reach and push; batch 256, one thread), arms interleaved over --repeats
rounds: the learner's cost per model (goals: moe-e32 / moe-e8 >= 0.8, moe-e32 / dense at
equal active width >= 0.67). Each arm's config is built as `fleetrl train --tasks ... --set ...`
builds it (fleet.cli.presets.preset_for): FetchPush's preset and the multi-task recipe, so a
task-routed MoE arm has the task heads and per-task temperatures its runs train with.

One invocation measures, on the same machine:

(a) bare: `learner.gradients.compute_gradients` plus an in-process Adam step on in-memory random
    batches of the task's shapes (same ModelSpec, batch size and torch threads as the
    learner): updates per CPU-second of this process. Half before (b), half after.
(b) the real learner: a LocalRedisCluster, buffer, aggregator and one sampler started by
    fleet.launch.local_fleet.LocalFleet with the task's preset, then the learner process: it samples
    from Redis, computes gradients on the newest weights and pushes them to the aggregator.
    Updates are the aggregator's applied gradients over the window (exact, from its Stats);
    CPU-seconds are the learner process's own (psutil), so load from the other roles on a
    2-core machine changes the ratio little. The learner's phase timers (heartbeat) show
    where its time goes.

With learner.num_learners > 1 (e.g. `--task FetchPickAndPlace-v4`, whose preset trains two), (b)
measures all of them, and the fleet figure is the result: rows of applied gradients per wall-second
(the aggregator's count x batch) / those of the bare loop at the reference settings (batch 256,
float32, eager, one thread; measured too when --set changes them). Goal: >= 1.4 on 2 cores.

Figures come LAST; the ratios are the result (per CPU-second: goal >= 0.9). Absolute rates are
context.
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
from harness import (
    median_figures,
    print_table,
    repeats_arg,  # benchmarks/harness.py (this script's folder)
    result_record,
    run_interleaved,
    write_result,
)
from model_arms import MODEL_ARMS, MODEL_TASKS, arm_config, model_ratios  # this script's folder

from aggregator.client import AggregatorClient
from fleet.cli.presets import preset_config
from fleet.cli.resolve import split_tasks
from fleet.launch.local_fleet import LocalFleet
from fleet.launch.watchdog import Watchdog
from foundation.config import ConfigError, RunConfig, with_overrides
from foundation.policy import model_spec
from learner.algorithm import Batch
from learner.gradients import Hyperparams, compute_gradients
from nets.flat import GradientBuffers
from nets.models import GRADIENT_GROUPS, SACModel
from sim.tasks import TaskSet

WARMUP_UPDATES = 200
BARE_WARMUP_UPDATES = 5
START_TIMEOUT_SEC = 180.0


# the yardstick: one thread, float32, eager, batch 256: as fast as one core goes
REFERENCE = ["learner.batch_size=256", 'learner.autocast="off"', "learner.compile=false", "learner.torch_threads=1"]


def reference_config(config: RunConfig) -> RunConfig:
    """`config`'s model and algorithm with the reference loop's batch, precision and threads."""
    return with_overrides(config, REFERENCE)


def bare_updates_per_cpu_sec(config: RunConfig, seconds: float, adam: bool = True) -> float:
    """compute_gradients (+ Adam, as the aggregator steps) on one in-memory batch, as fast as it
    goes; per CPU-second. A multi-task config draws the batch evenly over its tasks, as learners do."""
    torch.set_num_threads(config.learner.torch_threads)
    tasks = TaskSet.for_run(config)
    spec = model_spec(config, tasks if tasks.multi else tasks.tasks[0])
    model = SACModel(spec).train_gates(config.model.gate_grad).fuse_critics(config.learner.fused_critics)
    hp = Hyperparams.for_run(config, tasks.act_dim)
    optim = {g: torch.optim.Adam(model.group_parameters(g), lr=1e-3) for g in GRADIENT_GROUPS}
    rng = np.random.default_rng(0)
    n = config.learner.batch_size

    def cols(*shape: int) -> np.ndarray:
        return rng.standard_normal(shape).astype(np.float32)

    place = np.arange(n) % len(tasks)
    obs = cols(n, tasks.obs_dim)
    if tasks.multi:  # the padded observation ends with the task's one-hot
        obs[:, -len(tasks) :] = np.eye(len(tasks), dtype=np.float32)[place]
    task = place if tasks.multi else None
    batch = Batch.from_numpy(
        obs, cols(n, tasks.goal_dim), np.tanh(cols(n, tasks.act_dim)), -np.ones(n, np.float32), obs.copy(),
        np.zeros(n, np.float32), task=task,
    )  # fmt: skip
    buffers = GradientBuffers()  # as the learner writes its gradients (learner/worker.py)
    for _ in range(BARE_WARMUP_UPDATES):  # first calls (and learner.compile's compilation) untimed
        compute_gradients(model, batch, hp, out=buffers.next())
    updates, cpu0, deadline = 0, time.process_time(), time.monotonic() + seconds
    while time.monotonic() < deadline:
        result = compute_gradients(model, batch, hp, out=buffers.next())
        for g in GRADIENT_GROUPS if adam else ():
            flat = torch.from_numpy(result.grads[g])
            offset = 0
            for p in model.group_parameters(g):
                p.grad = flat[offset : offset + p.numel()].view_as(p)
                offset += p.numel()
            optim[g].step()
        updates += 1
    return updates / (time.process_time() - cpu0)


def model_cost(arms: list[str], extra: list[str], seconds: float, repeats: int, tasks: list[str]) -> dict:
    """Each arm's bare updates per CPU-second, gradients alone (the learner's work) and with an
    in-process Adam step; arms interleaved over `repeats` rounds, medians (a shared machine drifts)."""

    def measure(arm: str) -> dict[str, float]:
        config = arm_config(arm, extra, tasks)
        return {
            "gradients": bare_updates_per_cpu_sec(config, seconds, adam=False),
            "with_adam": bare_updates_per_cpu_sec(config, seconds, adam=True),
        }

    runs = run_interleaved({arm: (lambda _repeat, a=arm: measure(a)) for arm in arms}, repeats)
    medians = median_figures(runs)
    out = {}
    for arm, rounds in runs.items():
        config = arm_config(arm, extra, tasks)
        spec = model_spec(config, TaskSet.for_run(config))
        sizes = SACModel(spec).group_sizes()
        out[arm] = {
            "overrides": MODEL_ARMS[arm],
            "preset": config.preset,
            "hidden_sizes": list(spec.hidden_sizes),
            "params": {g: sizes[g] for g in ("actor", "critic")},
            **{
                k: {"runs": [round(r[k], 2) for r in rounds], "median": round(float(medians[arm][k] or 0.0), 2)}
                for k in ("gradients", "with_adam")
            },
        }
    return out


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
    """Start the fleet (learner.num_learners learners), wait for WARMUP_UPDATES, then measure over
    `seconds`: the aggregator's applied gradients (all learners') and the learners' CPU."""
    fleet = LocalFleet(config, started_at=time.monotonic())
    cluster = fleet.make_cluster()
    with closing(cluster), Watchdog(run_dir / "logs", stop_grace_sec=5.0) as dog:
        fleet.prepare()
        _, aggregator = fleet.start_roles(dog, cluster, learners=True, evaluator=False, max_restarts=0)
        roles = dog.pids()
        pids = [pid for name, pid in roles.items() if name.startswith("learner-")]
        pid = roles["learner-0"]  # phases and threads: the first learner's
        with AggregatorClient(aggregator, security=fleet.security) as agg:
            deadline = time.monotonic() + START_TIMEOUT_SEC
            while agg.stats().gradients_applied < WARMUP_UPDATES:
                dog.poll()
                if time.monotonic() > deadline:
                    raise TimeoutError(f"learner made < {WARMUP_UPDATES} updates in {START_TIMEOUT_SEC}s")
                time.sleep(0.5)
            beat0, cpu0, t0 = _heartbeat(run_dir), sum(map(_learner_cpu, pids)), time.monotonic()
            threads0 = _thread_cpu(pid)
            applied0 = agg.stats().gradients_applied
            time.sleep(seconds)
            applied1 = agg.stats().gradients_applied
            beat1, cpu1, t1 = _heartbeat(run_dir), sum(map(_learner_cpu, pids)), time.monotonic()
            threads1 = _thread_cpu(pid)
        LocalFleet.stop_roles(dog)
    updates = applied1 - applied0
    phases0, phases1 = beat0.get("phase_sec", {}), beat1.get("phase_sec", {})
    pushed = beat1.get("counters", {}).get("pushed", 0) - beat0.get("counters", {}).get("pushed", 0)
    phase_ms = {k: 1e3 * (v - phases0.get(k, 0.0)) / max(pushed, 1) for k, v in phases1.items()}
    return {
        "learners": len(pids),
        "updates": updates,
        "window_sec": t1 - t0,
        "learner_cpu_sec": cpu1 - cpu0,
        "updates_per_sec": updates / (t1 - t0),
        "rows_per_sec": updates * config.learner.batch_size / (t1 - t0),
        "updates_per_cpu_sec": updates / max(cpu1 - cpu0, 1e-9),
        "phase_ms_per_update": {k: round(v, 3) for k, v in sorted(phase_ms.items())},
        "thread_cpu_ms_per_update": {
            k: round(1e3 * (v - threads0.get(k, 0.0)) / max(pushed, 1), 3)  # per gradient learner-0 pushed
            for k, v in sorted(threads1.items())
            if v - threads0.get(k, 0.0) > 0.01
        },
    }


def tasks_arg(text: str) -> list[str]:
    """--tasks as `fleetrl train --tasks` reads it: registered names or a set's name (mt10)."""
    try:
        return split_tasks(text)
    except ConfigError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--task", default="FetchPush-v4", help="task name; its preset sets the learner's shapes")
    p.add_argument("--seconds", type=float, default=60.0, help="window of (b); (a) runs half before, half after")
    p.add_argument("--set", action="append", default=[], help="config override section.field=value (repeatable)")
    p.add_argument("--run-dir", help="config, logs, heartbeats of (b); default: a temporary directory")
    p.add_argument("--json", help="write the raw result (figures, commit, command) here")
    p.add_argument(
        "--model",
        action="append",
        choices=sorted(MODEL_ARMS),
        help="instead of (a)/(b): the bare loop of each named model on --tasks (repeatable; "
        "--seconds per arm and round)",
    )
    p.add_argument(
        "--tasks",
        type=tasks_arg,
        default=MODEL_TASKS,
        help="--model: the tasks, comma-separated or a set's name (mt10); default the 4-task set",
    )
    p.add_argument("--repeats", type=repeats_arg, default=3, help="--model: interleaved rounds (medians reported)")
    args = p.parse_args(argv)
    if args.seconds <= 0:
        p.error(f"--seconds {args.seconds}: must be > 0")
    return args


def main_models(args: argparse.Namespace) -> int:
    """--model: the learner's cost per model on --tasks; ratios are the result."""
    arms = list(dict.fromkeys(args.model))
    batch = arm_config(arms[0], args.set, args.tasks).learner.batch_size
    figures: dict = {"tasks": args.tasks, "batch_size": batch, "torch_threads": 1, "set": args.set}
    figures["arms"] = model_cost(arms, args.set, args.seconds, args.repeats, args.tasks)
    figures["ratios"] = model_ratios({a: figures["arms"][a]["gradients"]["median"] for a in arms})
    if args.json:
        write_result(result_record("learner_throughput_models", figures), args.json)
    rows = {
        arm: {
            "params (actor+critic)": sum(row["params"].values()),
            "grads/CPU-s": row["gradients"]["median"],
            "+Adam": row["with_adam"]["median"],
        }
        for arm, row in figures["arms"].items()
    }
    print_table(f"learner cost per model: {len(args.tasks)} tasks, batch {batch}, 1 thread", rows)
    print_table("ratios", {name: {"ratio": value} for name, value in figures["ratios"].items()})
    return 0


def fleet_figures(args: argparse.Namespace, config: RunConfig, run_dir: pathlib.Path) -> dict:
    """(a) the bare loop, half before and half after (b) the learner in the fleet; the ratios."""
    print(f"[a] bare loop, {args.seconds / 2:.0f}s", file=sys.stderr)
    bare_before = bare_updates_per_cpu_sec(config, args.seconds / 2)
    print(f"[b] learner in the fleet, {args.seconds:.0f}s window, run dir {run_dir}", file=sys.stderr)
    learner = measure_learner(config, run_dir, args.seconds)
    bare_after = bare_updates_per_cpu_sec(config, args.seconds / 2)
    bare = (bare_before + bare_after) / 2
    reference = reference_config(config)
    bare_reference = bare if reference == config else bare_updates_per_cpu_sec(reference, args.seconds / 2)
    return {
        "task": args.task,
        "batch_size": config.learner.batch_size,
        "hidden_sizes": list(config.learner.hidden_sizes),
        "torch_threads": config.learner.torch_threads,
        "bare_updates_per_cpu_sec": {"before": round(bare_before, 2), "after": round(bare_after, 2)},
        "learner": learner,
        "ratio": learner["updates_per_cpu_sec"] / bare,
        "learners": learner["learners"],
        "reference_bare_updates_per_sec": round(bare_reference, 2),
        "reference": REFERENCE,
        "reference_rows_per_sec": round(bare_reference * reference.learner.batch_size, 1),
        # the fleet's learning throughput (rows of applied gradients per wall-second) / the reference's
        "fleet_ratio": learner["rows_per_sec"] / (bare_reference * reference.learner.batch_size),
    }


def print_fleet(figures: dict) -> None:
    learner, bare = figures["learner"], figures["bare_updates_per_cpu_sec"]
    print(f"\nlearner phases (wall ms per update): {learner['phase_ms_per_update']}")
    print(f"learner threads (CPU ms per update): {learner['thread_cpu_ms_per_update']}")
    print(f"learner wall rate: {learner['updates_per_sec']:.1f} updates/s over {learner['window_sec']:.0f}s")
    rows = {
        f"bare loop updates per CPU-s (before {bare['before']}, after {bare['after']})": (
            bare["before"] + bare["after"]
        )
        / 2,
        "learner process updates per CPU-s": learner["updates_per_cpu_sec"],
        "ratio learner / bare": figures["ratio"],
        f"fleet rows learned per second ({learner['learners']} learner(s))": learner["rows_per_sec"],
        f"bare reference rows per second ({', '.join(REFERENCE)})": figures["reference_rows_per_sec"],
        "ratio fleet / bare reference": figures["fleet_ratio"],
    }
    title = f"learner throughput: {figures['task']}, batch {figures['batch_size']}"
    print_table(title, {name: {"value": value} for name, value in rows.items()})


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.model:
        return main_models(args)
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    run_dir = pathlib.Path(args.run_dir or tempfile.mkdtemp(prefix="fleetrl-learner-bench-"))
    overrides = ["run_id=bench", f"run_dir={json.dumps(str(run_dir))}", *args.set]
    config = with_overrides(preset_config(args.task), overrides).validate()
    figures = fleet_figures(args, config, run_dir)
    if not args.run_dir:
        shutil.rmtree(run_dir, ignore_errors=True)
    if args.json:
        write_result(result_record("learner_throughput", figures), args.json)
    print_fleet(figures)
    return 0


if __name__ == "__main__":
    sys.exit(main())
