"""Learner efficiency: SAC updates per CPU-second of the real learner process ÷ a bare torch loop.

    python3 benchmarks/learner_throughput.py [--task FetchPush-v4] [--seconds 60] [--json out.json]
    python3 benchmarks/learner_throughput.py --model dense --model moe-e8 --model moe-e32 [--seconds 10]

With --model, only the bare loop runs, once per named model on the 4-task set (FetchReach,
FetchPush, Meta-World reach and push; batch 256, one thread), arms interleaved over --repeats
rounds: the learner's cost per model (issue 18: moe-e32 / moe-e8 >= 0.8, moe-e32 / dense at
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
float32, eager, one thread; measured too when --set changes them). Issue 19's goal: >= 1.4 on 2
cores.

Figures come LAST; the ratios are the result (per CPU-second: issue goal >= 0.9). Absolute rates
are context.
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
from fleet.cli.presets import preset_config, preset_for
from fleet.launch.local_fleet import LocalFleet
from fleet.launch.watchdog import Watchdog
from foundation.config import RunConfig, with_overrides
from foundation.policy import model_spec
from learner.algorithm import Batch
from learner.gradients import Hyperparams, compute_gradients
from nets.flat import GradientBuffers
from nets.models import GRADIENT_GROUPS, SACModel
from sim.tasks import TaskSet

WARMUP_UPDATES = 200
BARE_WARMUP_UPDATES = 5
START_TIMEOUT_SEC = 180.0


# issue 19's yardstick: one thread, float32, eager, batch 256
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


# --model arms: overrides on the multi-task config (4 tasks, batch 256, one torch thread).
MODEL_ARMS: dict[str, list[str]] = {
    "dense": ['model.kind="dense"'],  # learner.hidden_sizes [256, 256]
    "moe-e8": ['model.kind="moe"', "model.experts=8"],  # top-2, expert width 128, task router
    "moe-e32": ['model.kind="moe"', "model.experts=32"],  # the default MoE: active width 2 x 128
    "moe-e32-w256": ['model.kind="moe"', "model.experts=32", "model.expert_width=256"],  # 2x the active width
    # per task, k mixed experts are ONE Linear of expert_width (sum_j g_j W_j): 256 is the
    # dense default's width per task; 8 or 16 experts keep the flat vector near moe-e32's
    "moe-e8-w256": ['model.kind="moe"', "model.experts=8", "model.expert_width=256"],
    "moe-e16-w256": ['model.kind="moe"', "model.experts=16", "model.expert_width=256"],
    "moe-e8-state": ['model.kind="moe"', "model.experts=8", 'model.router="state"'],
    "moe-e32-state": ['model.kind="moe"', "model.experts=32", 'model.router="state"'],
    "dense-bf16": ['model.kind="dense"', 'learner.autocast="bf16"'],  # issue 19: the CPU's BF16 instructions
    "dense-compile": ['model.kind="dense"', "learner.compile=true"],  # issue 19: torch.compile (inductor)
    # issue 19: TQC (sb3-contrib's, rl-zoo's choice for Fetch): two critics of 25 quantiles, 2 dropped each
    "dense-tqc": ['model.kind="dense"', 'learner.algo="tqc"'],
    # issue 19: CrossQ (no target critics; batch-renormalized critics on the current and next halves at once)
    "dense-crossq": ['model.kind="dense"', 'learner.algo="crossq"'],
    "moe-e32-bf16": ['model.kind="moe"', "model.experts=32", 'learner.autocast="bf16"'],
    # the MoE's twin critics one after the other (learner.fused_critics false), as before
    "moe-e32-unfused": ['model.kind="moe"', "model.experts=32", "learner.fused_critics=false"],
    # each pass of the update mixing the experts anew (learner.mix_once false), as before
    "moe-e32-mixeach": ['model.kind="moe"', "model.experts=32", "learner.mix_once=false"],
    # twice the rows per update: a cost mostly per op (the MoE's) grows less than the rows do
    "dense-b512": ['model.kind="dense"', "learner.batch_size=512"],
    "moe-e32-b512": ['model.kind="moe"', "model.experts=32", "learner.batch_size=512"],
}
# Issue 18's yardstick is top-2 (k = 2) with no shared expert: every MoE arm sets it, since a
# multi-task run of a task-routed MoE otherwise takes the recipe's top_k 3 with one shared
# expert (fleet/cli/presets.py TASK_ROUTED_SHARED), measured by its own arm.
MODEL_ARMS = {
    arm: [*sets, "model.top_k=2", "model.shared_experts=0"] if arm.startswith("moe") else sets
    for arm, sets in MODEL_ARMS.items()
}
MODEL_ARMS["moe-e32-shared"] = ['model.kind="moe"', "model.experts=32"]  # the recipe: top_k 3, 1 shared
MODEL_TASKS = ["FetchReach-v4", "FetchPush-v4", "MetaWorld-reach-v3", "MetaWorld-push-v3"]
# every arm at batch 256 in float32 unless it says otherwise, whatever the multi-task recipe's
# (a dense or task-routed MoE multi-task run's is batch 1024 with autocast "auto": MULTITASK_BATCH)
MODEL_BASE = ["learner.batch_size=256", 'learner.autocast="off"']


def arm_config(arm: str, extra: list[str] | None = None) -> RunConfig:
    """`arm`'s config on the 4-task set as the CLI builds a run's (fleet/cli/main.py): the preset and
    multi-task recipe chosen by what was set, then what was set on top (batch 256 in float32
    unless the arm or `extra` sets them: MODEL_BASE); one torch thread."""
    overrides = [f"sim.tasks={json.dumps(MODEL_TASKS)}", *MODEL_BASE, *MODEL_ARMS[arm], *(extra or [])]
    overrides.append("learner.torch_threads=1")
    return with_overrides(preset_for(with_overrides(RunConfig(), overrides), overrides), overrides).validate()


def model_cost(arms: list[str], extra: list[str], seconds: float, repeats: int) -> dict:
    """Each arm's bare updates per CPU-second, gradients alone (the learner's work) and with an
    in-process Adam step; arms interleaved, `repeats` rounds, medians (a shared machine drifts)."""
    rates: dict[str, dict[str, list[float]]] = {a: {"gradients": [], "with_adam": []} for a in arms}
    for r in range(repeats):
        for arm in arms:
            config = arm_config(arm, extra)
            rates[arm]["gradients"].append(bare_updates_per_cpu_sec(config, seconds, adam=False))
            rates[arm]["with_adam"].append(bare_updates_per_cpu_sec(config, seconds, adam=True))
            print(f"[round {r + 1}/{repeats}] {arm}: {rates[arm]['gradients'][-1]:.1f} updates/CPU-s", file=sys.stderr)
    out = {}
    for arm, rate in rates.items():
        config = arm_config(arm, extra)
        spec = model_spec(config, TaskSet.for_run(config))
        sizes = SACModel(spec).group_sizes()
        out[arm] = {
            "overrides": MODEL_ARMS[arm],
            "preset": config.preset,
            "hidden_sizes": list(spec.hidden_sizes),
            "params": {g: sizes[g] for g in ("actor", "critic")},
            **{
                k: {"runs": [round(v, 2) for v in vs], "median": round(float(np.median(vs)), 2)}
                for k, vs in rate.items()
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
        help="instead of (a)/(b): the bare loop of each named model on the 4-task set (repeatable; "
        "--seconds per arm and round)",
    )
    p.add_argument("--repeats", type=int, default=3, help="--model: interleaved rounds (medians reported)")
    args = p.parse_args(argv)
    if args.seconds <= 0:
        p.error(f"--seconds {args.seconds}: must be > 0")
    return args


def main_models(args: argparse.Namespace) -> int:
    """--model: the learner's cost per model on the 4-task set; ratios are the result."""
    arms = list(dict.fromkeys(args.model))
    batch = arm_config(arms[0], args.set).learner.batch_size
    figures: dict = {"tasks": MODEL_TASKS, "batch_size": batch, "torch_threads": 1, "set": args.set}
    figures["arms"] = model_cost(arms, args.set, args.seconds, args.repeats)
    med = {a: figures["arms"][a]["gradients"]["median"] for a in arms}
    ratios = {}
    if {"moe-e32", "moe-e8"} <= med.keys():
        ratios["moe-e32 / moe-e8"] = med["moe-e32"] / med["moe-e8"]  # issue 18 goal >= 0.8
    if {"moe-e32", "dense"} <= med.keys():
        ratios["moe-e32 / dense (equal active width)"] = med["moe-e32"] / med["dense"]  # goal >= 0.67
    if {"dense-tqc", "dense"} <= med.keys():
        ratios["dense-tqc / dense"] = med["dense-tqc"] / med["dense"]
    if {"moe-e32-w256", "dense"} <= med.keys():
        ratios["moe-e32-w256 / dense (twice the active width)"] = med["moe-e32-w256"] / med["dense"]
    for arm in ("dense", "moe-e32"):  # rows learned per CPU-second at batch 512 over batch 256
        if {arm, f"{arm}-b512"} <= med.keys():
            ratios[f"{arm}-b512 / {arm} (rows)"] = 2 * med[f"{arm}-b512"] / med[arm]
    if {"moe-e32-b512", "dense"} <= med.keys():
        ratios["moe-e32-b512 / dense (rows)"] = 2 * med["moe-e32-b512"] / med["dense"]
    figures["ratios"] = {k: round(v, 3) for k, v in ratios.items()}
    if args.json:
        write_result(result_record("learner_throughput_models", figures), args.json)
    print(f"\n=== learner cost per model: {len(MODEL_TASKS)} tasks, batch {batch}, 1 thread ===")
    print(f"{'arm':16s} {'params (actor+critic)':>22s} {'grads/CPU-s':>12s} {'+Adam':>8s}")
    for arm in arms:
        row = figures["arms"][arm]
        params = sum(row["params"].values())
        print(f"{arm:16s} {params:22,d} {row['gradients']['median']:12.1f} {row['with_adam']['median']:8.1f}")
    for name, value in figures["ratios"].items():
        print(f"ratio {name}: {value:.3f}")
    return 0


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.model:
        return main_models(args)
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
    reference = reference_config(config)
    # the yardstick: a bare one-thread float32 loop at batch 256, as fast as one core goes
    bare_reference = bare if reference == config else bare_updates_per_cpu_sec(reference, args.seconds / 2)
    reference_rows = bare_reference * reference.learner.batch_size
    figures = {
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
        # the fleet's learning throughput (rows of applied gradients per wall-second) / the reference's
        "fleet_ratio": learner["rows_per_sec"] / reference_rows,
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
    print(f"fleet rows learned per second:        {learner['rows_per_sec']:10.0f}  ({learner['learners']} learner(s))")
    print(f"bare reference rows per second:       {reference_rows:10.0f}  ({', '.join(REFERENCE)})")
    print(f"ratio fleet / bare reference:         {figures['fleet_ratio']:10.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
