"""The ceiling of one sampler process: `env.step` calls per second of the randomized env.

from env_step_rate import measure_env_steps
rate = measure_env_steps("FetchPush-v4", seconds=10, warmup_sec=2)
rate.env_steps_per_sec, rate.env_steps_per_cpu_sec
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass

import numpy as np
from harness import CpuMeter  # this script's folder

from foundation.config import RandomizationConfig
from sim.registry import get_task, make_env


def per_unit(amount: float, unit: float) -> float:
    """amount / unit, NaN where there is no unit (a process that used no CPU)."""
    return amount / unit if unit > 0 else float("nan")


@dataclass
class SingleResult:
    env_steps: int
    window_sec: float
    cpu: dict[str, float]  # CpuMeter.stop() over the measured window

    @property
    def env_steps_per_sec(self) -> float:
        return self.env_steps / self.window_sec

    @property
    def env_steps_per_cpu_sec(self) -> float:
        return per_unit(self.env_steps_per_sec, self.cpu["benchmark"] / 100)

    @staticmethod
    def combine(a: SingleResult, b: SingleResult) -> SingleResult:
        """Both windows as one: steps and seconds add up, CPU shares are time-weighted."""
        window = a.window_sec + b.window_sec
        cpu = {k: (a.cpu[k] * a.window_sec + b.cpu[k] * b.window_sec) / window for k in a.cpu}
        return SingleResult(a.env_steps + b.env_steps, window, cpu)


def measure_env_steps(task: str, seconds: float, warmup_sec: float, seed: int = 0) -> SingleResult:
    """env.step calls per second of the randomized env with uniform random actions, reset on episode end."""
    env = make_env(get_task(task), RandomizationConfig())
    rng = np.random.default_rng(seed)
    shape = env.action_space.shape
    env.reset(seed=seed)
    episodes = 1

    def run_for(duration: float) -> tuple[int, float]:
        nonlocal episodes
        steps, start = 0, time.perf_counter()
        while time.perf_counter() - start < duration:
            _, _, terminated, truncated, _ = env.step(rng.uniform(-1.0, 1.0, shape).astype(np.float32))
            steps += 1
            if terminated or truncated:
                env.reset(seed=seed + episodes)
                episodes += 1
        return steps, time.perf_counter() - start

    run_for(warmup_sec)
    meter = CpuMeter({"benchmark": os.getpid()})
    meter.start()
    steps, elapsed = run_for(seconds)
    cpu = meter.stop()
    env.close()
    return SingleResult(steps, elapsed, cpu)
