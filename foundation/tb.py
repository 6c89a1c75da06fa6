"""A small TensorBoard scalar writer on tensorboard's own event-file writer.

torch.utils.tensorboard would do the same but imports torch (3 s per process here); the
launcher, samplers and services only ever log scalars.
"""

from __future__ import annotations

import os
import time

from tensorboard.compat.proto.event_pb2 import Event
from tensorboard.compat.proto.summary_pb2 import Summary
from tensorboard.summary.writer.event_file_writer import EventFileWriter


class ScalarWriter:
    """writer.add_scalar("eval/success_rate", 0.9, step); close() flushes."""

    def __init__(self, logdir: str | os.PathLike, flush_secs: float = 10.0) -> None:
        self._writer = EventFileWriter(str(logdir), flush_secs=flush_secs)

    def add_scalar(self, tag: str, value: float, step: int) -> None:
        summary = Summary(value=[Summary.Value(tag=tag, simple_value=float(value))])
        self._writer.add_event(Event(wall_time=time.time(), step=int(step), summary=summary))

    def flush(self) -> None:
        self._writer.flush()

    def close(self) -> None:
        self._writer.close()

    def __enter__(self) -> ScalarWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
