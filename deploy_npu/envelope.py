"""`fleetrl deploy-check RUN_DIR --sweep`: how far a controller carries — its robustness envelope.

    envelopes = sweep("runs/push", SweepSetting(hz=120, episodes=20, int8=True))  # one per task of the run
    print(envelopes[0].table())                                                    # RUN_DIR/envelope/<task>.json, .png

One axis at a time, one knob moves from nominal out past the run's training range while every
other knob stays at the controller's operating point (no randomization, the task's own model, the
check's actuation delay: `delay_ms`, one tick at 120 Hz by default), and the exported
controller (the float graph, and the int8 graph with `int8`) drives the same seeded episodes at
every point, so two policies or two graphs meet the same episodes. The axes:

- the scaled dynamics the run randomizes: object mass, friction, damping, weld stiffness, action
  scale, at 0.5, 1, 1.5, 2, 3 and 4 times the training range's half-width either side of nominal
  (a knob the run did not randomize uses a reference half-width of 0.2); with `ranges`, another
  run's ranges set these points instead, so runs trained on different ranges meet the same points;
- actuation delay in ticks, observation noise (std, the observation's units: metres), and the
  control rate (each rate its own export, re-timed as deploy-check does);
- model changes that are not a scale (sim/variants.py): integrator, physics timestep, impratio and
  the friction cone.

Each axis reports where success first falls below 80% of its nominal score on either side
(`falls_below`; None: not within the swept range). Points run in parallel processes (`workers`,
default one per core), each with its own single-threaded onnxruntime session.
"""

from __future__ import annotations

import dataclasses
import json
import os
import pathlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from foundation.config import ConfigError, RandomizationConfig, RunConfig
from sim.randomization import NOMINAL_CONFIG
from sim.registry import TaskSpec, control_rate_problem, get_task
from sim.variants import VariantConfig

SCALE_AXES = ("mass_scale", "friction_scale", "damping_scale", "weld_stiffness_scale", "action_scale")
MULTIPLES = (0.5, 1.0, 1.5, 2.0, 3.0, 4.0)  # of the training range's half-width, either side of nominal
REFERENCE_HALF_WIDTH = 0.2  # a knob the run did not randomize
DELAY_TICKS = (0, 1, 2, 3, 4, 6, 8)
OBS_NOISE_STD = (0.0, 0.002, 0.005, 0.01, 0.02, 0.05)
CONTROL_HZ = (25.0, 40.0, 60.0, 80.0, 120.0, 240.0)
MODEL_AXES: dict[str, tuple] = {
    "integrator": ("euler", "implicitfast", "implicit", "rk4"),
    "timestep_scale": (0.25, 0.5, 1.0, 2.0, 4.0),
    "impratio": (1.0, 3.0, 10.0, 30.0),
    "cone": ("pyramidal", "elliptic"),
}
AXES = (*SCALE_AXES, "delay_ticks", "obs_noise_std", "control_hz", *MODEL_AXES)
FALL_RATIO = 0.8  # an axis carries while success stays at or above this share of its nominal score


@dataclass(frozen=True)
class Point:
    """One condition of the sweep: everything nominal but the axis's knob at `value`."""

    axis: str
    value: float | str
    randomization: RandomizationConfig = dataclasses.replace(NOMINAL_CONFIG, enabled=True)
    delay_ticks: int = 0
    hz: float = 0.0  # 0: the sweep's rate
    variant: VariantConfig = VariantConfig()


def _pin(axis: str, value: float) -> dict[str, Any]:
    return {axis: (value, value)}


@dataclass(frozen=True)
class SweepRanges:
    """The ranges a sweep's scale axes take their points from, and where they were read.

    By default a run is swept on its own training ranges; runs trained on different ranges meet
    the same points when each is swept on one run's ranges (`fleetrl deploy-check --ranges-from`).
    """

    randomization: RandomizationConfig
    source: str  # the run directory or RunConfig JSON the ranges are read from

    def half_width(self, axis: str) -> float:
        """The half-width whose MULTIPLES set the points of scale axis `axis`: the range's, or
        REFERENCE_HALF_WIDTH where the ranges leave the knob alone (randomization off included)."""
        if not self.randomization.enabled:
            return REFERENCE_HALF_WIDTH
        low, high = getattr(self.randomization, axis)
        return round((high - low) / 2, 6) or REFERENCE_HALF_WIDTH  # 0.2, not 0.19999999999999996


def own_ranges(run_dir: str, config: RunConfig) -> SweepRanges:
    """A run's own training ranges: what a sweep uses unless it is given others."""
    return SweepRanges(config.sim.randomization, str(run_dir))


def ranges_of(path: str | pathlib.Path) -> SweepRanges:
    """The training ranges of a run directory (its config.json) or of a RunConfig JSON file (as
    `fleetrl config --json` writes), to sweep another run on; ConfigError naming --ranges-from."""
    source = pathlib.Path(path)
    file = source / "config.json" if source.is_dir() else source
    if not source.exists():
        raise ConfigError(f"--ranges-from {source}: does not exist (a run directory or a RunConfig JSON)")
    if not file.is_file():
        raise ConfigError(f"--ranges-from {source}: no config.json there (not a run directory, or a run not started)")
    try:
        config = RunConfig.load(file)
    except (ValueError, TypeError) as err:  # JSONDecodeError, ConfigError: the file is not a RunConfig
        raise ConfigError(f"--ranges-from {file}: not a RunConfig JSON: {err}") from err
    return SweepRanges(config.sim.randomization, str(source))


def scale_points(axis: str, ranges: SweepRanges) -> list[float]:
    """Nominal (1.0) and MULTIPLES of the ranges' half-width on `axis` either side, above zero,
    ascending."""
    half = ranges.half_width(axis)
    values = {1.0} | {round(1.0 + sign * m * half, 4) for m in MULTIPLES for sign in (-1, 1)}
    return sorted(v for v in values if v > 0.05)


def ticks(delay_ms: float, hz: float) -> int:
    """An actuation delay in whole controller ticks at `hz` (deploy-check's rounding)."""
    return round(delay_ms * hz / 1000.0)


def axis_points(axis: str, ranges: SweepRanges, spec: TaskSpec, hz: float, delay_ms: float = 0.0) -> list[Point]:
    """The points of one axis for a task swept at `hz` with every other knob at its operating
    point, `delay_ms` of actuation delay included (an axis the task cannot take: []); a scale
    axis's points are multiples of `ranges`' half-width."""
    base = Point(axis, 0.0, delay_ticks=ticks(delay_ms, hz))
    if axis in SCALE_AXES:
        pinned = [(v, dataclasses.replace(base.randomization, **_pin(axis, v))) for v in scale_points(axis, ranges)]
        return [dataclasses.replace(base, value=v, randomization=r) for v, r in pinned]
    if axis == "delay_ticks":
        return [
            dataclasses.replace(base, value=float(t), delay_ticks=t) for t in sorted({*DELAY_TICKS, base.delay_ticks})
        ]
    if axis == "obs_noise_std":
        noisy = base.randomization
        return [
            dataclasses.replace(base, value=s, randomization=dataclasses.replace(noisy, obs_noise_std=s))
            for s in OBS_NOISE_STD
        ]
    if axis == "control_hz":
        rates = sorted({*CONTROL_HZ, hz})
        runnable = [r for r in rates if control_rate_problem(spec, r) is None]
        return [dataclasses.replace(base, value=r, hz=r, delay_ticks=ticks(delay_ms, r)) for r in runnable]
    if axis == "timestep_scale" and not spec.is_fetch:
        return []  # a Meta-World task's physics step follows its control rate (sim/variants.py)
    values = MODEL_AXES[axis]
    return [dataclasses.replace(base, value=v, variant=VariantConfig(**{axis: v})) for v in values]


def training_range(axis: str, config: RunConfig) -> tuple[float, float] | None:
    """The range the run trained over on this axis (None: an axis it does not randomize)."""
    randomization = config.sim.randomization
    if not randomization.enabled:
        return None
    if axis in SCALE_AXES:
        low, high = getattr(randomization, axis)
        return (low, high)
    if axis == "obs_noise_std":
        return (0.0, randomization.obs_noise_std)
    if axis == "delay_ticks":
        low, high = randomization.action_latency_steps
        return (float(low), float(high))
    return None


def falls_below(values: Sequence, success: Sequence[float], nominal_index: int) -> list:
    """Where success first drops below FALL_RATIO of the nominal point's, walking outward from
    it: [below nominal or None, above nominal or None]. Categorical axes (strings) list every
    value below instead."""
    limit = FALL_RATIO * success[nominal_index]
    if any(isinstance(v, str) for v in values):
        return [v for v, s in zip(values, success, strict=True) if s < limit]
    low = next((values[i] for i in range(nominal_index - 1, -1, -1) if success[i] < limit), None)
    high = next((values[i] for i in range(nominal_index + 1, len(values)) if success[i] < limit), None)
    return [low, high]


NOMINAL_VALUE: dict[str, float | str] = {"delay_ticks": 0.0, "obs_noise_std": 0.0, "integrator": "euler"}
NOMINAL_VALUE |= {"timestep_scale": 1.0, "impratio": 1.0, "cone": "pyramidal"}


@dataclass
class AxisResult:
    axis: str
    values: list
    success: dict[str, list[float]]  # graph ("float", "int8") -> success rate at each value
    training_range: tuple[float, float] | None
    nominal_value: float | str
    falls_below: dict[str, list] = field(default_factory=dict)


@dataclass
class Envelope:
    """One task's envelope: per axis, success at each point for each graph."""

    run_dir: str
    task: str
    hz: float
    episodes: int
    seed: int
    graphs: dict[str, str]
    axes: list[AxisResult]
    wall_sec: float = 0.0
    workers: int = 1
    delay_ms: float = 0.0  # the operating point's actuation delay (ticks(delay_ms, hz) on every axis but delay)
    ranges_from: str = ""  # the run directory or RunConfig JSON whose ranges set the scale axes' points
    half_widths: dict[str, float] = field(default_factory=dict)  # scale axis -> the half-width of its MULTIPLES

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), indent=1)

    def table(self) -> str:
        """One line per axis and graph: nominal success and where it falls below 80% of it."""
        head = f"envelope {self.task} at {self.hz:g} Hz, {ticks(self.delay_ms, self.hz)} tick(s) of delay"
        lines = [f"{head}, {self.episodes} episodes a point ({self.wall_sec:.0f} s)"]
        if self.ranges_from and self.ranges_from != self.run_dir:
            lines.append(f"  scale axes at multiples of the ranges of {self.ranges_from}")
        for axis in self.axes:
            for graph, rates in axis.success.items():
                nominal = rates[axis.values.index(axis.nominal_value)]
                below = axis.falls_below.get(graph)
                lines.append(
                    f"  {axis.axis:<22} {graph:<5} nominal {nominal:.2f}  trained {_range(axis.training_range):<14}"
                    f" below 80% at {below}"
                )
        return "\n".join(lines)


def _range(r: tuple[float, float] | None) -> str:
    return "-" if r is None else f"{r[0]:g}..{r[1]:g}"


def nominal_value(axis: str, hz: float, delay_ms: float = 0.0) -> float | str:
    """The value of `axis` at the sweep's operating point (its rate and delay, nominal dynamics)."""
    if axis in SCALE_AXES:
        return 1.0
    if axis == "delay_ticks":
        return float(ticks(delay_ms, hz))
    return hz if axis == "control_hz" else NOMINAL_VALUE[axis]


def score_point(job: tuple[str, str, Point, float, int, int]) -> int:
    """Successes of one graph at one point (runs in a worker process)."""
    from deploy_npu.parity import OnnxPolicy, drive

    graph, task, point, hz, episodes, seed = job
    policy = OnnxPolicy(graph)
    spec = get_task(task)
    variant = point.variant if point.variant != VariantConfig() else None
    won, _ = drive(
        lambda x: policy.run_batch(x[None])[0], spec, point.hz or hz, point.randomization,
        episodes=episodes, delay_ticks=point.delay_ticks, seed=seed, variant=variant,
    )  # fmt: skip
    return won


def default_workers() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
