"""Run a robustness sweep (deploy_npu/envelope.py) over a run's exported controllers.

    envelopes = sweep("runs/push", SweepSetting(hz=120, episodes=20, int8=True, workers=2))
    envelopes = sweep("runs/push-wide", SweepSetting(ranges=ranges_of("runs/push")))  # on runs/push's points

Every graph is exported (and quantized) once in this process, one per control rate the sweep
visits, under RUN_DIR/envelope/graphs/; the points then run in worker processes that only load
ONNX files, so a worker holds no torch state and a point costs its episodes alone.
"""

from __future__ import annotations

import pathlib
import time
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass
from typing import Any

from deploy_npu.controller import export_controllers
from deploy_npu.envelope import (
    AXES,
    SCALE_AXES,
    AxisResult,
    Envelope,
    Point,
    SweepRanges,
    axis_points,
    default_workers,
    falls_below,
    nominal_value,
    own_ranges,
    score_point,
    training_range,
)
from deploy_npu.envelope_plot import plot_envelope
from foundation.checkpoint import load_policy_checkpoint
from foundation.config import ConfigError, RunConfig
from sim.registry import TaskSpec, get_task
from sim.variants import INTEGRATORS

Job = tuple[str, str, Point, float, int, int]


@dataclass(frozen=True)
class SweepSetting:
    """What every point of a sweep shares: the operating point, the episodes and where they run.
    Checked here, so a bad value is refused before any graph is exported."""

    hz: float = 120.0  # the controller's operating rate (deploy-check's default); control_hz moves it
    delay_ms: float = 10.0  # the actuation delay at the operating point: one tick at 120 Hz
    episodes: int = 20  # seeded episodes each point is scored on
    seed: int = 0  # the first episode's seed: every point and every graph meets the same episodes
    int8: bool = False  # sweep the int8 graph (quantize.int8_beside) beside the float one
    workers: int | None = None  # processes the points run in; None: one per CPU this process may use
    axes: tuple[str, ...] = AXES  # the axes to sweep, by envelope.AXES's names
    ranges: SweepRanges | None = None  # the scale axes' half-widths; None: the run's own training ranges

    def __post_init__(self) -> None:
        if unknown := [a for a in self.axes if a not in AXES]:
            raise ConfigError(f"--axes: unknown {unknown}; the axes are {', '.join(AXES)}")
        if self.episodes < 1:
            raise ConfigError(f"--episodes ({self.episodes}) must be >= 1: a point is scored on its episodes")
        if self.delay_ms < 0:
            raise ConfigError(f"--delay-ms ({self.delay_ms}) must be >= 0")
        if self.workers is not None and self.workers < 1:
            raise ConfigError(f"--workers ({self.workers}) must be >= 1")


def sweep(
    run_dir: str | pathlib.Path, setting: SweepSetting = SweepSetting(), progress: Callable[[str], None] = print
) -> list[Envelope]:
    """The envelope of every task's controller of the run (one for a one-task run) around the
    operating point `setting.hz` and `setting.delay_ms`, each written to RUN_DIR/envelope/<task>.json
    and .png. The scale axes' points are multiples of `setting.ranges`' half-widths (default: the
    run's own training ranges; envelope.ranges_of reads another run's)."""
    run_dir = pathlib.Path(run_dir)
    config = RunConfig.load(run_dir / "config.json")
    names = load_policy_checkpoint(run_dir / "checkpoints").task_names
    tasks: list[str | None] = list(names) if len(names) >= 2 else [None]
    ranges = setting.ranges or own_ranges(str(run_dir), config)
    run = _Run(run_dir, config, setting, ranges, setting.workers or default_workers(), progress)
    return [_sweep_task(run, task) for task in tasks]


@dataclass(frozen=True)
class _Run:
    """One run's sweep: the setting, with its defaults resolved against the run."""

    run_dir: pathlib.Path
    config: RunConfig
    setting: SweepSetting
    ranges: SweepRanges  # setting.ranges, else the run's own
    workers: int  # setting.workers, else default_workers()
    progress: Callable[[str], None]


def _sweep_task(run: _Run, task: str | None) -> Envelope:
    started = time.monotonic()
    s = run.setting
    spec = get_task(task or run.config.sim.task)
    points = {axis: axis_points(axis, run.ranges, spec, s.hz, s.delay_ms) for axis in s.axes}
    points = {axis: ps for axis, ps in points.items() if ps}
    rates = sorted({s.hz, *(p.hz for ps in points.values() for p in ps if p.hz)})
    graphs = _export(run, task, spec, rates)
    labels = sorted({label for label, _ in graphs})
    jobs: list[Job] = [
        (str(graphs[(label, p.hz or s.hz)]), spec.name, p, s.hz, s.episodes, s.seed)
        for ps in points.values()
        for p in ps
        for label in labels
    ]
    run.progress(f"envelope {spec.name}: {len(jobs)} points x {s.episodes} episodes on {run.workers} worker(s)")
    wins = run_points(jobs, run.workers, run.progress)
    results, at = [], 0
    for axis, ps in points.items():
        per_label: dict[str, list[float]] = {label: [] for label in labels}
        for _ in ps:
            for label in labels:
                per_label[label].append(wins[at] / s.episodes)
                at += 1
        results.append(_axis_result(axis, ps, per_label, run, spec))
    shipped = {label: str(graphs[(label, s.hz)]) for label in labels}
    wall = round(time.monotonic() - started, 1)
    half_widths = {axis: run.ranges.half_width(axis) for axis in points if axis in SCALE_AXES}
    envelope = Envelope(
        str(run.run_dir), spec.name, s.hz, s.episodes, s.seed, shipped, results, wall, run.workers, s.delay_ms,
        run.ranges.source, half_widths,
    )  # fmt: skip
    write(envelope, run.run_dir / "envelope")
    return envelope


def _axis_result(axis: str, points: list[Point], success: dict[str, list[float]], run: _Run, spec) -> AxisResult:
    values = [p.value for p in points]
    s = run.setting
    nominal = nominal_value(axis, s.hz, s.delay_ms) if axis != "integrator" else _own_integrator(spec)
    index = values.index(nominal)
    below = {label: falls_below(values, rates, index) for label, rates in success.items()}
    return AxisResult(axis, values, success, training_range(axis, run.config), nominal, below)


def _own_integrator(spec: TaskSpec) -> str:
    """The integrator the task's own model uses (what 'nominal' means on that axis)."""
    from sim.registry import make_env

    env = make_env(spec)
    try:
        code: Any = env.unwrapped.model.opt.integrator  # type: ignore[attr-defined]
        return next(name for name, value in INTEGRATORS.items() if int(value) == int(code))
    finally:
        env.close()


def _export(run: _Run, task: str | None, spec: TaskSpec, rates: list[float]) -> dict[tuple[str, float], pathlib.Path]:
    """{(graph, rate): path}: the float graph at every rate, and its int8 version with `int8`."""
    from deploy_npu.quantize import int8_beside

    folder = run.run_dir / "envelope" / "graphs"
    seed = run.setting.seed
    graphs: dict[tuple[str, float], pathlib.Path] = {}
    for rate in rates:
        out = folder / f"{spec.name}-{rate:g}hz.onnx"
        pair = export_controllers(run.run_dir, run.config, hz=rate, seed=seed, onnx_path=out, task=task, retime=True)
        graphs[("float", rate)] = pair.onnx_path
        if run.setting.int8:
            graphs[("int8", rate)] = int8_beside(pair.onnx_path, spec, seed)
    return graphs


def run_points(jobs: list[Job], workers: int, progress: Callable[[str], None]) -> list[int]:
    """Successes of every job, in order; a line of progress at every tenth of the jobs."""
    if workers <= 1:
        return [score_point(job) for job in jobs]
    import multiprocessing

    wins: list[int] = [0] * len(jobs)
    step = max(1, len(jobs) // 10)
    with ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn")) as pool:
        futures = {pool.submit(score_point, job): i for i, job in enumerate(jobs)}
        for done, future in enumerate(as_completed(futures), 1):
            wins[futures[future]] = future.result()
            if done % step == 0 or done == len(jobs):
                progress(f"  {done}/{len(jobs)} points")
    return wins


def write(envelope: Envelope, out_dir: pathlib.Path) -> pathlib.Path:
    """<out_dir>/<task>.json (and .png beside it); the JSON's path."""
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"{envelope.task}.json"
    path.write_text(envelope.to_json() + "\n")
    plot_envelope(envelope, path.with_suffix(".png"))
    return path
