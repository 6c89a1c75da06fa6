"""What the aggregator writes beside its checkpoints: TensorBoard scalars and the expert load.

writer = summary_writer(run_dir, "aggregator")    # None without a run directory
write_version_scalars(writer, servicer, run_dir)  # once per new version, from the main loop
writer.close()
"""

from __future__ import annotations

import json
import os
import pathlib

from aggregator.servicer import AggregatorServicer
from foundation.tb import ScalarWriter


def write_version_scalars(writer: ScalarWriter, servicer: AggregatorServicer, run_dir: str | None) -> int:
    """The learners' newest metrics and the aggregator's counters at the current version;
    returns the version written."""
    core = servicer.core
    version = core.version
    metrics = dict(servicer.metrics)
    for key, value in metrics.items():
        writer.add_scalar(f"learner/{key}", value, version)
    write_expert_load(run_dir, version, metrics)
    writer.add_scalar("aggregator/gradients_stale", servicer.counts["stale"], version)
    writer.add_scalar("aggregator/steps_skipped", core.steps_skipped, version)
    writer.add_scalar("aggregator/gradients_clipped", core.clipped, version)
    writer.add_scalar("aggregator/learning_rate", core.config.lr_at(version), version)
    for learner, count in dict(servicer.rejected_by_learner).items():
        writer.add_scalar(f"aggregator/rejected/{learner}", count, version)
    writer.flush()
    return version


def write_expert_load(run_dir: str | None, version: int, metrics: dict[str, float]) -> None:
    """A MoE run's newest router metrics (beta, balancing loss, expert shares per layer) as
    <run_dir>/expert_load.json: the launcher puts them in summary.json."""
    moe = {k.removeprefix("moe/"): v for k, v in metrics.items() if k.startswith("moe/")}
    if run_dir is None or not moe:
        return
    path = pathlib.Path(run_dir) / "expert_load.json"
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps({"version": version, **moe}, indent=1, sort_keys=True))
    os.replace(tmp, path)


def summary_writer(run_dir: str | None, name: str) -> ScalarWriter | None:
    """<run_dir>/tb/<name>: the TensorBoard scalars; None without a run directory."""
    return None if run_dir is None else ScalarWriter(pathlib.Path(run_dir) / "tb" / name)
