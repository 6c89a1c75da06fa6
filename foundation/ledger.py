"""Ack ledgers: one JSON line per acked push, written by the process that pushed.

    ledger = AckLedger(run_dir / "acks", "sampler-0", incarnation)
    ledger.record(seq=7, env_steps=50, duplicate=False, ...)   # right after the ack arrives

Samplers record every acked TransitionBatch and learners every acked gradient push, one
file per process start (`<name>-<incarnation>.jsonl`). An auditor reads them against what
the services hold: every acked batch stored once in Redis, every acked gradient applied once
in the history of the weights (tests/test_e2e_faults.py does both). Lines are flushed to the
page cache at once, so they survive the process being SIGKILLed.
"""

from __future__ import annotations

import json
import os
import pathlib
import time


class AckLedger:
    def __init__(self, directory: str | os.PathLike, name: str, incarnation: int) -> None:
        path = pathlib.Path(directory)
        path.mkdir(parents=True, exist_ok=True)
        self.incarnation = incarnation
        self._file = open(path / f"{name}-{incarnation}.jsonl", "a")  # noqa: SIM115 - close()

    def record(self, **fields: object) -> None:
        if self._file.closed:  # an ack that lands after shutdown began: the ledger is already closed
            return
        # `time` (epoch seconds): an auditor orders acks against restarts (a version seen before
        # an aggregator's restart must not be made again after it).
        row = {"incarnation": self.incarnation, "time": round(time.time(), 3), **fields}
        self._file.write(json.dumps(row) + "\n")
        self._file.flush()

    def close(self) -> None:
        self._file.close()


def read_ledgers(directory: str | os.PathLike, name_prefix: str) -> list[dict]:
    """Every line of every `<name_prefix>*.jsonl` ledger in `directory`."""
    rows = []
    for path in sorted(pathlib.Path(directory).glob(f"{name_prefix}*.jsonl")):
        rows += [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return rows
