"""A host full of samplers beside a CPU hog: per-step time jitter and locked memory.

    python3 benchmarks/sampler_jitter.py [--samplers 8] [--task FetchPush-v4] [--seconds 30] [--out R.json]

Runs `--samplers` processes that each step the task's domain-randomized env (random actions,
the work a sampler does per step) and time every `env.step`, next to one CPU hog process
(a busy loop, unpinned, at normal priority). Twice, in one run: with each sampler hardened
as `fleetrl sampler` does it (`sampler.harden`: pinned to a CPU, memory locked with
MCL_ONFAULT) and with neither. Reports per arm the p50/p99/p99.9 per-step time over all
samplers and each sampler's locked memory (goal: <= 200 MiB locked per sampler).

Prints LAST the p99 ratio hardened / neither (below 1: the hardening protects steps) and
the locked MiB per sampler.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import sys
import time

import numpy as np
from harness import result_record, write_result  # benchmarks/harness.py (this script's folder)

from foundation.config import RandomizationConfig
from foundation.process import locked_kib


def _sampler(index: int, task: str, seconds: float, harden_it: bool, out) -> None:
    from sampler.hardening import harden
    from sim.registry import make_env

    if harden_it:
        harden(index, pin=True, mlock=True)
    env = make_env(task, RandomizationConfig())
    rng = np.random.default_rng(index)
    env.reset(seed=index)
    times = []
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        action = rng.uniform(-1, 1, env.action_space.shape).astype(np.float32)
        start = time.perf_counter()
        _, _, terminated, truncated, _ = env.step(action)
        times.append(time.perf_counter() - start)
        if terminated or truncated:
            env.reset()
    out.put((index, np.asarray(times, np.float32), locked_kib() / 1024))


def _hog(stop) -> None:
    x = 0
    while not stop.is_set():
        for _ in range(100_000):
            x += 1


def run_arm(args: argparse.Namespace, harden_it: bool) -> dict:
    ctx = mp.get_context("spawn")
    out, stop = ctx.Queue(), ctx.Event()
    hog = ctx.Process(target=_hog, args=(stop,))
    hog.start()
    procs = [
        ctx.Process(target=_sampler, args=(i, args.task, args.seconds, harden_it, out)) for i in range(args.samplers)
    ]
    for p in procs:
        p.start()
    results = [out.get(timeout=args.seconds + 300) for _ in procs]
    for p in procs:
        p.join(30)
    stop.set()
    hog.join(30)
    steps = np.concatenate([r[1] for r in results]) * 1000
    return {
        "hardened": harden_it,
        "steps": int(len(steps)),
        "step_ms_p50": round(float(np.percentile(steps, 50)), 3),
        "step_ms_p99": round(float(np.percentile(steps, 99)), 3),
        "step_ms_p999": round(float(np.percentile(steps, 99.9)), 3),
        "locked_mib_per_sampler": [round(r[2], 1) for r in sorted(results, key=lambda r: r[0])],
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--samplers", type=int, default=8)
    p.add_argument("--task", default="FetchPush-v4")
    p.add_argument("--seconds", type=float, default=30.0, help="stepping time per arm")
    p.add_argument("--out", help="write the raw result (JSON) here")
    args = p.parse_args(argv)
    arms = [run_arm(args, harden_it=False), run_arm(args, harden_it=True)]
    neither, hardened = arms
    ratio = round(hardened["step_ms_p99"] / neither["step_ms_p99"], 3)
    if args.out:
        figures = {"arms": arms, "p99_hardened_vs_neither": ratio, "samplers": args.samplers, "task": args.task}
        write_result(result_record("sampler_jitter", figures), args.out)
    for arm in arms:
        label = "pinned+locked" if arm["hardened"] else "neither"
        print(f"{label:>14}: step p50 {arm['step_ms_p50']} ms, p99 {arm['step_ms_p99']} ms, "
              f"p99.9 {arm['step_ms_p999']} ms over {arm['steps']} steps")  # fmt: skip
    print(f"locked MiB per sampler (pinned+locked): {hardened['locked_mib_per_sampler']}")
    print(f"p99 step time pinned+locked / neither: {ratio}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
