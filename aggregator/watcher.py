"""The subscriber side of WatchWeights: the newest weights, kept fresh in a daemon thread.

    with AggregatorClient(address) as agg, agg.watch("sampler-0", shared_memory=True) as weights:
        w = weights.wait_newer_than(-1, timeout=30)      # WeightsSnapshot(version, tensors, spec)
        w = weights.latest()                             # the newest, without waiting

It reconnects when the aggregator restarts and always holds only the newest version (older ones
are conflated). Other roles get one from `AggregatorClient.watch` (aggregator/client.py).
"""

from __future__ import annotations

import logging
import threading
import time

import grpc

from foundation.acting import WeightsSnapshot
from foundation.policy import ModelSpec
from foundation.proto import fleetrl_pb2 as pb
from foundation.proto import fleetrl_pb2_grpc as pb_grpc
from foundation.shm import SharedWeightsReader
from foundation.transport import Backoff
from foundation.wire import from_tensor

log = logging.getLogger("fleetrl.aggregator.watcher")


class WeightsWatcher:
    """Newest weights from a WatchWeights stream, kept fresh by a daemon thread.

    With `shared_memory`, the first message offers the aggregator's segment (foundation/shm.py);
    once mapped and its key checked, the watcher watches again with that key. The aggregator
    then writes every version into the segment and sends nothing more: `latest()` and
    `wait_newer_than()` read the segment's header (one integer) and copy the weights only when
    the version moved, and the open stream only tells the watcher when the aggregator goes (a
    restarted one offers a new segment). A segment that cannot be read puts it back on gRPC.
    """

    POLL_SEC = 0.0005  # wait_newer_than on a segment: how often it looks at the version
    WRITER_STALL_SEC = 1.0  # a write still in progress after this: the writer is wedged, use gRPC

    def __init__(
        self,
        stub: pb_grpc.AggregatorStub,
        subscriber: str,
        groups: tuple[str, ...],
        interval: float,
        shared_memory: bool = False,
    ):
        self._stub = stub
        self._request = pb.WatchRequest(
            subscriber=subscriber, groups=list(groups), min_interval_sec=interval, shared_memory=shared_memory
        )
        self._cond = threading.Condition()
        self._latest: WeightsSnapshot | None = None
        self._closed = False
        self._call: grpc.Call | None = None  # the open WatchWeights stream, for close() to cancel
        self._reader: SharedWeightsReader | None = None
        self._spec: ModelSpec | None = None
        self.received = 0
        self.shared_reads = 0  # versions copied from shared memory (the rest came over gRPC)
        self._thread = threading.Thread(target=self._run, name=f"watch-{subscriber}", daemon=True)
        self._thread.start()

    def __enter__(self) -> WeightsWatcher:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        if self._call is not None:
            self._call.cancel()
        self._thread.join(timeout=5)
        with self._cond:
            self._drop_reader()

    @property
    def shared_memory(self) -> bool:
        """True while the weights come from the aggregator's shared-memory segment."""
        return self._reader is not None

    def latest(self) -> WeightsSnapshot | None:
        with self._cond:
            self._poll()
            return self._latest

    def wait_newer_than(self, version: int, timeout: float | None = None) -> WeightsSnapshot | None:
        """The newest snapshot once its version exceeds `version`; None on timeout or close."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            while True:
                self._poll()
                if self._latest is not None and self._latest.version > version:
                    return self._latest
                left = None if deadline is None else deadline - time.monotonic()
                if self._closed or (left is not None and left <= 0):
                    return None
                if self._reader is not None:  # a segment tells no one: look again shortly
                    left = self.POLL_SEC if left is None else min(left, self.POLL_SEC)
                self._cond.wait(left)  # else until the stream thread stores a newer snapshot

    def _poll(self) -> None:
        """With a segment (lock held): take its newest version if it moved."""
        reader = self._reader
        if reader is None or self._spec is None:
            return
        if self._latest is not None and reader.version() <= self._latest.version:
            return
        read = reader.read(wait_sec=self.WRITER_STALL_SEC)
        if read is None:  # a write that never finished: a wedged or foreign writer
            log.warning("%s: shared-memory weights unreadable; back on gRPC", self._request.subscriber)
            self._request.shared_memory = False
            self._request.shared_memory_key = 0
            self._drop_reader()
            if self._call is not None:
                self._call.cancel()  # the stream thread watches again, over gRPC
            return
        version, tensors = read
        if self._latest is None or version > self._latest.version:
            self._set(WeightsSnapshot(version=version, tensors=tensors, spec=self._spec))
            self.shared_reads += 1

    def _set(self, snapshot: WeightsSnapshot) -> None:
        self._latest = snapshot
        self._request.after_version = snapshot.version  # a reconnect resumes after this version
        self.received += 1
        self._cond.notify_all()

    def _drop_reader(self) -> None:
        if self._reader is not None:
            self._reader.close()
            self._reader = None

    def _run(self) -> None:
        backoff = Backoff(f"aggregator (weights for {self._request.subscriber})")
        while not self._closed:
            try:
                call = self._stub.WatchWeights(self._request, wait_for_ready=True)
                self._call = call
                for msg in call:
                    switch = self._store(msg)
                    backoff.reset()
                    if switch:  # watch again, now reading from the mapped segment
                        call.cancel()
                        break
                else:
                    backoff.wait("stream ended")
            except grpc.RpcError as err:
                if self._closed:  # our own cancel; a server-side CANCELLED (a stopping aggregator) reconnects
                    return
                if err.code() == grpc.StatusCode.INVALID_ARGUMENT:
                    log.error("WatchWeights refused: %s", err.details())
                    return
                backoff.wait(err.code().name)

    def _store(self, msg: pb.Weights) -> bool:
        """Keep `msg`'s weights as the newest; True: reconnect (a shared-memory switch)."""
        tensors = {t.name: from_tensor(t, "tensors").copy() for t in msg.tensors}
        spec = ModelSpec.from_json(msg.layout)
        with self._cond:
            self._spec = spec
            self._set(WeightsSnapshot(version=msg.version, tensors=tensors, spec=spec))
            offer = msg.shared if msg.HasField("shared") else None
            if offer is None or not self._request.shared_memory or offer.key == self._request.shared_memory_key:
                return False
            return self._map(offer, {name: t.size for name, t in tensors.items()})

    def _map(self, offer: pb.SharedSegment, sizes: dict[str, int]) -> bool:
        """Map an offered segment (lock held); True: mapped, watch again with its key."""
        try:
            reader = SharedWeightsReader(offer.path, offer.key, sizes)
        except (OSError, ValueError) as err:  # another host's aggregator: its segment is not here
            log.info("%s: weights over gRPC (%s)", self._request.subscriber, err)
            self._request.shared_memory = False
            return False
        self._drop_reader()
        self._reader = reader
        self._request.shared_memory_key = offer.key
        return True
