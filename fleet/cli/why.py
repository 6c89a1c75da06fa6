"""`fleetrl evaluate --why`: run the held-out episodes, classify every failure, print the table
and write its JSON and plot (sampler/why.py runs and classifies, fleet/report/why.py writes).

    out = out_dir(args, run_dir)                       # at the door: --out refused before any episode
    status = why(args, run_dir, run_config, source, out)  # from fleet/cli/commands.py's evaluate
"""

from __future__ import annotations

import argparse
import json
import pathlib
from typing import TYPE_CHECKING

from foundation.config import ConfigError

if TYPE_CHECKING:
    from foundation.config import RunConfig


def out_dir(args: argparse.Namespace, run_dir: pathlib.Path) -> pathlib.Path:
    """--out, or RUN_DIR/why/; refused (naming --out) when it is anything but a folder or nothing yet."""
    if args.out and not args.why:
        raise ConfigError("--out is read only with --why: where its table and plot go", field="--out")
    out = pathlib.Path(args.out) if args.out else run_dir / "why"
    if out.exists() and not out.is_dir():
        raise ConfigError(f"--out {out}: a file; --why writes a JSON and a plot into a folder", field="--out")
    return out


def why(
    args: argparse.Namespace, run_dir: pathlib.Path, config: RunConfig, source: pathlib.Path, out: pathlib.Path
) -> int:
    """The table of every task the run's checkpoint has a classifier for, on stdout (--json: the
    JSON document instead); the files under `out`. Exit status 0 once written."""
    from fleet.report.why import WhySetting, class_table, heading, write_why
    from sampler.why import diagnose_checkpoint

    diagnosis = diagnose_checkpoint(source, config, args.episodes, args.weights)
    setting = WhySetting(str(run_dir), args.weights, config.eval.seed, args.episodes)
    doc = write_why(diagnosis, setting, out)
    if args.json:
        print(json.dumps(doc))
        return 0
    for task, verdicts in diagnosis.tasks.items():
        print(f"{heading(task, diagnosis, setting)}\n\n{class_table(task, verdicts)}\n")
    for reason in diagnosis.skipped.values():
        print(f"skipped: {reason}")
    plots = ", ".join(task["plot"] for task in doc["tasks"].values())
    print(f"why: {out / setting.stem(diagnosis)}.json; plots: {plots}")
    return 0
