"""What every benchmark shares: interleaved arms, medians, a table and the raw result.

    from harness import median_figures, print_table, result_record, run_interleaved, write_result

    runs = run_interleaved({"dense": measure_dense, "moe": measure_moe}, repeats=3)
    medians = median_figures(runs)        # {"dense": {"updates_per_sec": 41.0}, "moe": {...}}
    print_table("updates per CPU-second, medians of 3", medians)
    write_result(result_record("learner_throughput", {"medians": medians, "runs": runs}), "R.json")

An arm is a function of the repeat's index (0, 1, ...) that measures once and returns its
figures. Arms run in the order A B A B ...: a slow spell on a shared machine falls on every
arm alike, so ratios taken within one run hold where absolute rates drift.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import io
import json
import math
import os
import pathlib
import platform
import shlex
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, NamedTuple

import psutil
from rich.console import Console
from rich.table import Table

REPO = pathlib.Path(__file__).resolve().parent.parent

Figures = Mapping[str, Any]
Arm = Callable[[int], Figures]


class Turn(NamedTuple):
    """One measurement in an interleaved schedule: arm `arm` in repeat `repeat` (0-based)."""

    repeat: int
    arm: str


def interleaved_order(arms: Sequence[str], repeats: int) -> list[Turn]:
    """Every arm once per repeat, in the arms' order: A B A B for two arms and two repeats."""
    if repeats < 1:
        raise ValueError(f"repeats ({repeats}) must be >= 1: with none no arm is measured")
    if not arms:
        raise ValueError("arms is empty: there is nothing to measure")
    if len(set(arms)) != len(arms):
        raise ValueError(f"arms {list(arms)} name an arm twice: its figures would mix two runs")
    return [Turn(r, arm) for r in range(repeats) for arm in arms]


def repeats_arg(text: str) -> int:
    """argparse type for --repeats: an int >= 1, refused at the door with what it would mean."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number of repeats") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value} must be >= 1: with no repeat no arm is measured")
    return value


def run_interleaved(arms: Mapping[str, Arm], repeats: int) -> dict[str, list[dict[str, Any]]]:
    """Each arm's figures per repeat, measured in `interleaved_order`; progress goes to stderr."""
    turns = interleaved_order(list(arms), repeats)
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in arms}
    for i, turn in enumerate(turns, 1):
        print(f"[{i}/{len(turns)}] repeat {turn.repeat + 1}/{repeats}: {turn.arm}", file=sys.stderr, flush=True)
        runs[turn.arm].append(dict(arms[turn.arm](turn.repeat)))
    return runs


def median_figures(runs: Mapping[str, Sequence[Figures]]) -> dict[str, dict[str, float | None]]:
    """Per arm, the median of each numeric figure over its runs (None where no run had one)."""
    medians: dict[str, dict[str, float | None]] = {}
    for arm, samples in runs.items():
        keys = [k for k in dict.fromkeys(k for s in samples for k in s) if _numeric(samples, k)]
        medians[arm] = {}
        for key in keys:
            values = [s[key] for s in samples if s.get(key) is not None]
            medians[arm][key] = statistics.median(values) if values else None
    return medians


def median_and_worst(values: Sequence[float | None], digits: int | None = None) -> tuple[float | None, float | None]:
    """The median and the largest of `values` (minutes or env steps to a target: larger is worse),
    both None unless every value is there: a run that missed the target has no time to it, and a
    median over the runs that made it would hide the one that did not."""
    if not values or any(v is None for v in values):
        return None, None
    present = [v for v in values if v is not None]
    median = statistics.median(present)
    return (round(median, digits) if digits is not None else median), max(present)


def _numeric(samples: Sequence[Figures], key: str) -> bool:
    values = [s.get(key) for s in samples]
    return all(v is None or (isinstance(v, int | float) and not isinstance(v, bool)) for v in values)


def ratio(numerator: float | None, denominator: float | None, digits: int = 3) -> float | None:
    """numerator / denominator rounded, or None where either is missing or the denominator is 0."""
    if numerator is None or not denominator:
        return None
    return round(numerator / denominator, digits)


def paired_ratios(runs: Mapping[str, Sequence[Figures]], numerator: str, denominator: str, key: str) -> list[float]:
    """`key` of arm `numerator` over arm `denominator`, repeat by repeat (the pair a slow spell hit alike)."""
    pairs = zip(runs[numerator], runs[denominator], strict=True)
    return [a[key] / b[key] for a, b in pairs if a.get(key) is not None and b.get(key)]


def cell(value: Any) -> str:
    """How a table shows a figure: '-' for none, thousands apart, a ratio to three decimals."""
    if value is None:
        return "-"
    if isinstance(value, float):
        if abs(value) >= 100:
            return f"{value:,.1f}"
        return f"{value:.3f}" if abs(value) >= 1 else f"{value:.3g}"
    if isinstance(value, int) and not isinstance(value, bool):
        return f"{value:,}"
    return str(value)


def build_table(title: str, rows: Mapping[str, Figures], columns: Sequence[str] | None = None) -> Table:
    """A table with one row per key of `rows` and one column per figure (all figures seen by default)."""
    columns = list(columns) if columns is not None else list(dict.fromkeys(k for r in rows.values() for k in r))
    table = Table(title=title)
    table.add_column("", justify="left")
    for column in columns:
        table.add_column(column, justify="right")
    for name, figures in rows.items():
        table.add_row(name, *(cell(figures.get(c)) for c in columns))
    return table


def table_text(table: Table, width: int = 120) -> str:
    """The table as plain text (what a log file or a test reads)."""
    out = io.StringIO()
    Console(file=out, width=width, color_system=None).print(table)
    return out.getvalue()


def print_table(title: str, rows: Mapping[str, Figures], columns: Sequence[str] | None = None) -> None:
    """Print `build_table` to stdout (nothing for no rows); the figures a benchmark prints last."""
    if not rows:
        return
    Console(width=None if sys.stdout.isatty() else 240).print(build_table(title, rows, columns))  # a log: wide


class CpuMeter:
    """CPU used by given processes, and by the whole machine, between start() and stop().

    meter = CpuMeter({"sampler-0": pid}); meter.start(); ...; meter.stop()
    # {"sampler-0": 97.0, "machine": 180.0, "others": 83.0}: percent of one core
    """

    def __init__(self, procs: dict[str, int]) -> None:
        self.procs = {name: psutil.Process(pid) for name, pid in procs.items()}
        self._start: dict[str, float] = {}
        self._machine_busy = 0.0
        self._t0 = 0.0

    @staticmethod
    def _busy() -> float:
        """CPU seconds the whole machine spent not idle (every core, every process)."""
        t = psutil.cpu_times()
        # Linux counts guest time inside user time too: leave it out of the sum.
        not_busy = ("idle", "iowait", "guest", "guest_nice")
        return sum(getattr(t, f) for f in t._fields if f not in not_busy)

    def _cpu(self, proc: psutil.Process) -> float:
        with contextlib.suppress(psutil.Error):
            return sum(proc.cpu_times()[:2])  # user + system
        return float("nan")

    def start(self) -> None:
        self._t0 = time.monotonic()
        self._machine_busy = self._busy()
        self._start = {name: self._cpu(p) for name, p in self.procs.items()}

    def stop(self) -> dict[str, float]:
        """Percent of one core per process, plus 'machine' (all processes) and 'others' (not ours)."""
        wall = time.monotonic() - self._t0
        used = {name: 100 * (self._cpu(p) - self._start[name]) / wall for name, p in self.procs.items()}
        ours = sum(v for v in used.values() if not math.isnan(v))
        machine = 100 * (self._busy() - self._machine_busy) / wall
        used["machine"] = machine
        used["others"] = max(0.0, machine - ours)
        return used


def cpu_model(cpuinfo: str) -> str:
    """The first 'model name' of a /proc/cpuinfo text ('unknown' if it has none)."""
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "model name" and value.strip():
            return value.strip()
    return "unknown"


def machine() -> dict[str, Any]:
    """The CPU model, its logical cores and the cores this process may use, and the host name."""
    try:
        model = cpu_model(pathlib.Path("/proc/cpuinfo").read_text())
    except OSError:
        model = platform.processor() or platform.machine()
    return {
        "cpu": model,
        "cores": os.cpu_count(),
        "usable_cores": len(os.sched_getaffinity(0)),
        "host": platform.node(),
    }


def git_commit() -> str:
    """HEAD's hash, with '+dirty' when the work tree has uncommitted changes."""
    try:
        head = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True, check=True
        ).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain"], cwd=REPO, capture_output=True, text=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return head + ("+dirty" if dirty.strip() else "")


def command_line(argv: Sequence[str] | None = None) -> str:
    """The command as typed from the repository root: 'python3 benchmarks/x.py --flag value'."""
    argv = list(sys.argv if argv is None else argv)
    script = os.path.relpath(argv[0], REPO) if argv else ""
    return shlex.join(["python3", script, *argv[1:]])


def result_record(benchmark: str, figures: Figures, argv: Sequence[str] | None = None) -> dict[str, Any]:
    """The raw result: the figures with the commit, command line, machine and date that made them."""
    return {
        "benchmark": benchmark,
        "command": command_line(argv),
        "commit": git_commit(),
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "machine": machine(),
        "figures": dict(figures),
    }


def write_result(record: Mapping[str, Any], path: str | os.PathLike) -> None:
    """Write `record` as JSON to `path` (its folder made if missing); the path goes to stderr."""
    out = pathlib.Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(record, indent=2) + "\n")
    print(f"raw result: {out}", file=sys.stderr)


@contextlib.contextmanager
def stopped_on_ctrl_c(proc: subprocess.Popen) -> Iterator[None]:
    """Ctrl-C while waiting on a run reaches the run too (it has its own process group, so the
    terminal's SIGINT does not): it stops as on Ctrl-C, within a bounded wait, then goes on up."""
    try:
        yield
    except KeyboardInterrupt:
        os.killpg(proc.pid, signal.SIGINT)
        try:
            proc.wait(timeout=120)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
        raise


def start_train(argv: Sequence[str], log: pathlib.Path) -> subprocess.Popen:
    """`fleetrl train ARGV` in its own process group (a kill of the group takes every process of
    the run), its output appended to `log`."""
    with open(log, "ab") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "fleet.cli.main", "train", *argv],
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            env={**os.environ, "COLUMNS": "120"},
        )


def wait_train(proc: subprocess.Popen) -> int:
    """The run's exit status, once it ends; Ctrl-C meanwhile stops it (stopped_on_ctrl_c)."""
    with stopped_on_ctrl_c(proc):
        return proc.wait()
