"""Weights and gradients through this host's shared memory; gRPC says when, and which.

    writer = SharedWeightsWriter({"actor": 1234, ...})      # the aggregator, one per group selection
    writer.write(version, views)                            # after a step: one memcpy, any readers
    reader = SharedWeightsReader(writer.path, writer.key, sizes)   # a learner on the same host
    version, tensors = reader.read(wait_sec=1.0)            # a consistent copy, or None

Serving a 256x256 policy's weights over gRPC costs the aggregator about 1.5 ms of CPU per
version per learner (benchmarks/aggregator_cpu.py: 1.67 ms per MB); a copy into a mapped file
costs a tenth of that, once per version however many local learners read it. The stream then
carries nothing: a reader looks at the header's version and copies only when it moved
(aggregator/watcher.py's WeightsWatcher). A learner that has mapped the aggregator's
weights knows it shares the host, and writes each gradient into a segment of its own the same
way (kind "grads"); the push then names the segment instead of carrying the bytes.

The segment is a file in /dev/shm (mode 0600): a header of four int64 [key, seq, version,
data bytes], then each group's float32 vector in the order given. `key` is random per segment
and also travels over gRPC, so a reader proves it mapped the aggregator's own segment (not one
of another host's with the same name: across hosts the file is absent or its key differs).
Writes follow a seqlock: seq is odd while the data changes; a reader copies, then retries if
seq moved. x86's stores and loads keep program order, which this relies on.
"""

from __future__ import annotations

import contextlib
import mmap
import os
import re
import secrets
import time
from collections.abc import Mapping

import numpy as np

SHM_DIR = "/dev/shm"
KINDS = ("weights", "grads")
NAME = re.compile(r"^/dev/shm/fleetrl-(weights|grads)-(\d+)-([0-9a-f]{16})$")
HEADER = 4  # int64s: key, seq, version, data bytes
KEY, SEQ, VERSION, NBYTES = range(HEADER)


class SharedWeightsWriter:
    """The writing side of one segment: the aggregator's for one group selection, or a
    learner's for its gradients (`kind` "grads"; `version` is then the push's seq)."""

    def __init__(self, sizes: Mapping[str, int], kind: str = "weights") -> None:
        if kind not in KINDS:
            raise ValueError(f"kind {kind!r} is not one of {KINDS}")
        self.sizes = dict(sizes)
        self.key = secrets.randbits(63) or 1
        self.path = f"{SHM_DIR}/fleetrl-{kind}-{os.getpid()}-{self.key:016x}"
        nbytes = 4 * sum(self.sizes.values())
        _remove_orphans()
        fd = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
        try:
            os.ftruncate(fd, 8 * HEADER + nbytes)
            self._map = mmap.mmap(fd, 8 * HEADER + nbytes)
        finally:
            os.close(fd)
        self._header = np.frombuffer(self._map, np.int64, HEADER)
        self._header[:] = (self.key, 0, -1, nbytes)
        self._data = _views(self._map, self.sizes)
        self.version = -1

    def write(self, version: int, tensors: Mapping[str, np.ndarray]) -> None:
        header = self._header
        header[SEQ] += 1  # odd: a reader that starts now, or is mid-copy, will retry
        for group, view in self._data.items():
            view[:] = tensors[group]
        header[VERSION] = version
        header[SEQ] += 1
        self.version = version

    def close(self) -> None:
        """Unmap and remove the file (readers that mapped it keep their mapping until they drop it)."""
        self._header = self._data = None  # type: ignore[assignment]  # views pin the mapping
        with contextlib.suppress(BufferError):
            self._map.close()
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path)


class SharedWeightsReader:
    """A subscriber's side. Raises OSError or ValueError when the segment is not the one named
    (another host's, a removed one, a different size): the caller then stays on gRPC."""

    def __init__(self, path: str, key: int, sizes: Mapping[str, int]) -> None:
        if not NAME.match(path):
            raise ValueError(f"{path!r} is not a {SHM_DIR}/fleetrl-<weights|grads>-<pid>-<key> file")
        self.sizes = dict(sizes)
        fd = os.open(path, os.O_RDONLY)
        try:
            size = os.fstat(fd).st_size
            nbytes = 4 * sum(self.sizes.values())
            if size != 8 * HEADER + nbytes:
                raise ValueError(f"{path}: {size} bytes, expected {8 * HEADER + nbytes} for groups {self.sizes}")
            self._map = mmap.mmap(fd, size, prot=mmap.PROT_READ)
        finally:
            os.close(fd)
        self._header = np.frombuffer(self._map, np.int64, HEADER)
        if int(self._header[KEY]) != key or int(self._header[NBYTES]) != nbytes:
            self.close()
            raise ValueError(f"{path}: key or size differ from the writer's (another host's segment?)")
        self._data = _views(self._map, self.sizes)

    def version(self) -> int:
        """The newest version written (-1: none yet): one integer, no copy."""
        return int(self._header[VERSION])

    def read(self, wait_sec: float = 0.0) -> tuple[int, dict[str, np.ndarray]] | None:
        """(version, copies of every group) as one consistent write left them; None if nothing
        was written yet or a write was still in progress after `wait_sec`. A write takes well
        under a millisecond, but on a busy host the writer can be preempted mid-copy for a time
        slice or more: a reader that expects writes (a weights watcher) waits that out."""
        header = self._header
        deadline = time.monotonic() + wait_sec
        while True:
            before = int(header[SEQ])
            if before % 2 == 0:
                version = int(header[VERSION])
                tensors = {group: view.copy() for group, view in self._data.items()}
                if int(header[SEQ]) == before:
                    return (version, tensors) if version >= 0 else None
            if time.monotonic() >= deadline:
                return None
            time.sleep(0.0001)  # let the writer finish

    def close(self) -> None:
        self._header = self._data = None  # type: ignore[assignment]
        with contextlib.suppress(BufferError):
            self._map.close()


def _views(buffer: mmap.mmap, sizes: Mapping[str, int]) -> dict[str, np.ndarray]:
    views, offset = {}, 8 * HEADER
    for group, size in sizes.items():
        views[group] = np.frombuffer(buffer, np.float32, size, offset)
        offset += 4 * size
    return views


def _remove_orphans() -> None:
    """Segments whose writer died without removing them (a kill -9): their pid is gone."""
    with contextlib.suppress(OSError):
        for name in os.listdir(SHM_DIR):
            match = NAME.match(f"{SHM_DIR}/{name}")
            if match and not _alive(int(match.group(2))):
                with contextlib.suppress(OSError):
                    os.unlink(f"{SHM_DIR}/{name}")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
