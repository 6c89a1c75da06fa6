"""The HTML blocks of `fleetrl report`'s page besides the plots: the runs' table, CPU per role,
what the terms mean, and what each run ran with (config changes, preset, commit).

    html = run_table(runs) + cpu_table(runs) + glossary(RATE_WINDOW_SEC) + setup_table(runs)
"""

from __future__ import annotations

import html
from collections.abc import Callable
from typing import Any

from fleet.report.rundir import Run, num
from foundation.config import NOT_A_FIELD, config_changes


def _fmt(value: object, spec: str) -> str:
    return format(value, spec) if num(value) else "—"


def _seconds(value: object) -> str:
    return f"{value:.1f} s ({value / 60:.1f} min)" if num(value) else "—"


def _best_success(run: Run) -> object:
    rates = [e["success_rate"] for e in run.evals]
    return run.summary.get("best_success", max(rates, default=None))


def _overhead(run: Run) -> object:
    # Written at the top level of summary.json; some writers nest it under "cpu".
    cpu = run.summary.get("cpu")
    return run.summary.get("fleet_overhead_share", cpu.get("fleet_overhead_share") if isinstance(cpu, dict) else None)


def _nested(data: dict[str, Any], section: str, key: str) -> object:
    inner = data.get(section)
    return inner.get(key) if isinstance(inner, dict) else None


COLUMNS: list[tuple[str, Callable[[Run], str]]] = [
    ("run", lambda r: r.name),
    ("task", lambda r: str(r.summary.get("task") or _nested(r.config, "sim", "task") or "—")),
    ("seed", lambda r: _fmt(r.summary.get("seed", _nested(r.config, "sampler", "seed")), "")),
    ("stop reason", lambda r: str(r.summary.get("stop_reason") or "—")),
    ("reached target", lambda r: {True: "yes", False: "no", None: "—"}.get(r.summary.get("reached_target"), "—")),
    ("wall-clock to target", lambda r: _seconds(r.summary.get("wall_sec_to_target"))),
    ("env steps to target", lambda r: _fmt(r.summary.get("env_steps_to_target"), ",")),
    ("best success", lambda r: _fmt(_best_success(r), ".2f")),
    ("final env steps", lambda r: _fmt(r.summary.get("final_env_steps"), ",")),
    ("final version", lambda r: _fmt(r.summary.get("final_version"), ",")),
    ("updates/s (whole-run mean)", lambda r: _fmt(r.summary.get("updates_per_sec"), ".1f")),
    ("fleet overhead", lambda r: _fmt(_overhead(r), ".1%")),
]


def cpu_table(runs: list[Run]) -> str:
    """A row per run that measured CPU, a column per role: CPU share of the machine (seconds)."""
    measured = [run for run in runs if run.cpu]
    if not measured:
        return ""
    esc = html.escape
    roles = sorted({role for run in measured for role in run.cpu})

    def cell(run: Run, role: str) -> str:
        entry = run.cpu.get(role)
        return "—" if entry is None else f"{entry['share']:.1%} ({_fmt(entry.get('cpu_sec'), '.1f')} s)"

    header = "<th>run</th>" + "".join(f"<th>{esc(role)}</th>" for role in roles)
    rows = "".join(
        f"<tr><td>{esc(run.name)}</td>" + "".join(f"<td>{esc(cell(run, role))}</td>" for role in roles) + "</tr>\n"
        for run in measured
    )
    caption = "CPU per role: share of wall-clock x cores (CPU-seconds)"
    return f"<h2>{esc(caption)}</h2>\n<table><tr>{header}</tr>\n{rows}</table>\n"


def run_table(runs: list[Run]) -> str:
    """A row per run: its outcome (COLUMNS)."""
    esc = html.escape
    header = "".join(f"<th>{esc(name)}</th>" for name, _ in COLUMNS)
    rows = "".join("<tr>" + "".join(f"<td>{esc(cell(run))}</td>" for _, cell in COLUMNS) + "</tr>\n" for run in runs)
    return f"<table><tr>{header}</tr>\n{rows}</table>\n"


def glossary(rate_window_sec: float) -> str:
    """What the page's terms mean, so two numbers that differ on purpose are not read as a bug."""
    terms = [
        ("curve score", "the evaluator's quick score of a weight version: a few deterministic episodes "
         "(eval.curve_episodes, 10 by default), never cut short; the learning curve"),
        ("full score", "the evaluator's full score: 50 deterministic episodes by default (eval.episodes), run "
         "when the curve nears the target and ended early once out of reach; only a complete one can stop a "
         "run at target_success"),
        ("training success", "the share of successful episodes among the samplers' last 100: acting with "
         "exploration noise and random actions (sampler.random_action_prob), so it stays below the evaluation "
         "success of the same weights"),
        ("evaluation success", "the deterministic policy (the Gaussian's mean, no random actions) on held-out "
         "episode seeds"),
        ("updates/s", f"optimizer steps per second: the table's is the whole-run mean (final version / wall "
         f"time), the plot's the rate over the last {rate_window_sec:.0f} s"),
    ]  # fmt: skip
    rows = "".join(f"<dt>{html.escape(term)}</dt><dd>{html.escape(text)}</dd>\n" for term, text in terms)
    return f"<h2>What the terms mean</h2>\n<dl>\n{rows}</dl>\n"


SETUP_COLUMNS = ("run", "preset", "commit", "fleetrl", "config changes from the defaults")


def setup_table(runs: list[Run]) -> str:
    """A row per run: its preset, its commit and fleetrl version (code.json), and every config
    field that differs from the defaults (config_changes, as `fleetrl config --changed` prints)."""
    esc = html.escape
    rows = []
    for run in runs:
        changes = config_changes(run.config) if run.config else []
        listed = "<br>".join(esc(_change(c.name, c.value, c.default)) for c in changes) or "—"
        preset = str(run.config.get("preset") or "none") if run.config else "—"
        cells = [run.name, preset, str(run.code.get("commit") or "—"), str(run.code.get("fleetrl") or "—")]
        rows.append("<tr>" + "".join(f"<td>{esc(c)}</td>" for c in cells) + f"<td>{listed}</td></tr>\n")
    header = "".join(f"<th>{h}</th>" for h in SETUP_COLUMNS)
    return f"<h2>What each run ran with</h2>\n<table><tr>{header}</tr>\n{''.join(rows)}</table>\n"


def _change(name: str, value: Any, default: Any) -> str:
    was = "not a field of this fleetrl" if default == NOT_A_FIELD else f"default {default!r}"
    return f"{name} = {value!r} ({was})"
