"""Does the exported ONNX act like the checkpoint, fast enough, in the real env?

    policy = OnnxPolicy("policy.onnx")                              # single-threaded onnxruntime
    actor = reference_actor(load_policy_checkpoint(ckpt_path))      # the learner's torch actor
    inputs = np.concatenate([random_inputs(ckpt, 512), env_inputs(task, 512)])
    check_parity(policy, actor.deterministic, inputs).max_abs_error  # <= 1e-5 to pass
    measure_latency(policy).p99_ms                                  # vs the 8.33 ms of a 120 Hz tick
    closed_loop(policy, task, episodes=5).success_rate              # nominal env, no randomization

Latency is onnxruntime on this host's CPU with one thread: a proxy for the controller's NPU,
whose own toolchain reports the real figure; a policy that misses the budget here is suspect.
"""

from __future__ import annotations

import collections
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import numpy as np
import onnxruntime as ort
import torch

from foundation.checkpoint import PolicyCheckpoint
from foundation.config import ConfigError, RandomizationConfig
from nets.models import ModelSpec
from sim import TASKS, TaskSpec, get_task, goal_success, make_env
from sim.variants import ModelVariant, VariantConfig

CONTROLLER_HZ = 120.0
CONTROL_BUDGET_MS = 1000.0 / CONTROLLER_HZ  # 8.33 ms per tick for everything, inference included
PARITY_TOLERANCE = 1e-5  # max |torch - onnx| per action component; float32 MLPs agree to ~1e-7


class OnnxPolicy:
    """An exported policy in a single-threaded onnxruntime session (a controller has one core for it).

    Call it with any number of rows; a static batch B is served in padded chunks of B.
    """

    def __init__(self, onnx_path: str | os.PathLike) -> None:
        options = ort.SessionOptions()
        options.intra_op_num_threads = 1
        options.inter_op_num_threads = 1
        options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        self.session = ort.InferenceSession(os.fspath(onnx_path), options, providers=["CPUExecutionProvider"])
        (self._input,) = self.session.get_inputs()
        batch, self.input_dim = self._input.shape
        self.static_batch = batch if isinstance(batch, int) else None
        self.act_dim = self.session.get_outputs()[0].shape[1]
        self.input_name = self._input.name

    def run_batch(self, batch: np.ndarray) -> np.ndarray:
        """One session.run on exactly one model-shaped batch (what a controller tick costs)."""
        return self.session.run(None, {self._input.name: batch})[0]

    def __call__(self, obs_goal: np.ndarray) -> np.ndarray:
        rows = np.ascontiguousarray(obs_goal, dtype=np.float32).reshape(-1, self.input_dim)
        if self.static_batch is None:
            return self.run_batch(rows)
        size = self.static_batch
        out = [np.empty((0, self.act_dim), np.float32)]
        for start in range(0, len(rows), size):
            chunk = rows[start : start + size]
            padded = np.zeros((size, self.input_dim), np.float32)
            padded[: len(chunk)] = chunk
            out.append(self.run_batch(padded)[: len(chunk)])
        return np.concatenate(out)


def task_for_spec(spec: ModelSpec, task: str | int | None = None) -> TaskSpec:
    """The task a checkpoint's policy acts in: `task` if given (dims checked), else the only one that fits."""

    def dims(t: TaskSpec | ModelSpec) -> tuple[int, int, int]:
        return (t.obs_dim, t.goal_dim, t.act_dim)

    if task is not None:
        found = get_task(task)
        if dims(found) != dims(spec):
            raise ConfigError(
                f"task {found.name} has (obs, goal, act) dims {dims(found)}, the checkpoint's policy {dims(spec)}",
                field="task",
            )
        return found
    fits = [t for t in TASKS.values() if dims(t) == dims(spec)]
    if len(fits) != 1:
        names = [t.name for t in fits] or "none"
        raise ConfigError(f"policy dims {dims(spec)} fit task(s) {names}: name the task to run (--task)", field="task")
    return fits[0]


def random_inputs(
    ckpt: PolicyCheckpoint, n: int, seed: int = 0, columns: np.ndarray | None = None, task: int = 0
) -> np.ndarray:
    """Rows drawn as mean + 2.5 * std * N(0, 1) of the checkpoint's normalizer (of its
    `columns` only: a multi-task run's task, on its own input).

    The scale puts a component past the normalizer's +-5 clip when |z| > 2 (4.6% of them), so
    both sides of the Clip node are exercised: about 45% of 13-wide rows clip somewhere.
    """
    means, stds = ckpt.spec.split_norm(ckpt.obs_norm)
    mean, std = means[ckpt.spec.norm_row(task)], stds[ckpt.spec.norm_row(task)]
    if columns is not None:
        mean, std = mean[columns], std[columns]
    z = np.random.default_rng(seed).standard_normal((n, len(mean)))
    return (mean + 2.5 * std * z).astype(np.float32)


def env_inputs(task: TaskSpec, n: int, seed: int = 0) -> np.ndarray:
    """`n` real observation ++ desired_goal rows from the nominal env under uniform random actions."""
    rows: list[np.ndarray] = []
    if n < 1:
        return np.empty((0, task.obs_dim + task.goal_dim), np.float32)
    env = make_env(task)
    rng = np.random.default_rng(seed)
    try:
        obs, _ = env.reset(seed=seed)
        while len(rows) < n:
            rows.append(np.concatenate([obs["observation"], obs["desired_goal"]]))
            obs, _, terminated, truncated, _ = env.step(rng.uniform(-1, 1, task.act_dim).astype(np.float32))
            if terminated or truncated:
                obs, _ = env.reset(seed=seed + len(rows))
    finally:
        env.close()
    return np.asarray(rows, np.float32)


@dataclass(frozen=True)
class ParityReport:
    max_abs_error: float
    num_inputs: int
    tolerance: float

    @property
    def passed(self) -> bool:
        return self.max_abs_error <= self.tolerance  # False for NaN, as it should be


def check_parity(
    policy: OnnxPolicy,
    reference: Callable[[torch.Tensor], torch.Tensor],
    inputs: np.ndarray,
    *,
    tolerance: float = PARITY_TOLERANCE,
) -> ParityReport:
    """Max |reference(x) - policy(x)| over all rows and action components (reference: obs_goal -> action)."""
    inputs = np.asarray(inputs, np.float32)
    with torch.no_grad():
        expected = reference(torch.from_numpy(inputs)).numpy()
    got = policy(inputs)
    if got.shape != expected.shape:
        raise ValueError(f"onnx output shape {got.shape} differs from torch {expected.shape}")
    error = float(np.max(np.abs(got.astype(np.float64) - expected))) if len(inputs) else 0.0
    return ParityReport(error, len(inputs), tolerance)


@dataclass(frozen=True)
class LatencyReport:
    p50_ms: float
    p99_ms: float
    num_calls: int
    budget_ms: float

    @property
    def within_budget(self) -> bool:
        return self.p99_ms <= self.budget_ms  # one call in a hundred late is already a missed tick per second


def measure_latency(
    policy: OnnxPolicy, *, num_calls: int = 1000, warmup_calls: int = 50, budget_ms: float = CONTROL_BUDGET_MS
) -> LatencyReport:
    """Per-call wall time of one model-shaped batch (batch 1 for a dynamic axis), after warm-up."""
    if num_calls < 1:
        raise ConfigError(f"num_calls ({num_calls}) must be >= 1: no calls, no percentiles", field="num_calls")
    batch = np.random.default_rng(0).standard_normal((policy.static_batch or 1, policy.input_dim)).astype(np.float32)
    for _ in range(warmup_calls):  # first runs allocate arenas and page in the weights
        policy.run_batch(batch)
    times_ns = np.empty(num_calls)
    for i in range(num_calls):
        start = time.perf_counter_ns()
        policy.run_batch(batch)
        times_ns[i] = time.perf_counter_ns() - start
    p50, p99 = np.percentile(times_ns / 1e6, [50, 99])
    return LatencyReport(float(p50), float(p99), num_calls, budget_ms)


@dataclass(frozen=True)
class ClosedLoopReport:
    task: str
    episodes: int
    successes: int

    @property
    def success_rate(self) -> float:
        return self.successes / self.episodes if self.episodes else 0.0


def closed_loop(
    policy: OnnxPolicy, task: TaskSpec, *, episodes: int = 5, seed: int = 0, hz: float = 0.0
) -> ClosedLoopReport:
    """Drive the nominal env with the ONNX policy; an episode succeeds if its last state reaches
    the goal. `hz`: the controller's rate (0: the task's own)."""
    if episodes < 0:
        raise ConfigError(f"episodes ({episodes}) must be >= 0", field="episodes")
    # No randomization, no delay: the nominal task, as the evaluator scores it.
    nominal = RandomizationConfig(enabled=False)
    successes, _ = drive(lambda x: policy(x)[0], task, hz, nominal, episodes=episodes, delay_ticks=0, seed=seed)
    return ClosedLoopReport(task.name, episodes, successes)


PolicyFn = Callable[[np.ndarray], np.ndarray]  # obs ++ goal [input_dim] -> action [act_dim]


class DriveRecorder(Protocol):
    """What `drive` reports tick by tick to a caller that compares trajectories
    (deploy_npu/agreement_run.py); `drive` calls it in this order:

        for episode in range(episodes):
            for each tick: recorder.tick(episode, x, action, obs)   # after env.step
            recorder.episode_end(episode, success)
    """

    def tick(self, episode: int, x: np.ndarray, action: np.ndarray, obs: dict[str, np.ndarray]) -> None:
        """`x` the policy's input, `action` its output this tick, `obs` the observation the step returned."""

    def episode_end(self, episode: int, success: bool) -> None: ...


def drive(
    policy: PolicyFn,
    task: TaskSpec,
    hz: float,
    randomization: RandomizationConfig,
    *,
    episodes: int,
    delay_ticks: int,
    seed: int,
    variant: VariantConfig | None = None,
    recorder: DriveRecorder | None = None,
) -> tuple[int, list[float]]:
    """(successes, per-call seconds) of `policy` as a `hz` controller (0: the task's own rate)
    whose actions take effect `delay_ticks` ticks late, each held for its whole tick; `variant`
    changes the physics model (sim/variants.py); `recorder` hears every tick and episode."""
    env = make_env(task, randomization, hz)
    if variant is not None:
        env = ModelVariant(env, variant)
    successes, calls = 0, []
    try:
        for episode in range(episodes):
            obs, _ = env.reset(seed=seed + episode)
            pending = collections.deque([np.zeros(task.act_dim, np.float32)] * delay_ticks)
            done = False
            while not done:
                x = np.concatenate([obs["observation"], obs["desired_goal"]]).astype(np.float32)
                start = time.perf_counter()
                action = policy(x)
                calls.append(time.perf_counter() - start)
                pending.append(action)
                obs, _, terminated, truncated, _ = env.step(pending.popleft())  # held for the whole tick
                done = terminated or truncated
                if recorder is not None:
                    recorder.tick(episode, x, action, obs)
            success = bool(goal_success(env, obs["achieved_goal"][None], obs["desired_goal"][None])[0])
            successes += success
            if recorder is not None:
                recorder.episode_end(episode, success)
    finally:
        env.close()
    return successes, calls
