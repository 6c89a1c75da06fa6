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
import contextlib
import dataclasses
import itertools
import json
import os
import pathlib
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator

import numpy as np
import psutil
import torch
from harness import (
    REPO,
    median_figures,
    print_table,
    ratio,
    repeats_arg,
    result_record,
    run_interleaved,
    write_result,
)  # benchmarks/harness.py (this script's folder)

from aggregator.client import AggregatorClient, GradientPush
from fleet.launch.local_fleet import free_port
from foundation.config import RunConfig, tasks_overrides, with_overrides
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


@dataclasses.dataclass(frozen=True)
class ArmSpec:
    """One arm: the checkout whose aggregator runs, the networks' size and how bytes travel."""

    checkout: pathlib.Path
    hidden: tuple[int, ...]
    wire: str  # float32 | bfloat16: the gradients' wire format
    weights_via: str  # grpc | shm
    push_via: str  # stream | unary
    settings: tuple[str, ...]  # section.field=value for this arm's run


@contextlib.contextmanager
def running_aggregator(checkout: pathlib.Path, config_path: str) -> Iterator[tuple[str, psutil.Process]]:
    """A `fleetrl aggregator` process of `checkout`, up and answering: (address, process)."""
    port = free_port()
    env = {**os.environ, "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "PYTHONPATH": str(checkout)}
    cmd = [sys.executable, "-m", "fleet.cli.main", "aggregator", "--config", config_path, "--port", str(port)]
    proc = subprocess.Popen(cmd, cwd=checkout, env=env, stdout=subprocess.DEVNULL)
    address = f"127.0.0.1:{port}"
    try:
        _wait_up(address, proc)
        yield address, psutil.Process(proc.pid)
    finally:
        proc.terminate()
        proc.wait(30)


def measure(spec: ArmSpec, config_path: str, versions: int) -> dict:
    """The aggregator's CPU per version while a learner pushes a gradient on each of `versions` versions."""
    grads, stats, sizes = _gradient(RunConfig.load(config_path))
    gradient_bytes = (2 if spec.wire == "bfloat16" else 4) * sum(sizes[g] for g in GRADIENT_GROUPS)
    weight_bytes = 4 * sum(sizes[g] for g in LEARNER_GROUPS)
    shm = spec.weights_via == "shm"
    with (
        running_aggregator(spec.checkout, config_path) as (address, agg),
        AggregatorClient(address) as client,
        client.watch("bench-learner", LEARNER_GROUPS, shared_memory=shm) as weights,
        client.watch("bench-sampler", ACTOR_GROUPS, 0.2),
    ):
        snapshot = weights.wait_newer_than(-1, timeout=30)
        assert snapshot is not None, "no weights streamed"
        if shm:  # as a learner does once it maps the aggregator's weights
            deadline = time.monotonic() + 30
            while not weights.shared_memory and time.monotonic() < deadline:
                time.sleep(0.01)
            assert weights.shared_memory and client.share_gradients({g: grads[g].size for g in grads})
        before, start = agg.cpu_times(), time.monotonic()
        first = snapshot.version
        while snapshot.version < first + versions:
            push = GradientPush(0, snapshot.version, grads, stats, 256, wire_dtype=spec.wire)
            if spec.push_via == "stream":  # as a learner pushes: PushGradientsStream
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
        "mb_moved_per_version": 0.0 if shm else (gradient_bytes + weight_bytes) / 1e6,  # gradient in, weights out
        "weights_from_shared_memory": weights.shared_reads,
        "gradients_through_shared_memory": client.shares_gradients,
        "cpu_ms_per_version": 1000 * cpu / made,
        "versions_per_sec": made / elapsed,
    }


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


def _fits(medians: dict, arms: dict[str, ArmSpec]) -> dict:
    """Per checkout and transport: CPU per version = fixed + per_mb * MB moved (least squares on the medians)."""
    groups: dict[tuple, list[str]] = {}
    for name, spec in arms.items():
        groups.setdefault((spec.checkout, spec.wire, spec.weights_via, spec.push_via, spec.settings), []).append(name)
    fits = {}
    for names in groups.values():
        if len({arms[n].hidden for n in names}) < 2:
            continue
        points = [medians[n] for n in names]
        per_mb, fixed = np.polyfit([m["mb_moved_per_version"] for m in points],
                                   [m["cpu_ms_per_version"] for m in points], 1)  # fmt: skip
        fits[re.sub(r"@[0-9x]+", "", names[0])] = {
            "fixed_cpu_ms_per_version": float(fixed),
            "cpu_ms_per_mb_moved": float(per_mb),
        }
    return fits


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--task", default="FetchPush-v4", help="the task of a one-task run (sim.task)")
    p.add_argument("--versions", type=int, default=3000, help="versions per measurement")
    p.add_argument("--repeats", type=repeats_arg, default=3)
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
    p.add_argument("--tasks", help="A,B,...: a multi-task run's tasks for every arm (sim.tasks; sim.task its first)")
    p.add_argument("--set", action="append", default=[], help="section.field=value (JSON) for every arm's run")
    p.add_argument("--out", help="write the raw result (JSON) here")
    return p


def arm_specs(args: argparse.Namespace, p: argparse.ArgumentParser) -> dict[str, ArmSpec]:
    """Every checkout x size x wire x transport x push, named by what varies: 'this@64x64/bfloat16'."""
    checkouts = dict(a.split("=", 1) for a in args.arm) or {"this": str(REPO)}
    arm_sets: dict[str, list[str]] = {}
    for item in args.arm_set:
        name, _, setting = item.partition(":")
        if name not in checkouts or not setting:
            p.error(f"--arm-set {item!r}: expected NAME:section.field=value for an --arm NAME")
        arm_sets.setdefault(name, []).append(setting)
    sizes = [tuple(int(w) for w in h.split(",")) for h in args.hidden] or [(256, 256)]
    wires = args.wire or [RunConfig().learner.gradient_wire_dtype]
    vias, pushes = args.weights or ["grpc"], args.push or ["stream"]
    arms = {}
    for name, path in checkouts.items():
        for hidden, wire, via, push in itertools.product(sizes, wires, vias, pushes):
            size = f"@{'x'.join(map(str, hidden))}" if len(sizes) > 1 else ""
            label = name + size + _tag(wire, wires) + _tag(via, vias) + _tag(push, pushes)
            arms[label] = ArmSpec(pathlib.Path(path), hidden, wire, via, push, tuple(arm_sets.get(name, [])))
    return arms


def arm_config(args: argparse.Namespace, spec: ArmSpec, path: pathlib.Path) -> str:
    """Write the arm's run config (one learner, the arm's networks and settings) to `path`."""
    overrides = [
        *(tasks_overrides(args.tasks.split(",")) if args.tasks else [f"sim.task={json.dumps(args.task)}"]),
        "learner.num_learners=1",
        f"learner.hidden_sizes={list(spec.hidden)}",
        *args.set,
        *spec.settings,
    ]
    path.write_text(with_overrides(RunConfig(), overrides).to_json())
    return str(path)


def main(argv: list[str] | None = None) -> int:
    p = _parser()
    args = p.parse_args(argv)
    arms = arm_specs(args, p)
    with tempfile.TemporaryDirectory() as tmp:
        configs = {name: arm_config(args, spec, pathlib.Path(tmp, f"config-{i}.json"))
                   for i, (name, spec) in enumerate(arms.items())}  # fmt: skip
        runs = run_interleaved(
            {name: (lambda _repeat, n=name: measure(arms[n], configs[n], args.versions)) for name in arms},
            args.repeats,
        )
    keys = ("mb_moved_per_version", "cpu_ms_per_version", "versions_per_sec")
    medians = {name: {k: m[k] for k in keys} for name, m in median_figures(runs).items()}
    base = next(iter(arms))
    ratios = {
        f"cpu_per_version_{name}_over_{base}": ratio(m["cpu_ms_per_version"], medians[base]["cpu_ms_per_version"])
        for name, m in medians.items()
        if name != base
    }
    fits = _fits(medians, arms)
    if args.out:
        commits = {name: _commit(spec.checkout) for name, spec in arms.items()}
        task = args.tasks.split(",")[0] if args.tasks else args.task  # the run's sim.task
        figures = {"task": task, "tasks": args.tasks, "settings": args.set, "commits": commits}
        figures |= {"arms": {n: dataclasses.asdict(s) | {"checkout": str(s.checkout)} for n, s in arms.items()}}
        figures |= {"runs": runs, "medians": medians, "ratios": ratios, "fits": fits}
        write_result(result_record("aggregator_cpu", figures), args.out)
    print_table(f"aggregator per version, medians of {args.repeats}", medians)
    print_table("CPU per version = fixed + per MB moved", fits)
    print_table("CPU per version over the first arm's (below 1: cheaper)", {k: {"ratio": v} for k, v in ratios.items()})
    return 0


def _commit(checkout: pathlib.Path) -> str:
    return subprocess.run(["git", "rev-parse", "HEAD"], cwd=checkout, capture_output=True, text=True).stdout.strip()


if __name__ == "__main__":
    sys.exit(main())
