"""Run the agreement check (deploy_npu/agreement.py): a run's controllers over the same episodes.

    report = agreement("runs/slide", hz=120, delay_ms=10, episodes=200, int8=True)
    report = agree({"onnx": graph, "torch": module}, setting, randomization)   # any named controllers

The float graph is exported as deploy-check exports it (deploy_npu/controller.py's
export_controllers, re-timed to `hz`) and paired with the torch policy it came from; the int8
graph is the envelope's (quantize.int8_beside). Graphs go to `graphs_dir` (default
RUN_DIR/agreement/). The controllers run one after another in this process, each through
deploy-check's own drive loop (parity.drive) with a recorder that keeps every tick's input,
action and achieved goal; the episodes are seeded, so every controller meets the same ones.

torch+eps is the torch policy with every action moved by `epsilon` times a fixed sign per action
component (drawn once from `seed`; added in float64, so an epsilon below float32's spacing near
1.0 still moves an action), the same move on every tick: a disagreement of the size of float
rounding that no export made.
"""

from __future__ import annotations

import dataclasses
import math
import pathlib
import time
from collections.abc import Callable, Iterable, Mapping

import numpy as np

from deploy_npu.agreement import (
    INT8,
    ONNX,
    PAIRS,
    TORCH,
    TORCH_AGAIN,
    TORCH_EPS,
    AgreementReport,
    AgreementSetting,
    EpisodeTrace,
    compare,
)
from deploy_npu.controller import export_controllers
from deploy_npu.envelope import ticks
from deploy_npu.parity import PolicyFn, drive
from foundation.checkpoint import load_policy_checkpoint
from foundation.config import ConfigError, RandomizationConfig, RunConfig
from sim.registry import get_task


class TraceRecorder:
    """parity.DriveRecorder that keeps each episode as an EpisodeTrace, in episode order."""

    def __init__(self) -> None:
        self.traces: list[EpisodeTrace] = []
        self._inputs: list[np.ndarray] = []
        self._actions: list[np.ndarray] = []
        self._achieved: list[np.ndarray] = []

    def tick(self, episode: int, x: np.ndarray, action: np.ndarray, obs: dict[str, np.ndarray]) -> None:
        self._inputs.append(np.array(x))
        self._actions.append(np.array(action, np.float64))
        self._achieved.append(np.array(obs["achieved_goal"], np.float64))

    def episode_end(self, episode: int, success: bool) -> None:
        rows = (np.array(self._inputs), np.array(self._actions), np.array(self._achieved))
        self.traces.append(EpisodeTrace(success, *rows))
        self._inputs, self._actions, self._achieved = [], [], []


def perturbed(policy: PolicyFn, epsilon: float, act_dim: int, seed: int) -> PolicyFn:
    """`policy` with every action moved by epsilon times a fixed sign per component (from `seed`)."""
    signs = np.random.default_rng(seed).choice([-1.0, 1.0], size=act_dim)
    return lambda x: np.asarray(policy(x), np.float64) + epsilon * signs


def agree(
    controllers: Mapping[str, PolicyFn],
    setting: AgreementSetting,
    randomization: RandomizationConfig,
    pairs: Iterable[tuple[str, str]] = PAIRS,
    progress: Callable[[str], None] = print,
) -> AgreementReport:
    """Drive each named controller over the setting's episodes and compare every pair of `pairs`
    whose two controllers are both given (the rest are left out)."""
    spec = get_task(setting.task)
    traces: dict[str, list[EpisodeTrace]] = {}
    for name, policy in controllers.items():
        started, recorder = time.monotonic(), TraceRecorder()
        drive(
            policy, spec, setting.hz, randomization, episodes=setting.episodes, delay_ticks=setting.delay_ticks,
            seed=setting.seed, recorder=recorder,
        )  # fmt: skip
        traces[name] = recorder.traces
        won = sum(t.success for t in recorder.traces)
        progress(f"agreement {spec.name}: {name} {won}/{setting.episodes} ({time.monotonic() - started:.0f} s)")
    figures = [
        compare(a, b, traces[a], traces[b], setting.divergence_threshold)
        for a, b in pairs
        if a in traces and b in traces
    ]
    outcomes = {name: tuple(t.success for t in ts) for name, ts in traces.items()}
    return AgreementReport(setting, outcomes, figures)


def agreement(
    run_dir: str | pathlib.Path,
    *,
    hz: float = 120.0,
    delay_ms: float = 10.0,
    episodes: int = 50,
    seed: int = 0,
    nominal: bool = False,
    int8: bool = False,
    epsilon: float = 1e-7,
    divergence_threshold: float = 1e-4,
    task: str | None = None,
    graphs_dir: str | pathlib.Path | None = None,
    progress: Callable[[str], None] = print,
) -> AgreementReport:
    """onnx, torch, torch again, torch+eps (and int8 with `int8`) of the run's newest checkpoint
    over the same `episodes`, randomized as deploy-check drives them (`nominal`: the nominal task);
    a multi-task run needs `task`. See the module docstring."""
    _check(hz=hz, delay_ms=delay_ms, episodes=episodes, epsilon=epsilon, divergence_threshold=divergence_threshold)
    run_dir = pathlib.Path(run_dir)
    config = RunConfig.load(run_dir / "config.json")
    names = load_policy_checkpoint(run_dir / "checkpoints").task_names
    if task is None and len(names) >= 2:
        raise ConfigError(f"{run_dir} is a multi-task run: name one of its tasks {names} (--task)", field="task")
    spec = get_task(task or config.sim.task)
    folder = pathlib.Path(graphs_dir) if graphs_dir is not None else run_dir / "agreement"
    out = folder / f"{spec.name}-{hz:g}hz.onnx"
    pair = export_controllers(run_dir, config, hz=hz, seed=seed, onnx_path=out, task=task, retime=True)
    controllers = {
        ONNX: pair.onnx,
        TORCH: pair.torch,
        TORCH_AGAIN: pair.torch,
        TORCH_EPS: perturbed(pair.torch, epsilon, spec.act_dim, seed),
    }
    if int8:
        from deploy_npu.parity import OnnxPolicy
        from deploy_npu.quantize import int8_beside

        quantized = OnnxPolicy(int8_beside(pair.onnx_path, spec, seed))
        controllers[INT8] = lambda x: quantized.run_batch(x[None])[0]
    setting = AgreementSetting(
        spec.name, hz, ticks(delay_ms, hz), episodes, seed, not nominal, epsilon, divergence_threshold
    )
    randomization = dataclasses.replace(config.sim.randomization, enabled=not nominal)
    return agree(controllers, setting, randomization, progress=progress)


def _check(*, hz: float, delay_ms: float, episodes: int, epsilon: float, divergence_threshold: float) -> None:
    """Refuse a setting whose figures would mean nothing, naming the value and why."""
    problems = [
        (episodes >= 1, "episodes", f"episodes ({episodes}) must be >= 1: the pairs are compared episode by episode"),
        (math.isfinite(hz) and hz > 0, "hz", f"hz ({hz}) must be > 0: the controller's rate"),
        (math.isfinite(delay_ms) and delay_ms >= 0, "delay_ms", f"delay_ms ({delay_ms}) must be >= 0"),
        (
            math.isfinite(epsilon) and epsilon > 0,
            "epsilon",
            f"epsilon ({epsilon}) must be > 0: with 0 torch+eps is torch and the chaos floor reads zero flips",
        ),
        (
            math.isfinite(divergence_threshold) and divergence_threshold >= 0,
            "divergence_threshold",
            f"divergence_threshold ({divergence_threshold}) must be finite and >= 0 (0: any difference parts them)",
        ),
    ]
    for ok, field, message in problems:
        if not ok:
            raise ConfigError(message, field=field)
