"""A MoE policy's per-call latency with frozen routing against dynamic routing (and dense).

    python3 benchmarks/moe_latency.py [--task FetchPush-v4] [--checkpoint RUN/checkpoints] \
        [--calls 10000] [--out R.json]

One MoE actor of the task preset's widths (model.experts, model.top_k defaults), freshly
initialized (the graphs' shapes, and so their cost, do not depend on training), or with
`--checkpoint` a trained single-task MoE run's (its task; routing agreement is then the trained
router's), exported three ways with the same
exporter: frozen routing (deploy_npu/routing.py, calibrated on fresh rollouts: only the
selected experts, fixed gates), dynamic routing (the training module as it is: every expert,
TopK gates), and a dense actor of the same widths for context. Each is timed single-threaded
in onnxruntime on batch-1 calls, the arms interleaved in `--rounds` rounds so that machine
noise falls on all of them alike; the audit verdict of each graph is reported. Figures printed last.
"""

from __future__ import annotations

import argparse
import dataclasses
import pathlib
import sys
import tempfile
import time
from collections.abc import Callable

import numpy as np
import torch
from harness import (
    Arm,
    print_table,
    ratio,
    repeats_arg,  # benchmarks/harness.py (this script's folder)
    result_record,
    run_interleaved,
    write_result,
)

from aggregator.core import AggregatorCore
from deploy_npu.audit import OpAuditError, audit_onnx
from deploy_npu.export import export_onnx, trace_to_onnx
from deploy_npu.freeze import reference_actor
from deploy_npu.parity import OnnxPolicy
from deploy_npu.routing import RoutingTable, calibration_states, freeze_routing
from fleet.cli.presets import preset_config
from foundation.checkpoint import latest_checkpoint, load_checkpoint, load_policy_checkpoint
from foundation.config import with_overrides
from foundation.policy import ModelSpec, model_spec
from sim.registry import TaskSpec, get_task


class DynamicPolicy(torch.nn.Module):
    """The MoE actor as trained: every expert computed, TopK gates."""

    def __init__(self, actor: torch.nn.Module) -> None:
        super().__init__()
        self.actor = actor

    def forward(self, obs_goal: torch.Tensor) -> torch.Tensor:
        return self.actor.deterministic(obs_goal)


def _audit(path: pathlib.Path) -> str:
    try:
        audit_onnx(path)
    except OpAuditError as err:
        return "fails on " + ", ".join(sorted({f.op_type for f in err.report.findings}))
    return "passes"


@dataclasses.dataclass(frozen=True)
class Subject:
    """The MoE actor under test: a trained run's newest checkpoint, or the preset's fresh weights."""

    task: TaskSpec
    spec: ModelSpec
    state: dict
    checkpoint: str | None


def load_subject(args: argparse.Namespace, p: argparse.ArgumentParser) -> Subject:
    if not args.checkpoint:
        task = get_task(args.task)
        config = with_overrides(preset_config(args.task), ['model.kind="moe"'])
        spec = model_spec(config, task)
        return Subject(task, spec, AggregatorCore(spec, config.aggregator, 1, 1, task.name).state(), None)
    state = load_checkpoint(latest_checkpoint(args.checkpoint) or args.checkpoint)
    spec = ModelSpec.from_json(state["spec"])
    if spec.kind != "moe" or spec.tasks != 1 or not state.get("task"):
        p.error(f"--checkpoint: a single-task MoE run's, got kind {spec.kind!r} with {spec.tasks} task(s)")
    return Subject(get_task(state["task"]), spec, state, args.checkpoint)


def export_arms(subject: Subject, calibration_episodes: int, out: pathlib.Path) -> tuple[dict, RoutingTable]:
    """The three graphs (frozen routing, dynamic routing, dense) and the frozen routing's table."""
    ckpt = load_policy_checkpoint(subject.state, weights="live")
    actor = reference_actor(ckpt)
    states = calibration_states(subject.spec, ckpt.actor, ckpt.obs_norm, subject.task, calibration_episodes)
    table = freeze_routing(actor, subject.task.name, states)
    paths = {"frozen": out / "frozen.onnx", "dynamic": out / "dynamic.onnx", "dense": out / "dense.onnx"}
    export_onnx(subject.state, paths["frozen"], routing=table)
    dynamic = trace_to_onnx(DynamicPolicy(actor).eval(), subject.spec.input_dim, 17, 1)
    paths["dynamic"].write_bytes(dynamic.SerializeToString())
    config = preset_config(subject.task.name)
    dense_spec = dataclasses.replace(subject.spec, kind="dense")
    export_onnx(AggregatorCore(dense_spec, config.aggregator, 1, 1, subject.task.name).state(), paths["dense"])
    return paths, table


def latency_arms(paths: dict[str, pathlib.Path], input_dim: int, calls: int) -> dict[str, Arm]:
    """Per graph: `calls` timed batch-1 calls in onnxruntime (milliseconds each), after a warm-up."""
    batch = np.random.default_rng(0).standard_normal((1, input_dim)).astype(np.float32)
    policies = {name: OnnxPolicy(path) for name, path in paths.items()}
    for policy in policies.values():
        for _ in range(200):  # warm-up: arenas, page-in
            policy.run_batch(batch)

    def timed(run: Callable[[np.ndarray], object]) -> dict:
        times = []
        for _ in range(calls):
            start = time.perf_counter_ns()
            run(batch)
            times.append((time.perf_counter_ns() - start) / 1e6)
        return {"call_ms": times}

    return {name: (lambda _repeat, run=policy.run_batch: timed(run)) for name, policy in policies.items()}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--task", default="FetchPush-v4")
    p.add_argument("--calls", type=int, default=10_000, help="timed calls per arm")
    p.add_argument("--rounds", type=repeats_arg, default=10, help="interleaved rounds the calls are split into")
    p.add_argument("--calibration-episodes", type=int, default=10)
    p.add_argument("--checkpoint", help="a trained single-task MoE checkpoint (file, or the directory: newest)")
    p.add_argument("--out", help="write the raw result here")
    args = p.parse_args(argv)
    if args.calls < args.rounds:
        p.error(f"--calls {args.calls} must be >= --rounds {args.rounds}: each round times calls // rounds calls")
    torch.set_num_threads(1)
    subject = load_subject(args, p)
    paths, table = export_arms(subject, args.calibration_episodes, pathlib.Path(tempfile.mkdtemp(prefix="moe-lat-")))
    runs = run_interleaved(latency_arms(paths, subject.spec.input_dim, args.calls // args.rounds), args.rounds)
    arms = {}
    for name, rounds in runs.items():
        t = [ms for r in rounds for ms in r["call_ms"]]
        p50, p99 = (float(np.percentile(t, q)) for q in (50, 99))
        arms[name] = {"p50_ms": p50, "p99_ms": p99, "calls": len(t), "audit": _audit(paths[name])}
    version = int(subject.state["version"])
    figures = {
        "task": subject.task.name,
        "checkpoint": {"path": args.checkpoint, "version": version} if args.checkpoint else None,
        "spec": subject.spec.to_json(),
        "routing": {"agreement": table.agreement, "action_error_max": table.action_error_max, "states": table.states},
        "arms": arms,
        "frozen_over_dynamic_p50": ratio(arms["frozen"]["p50_ms"], arms["dynamic"]["p50_ms"]),
        "frozen_over_dynamic_p99": ratio(arms["frozen"]["p99_ms"], arms["dynamic"]["p99_ms"]),
    }
    if args.out:
        write_result(result_record("moe_latency", figures), args.out)
    spec = subject.spec
    print_table(f"{subject.task.name}: MoE actor {spec.experts} experts, top {spec.top_k}, {spec.hidden_sizes}", arms)
    router = f"the trained router of version {version}" if args.checkpoint else "an untrained router"
    print(f"routing agreement {table.agreement:.3f} over {table.states} states ({router})")
    print(f"frozen / dynamic: p50 {figures['frozen_over_dynamic_p50']}, p99 {figures['frozen_over_dynamic_p99']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
