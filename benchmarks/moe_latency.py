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
in onnxruntime on batch-1 calls, the arms interleaved in rounds so that machine noise falls on
all of them alike; the audit verdict of each graph is reported. Figures printed last.
"""

from __future__ import annotations

import argparse
import dataclasses
import pathlib
import sys
import tempfile
import time

import numpy as np
import torch
from harness import result_record, write_result  # benchmarks/harness.py (this script's folder)

from aggregator.core import AggregatorCore
from deploy_npu.audit import OpAuditError, audit_onnx
from deploy_npu.export import export_onnx, trace_to_onnx
from deploy_npu.freeze import reference_actor
from deploy_npu.parity import OnnxPolicy
from deploy_npu.routing import calibration_states, freeze_routing
from fleet.cli.presets import preset_config
from foundation.checkpoint import latest_checkpoint, load_checkpoint, load_policy_checkpoint
from foundation.config import with_overrides
from foundation.policy import ModelSpec, model_spec
from sim.registry import get_task


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


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--task", default="FetchPush-v4")
    p.add_argument("--calls", type=int, default=10_000, help="timed calls per arm")
    p.add_argument("--rounds", type=int, default=10, help="interleaved rounds the calls are split into")
    p.add_argument("--calibration-episodes", type=int, default=10)
    p.add_argument("--checkpoint", help="a trained single-task MoE checkpoint (file, or the directory: newest)")
    p.add_argument("--out", help="write the raw result here")
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    if args.checkpoint:
        state = load_checkpoint(latest_checkpoint(args.checkpoint) or args.checkpoint)
        spec = ModelSpec.from_json(state["spec"])
        if spec.kind != "moe" or spec.tasks != 1 or not state.get("task"):
            p.error(f"--checkpoint: a single-task MoE run's, got kind {spec.kind!r} with {spec.tasks} task(s)")
        args.task = state["task"]
    task = get_task(args.task)
    config = with_overrides(preset_config(args.task), ['model.kind="moe"'])
    if not args.checkpoint:
        spec = model_spec(config, task)
        state = AggregatorCore(spec, config.aggregator, 1, 1, task.name).state()
    ckpt = load_policy_checkpoint(state, weights="live")
    actor = reference_actor(ckpt)
    states = calibration_states(spec, ckpt.actor, ckpt.obs_norm, task, args.calibration_episodes)
    table = freeze_routing(actor, task.name, states)
    out = pathlib.Path(tempfile.mkdtemp(prefix="fleetrl-moe-latency-"))
    paths = {"frozen": out / "frozen.onnx", "dynamic": out / "dynamic.onnx", "dense": out / "dense.onnx"}
    export_onnx(state, paths["frozen"], routing=table)
    (out / "dynamic.onnx").write_bytes(
        trace_to_onnx(DynamicPolicy(actor).eval(), spec.input_dim, 17, 1).SerializeToString()
    )
    dense_spec = dataclasses.replace(spec, kind="dense")
    export_onnx(AggregatorCore(dense_spec, config.aggregator, 1, 1, task.name).state(), paths["dense"])
    policies = {name: OnnxPolicy(path) for name, path in paths.items()}
    batch = np.random.default_rng(0).standard_normal((1, spec.input_dim)).astype(np.float32)
    times: dict[str, list[float]] = {name: [] for name in policies}
    for policy in policies.values():
        for _ in range(200):  # warm-up: arenas, page-in
            policy.run_batch(batch)
    per_round = args.calls // args.rounds
    for r in range(args.rounds):
        order = list(policies) if r % 2 == 0 else list(reversed(policies))
        for name in order:
            run = policies[name].run_batch
            for _ in range(per_round):
                start = time.perf_counter_ns()
                run(batch)
                times[name].append((time.perf_counter_ns() - start) / 1e6)
    arms = {
        name: {
            "p50_ms": float(np.percentile(t, 50)),
            "p99_ms": float(np.percentile(t, 99)),
            "calls": len(t),
            "audit": _audit(paths[name]),
        }
        for name, t in times.items()
    }
    figures = {
        "task": task.name,
        "checkpoint": {"path": args.checkpoint, "version": ckpt.version} if args.checkpoint else None,
        "spec": spec.to_json(),
        "routing": {"agreement": table.agreement, "action_error_max": table.action_error_max, "states": table.states},
        "arms": arms,
        "frozen_over_dynamic_p50": round(arms["frozen"]["p50_ms"] / arms["dynamic"]["p50_ms"], 3),
        "frozen_over_dynamic_p99": round(arms["frozen"]["p99_ms"] / arms["dynamic"]["p99_ms"], 3),
    }
    if args.out:
        write_result(result_record("moe_latency", figures), args.out)
    print(f"\n=== {task.name}: MoE actor {spec.experts} experts, top {spec.top_k}, {spec.hidden_sizes} ===")
    for name, arm in arms.items():
        timing = f"p50 {arm['p50_ms']:.4f} ms  p99 {arm['p99_ms']:.4f} ms  ({arm['calls']} calls)"
        print(f"{name:8s} {timing}  audit {arm['audit']}")
    router = f"the trained router of version {ckpt.version}" if args.checkpoint else "an untrained router"
    print(f"routing agreement {table.agreement:.3f} over {table.states} states ({router})")
    print(f"frozen / dynamic: p50 {figures['frozen_over_dynamic_p50']}, p99 {figures['frozen_over_dynamic_p99']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
