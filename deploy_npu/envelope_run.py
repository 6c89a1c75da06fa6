"""Run a robustness sweep (deploy_npu/envelope.py) over a run's exported controllers.

    envelopes = sweep("runs/push", hz=120, episodes=20, int8=True, workers=2)
    envelopes = sweep("runs/push-wide", ranges=ranges_of("runs/push"))   # at runs/push's points (envelope.py)

Every graph is exported (and quantized) once in this process, one per control rate the sweep
visits, under RUN_DIR/envelope/graphs/; the points then run in worker processes that only load
ONNX files, so a worker holds no torch state and a point costs its episodes alone.
"""

from __future__ import annotations

import pathlib
import time
from collections.abc import Callable, Iterable
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


def sweep(
    run_dir: str | pathlib.Path, *, hz: float = 120.0, delay_ms: float = 10.0, episodes: int = 20, seed: int = 0,
    int8: bool = False, workers: int | None = None, axes: Iterable[str] = AXES, progress: Callable[[str], None] = print,
    ranges: SweepRanges | None = None,
) -> list[Envelope]:  # fmt: skip
    """The envelope of every task's controller of the run (one for a one-task run) around the
    operating point `hz` and `delay_ms` (deploy-check's defaults), each written to
    RUN_DIR/envelope/<task>.json and .png. The scale axes' points are multiples of `ranges`'
    half-widths (default: the run's own training ranges; envelope.ranges_of reads another run's)."""
    run_dir = pathlib.Path(run_dir)
    axes = list(axes)
    if unknown := [a for a in axes if a not in AXES]:
        raise ConfigError(f"--axes: unknown {unknown}; the axes are {', '.join(AXES)}")
    if episodes < 1:
        raise ConfigError(f"--episodes ({episodes}) must be >= 1: a point is scored on its episodes")
    config = RunConfig.load(run_dir / "config.json")
    names = load_policy_checkpoint(run_dir / "checkpoints").task_names
    tasks: list[str | None] = list(names) if len(names) >= 2 else [None]
    if delay_ms < 0:
        raise ConfigError(f"--delay-ms ({delay_ms}) must be >= 0")
    ranges = ranges or own_ranges(str(run_dir), config)
    setting = _Setting(
        run_dir, config, ranges, hz, delay_ms, episodes, seed, int8, workers or default_workers(), progress
    )
    return [_sweep_task(setting, task, axes) for task in tasks]


@dataclass(frozen=True)
class _Setting:
    """What every task's sweep of one run shares."""

    run_dir: pathlib.Path
    config: RunConfig
    ranges: SweepRanges
    hz: float
    delay_ms: float
    episodes: int
    seed: int
    int8: bool
    workers: int
    progress: Callable[[str], None]


def _sweep_task(s: _Setting, task: str | None, axes: list[str]) -> Envelope:
    started = time.monotonic()
    spec = get_task(task or s.config.sim.task)
    points = {axis: axis_points(axis, s.ranges, spec, s.hz, s.delay_ms) for axis in axes}
    points = {axis: ps for axis, ps in points.items() if ps}
    rates = sorted({s.hz, *(p.hz for ps in points.values() for p in ps if p.hz)})
    graphs = _export(s, task, spec, rates)
    labels = sorted({label for label, _ in graphs})
    jobs: list[Job] = [
        (str(graphs[(label, p.hz or s.hz)]), spec.name, p, s.hz, s.episodes, s.seed)
        for ps in points.values()
        for p in ps
        for label in labels
    ]
    s.progress(f"envelope {spec.name}: {len(jobs)} points x {s.episodes} episodes on {s.workers} worker(s)")
    wins = run_points(jobs, s.workers, s.progress)
    results, at = [], 0
    for axis, ps in points.items():
        per_label: dict[str, list[float]] = {label: [] for label in labels}
        for _ in ps:
            for label in labels:
                per_label[label].append(wins[at] / s.episodes)
                at += 1
        results.append(_axis_result(axis, ps, per_label, s, spec))
    shipped = {label: str(graphs[(label, s.hz)]) for label in labels}
    wall = round(time.monotonic() - started, 1)
    half_widths = {axis: s.ranges.half_width(axis) for axis in points if axis in SCALE_AXES}
    envelope = Envelope(
        str(s.run_dir), spec.name, s.hz, s.episodes, s.seed, shipped, results, wall, s.workers, s.delay_ms,
        s.ranges.source, half_widths,
    )  # fmt: skip
    write(envelope, s.run_dir / "envelope")
    return envelope


def _axis_result(axis: str, points: list[Point], success: dict[str, list[float]], s: _Setting, spec) -> AxisResult:
    values = [p.value for p in points]
    nominal = nominal_value(axis, s.hz, s.delay_ms) if axis != "integrator" else _own_integrator(spec)
    index = values.index(nominal)
    below = {label: falls_below(values, rates, index) for label, rates in success.items()}
    return AxisResult(axis, values, success, training_range(axis, s.config), nominal, below)


def _own_integrator(spec: TaskSpec) -> str:
    """The integrator the task's own model uses (what 'nominal' means on that axis)."""
    from sim.registry import make_env

    env = make_env(spec)
    try:
        code: Any = env.unwrapped.model.opt.integrator  # type: ignore[attr-defined]
        return next(name for name, value in INTEGRATORS.items() if int(value) == int(code))
    finally:
        env.close()


def _export(s: _Setting, task: str | None, spec: TaskSpec, rates: list[float]) -> dict[tuple[str, float], pathlib.Path]:
    """{(graph, rate): path}: the float graph at every rate, and its int8 version with `int8`."""
    from deploy_npu.quantize import int8_beside

    folder = s.run_dir / "envelope" / "graphs"
    graphs: dict[tuple[str, float], pathlib.Path] = {}
    for rate in rates:
        out = folder / f"{spec.name}-{rate:g}hz.onnx"
        pair = export_controllers(s.run_dir, s.config, hz=rate, seed=s.seed, onnx_path=out, task=task, retime=True)
        graphs[("float", rate)] = pair.onnx_path
        if s.int8:
            graphs[("int8", rate)] = int8_beside(pair.onnx_path, spec, s.seed)
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
