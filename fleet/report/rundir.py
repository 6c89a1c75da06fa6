"""A run directory as `fleetrl report` reads it: what `fleetrl train` or
`benchmarks/sb3_baseline.py --out` writes, each file read if present.

    run = load_run("runs/FetchPush-v4-20250101-120000")   # ReportError naming the path if unusable
    run.summary, run.evals, run.progress, run.config, run.code

summary.json (the run's outcome), evals.jsonl (every score), progress.jsonl (rates over time),
config.json (the run's config), code.json (fleetrl's version and the commit that ran). A run
needs at least summary.json or evals.jsonl; malformed JSONL lines are counted and left out.
"""

from __future__ import annotations

import json
import pathlib
from dataclasses import dataclass, field
from typing import Any, TypeGuard

from foundation.errors import FleetrlError


class ReportError(FleetrlError, ValueError):
    """A run directory (or argument) the report cannot use; the message names the path."""


@dataclass(frozen=True)
class Run:
    """One run directory as read: a missing file leaves its field empty."""

    name: str  # summary.json's `label`, else the directory name
    summary: dict[str, Any]
    evals: list[dict[str, Any]]  # evals.jsonl; `wall_sec` filled in (None when it cannot be known)
    progress: list[dict[str, Any]]  # progress.jsonl
    cpu: dict[str, dict[str, float]]  # role (all its processes) -> {"cpu_sec", "share"}; share of wall_sec * cores
    config: dict[str, Any] = field(default_factory=dict)  # config.json
    code: dict[str, Any] = field(default_factory=dict)  # code.json (else summary.json's "code"): version, commit
    skipped_lines: int = 0  # malformed lines of evals.jsonl and progress.jsonl, left out
    envelopes: list[pathlib.Path] = field(default_factory=list)  # envelope/<task>.png (deploy-check --sweep)


def load_run(path: str | pathlib.Path) -> Run:
    """Read a run directory, tolerating missing files and malformed JSONL lines.

    >>> load_run("runs/FetchReach-v4-20250101-120000").name
    'FetchReach-v4-20250101-120000'
    """
    run_dir = pathlib.Path(path)
    if not run_dir.is_dir():
        raise ReportError(f"run dir {run_dir} does not exist or is not a directory")
    summary_path, evals_path = run_dir / "summary.json", run_dir / "evals.jsonl"
    if not summary_path.exists() and not evals_path.exists():
        raise ReportError(f"run dir {run_dir} has neither summary.json nor evals.jsonl: nothing to report")
    summary = _read_json(summary_path)
    evals, bad_evals = _read_jsonl(evals_path, ("success_rate", "env_steps"))
    progress, bad_progress = _read_jsonl(run_dir / "progress.jsonl", ("wall_sec",))
    config, code = _optional_json(run_dir / "config.json"), _optional_json(run_dir / "code.json")
    embedded = summary.get("code")  # summary.json carries the same provenance
    code = code or (embedded if isinstance(embedded, dict) else {})
    cpu = summary.get("cpu")
    cpu = cpu if isinstance(cpu, dict) else {}
    groups = cpu.get("groups")  # fleetrl.cpu.CpuMeter.report(): per role ("sampler": every sampler process)
    cpu = groups if isinstance(groups, dict) else cpu
    return Run(
        name=str(summary.get("label") or run_dir.resolve().name),
        summary=summary,
        evals=[_with_wall_sec(e, summary.get("started_unix")) for e in evals],
        progress=progress,
        cpu={role: v for role, v in cpu.items() if isinstance(v, dict) and num(v.get("share"))},
        config=config,
        code=code,
        skipped_lines=bad_evals + bad_progress,
        envelopes=sorted((run_dir / "envelope").glob("*.png")),
    )


def num(value: object) -> TypeGuard[float]:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _read_json(path: pathlib.Path) -> dict[str, Any]:
    if not path.exists():
        return {}
    try:
        data = json.loads(path.read_text(encoding="utf-8", errors="replace"))
    except json.JSONDecodeError as err:
        raise ReportError(f"{path} is not valid JSON: {err}") from None
    if not isinstance(data, dict):
        raise ReportError(f"{path} must hold a JSON object, got {type(data).__name__}")
    return data


def _optional_json(path: pathlib.Path) -> dict[str, Any]:
    """A file the report only labels with (config.json, code.json): {} when missing or unreadable."""
    try:
        return _read_json(path)
    except ReportError:  # not worth refusing the run over
        return {}


def _read_jsonl(path: pathlib.Path, required: tuple[str, ...]) -> tuple[list[dict[str, Any]], int]:
    """(records, malformed line count): a line must be a JSON object with numbers at `required`."""
    if not path.exists():
        return [], 0
    records, skipped = [], 0
    for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError:  # e.g. the last line of a run still writing
            record = None
        if isinstance(record, dict) and all(num(record.get(key)) for key in required):
            records.append(record)
        else:
            skipped += 1
    return records, skipped


def _with_wall_sec(record: dict[str, Any], started_unix: object) -> dict[str, Any]:
    """Older evals.jsonl lines lack `wall_sec`; derive it from `time` when the start is known."""
    if num(record.get("wall_sec")):
        return record
    known = num(record.get("time")) and num(started_unix)
    return {**record, "wall_sec": record["time"] - started_unix if known else None}
