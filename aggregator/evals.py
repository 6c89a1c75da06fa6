"""The evaluator's reports, as the aggregator takes them: checked, fed to the weight average, logged.

problem, actor = check_eval_report(request, core)   # "field: what is wrong", or None
feed_swa(core, request, actor, learner_metrics)     # under the servicer's lock
row = eval_row(request, core.swa)                   # one line of <run_dir>/evals.jsonl
newest = newest_reports(run_dir / "evals.jsonl")    # at start: {"curve": ..., "full": ...} scored before
"""

from __future__ import annotations

import json
import pathlib
import time

import numpy as np

from aggregator.core import AggregatorCore
from aggregator.swa import LayeredSWA
from foundation.proto import fleetrl_pb2 as pb
from foundation.wire import WireError, from_tensor

EVAL_KINDS = ("curve", "full", "swa_curve")  # see EvalReport.kind


def check_eval_report(request: pb.EvalReport, core: AggregatorCore) -> tuple[str | None, np.ndarray | None]:
    """(problem, actor): the first field that breaks the contract (None when sound), and the
    actor a live curve report carries with aggregator.swa on (None without one)."""
    if not 0.0 <= request.success_rate <= 1.0 or not np.isfinite(request.success_rate):
        return f"success_rate: {request.success_rate} not in [0, 1]", None
    if request.version > core.version:
        return f"version: {request.version} > {core.version}", None
    if request.kind not in EVAL_KINDS:
        return f"kind: {request.kind[:40]!r} not one of {EVAL_KINDS}", None
    for task, rate in request.task_success.items():
        if not 0.0 <= rate <= 1.0 or not np.isfinite(rate):
            return f"task_success[{task[:40]!r}]: {rate} not in [0, 1]", None
    if not request.HasField("actor"):
        return None, None
    expected = (core.sizes["actor"],)
    try:
        actor = from_tensor(request.actor, "actor")
    except WireError as err:
        return str(err), None
    if actor.shape != expected:
        return f"actor: shape {actor.shape}, expected {expected}", None
    if not np.all(np.isfinite(actor)):
        return "actor: NaN or inf", None
    return None, np.asarray(actor, np.float32)


def feed_swa(core: AggregatorCore, request: pb.EvalReport, actor: np.ndarray | None, metrics: dict) -> None:
    """Offer a scored live version to the weight average(s); record the average's own score."""
    if core.swa is None:
        return
    if request.kind == "swa_curve":
        core.swa.scored(request.success_rate)
    elif request.kind == "curve" and actor is not None:
        core.live_score = request.success_rate
        shares = expert_shares(metrics)
        for swa in (core.swa, core.swa_plain):
            if swa is not None:
                swa.offer(request.version, actor, request.success_rate, shares)


def eval_row(request: pb.EvalReport, swa: LayeredSWA | None) -> dict:
    row = {
        "version": request.version,
        "success_rate": request.success_rate,
        "mean_return": request.mean_return,
        "episodes": request.episodes,
        "env_steps": request.env_steps,
        "evaluator": request.evaluator,
        "kind": request.kind,
        "time": time.time(),
    }
    if request.task_success:  # a multi-task run: each task's rate beside the mean
        row["task_success"] = dict(sorted(request.task_success.items()))
    if request.kind == "swa_curve" and swa is not None:
        row["swa_versions"] = swa.versions
    return row


def newest_reports(path: pathlib.Path) -> dict[str, pb.EvalReport]:
    """The newest "curve" and "full" score an evals.jsonl holds (the highest version; the later
    line of two), as the reports that made them. A restarted or resumed aggregator answers Stats
    with them at once, so the learners' and samplers' task shares (foundation/task_schedule.py)
    and the launcher's progress go on from the run's last scores, not from none. A torn line is
    left out."""
    newest: dict[str, pb.EvalReport] = {}
    lines = path.read_text(errors="replace").splitlines() if path.exists() else []
    for line in lines:
        try:
            row = json.loads(line)
            report = pb.EvalReport(
                version=int(row["version"]),
                episodes=int(row["episodes"]),
                success_rate=float(row["success_rate"]),
                mean_return=float(row.get("mean_return", 0.0)),
                env_steps=int(row.get("env_steps", 0)),
                evaluator=str(row.get("evaluator", "")),
                kind=str(row.get("kind", "")),
                task_success={str(k): float(v) for k, v in (row.get("task_success") or {}).items()},
            )
        except (ValueError, TypeError, KeyError, AttributeError):
            continue
        if report.kind in ("curve", "full") and report.version >= newest.get(report.kind, report).version:
            newest[report.kind] = report
    return newest


def expert_shares(metrics: dict[str, float]) -> list[np.ndarray] | None:
    """Per actor MoE layer, each expert's activation share, from the learners' newest metrics
    (moe/actor/l<i>/share_e<e>); None for a dense actor or before any metrics."""
    layers: dict[int, dict[int, float]] = {}
    for key, value in metrics.items():
        parts = key.split("/")
        if len(parts) == 4 and parts[:2] == ["moe", "actor"] and parts[3].startswith("share_e"):
            layers.setdefault(int(parts[2][1:]), {})[int(parts[3][7:])] = value
    if not layers:
        return None
    return [np.array([shares[e] for e in sorted(shares)]) for _, shares in sorted(layers.items())]
