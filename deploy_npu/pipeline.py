"""The whole deploy check in one call: export, op audit, parity, latency, closed loop.

    report = export_and_check("runs/r1/checkpoints", "policy.onnx", DeployCheckConfig(episodes=5))
    print(report.summary())
    sys.exit(0 if report.passed else 1)

A policy passes when the audit finds nothing, parity is within tolerance and p99 latency is
within the controller budget. The closed-loop success rate is reported, never gated: an early
checkpoint legitimately scores ~0, and the evaluator owns the success targets.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import pathlib
from dataclasses import dataclass

import numpy as np
import torch

from deploy_npu.audit import AuditReport, OpAuditError, audit_onnx
from deploy_npu.export import ExportReport, export_onnx
from deploy_npu.freeze import TaskInput, freeze_policy, reference_actor
from deploy_npu.parity import (
    CONTROL_BUDGET_MS,
    PARITY_TOLERANCE,
    ClosedLoopReport,
    LatencyReport,
    OnnxPolicy,
    ParityReport,
    check_parity,
    closed_loop,
    env_inputs,
    measure_latency,
    random_inputs,
    task_for_spec,
)
from deploy_npu.quantize import Int8Report, audit_int8, quantize_int8
from deploy_npu.retime import retimed
from deploy_npu.routing import RoutingTable, calibration_states, freeze_routing
from foundation.checkpoint import CheckpointSource, PolicyCheckpoint, load_policy_checkpoint
from foundation.config import ConfigError, RunConfig
from foundation.config_base import config_field
from sim.rate import NATIVE_HZ
from sim.registry import TaskSpec, get_task
from sim.tasks import TaskSet


@dataclass(frozen=True)
class DeployCheckConfig:
    task: str | None = config_field(None, "task the policy acts in; None: the only registered task whose dims fit")
    opset: int = config_field(17, "ONNX opset of the exported graph (>= 13)")
    batch_size: int | None = config_field(
        1, "static batch of the exported graph; None: dynamic batch axis (not NPU-ready)"
    )
    random_inputs: int = config_field(512, "parity rows drawn around the checkpoint's input normalizer")
    env_inputs: int = config_field(512, "parity rows observed in the nominal env under random actions")
    tolerance: float = config_field(PARITY_TOLERANCE, "max |torch - onnx| action difference allowed")
    latency_calls: int = config_field(1000, "timed single-threaded onnxruntime calls")
    budget_ms: float = config_field(CONTROL_BUDGET_MS, "per-call p99 latency budget (120 Hz controller tick)")
    episodes: int = config_field(5, "closed-loop episodes in the nominal env (reported, not gated)")
    calibration_episodes: int = config_field(
        10, "a MoE policy: fresh deterministic episodes of the task whose states its routing is frozen over"
    )
    seed: int = config_field(0, "seed of parity inputs and closed-loop episode resets")
    weights: str = config_field(
        "best", "'live', 'swa' (the weight average), or 'best': the average when it scored above live"
    )
    int8: bool = config_field(
        False, "also write <out>.int8.onnx (onnxruntime static quantization) with its own parity and success"
    )
    control_hz: float = config_field(
        0.0,
        "the controller's rate; 0: the policy's training rate. Otherwise a Fetch policy's velocity inputs are "
        "re-timed from it to trained_hz in the graph's normalizer (deploy_npu/retime.py) and the closed-loop "
        "episodes run at it",
    )
    trained_hz: float = config_field(
        0.0, "the rate the policy was trained at; 0: its run's sim.control_hz (its config.json), else 25"
    )


@dataclass(frozen=True)
class ControlRate:
    """The rate an exported graph is for: `hz` decisions per second, the policy trained at
    `trained_hz`; `retimed`: its velocity inputs scaled to the training units (deploy_npu/retime.py)."""

    hz: float
    trained_hz: float
    retimed: bool


def run_control_hz(source: str, native_hz: float = NATIVE_HZ) -> float:
    """The rate a checkpoint's run trained at: sim.control_hz of the config.json beside its
    checkpoints/ directory (`source`: the checkpoint file or that directory), else the task's own
    rate `native_hz` (Fetch's 25 Hz by default; also for a checkpoint moved out of its run)."""
    path = pathlib.Path(source)
    if path.exists():
        run_dir = path.parent if path.is_dir() else path.parent.parent
        if (run_dir / "config.json").exists():
            return RunConfig.load(run_dir / "config.json").sim.control_hz or native_hz
    return native_hz


@dataclass(frozen=True)
class DeployReport:
    export: ExportReport
    audit: AuditReport
    parity: ParityReport
    latency: LatencyReport
    closed_loop: ClosedLoopReport
    routing: RoutingTable | None = None  # a MoE policy's frozen routing and how faithful it is
    input_layout: str = "observation ++ desired_goal"
    int8: Int8Report | None = None  # the optional int8 graph's figures (reported, never gated)
    rate: ControlRate | None = None  # the rate the graph is for, and whether its inputs were re-timed
    task_routing: tuple[RoutingTable, ...] = ()  # the multi-task graph's: every task's, in task order

    @property
    def passed(self) -> bool:
        return self.audit.passed and self.parity.passed and self.latency.within_budget

    def summary(self) -> str:
        """A short human report, one check per line."""
        ex, au, pa, la, cl = self.export, self.audit, self.parity, self.latency, self.closed_loop

        def mark(ok: bool) -> str:
            return "ok  " if ok else "FAIL"

        ops = ", ".join(f"{op} {n}" for op, n in au.op_histogram.items())
        lines = [
            f"export    ok   {ex.onnx_path} (checkpoint version {ex.checkpoint_version}, opset {ex.opset}, "
            f"{ex.input_name} {list(ex.input_shape)} -> {ex.output_name} {list(ex.output_shape)})",
            f"audit     {mark(au.passed)} ops: {ops}",
            *(f"            {finding}" for finding in au.findings),
            f"parity    {mark(pa.passed)} max |torch - onnx| {pa.max_abs_error:.3g} over {pa.num_inputs} inputs "
            f"(tolerance {pa.tolerance:g})",
            f"latency   {mark(la.within_budget)} p50 {la.p50_ms:.4f} ms, p99 {la.p99_ms:.4f} ms over {la.num_calls} "
            f"calls (budget {la.budget_ms:.2f} ms, 1 thread, onnxruntime CPU)",
            *self._routing_lines(),
            *self._int8_lines(),
            f"closed    info success rate {cl.success_rate:.2f} ({cl.successes}/{cl.episodes} episodes, {cl.task}"
            + (f", {self.rate.hz:g} Hz)" if self.rate is not None else ")"),
            *self._rate_lines(),
            f"result    {'PASS' if self.passed else 'FAIL'}",
        ]
        return "\n".join(lines)

    def manifest(self, ckpt: PolicyCheckpoint, tasks: list[str]) -> dict:
        """What a controller integrator needs beside the ONNX file (written as <file>.manifest.json)."""
        ex, spec = self.export, ckpt.spec
        return {
            "onnx": ex.onnx_path.name,
            "sha256": hashlib.sha256(ex.onnx_path.read_bytes()).hexdigest(),
            "tasks": tasks,
            "checkpoint": ckpt.source,
            "weight_version": ex.checkpoint_version,
            "weights": ckpt.weights,  # "live" (the newest actor) or "swa" (the weight average)
            "input": {"name": ex.input_name, "shape": list(ex.input_shape), "layout": self.input_layout},
            "output": {"name": ex.output_name, "shape": list(ex.output_shape), "range": [-1.0, 1.0]},
            "model_spec": json.loads(spec.to_json()),
            "normalizer": _normalizer(spec, ckpt.obs_norm),
            "routing": self._routing_json(),
            "control_rate": None if self.rate is None else dataclasses.asdict(self.rate),
            "checks": {
                "audit_passed": self.audit.passed,
                "ops": self.audit.op_histogram,
                "parity_max_abs_error": self.parity.max_abs_error,
                "parity_inputs": self.parity.num_inputs,
                "latency_p50_ms": self.latency.p50_ms,
                "latency_p99_ms": self.latency.p99_ms,
                "latency_calls": self.latency.num_calls,
                "closed_loop_success": self.closed_loop.success_rate,
                "closed_loop_episodes": self.closed_loop.episodes,
            },
            "int8": None
            if self.int8 is None
            else {
                "onnx": self.int8.onnx_path.name,
                "sha256": hashlib.sha256(self.int8.onnx_path.read_bytes()).hexdigest(),
                "audit_passed": self.int8.audit.passed,
                "max_abs_error_vs_float": self.int8.max_abs_error,
                "closed_loop_success": self.int8.success_rate,
                "closed_loop_episodes": self.int8.episodes,
                "latency_p50_ms": self.int8.p50_ms,
                "latency_p99_ms": self.int8.p99_ms,
            },
        }

    def write_manifest(self, ckpt: PolicyCheckpoint, tasks: list[str]) -> pathlib.Path:
        path = self.export.onnx_path.with_name(self.export.onnx_path.name + ".manifest.json")
        path.write_text(json.dumps(self.manifest(ckpt, tasks), indent=2))
        return path

    def _rate_lines(self) -> list[str]:
        r = self.rate
        if r is None or r.hz == r.trained_hz:
            return []
        if r.retimed:
            how = "velocity inputs re-timed to those units in the normalizer"
        else:  # Meta-World: sim/metaworld.py keeps the observation's previous frame 1/80 s old at any rate
            how = "its observation read in those units at any rate (not re-timed: nothing to)"
        return [f"rate      info a {r.hz:g} Hz controller; trained at {r.trained_hz:g} Hz, {how}"]

    def _int8_lines(self) -> list[str]:
        q = self.int8
        if q is None:
            return []
        return [
            f"int8      info {q.onnx_path.name}: audit {'ok' if q.audit.passed else 'FAIL'}, max |torch - int8| "
            f"{q.max_abs_error:.3g} over {q.num_inputs} inputs, p50 {q.p50_ms:.4f} ms, p99 {q.p99_ms:.4f} ms, "
            f"closed-loop success {q.success_rate:.2f} ({q.episodes} episodes)"
        ]

    def _routing_json(self) -> dict | None:
        """The manifest's routing: the graph's one table, or the multi-task graph's tables by task."""
        if self.task_routing:
            return {r.task: json.loads(r.to_json()) for r in self.task_routing}
        return json.loads(self.routing.to_json()) if self.routing is not None else None

    def _routing_lines(self) -> list[str]:
        lines = []
        for r in (self.routing,) if self.routing is not None else self.task_routing:
            table = "; ".join(
                f"layer {i}: experts {list(layer.experts)} gates {[round(g, 3) for g in layer.gates]}"
                for i, layer in enumerate(r.layers)
            )
            lines += [
                f"routing   info {r.task}: {table}",
                f"            agreement {r.agreement:.3f} over {r.states} calibration states; |frozen - dynamic| "
                f"max {r.action_error_max:.3g}, mean {r.action_error_mean:.3g}",
            ]
        return lines


def resolve_task(ckpt, named: str | None) -> tuple[TaskSpec, TaskInput | None]:
    """The task to export and check: the one named, else the checkpoint's, else by dims. A
    multi-task checkpoint needs one of its tasks named, and exports it on its own input."""
    if len(ckpt.task_names) > 1:
        tasks = TaskSet.of(ckpt.task_names)
        if named is None:
            raise ConfigError(
                f"checkpoint {ckpt.source} is of a multi-task run: name one of {list(tasks.names)} (--task)",
                field="task",
            )
        found = get_task(named)
        if found.name not in tasks.names:
            raise ConfigError(
                f"task {found.name} is not one of the checkpoint's tasks {list(tasks.names)}", field="task"
            )
        return found, TaskInput(tasks, tasks.names.index(found.name))
    # The task named on the command line, else the one the checkpoint records, else by dims.
    return task_for_spec(ckpt.spec, named if named is not None else ckpt.task), None


def frozen_and_timed(
    ckpt: PolicyCheckpoint,
    task: TaskSpec,
    task_input: TaskInput | None,
    *,
    hz: float,
    trained_hz: float,
    seed: int,
    calibration_episodes: int = 10,
) -> tuple[PolicyCheckpoint, RoutingTable | None, bool]:
    """What every export does before tracing: a MoE's routing frozen over fresh rollouts of the
    task (at its training rate), then, for a Fetch task run at another rate `hz` (0: none), its
    velocity inputs re-timed (deploy_npu/retime.py; a Meta-World task's observation reads the same
    at any rate, sim/metaworld.py). (checkpoint to trace, routing, re-timed)."""
    place = task_input.index if task_input is not None else 0  # the task's row of per-task tables
    routing = None
    if ckpt.spec.kind == "moe":
        tasks = task_input.tasks if task_input is not None else None
        states = calibration_states(ckpt.spec, ckpt.actor, ckpt.obs_norm, task, calibration_episodes, seed, tasks)
        routing = freeze_routing(reference_actor(ckpt), task.name, states, task_index=place)
    if hz and hz != trained_hz and task.is_fetch:
        return retimed(ckpt, task, trained_hz, hz, place), routing, True
    return ckpt, routing, False


def export_and_check(
    checkpoint: CheckpointSource, out_path: str | os.PathLike, config: DeployCheckConfig = DeployCheckConfig()
) -> DeployReport:
    """Export, then run every check on the written file; a failed audit is reported, not raised."""
    ckpt = load_policy_checkpoint(checkpoint, config.weights)
    task, task_input = resolve_task(ckpt, config.task)
    place = task_input.index if task_input is not None else 0  # the task's row of per-task tables
    trained_hz = config.trained_hz or run_control_hz(ckpt.source, task.native_hz)
    ckpt, routing, was_retimed = frozen_and_timed(
        ckpt, task, task_input, hz=config.control_hz, trained_hz=trained_hz, seed=config.seed,
        calibration_episodes=config.calibration_episodes,
    )  # fmt: skip
    exported = export_onnx(
        ckpt, out_path, opset=config.opset, batch_size=config.batch_size, routing=routing, task_input=task_input
    )
    try:
        audit = audit_onnx(exported.onnx_path, require_static_shapes=config.batch_size is not None)
    except OpAuditError as exc:
        audit = exc.report
    policy = OnnxPolicy(exported.onnx_path)
    columns = task_input.columns() if task_input is not None else None
    inputs = np.concatenate(
        [
            random_inputs(ckpt, config.random_inputs, config.seed, columns, task=place),
            env_inputs(task, config.env_inputs, config.seed),
        ]
    )
    # The graph against the torch module it was traced from (for MoE: the frozen routing; its
    # distance to dynamic routing is the routing report's action error); a multi-task run's
    # graph on the task's own input against that module on the padded input.
    padded_reference = freeze_policy(ckpt, routing) if routing is not None else reference_actor(ckpt).deterministic

    def reference(x: torch.Tensor) -> torch.Tensor:
        if task_input is None:
            return padded_reference(x)
        return padded_reference(torch.from_numpy(task_input.pad(x.numpy())))

    parity = check_parity(policy, reference, inputs, tolerance=config.tolerance)
    latency = measure_latency(policy, num_calls=config.latency_calls, budget_ms=config.budget_ms)
    loop = closed_loop(policy, task, episodes=config.episodes, seed=config.seed, hz=config.control_hz)
    layout = f"{task.name}: observation ({task.obs_dim}) ++ desired_goal ({task.goal_dim})"
    int8 = _int8(exported.onnx_path, reference, inputs, task, config) if config.int8 else None
    rate = ControlRate(config.control_hz or trained_hz, trained_hz, was_retimed)
    report = DeployReport(exported, audit, parity, latency, loop, routing, layout, int8, rate)
    report.write_manifest(ckpt, [task.name])
    return report


def _int8(onnx_path: pathlib.Path, reference, inputs: np.ndarray, task, config: DeployCheckConfig) -> Int8Report:
    """The int8 graph, calibrated on the env's own inputs (those after the random ones) and judged
    against the float torch policy: parity error, closed-loop success, latency and its op audit."""
    calibration = inputs[config.random_inputs :]
    path = quantize_int8(onnx_path, onnx_path.with_suffix(".int8.onnx"), calibration)
    quantized = OnnxPolicy(path)
    error = check_parity(quantized, reference, inputs, tolerance=float("inf")).max_abs_error
    won = closed_loop(quantized, task, episodes=config.episodes, seed=config.seed)
    static = config.batch_size is not None
    timed = measure_latency(quantized, num_calls=config.latency_calls, budget_ms=config.budget_ms)
    figures = (error, len(inputs), won.success_rate, won.episodes, timed.p50_ms, timed.p99_ms)
    return Int8Report(path, audit_int8(path, static), *figures)


def _normalizer(spec, obs_norm: np.ndarray) -> dict:
    """The manifest's normalizer over the padded input: one mean and std, or with per-task
    statistics a row of each per task (in the run's task order)."""
    mean, std = spec.split_norm(obs_norm)
    if len(mean) == 1:
        return {"mean": mean[0].tolist(), "std": std[0].tolist()}
    return {"per_task": True, "mean": mean.tolist(), "std": std.tolist()}
