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
  the group (each a batch of the preset's size), K-of-M / all-reduce (issue 9's goal: >= 1.4).

Prints the figures last.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import sys
import time
from dataclasses import replace

import numpy as np
from common import result_record, write_result  # benchmarks/common.py (this script's folder)

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
            if compute:  # as learner/worker.py: the newest weights, waiting only when too far behind
                latest = watcher.latest() or snap
                if latest.version < need:
                    latest = watcher.wait_newer_than(need - 1, timeout=60) or latest
                if latest.version != snap.version:
                    snap = latest
                    for group in GROUPS_SENT:
                        model.set_flat(group, snap.tensors[group])
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
                # Not past the window by much: a step the other learner, already done, never closes.
                left = start + seconds + 1.0 - time.monotonic()
                snap = watcher.wait_newer_than(snap.version, timeout=max(left, 0.1)) or snap
                for group in GROUPS_SENT:
                    model.set_flat(group, snap.tensors[group])
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


def main(argv: list[str] | None = None) -> int:
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
    p.add_argument("--repeats", type=int, default=3, help="runs of every arm, interleaved; figures are medians")
    p.add_argument("--out", help="write the raw result here")
    args = p.parse_args(argv)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    config = preset_config(args.task)
    staleness = args.learners if args.max_staleness is None else args.max_staleness
    learner = replace(config.learner, max_grad_staleness=staleness, shared_memory=not args.grpc_only)
    config = replace(config, learner=learner)
    still, straggle = (0.0, 0.0), (args.pause_prob, args.pause_ms / 1000.0)
    repeats = []  # each repeat runs every arm once: a slow spell on this shared machine hits all arms alike
    for r in range(args.repeats):
        arms = {}
        for name, runner, compute, pause in (
            ("round_aggregator", run_aggregator_arm, False, still),
            ("round_allreduce", run_allreduce_arm, False, still),
            ("straggler_k_of_m", run_aggregator_arm, True, straggle),
            ("straggler_allreduce", run_allreduce_arm, True, straggle),
        ):
            print(f"repeat {r + 1}/{args.repeats}: arm {name} ({args.seconds:.0f} s)", flush=True)
            arms[name] = runner(config, args.learners, args.seconds, compute, pause)
        k_of_m, allreduce = arms["straggler_k_of_m"], arms["straggler_allreduce"]
        repeats.append(
            {
                "arms": arms,
                "round_aggregator_vs_allreduce": arms["round_aggregator"]["sec_per_round"]
                / arms["round_allreduce"]["sec_per_round"],
                "straggler_k_of_m_vs_allreduce": k_of_m["gradients_applied_per_sec"]
                / allreduce["gradients_applied_per_sec"],
            }
        )
    round_ratio = float(np.median([r["round_aggregator_vs_allreduce"] for r in repeats]))
    straggler_ratio = float(np.median([r["straggler_k_of_m_vs_allreduce"] for r in repeats]))
    figures = {
        "task": args.task,
        "learners": args.learners,
        "batch_size": config.learner.batch_size,
        "hidden_sizes": list(config.learner.hidden_sizes),
        "pause": {"ms": args.pause_ms, "prob": args.pause_prob, "learner": 0},
        "step_deadline_ms": config.aggregator.step_deadline_ms,
        "max_grad_staleness": staleness,
        "shared_memory": config.learner.shared_memory,
        "seconds_per_arm": args.seconds,
        "repeats": repeats,
        "round_aggregator_vs_allreduce": round(round_ratio, 3),  # medians over the repeats
        "straggler_k_of_m_vs_allreduce": round(straggler_ratio, 3),
    }
    if args.out:
        write_result(result_record("learner_group", figures), args.out)
    print(f"\n=== {args.learners} learners, {args.task} networks, batch {config.learner.batch_size} ===")
    for r, rep in enumerate(repeats):
        for name, arm in rep["arms"].items():
            print(
                f"{r + 1} {name:20s} versions {arm['versions']:6d}  s/round {arm['sec_per_round'] * 1000:7.2f} ms  "
                f"gradients applied/s {arm['gradients_applied_per_sec']:7.1f}"
            )
    print(f"round time, aggregator / gloo all-reduce (median of {len(repeats)}): {round_ratio:.3f}")
    print(
        f"gradients applied/s with a straggler, K-of-M / all-reduce (median of {len(repeats)}): "
        f"{straggler_ratio:.3f}  (goal >= 1.4)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
