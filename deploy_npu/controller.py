"""`fleetrl deploy-check RUN_DIR --hz 120`: the exported policy as a fixed-rate controller.

    report = controller_check("runs/r1", hz=120, delay_ms=10, episodes=20)
    print(report.summary())

The ONNX graph `fleetrl export` writes drives the simulated task at `hz` decisions per
simulated second (sim/rate.py), with domain randomization on (the run's ranges, switched on where
the run trained on the nominal task: `nominal=True` drives the nominal task), its action held until
the next tick (zero-order hold: one env step per tick) and applied `delay_ms` late (rounded to
whole ticks, a queue of actions: what a real actuator chain adds). The torch policy the run
trained (dynamic routing for a MoE) drives the same episodes under the same delay, so the two
success rates compare what export changed. Each ONNX call is timed: a call longer than one
tick (1 / hz) is a deadline miss, the controller's real failure on hardware.

A policy trained at another rate than `hz` reads velocities per decision in other units (sim/rate.py):
by default its graph re-times them (deploy_npu/retime.py: a factor folded into the input
normalizer, no new op), `retime=False` runs it as trained, and `sim.control_hz` trains one at the
rate it will run at. The report says which.
"""

from __future__ import annotations

import dataclasses
import pathlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from deploy_npu.export import export_onnx
from deploy_npu.freeze import reference_actor
from deploy_npu.parity import OnnxPolicy, drive
from deploy_npu.pipeline import frozen_and_timed, resolve_task
from foundation.checkpoint import load_policy_checkpoint
from foundation.config import RunConfig
from sim.registry import control_rate_problem, get_task


@dataclass(frozen=True)
class ControllerReport:
    task: str
    hz: float
    trained_hz: float
    delay_ticks: int
    episodes: int
    onnx_successes: int
    torch_successes: int
    ticks: int
    deadline_misses: int  # ONNX calls longer than one tick
    p50_ms: float
    p99_ms: float
    max_ms: float
    retimed: bool = False  # velocity inputs re-timed from hz to trained_hz (deploy_npu/retime.py)
    randomized: bool = True  # driven with domain randomization on (False: the nominal task)
    trained_randomized: bool = True  # the run itself trained with it (sim.randomization.enabled)

    @property
    def passed(self) -> bool:
        return self.deadline_misses == 0

    def _randomization(self) -> str:
        if not self.randomized:
            return "domain randomization off (the nominal task)"
        if self.trained_randomized:
            return "domain randomization on (the run's ranges)"
        return "domain randomization on (the run's ranges, which it trained without: sim.randomization.enabled false)"

    def summary(self) -> str:
        tick_ms = 1000.0 / self.hz
        lines = [
            f"controller {self.task} at {self.hz:g} Hz (tick {tick_ms:.2f} ms), actuation delay {self.delay_ticks} "
            f"tick(s), {self._randomization()}, {self.episodes} episodes",
            f"success    onnx {self.onnx_successes}/{self.episodes}, torch {self.torch_successes}/{self.episodes}",
            f"deadline   {'ok  ' if self.passed else 'FAIL'} {self.deadline_misses} of {self.ticks} calls over one "
            f"tick; policy call p50 {self.p50_ms:.4f} ms, p99 {self.p99_ms:.4f} ms, max {self.max_ms:.4f} ms",
        ]
        if self.trained_hz != self.hz and self.retimed:
            lines.append(
                f"note       the policy was trained at {self.trained_hz:g} Hz: its velocity inputs re-timed "
                "to those units in the graph's normalizer (--no-retime: as trained)"
            )
        elif self.trained_hz != self.hz and not get_task(self.task).is_fetch:
            lines.append(
                f"note       the policy was trained at {self.trained_hz:g} Hz; the task's observation keeps its "
                "previous frame 1/80 s old at any rate (sim/metaworld.py), so nothing is re-timed"
            )
        elif self.trained_hz != self.hz:
            lines.append(
                f"note       the policy was trained at {self.trained_hz:g} Hz and reads velocities in those units, "
                f"not re-timed: set sim.control_hz={self.hz:g} to train one for this rate"
            )
        return "\n".join(lines)


def controller_checks(run_dir: str | pathlib.Path, **options: Any) -> tuple[list[ControllerReport], dict[str, str]]:
    """controller_check(run_dir, **options) of every task of the run that can run at the rate,
    and {task: why} for those that cannot (a Meta-World task runs at its own 80 Hz or faster:
    sim/metaworld.py). One report for a one-task run; a multi-task run's graphs are per task, each on
    its task's own input (deploy/<task>.onnx)."""
    ckpt = load_policy_checkpoint(pathlib.Path(run_dir) / "checkpoints")
    if len(ckpt.task_names) < 2:
        return [controller_check(run_dir, **options)], {}
    folder = options.pop("onnx_path", None)  # one file per task: <folder or RUN_DIR/deploy>/<task>.onnx
    hz = options.get("hz", 120.0)
    skipped = {name: why for name in ckpt.task_names if (why := control_rate_problem(get_task(name), hz))}
    reports = [
        controller_check(
            run_dir, **options, task=name, onnx_path=None if folder is None else pathlib.Path(folder) / f"{name}.onnx"
        )
        for name in ckpt.task_names
        if name not in skipped
    ]
    return reports, skipped


@dataclass(frozen=True)
class Controllers:
    """A run's task as the exported graph and as the torch policy it came from, on the same input."""

    task: str
    onnx_path: pathlib.Path
    onnx: Callable[[np.ndarray], np.ndarray]  # one observation row -> one action
    torch: Callable[[np.ndarray], np.ndarray]
    trained_hz: float
    retimed: bool


def export_controllers(
    run_dir: pathlib.Path, config: RunConfig, *, hz: float, seed: int, onnx_path: str | pathlib.Path | None,
    task: str | None, retime: bool,
) -> Controllers:  # fmt: skip
    """Export the run's newest checkpoint for `task` (MoE: routing frozen on fresh rollouts, seeded by
    `seed`) to `onnx_path` (default RUN_DIR/deploy/), and pair it with the torch policy it froze."""
    ckpt = load_policy_checkpoint(run_dir / "checkpoints")
    spec, task_input = resolve_task(ckpt, task if task is not None else (None if ckpt.task else config.sim.task))
    place = task_input.index if task_input is not None else 0
    trained_hz = config.sim.control_hz or spec.native_hz
    ckpt, routing, retimed = frozen_and_timed(
        ckpt, spec, task_input, hz=hz if retime else 0.0, trained_hz=trained_hz, seed=seed
    )
    name = f"{spec.name}.onnx" if task_input is not None else "policy.onnx"
    out = pathlib.Path(onnx_path) if onnx_path else run_dir / "deploy" / name
    export_onnx(ckpt, out, routing=routing, task_input=task_input)
    onnx_policy = OnnxPolicy(out)
    actor = reference_actor(ckpt)
    pad = task_input.pad if task_input is not None else (lambda rows: rows)

    def torch_policy(x: np.ndarray) -> np.ndarray:
        with torch.no_grad():
            return actor.deterministic(torch.from_numpy(pad(x[None])), torch.tensor([place])).numpy()[0]

    return Controllers(spec.name, out, lambda x: onnx_policy.run_batch(x[None])[0], torch_policy, trained_hz, retimed)


def controller_check(
    run_dir: str | pathlib.Path,
    *,
    hz: float = 120.0,
    delay_ms: float = 10.0,
    episodes: int = 20,
    seed: int = 0,
    onnx_path: str | pathlib.Path | None = None,
    task: str | None = None,
    retime: bool = True,
    nominal: bool = False,
) -> ControllerReport:
    """Export the run's newest checkpoint (MoE: routing frozen on fresh rollouts) and drive
    the task with it and with the torch policy; see the module docstring. A multi-task run's
    `task` is exported on its own input and its torch policy fed the padded input. The sim is
    randomized with the run's ranges even where the run trained without them (a controller meets
    a real robot's friction and masses), `nominal=True` drives the nominal task."""
    run_dir = pathlib.Path(run_dir)
    config = RunConfig.load(run_dir / "config.json")
    pair = export_controllers(run_dir, config, hz=hz, seed=seed, onnx_path=onnx_path, task=task, retime=retime)
    spec = get_task(pair.task)
    delay_ticks = round(delay_ms * hz / 1000.0)
    randomization = dataclasses.replace(config.sim.randomization, enabled=not nominal)
    # both policies, the same episodes
    onnx_ok, calls = drive(pair.onnx, spec, hz, randomization, episodes=episodes, delay_ticks=delay_ticks, seed=seed)
    torch_ok, _ = drive(pair.torch, spec, hz, randomization, episodes=episodes, delay_ticks=delay_ticks, seed=seed)
    ms = np.array(calls) * 1000.0
    return ControllerReport(
        spec.name, hz, pair.trained_hz, delay_ticks, episodes, onnx_ok, torch_ok, len(calls),
        deadline_misses=int(np.sum(ms > 1000.0 / hz)), p50_ms=float(np.percentile(ms, 50)),
        p99_ms=float(np.percentile(ms, 99)), max_ms=float(ms.max()), retimed=pair.retimed,
        randomized=not nominal, trained_randomized=config.sim.randomization.enabled,
    )  # fmt: skip
