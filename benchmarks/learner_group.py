"""Several learners, two ways: K-of-M through the aggregator against a gloo all-reduce.

    python3 benchmarks/learner_group.py [--task FetchPush-v4] [--learners 2] [--seconds 20] [--repeats 3] [--out R.json]

Every learner is its own OS process with one torch thread and the task preset's networks and
batch. The aggregator arms use the real AggregatorServer (gRPC, Adam, weights back on the
WatchWeights stream) in this process; the all-reduce arms use torch.distributed's gloo
backend over loopback, each learner then stepping its own Adam on the averaged gradient (what
a synchronous data-parallel learner group does). Arms, all in one run:

- round: no gradient computation, the policy's real gradient sizes: each learner sends its
  gradient and waits for the step it closes (aggregator: K = M, no deadline; all-reduce: one
  all_reduce + Adam step). Seconds per round, aggregator / all-reduce.
- straggler: learners compute real SAC gradients on in-memory batches; before each gradient,
  learner 0 pauses --pause-ms with probability --pause-prob. Aggregator: K = M with the
  default step_deadline_ms, each learner keeping one push in flight (as learner/worker.py does)
  and going on with the newest weights it has (weights and gradients through /dev/shm, as a
  learner on the aggregator's host does; --grpc-only: over gRPC);
  all-reduce: every rank waits for the slowest each step. Gradients applied per second over
  the group (each a batch of the preset's size), K-of-M / all-reduce (goal: >= 1.4).

Prints the figures last.
"""

from __future__ import annotations

import argparse
import functools
import multiprocessing as mp
import os
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import replace

import numpy as np
from harness import (
    Arm,
    median_figures,
    paired_ratios,
    print_table,
    repeats_arg,  # benchmarks/harness.py (this script's folder)
    result_record,
    run_interleaved,
    write_result,
)

from fleet.cli.presets import preset_config
from foundation.config import RunConfig
from foundation.policy import LEARNER_GROUPS
from foundation.process import free_port
from sim.registry import get_task

GROUPS_SENT = ("actor", "critic", "log_alpha")
WAIT_SEC = 300.0  # start-up barrier and joins: a stuck learner process fails the benchmark, never hangs it


def _setup(config: RunConfig):
    import torch

    from foundation.policy import model_spec
    from learner.algorithm import Batch
    from learner.gradients import Hyperparams
    from nets.models import SACModel

    torch.set_num_threads(1)
    task = get_task(config.sim.task)
    spec = model_spec(config, task)
    model = SACModel(spec)
    rng = np.random.default_rng(0)
    n = config.learner.batch_size

    def cols(width: int) -> np.ndarray:
        return rng.normal(size=(n, width)).astype(np.float32)

    batch = Batch.from_numpy(
        cols(task.obs_dim),
        cols(task.goal_dim),
        np.tanh(cols(task.act_dim)),
        -rng.integers(0, 2, (n,)).astype(np.float32),
        cols(task.obs_dim),
        np.zeros(n, np.float32),
    )
    hp = Hyperparams.for_run(config, task.act_dim)
    return spec, model, batch, hp


class _Pauser:
    """Learner 0 pauses `pause_sec` with probability `prob` before a gradient; the others never."""

    def __init__(self, index: int, prob: float, pause_sec: float) -> None:
        self.rng = np.random.default_rng(100 + index)
        self.prob = prob if index == 0 else 0.0
        self.pause_sec = pause_sec
        self.paused = 0.0

    def maybe(self) -> None:
        if self.prob and self.rng.random() < self.prob:
            time.sleep(self.pause_sec)
            self.paused += self.pause_sec


def _newest_weights(watcher, snap, need: int, model):  # noqa: ANN001, ANN202
    """As learner/worker.py: the newest weights, waiting only when `need` is not yet reached."""
    latest = watcher.latest() or snap
    if latest.version < need:
        latest = watcher.wait_newer_than(need - 1, timeout=60) or latest
    if latest.version != snap.version:
        for group in GROUPS_SENT:
            model.set_flat(group, latest.tensors[group])
    return latest


def _step_weights(watcher, snap, model, window_end: float):  # noqa: ANN001, ANN202
    """The weights of the step this learner's gradient closed, loaded into `model`."""
    # Not past the window by much: a step the other learner, already done, never closes.
    left = window_end + 1.0 - time.monotonic()
    snap = watcher.wait_newer_than(snap.version, timeout=max(left, 0.1)) or snap
    for group in GROUPS_SENT:
        model.set_flat(group, snap.tensors[group])
    return snap


def aggregator_learner(index, address, config, seconds, compute, pause, barrier, out) -> None:  # noqa: ANN001
    from aggregator.client import AggregatorClient, GradientPush
    from learner.gradients import compute_gradients

    spec, model, batch, hp = _setup(config)
    pauser = _Pauser(index, *pause)
    fixed = compute_gradients(model, batch, hp)
    shared = config.learner.shared_memory
    with (
        AggregatorClient(address) as client,
        client.watch(f"learner-{index}", LEARNER_GROUPS, shared_memory=shared) as watcher,
    ):
        snap = watcher.wait_newer_than(-1, timeout=60)
        deadline = time.monotonic() + 30
        while shared and not watcher.shared_memory and time.monotonic() < deadline:  # as learner/worker.py
            time.sleep(0.01)
        if watcher.shared_memory:
            client.share_gradients({g: v.size for g, v in fixed.grads.items()})
        barrier.wait(WAIT_SEC)
        applied = pushed = need = 0
        pending = None  # with compute: one push in flight, its step overlapping the next gradient (as learners do)
        start = time.monotonic()
        while time.monotonic() - start < seconds:
            if compute:
                snap = _newest_weights(watcher, snap, need, model)
            pauser.maybe()  # a stall while computing: this gradient's weights age meanwhile
            result = compute_gradients(model, batch, hp) if compute else fixed
            push = GradientPush(index, snap.version, result.grads, result.norm_stats, config.learner.batch_size)
            pushed += 1
            if compute:
                if pending is not None:
                    ack = pending.result()
                    applied += int(ack.applied)
                    need = max(need, int(ack.version) - config.learner.max_grad_staleness)
                pending = client.push_gradients_async(push)
            else:  # a round: push, then wait for the step this gradient is in
                applied += int(client.push_gradients(push).applied)
                snap = _step_weights(watcher, snap, model, start + seconds)
        if pending is not None:
            applied += int(pending.result().applied)
        elapsed = time.monotonic() - start
        sharing = {"weights_shared": watcher.shared_reads, "gradients_shared": client.shares_gradients}
        out.put({"index": index, "pushed": pushed, "applied": applied, "sec": elapsed} | sharing)


def allreduce_learner(index, world, port, config, seconds, compute, pause, barrier, out) -> None:  # noqa: ANN001
    import torch
    import torch.distributed as dist

    from learner.gradients import compute_gradients

    spec, model, batch, hp = _setup(config)
    pauser = _Pauser(index, *pause)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=index, world_size=world)
    params = {g: torch.nn.Parameter(torch.from_numpy(model.get_flat(g))) for g in GROUPS_SENT}
    optim = torch.optim.Adam(list(params.values()), lr=config.aggregator.lr)
    fixed = compute_gradients(model, batch, hp)
    sizes = [params[g].numel() for g in GROUPS_SENT]
    barrier.wait(WAIT_SEC)
    rounds = 0
    start = time.monotonic()
    while True:
        pauser.maybe()
        result = compute_gradients(model, batch, hp) if compute else fixed
        stop = 1.0 if index == 0 and time.monotonic() - start >= seconds else 0.0
        flat = torch.from_numpy(np.concatenate([*(result.grads[g] for g in GROUPS_SENT), [stop]]).astype(np.float32))
        dist.all_reduce(flat)  # the sum over ranks; the last element: rank 0 says stop
        if flat[-1].item() > 0:
            break
        mean = flat[:-1] / world
        for param, piece in zip(params.values(), torch.split(mean, sizes), strict=True):
            param.grad = piece
        optim.step()
        for group in GROUPS_SENT:
            model.set_flat(group, params[group].detach().numpy())
        rounds += 1
    elapsed = time.monotonic() - start
    dist.destroy_process_group()
    out.put({"index": index, "rounds": rounds, "applied": rounds, "sec": elapsed})


def run_aggregator_arm(config: RunConfig, learners: int, seconds: float, compute: bool, pause: tuple) -> dict:
    from aggregator.core import AggregatorCore
    from aggregator.service import AggregatorServer
    from foundation.policy import model_spec

    task = get_task(config.sim.task)
    spec = model_spec(config, task)
    agg = config.aggregator if compute else replace(config.aggregator, step_deadline_ms=0.0)
    core = AggregatorCore(spec, agg, grads_per_step=learners, max_staleness=config.learner.max_grad_staleness)
    ctx = mp.get_context("spawn")
    barrier, out = ctx.Barrier(learners + 1), ctx.Queue()
    with AggregatorServer(core, agg) as server:
        procs = [
            ctx.Process(
                target=aggregator_learner, args=(i, server.address, config, seconds, compute, pause, barrier, out)
            )
            for i in range(learners)
        ]
        for p in procs:
            p.start()
        barrier.wait(WAIT_SEC)
        v0 = core.version
        rows = [out.get(timeout=seconds + 120) for _ in procs]
        versions = core.version - v0
        for p in procs:
            p.join(WAIT_SEC)
    wall = max(r["sec"] for r in rows)
    return {
        "versions": versions,
        "sec": wall,
        "sec_per_round": wall / max(versions, 1),
        "gradients_applied": sum(r["applied"] for r in rows),
        "gradients_applied_per_sec": sum(r["applied"] for r in rows) / wall,
        "deadline_steps": core.deadline_steps,
        "repeat_steps": core.repeat_steps,
        "learners": rows,
    }


def run_allreduce_arm(config: RunConfig, learners: int, seconds: float, compute: bool, pause: tuple) -> dict:
    ctx = mp.get_context("spawn")
    barrier, out = ctx.Barrier(learners + 1), ctx.Queue()
    port = free_port()
    args = (learners, port, config, seconds, compute, pause, barrier, out)
    procs = [ctx.Process(target=allreduce_learner, args=(i, *args)) for i in range(learners)]
    for p in procs:
        p.start()
    barrier.wait(WAIT_SEC)
    rows = [out.get(timeout=seconds + 120) for _ in procs]
    for p in procs:
        p.join(WAIT_SEC)
    wall = max(r["sec"] for r in rows)
    rounds = rows[0]["rounds"]
    return {
        "versions": rounds,
        "sec": wall,
        "sec_per_round": wall / max(rounds, 1),
        "gradients_applied": rounds * learners,
        "gradients_applied_per_sec": rounds * learners / wall,
        "learners": rows,
    }


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--task", default="FetchPush-v4")
    p.add_argument("--learners", type=int, default=2)
    p.add_argument("--seconds", type=float, default=20.0)
    p.add_argument("--pause-ms", type=float, default=200.0)
    p.add_argument("--pause-prob", type=float, default=0.1)
    p.add_argument(
        "--max-staleness",
        type=int,
        help="learner.max_grad_staleness (default: the number of learners: each other learner's push may make "
        "a version while one computes, so a smaller bound drops or waits by construction)",
    )
    p.add_argument(
        "--grpc-only",
        action="store_true",
        help="learner.shared_memory=false: weights and gradients over gRPC even on the aggregator's host",
    )
    p.add_argument("--repeats", type=repeats_arg, default=3, help="runs of every arm, interleaved; figures are medians")
    p.add_argument("--out", help="write the raw result here")
    return p


def group_config(args: argparse.Namespace) -> RunConfig:
    """The task's preset with the staleness bound and the weights' transport under test."""
    config = preset_config(args.task)
    staleness = args.learners if args.max_staleness is None else args.max_staleness
    learner = replace(config.learner, max_grad_staleness=staleness, shared_memory=not args.grpc_only)
    return replace(config, learner=learner)


def group_arms(config: RunConfig, args: argparse.Namespace) -> dict[str, Arm]:
    """The four arms: a round with no gradient computation and a straggler, through each way."""
    still, straggle = (0.0, 0.0), (args.pause_prob, args.pause_ms / 1000.0)
    arms: dict[str, Arm] = {}
    for name, runner, compute, pause in (
        ("round_aggregator", run_aggregator_arm, False, still),
        ("round_allreduce", run_allreduce_arm, False, still),
        ("straggler_k_of_m", run_aggregator_arm, True, straggle),
        ("straggler_allreduce", run_allreduce_arm, True, straggle),
    ):
        arms[name] = functools.partial(_measure_arm, runner, config, args, compute, pause)
    return arms


def _measure_arm(
    runner: Callable[..., dict], config: RunConfig, args: argparse.Namespace, compute: bool, pause: tuple, _repeat: int
) -> dict:
    """One repeat of one arm (the repeat changes nothing: the arms differ, the repeats do not)."""
    return runner(config, args.learners, args.seconds, compute, pause)


def group_ratios(runs: dict[str, list[dict]]) -> dict[str, float]:
    """Per repeat, round time aggregator / all-reduce and gradients applied/s K-of-M / all-reduce; medians."""
    rounds = paired_ratios(runs, "round_aggregator", "round_allreduce", "sec_per_round")
    applied = paired_ratios(runs, "straggler_k_of_m", "straggler_allreduce", "gradients_applied_per_sec")
    return {
        "round_aggregator_vs_allreduce": round(statistics.median(rounds), 3),
        "straggler_k_of_m_vs_allreduce": round(statistics.median(applied), 3),
    }


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    config = group_config(args)
    runs = run_interleaved(group_arms(config, args), args.repeats)
    ratios = group_ratios(runs)
    figures = {
        "task": args.task,
        "learners": args.learners,
        "batch_size": config.learner.batch_size,
        "hidden_sizes": list(config.learner.hidden_sizes),
        "pause": {"ms": args.pause_ms, "prob": args.pause_prob, "learner": 0},
        "step_deadline_ms": config.aggregator.step_deadline_ms,
        "max_grad_staleness": config.learner.max_grad_staleness,
        "shared_memory": config.learner.shared_memory,
        "seconds_per_arm": args.seconds,
        "runs": runs,
        **ratios,  # medians over the repeats
    }
    if args.out:
        write_result(result_record("learner_group", figures), args.out)
    columns = ["versions", "sec_per_round", "gradients_applied_per_sec"]
    title = (
        f"{args.learners} learners, {args.task} networks, batch {config.learner.batch_size}: medians of {args.repeats}"
    )
    print_table(title, median_figures(runs), columns)
    print(f"round time, aggregator / gloo all-reduce: {ratios['round_aggregator_vs_allreduce']:.3f}")
    straggler = ratios["straggler_k_of_m_vs_allreduce"]
    print(f"gradients applied/s with a straggler, K-of-M / all-reduce: {straggler:.3f}  (goal >= 1.4)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
