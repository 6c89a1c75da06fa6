"""The aggregator's CPU per version, as a one-learner fleet drives it, for one or more checkouts.

    python3 benchmarks/aggregator_cpu.py [--task FetchPush-v4] [--versions 3000] [--repeats 3] \\
        [--arm NAME=CHECKOUT ...] [--weights grpc --weights shm] [--push stream --push unary] \\
        [--tasks A,B,C,D --set model.kind=\\"moe\\" ...] [--arm-set NAME:section.field=value] [--out R.json]

Starts a real `fleetrl aggregator` process from each arm's checkout (default: this one) and
drives it as the fleet's learner and sampler do: one client streams the groups a learner takes
(LEARNER_GROUPS: not the target critics) and pushes a real-sized gradient on each new version
(max_grad_staleness 1), a second streams the actor at most every 0.2 s. `--weights shm`: the
learner's weights and gradients go through /dev/shm segments, gRPC saying only which.
`--push unary`: one PushGradients call per gradient instead of the learners' one long-lived
PushGradientsStream. `--tasks` and `--set section.field=value` shape every arm's run (a
multi-task MoE: `--set model.kind=\\"moe\\"`); a MoE's pushed gradient is then a real one, a
learner's backward pass on a batch holding every task, so it touches only the experts those
tasks are routed to (what the aggregator's lazy expert steps skip), where a dense arm's is
random. Reports per arm the aggregator's CPU-milliseconds per version (its user +
system time over the pushes) and versions per second. Arms run interleaved, `--repeats` times
each, so a noisy machine affects them alike; the figures are medians.

Prints LAST each arm's CPU per version over the first arm's (below 1: cheaper).
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np
import psutil
import torch
from common import REPO, result_record, write_result  # benchmarks/common.py (this script's folder)

from aggregator.client import AggregatorClient, GradientPush
from fleet.launch.local_fleet import free_port
from foundation.config import RunConfig, with_overrides
from foundation.policy import ACTOR_GROUPS, GRADIENT_GROUPS, LEARNER_GROUPS, model_spec
from learner.algorithm import Batch
from learner.gradients import Hyperparams, compute_gradients
from nets.models import SACModel, norm_stats
from sim.tasks import TaskSet


def _wait_up(address: str, proc: subprocess.Popen, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    with AggregatorClient(address) as probe:
        while True:
            try:
                probe.stats(timeout_sec=1.0)
                return
            except Exception:  # noqa: BLE001 - not up yet
                if time.monotonic() > deadline or proc.poll() is not None:
                    raise RuntimeError(f"aggregator at {address} did not come up") from None
                time.sleep(0.2)


def measure(
    checkout: pathlib.Path,
    config_path: str,
    versions: int,
    task: str,
    hidden: tuple[int, ...],
    wire: str,
    weights_via: str = "grpc",
    push_via: str = "stream",
) -> dict:
    grads, stats, sizes = _gradient(RunConfig.load(config_path))
    gradient_bytes = (2 if wire == "bfloat16" else 4) * sum(sizes[g] for g in GRADIENT_GROUPS)
    weight_bytes = 4 * sum(sizes[g] for g in LEARNER_GROUPS)
    moved_mb = (gradient_bytes + weight_bytes) / 1e6 if weights_via == "grpc" else 0.0  # over gRPC
    port = free_port()
    env = {**os.environ, "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "PYTHONPATH": str(checkout)}
    cmd = [sys.executable, "-m", "fleet.cli.main", "aggregator", "--config", config_path, "--port", str(port)]
    proc = subprocess.Popen(cmd, cwd=checkout, env=env, stdout=subprocess.DEVNULL)
    address = f"127.0.0.1:{port}"
    try:
        _wait_up(address, proc)
        agg = psutil.Process(proc.pid)
        with (
            AggregatorClient(address) as client,
            client.watch("bench-learner", LEARNER_GROUPS, shared_memory=weights_via == "shm") as weights,
            client.watch("bench-sampler", ACTOR_GROUPS, 0.2),
        ):
            snapshot = weights.wait_newer_than(-1, timeout=30)
            assert snapshot is not None, "no weights streamed"
            if weights_via == "shm":  # as a learner does once it maps the aggregator's weights
                deadline = time.monotonic() + 30
                while not weights.shared_memory and time.monotonic() < deadline:
                    time.sleep(0.01)
                assert weights.shared_memory and client.share_gradients({g: grads[g].size for g in grads})
            before, start = agg.cpu_times(), time.monotonic()
            first = snapshot.version
            while snapshot.version < first + versions:
                push = GradientPush(0, snapshot.version, grads, stats, 256, wire_dtype=wire)
                if push_via == "stream":  # as a learner pushes: PushGradientsStream
                    client.push_gradients_async(push).result()
                else:
                    client.push_gradients(push)
                newer = weights.wait_newer_than(snapshot.version, timeout=30)
                assert newer is not None, f"no version after {snapshot.version}"
                snapshot = newer
            elapsed, after = time.monotonic() - start, agg.cpu_times()
        made = snapshot.version - first
        cpu = (after.user - before.user) + (after.system - before.system)
        return {
            "versions": made,
            "mb_moved_per_version": moved_mb,  # the gradient in, the learner's weights out (over gRPC)
            "weights_from_shared_memory": weights.shared_reads,
            "gradients_through_shared_memory": client.shares_gradients,
            "cpu_ms_per_version": 1000 * cpu / made,
            "versions_per_sec": made / elapsed,
        }
    finally:
        proc.terminate()
        proc.wait(30)


def _gradient(config: RunConfig, rows: int = 256) -> tuple[dict[str, np.ndarray], np.ndarray, dict[str, int]]:
    """(gradient, normalizer statistics, group sizes) a learner of this run pushes: a MoE's real
    (the aggregator's initial weights, a batch holding every task), a dense model's random."""
    tasks = TaskSet.for_run(config)
    spec = model_spec(config, tasks)
    torch.manual_seed(config.aggregator.seed)  # the aggregator's initial weights, so its routing
    model = SACModel(spec)
    rng = np.random.default_rng(0)
    obs_goal = rng.normal(size=(rows, spec.input_dim)).astype(np.float32)
    task = np.arange(rows) % len(tasks)
    if tasks.multi:  # the task one-hot the padded observation carries
        obs_goal[:, spec.one_hot[0] : spec.one_hot[1]] = np.eye(len(tasks), dtype=np.float32)[task]
    if spec.kind != "moe":
        grads = {g: (rng.standard_normal(n) * 1e-4).astype(np.float32) for g, n in model.group_sizes().items()
                 if g in GRADIENT_GROUPS}  # fmt: skip
        return grads, norm_stats(obs_goal, task, spec.norm_rows), model.group_sizes()
    obs, goal = obs_goal[:, : -spec.goal_dim], obs_goal[:, -spec.goal_dim :]
    action = rng.uniform(-1, 1, (rows, spec.act_dim))
    batch = Batch.from_numpy(obs, goal, action, -np.ones(rows), obs, np.zeros(rows), task=task)
    result = compute_gradients(model, batch, Hyperparams.for_run(config, spec.act_dim))
    return result.grads, result.norm_stats, model.group_sizes()


def _tag(value: str, values: list[str]) -> str:
    """An arm name's part for a setting that varies between arms ("" for one that does not)."""
    return f"/{value}" if len(values) > 1 else ""


def _print(medians: dict, fits: dict, ratios: dict, repeats: int) -> None:
    print(f"\n{'arm':>16} {'MB moved':>9} {'CPU ms/version':>15} {'versions/s':>11}  (medians of {repeats})")
    for name, m in medians.items():
        mb, cpu, rate = m["mb_moved_per_version"], m["cpu_ms_per_version"], m["versions_per_sec"]
        print(f"{name:>16} {mb:>9.2f} {cpu:>15.2f} {rate:>11.1f}")
    for name, fit in fits.items():
        print(
            f"{name}: {fit['fixed_cpu_ms_per_version']:.2f} ms fixed + {fit['cpu_ms_per_mb_moved']:.2f} ms per MB moved"
        )
    for name, value in ratios.items():
        print(f"{name}: {value:.3f}")


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--task", default="FetchPush-v4")
    p.add_argument("--versions", type=int, default=3000, help="versions per measurement")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--arm", action="append", default=[], help="NAME=CHECKOUT (a git work tree); default this one")
    p.add_argument(
        "--hidden",
        action="append",
        default=[],
        help="W,W: the networks' hidden widths (repeat for several sizes: CPU per version against MB moved); "
        "default 256,256",
    )
    p.add_argument(
        "--wire", action="append", default=[], help="float32 | bfloat16: how gradients travel (repeat for both)"
    )
    p.add_argument(
        "--weights",
        action="append",
        default=[],
        help="grpc | shm: how the learner's weights and gradients travel (shm: same-host segments, "
        "foundation/shm.py; repeat for both); default grpc",
    )
    p.add_argument(
        "--push",
        action="append",
        default=[],
        help="stream | unary: gradients on one PushGradientsStream call (as learners push) or one "
        "PushGradients call each (repeat for both); default stream",
    )
    p.add_argument(
        "--arm-set",
        action="append",
        default=[],
        help="NAME:section.field=value for one --arm's run only (two arms of one checkout, two settings)",
    )
    p.add_argument("--tasks", help="A,B,...: a multi-task run's tasks (sim.tasks) for every arm")
    p.add_argument("--set", action="append", default=[], help="section.field=value (JSON) for every arm's run")
    p.add_argument("--out", help="write the raw result (JSON) here")
    return p


def main(argv: list[str] | None = None) -> int:
    p = _parser()
    args = p.parse_args(argv)
    checkouts = dict(a.split("=", 1) for a in args.arm) or {"this": str(REPO)}
    arm_sets: dict[str, list[str]] = {}
    for item in args.arm_set:
        name, _, setting = item.partition(":")
        if name not in checkouts or not setting:
            p.error(f"--arm-set {item!r}: expected NAME:section.field=value for an --arm NAME")
        arm_sets.setdefault(name, []).append(setting)
    sizes = [tuple(int(w) for w in h.split(",")) for h in args.hidden] or [(256, 256)]
    wires = args.wire or [RunConfig().learner.gradient_wire_dtype]
    vias = args.weights or ["grpc"]
    pushes = args.push or ["stream"]

    def arm_name(name: str, hidden: tuple[int, ...], wire: str, via: str, push: str) -> str:  # what varies
        size = f"@{'x'.join(map(str, hidden))}" if len(sizes) > 1 else ""
        return name + size + _tag(wire, wires) + _tag(via, vias) + _tag(push, pushes)

    arms = {
        arm_name(name, hidden, wire, via, push): (path, hidden, wire, via, push)
        for name, path in checkouts.items()
        for hidden in sizes
        for wire in wires
        for via in vias
        for push in pushes
    }
    commits = {
        name: subprocess.run(["git", "rev-parse", "HEAD"], cwd=path, capture_output=True, text=True).stdout.strip()
        for name, path in checkouts.items()
    }
    rows: list[dict] = []
    with tempfile.TemporaryDirectory() as tmp:
        for repeat in range(args.repeats):
            for name, (path, hidden, wire, via, push) in arms.items():
                overrides = [
                    f'sim.task="{args.task}"',
                    "learner.num_learners=1",
                    f"learner.hidden_sizes={list(hidden)}",
                    *([f"sim.tasks={json.dumps(args.tasks.split(','))}"] if args.tasks else []),
                    *args.set,
                    *arm_sets.get(name.split("@")[0].split("/")[0], []),
                ]
                config_path = os.path.join(tmp, f"config-{name.replace('/', '-')}.json")
                pathlib.Path(config_path).write_text(with_overrides(RunConfig(), overrides).to_json())
                row = {
                    "arm": name,
                    "hidden": list(hidden),
                    "wire": wire,
                    "weights": via,
                    "push": push,
                    "repeat": repeat,
                    **measure(pathlib.Path(path), config_path, args.versions, args.task, hidden, wire, via, push),
                }
                rows.append(row)
                print(row, flush=True)
    medians = {
        name: {
            key: statistics.median(r[key] for r in rows if r["arm"] == name)
            for key in ("mb_moved_per_version", "cpu_ms_per_version", "versions_per_sec")
        }
        for name in arms
    }
    base = next(iter(arms))
    ratios = {
        f"cpu_per_version_{name}_over_{base}": medians[name]["cpu_ms_per_version"] / medians[base]["cpu_ms_per_version"]
        for name in arms
        if name != base
    }
    fits = {}
    if len(sizes) > 1:  # per checkout: CPU per version = fixed + per_mb * MB moved (least squares on the medians)
        for name, wire, via, push in ((n, w, v, u) for n in checkouts for w in wires for v in vias for u in pushes):
            same = (checkouts[name], wire, via, push)
            points = [medians[a] for a, (path, _, *rest) in arms.items() if (path, *rest) == same]
            per_mb, fixed = np.polyfit([m["mb_moved_per_version"] for m in points],
                                       [m["cpu_ms_per_version"] for m in points], 1)  # fmt: skip
            fits[name + _tag(wire, wires) + _tag(via, vias) + _tag(push, pushes)] = {
                "fixed_cpu_ms_per_version": float(fixed),
                "cpu_ms_per_mb_moved": float(per_mb),
            }
    if args.out:
        figures = {"task": args.task, "arms": {a: p for a, (p, *_) in arms.items()}, "commits": commits, "rows": rows}
        figures |= {"tasks": args.tasks, "settings": args.set, "arm_settings": arm_sets}
        figures |= {"medians": medians, "ratios": ratios, "fits": fits}
        write_result(result_record("aggregator_cpu", figures), args.out)
    _print(medians, fits, ratios, args.repeats)
    return 0


if __name__ == "__main__":
    sys.exit(main())
