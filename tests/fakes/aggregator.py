"""The aggregator's fakes: the weights watcher and the client a learner pushes gradients through
(see tests/fakes/__init__.py for how fakes check their calls)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import numpy as np

from aggregator.client import GradientPush
from foundation.acting import WeightsSnapshot
from foundation.policy import GRADIENT_GROUPS, GROUPS, ModelSpec
from foundation.proto import fleetrl_pb2 as pb
from foundation.wire import WIRE_DTYPES
from nets.models import SACModel


class FakeWeightsWatcher:
    """A WeightsWatcher as samplers and learners use it: latest() and wait_newer_than() over the
    versions published to it.

        weights = FakeWeightsWatcher(groups=ACTOR_GROUPS)   # holds only these groups; () = all
        weights.publish(snapshot)                           # what the aggregator broadcasts
        policy.refresh(weights.latest())                    # the code under test

    Checked where it happens: published versions only grow and keep the run's spec and each
    group's size (versions never go backwards); wait_newer_than() is asked with a timeout (a
    role waiting for weights must still see its stop flag) and a version >= -1; nothing is
    asked of a closed watcher. `asked`: every call, in order ("latest" or "wait_newer_than").
    """

    def __init__(self, groups: tuple[str, ...] = ()) -> None:
        self.groups = groups
        self.asked: list[str] = []
        self.received = 0
        self.shared_memory = False
        self._latest: WeightsSnapshot | None = None
        self._closed = False
        self._cond = threading.Condition()

    def __enter__(self) -> FakeWeightsWatcher:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()

    def publish(self, snapshot: WeightsSnapshot) -> None:
        held = {g: t.copy() for g, t in snapshot.tensors.items() if not self.groups or g in self.groups}
        with self._cond:
            last = self._latest
            if last is not None:
                assert snapshot.version > last.version, f"version {snapshot.version} after {last.version}: backwards"
                assert snapshot.spec == last.spec, f"the spec changed at version {snapshot.version}"
                sizes, before = {g: t.size for g, t in held.items()}, {g: t.size for g, t in last.tensors.items()}
                assert sizes == before, f"group sizes {sizes} at version {snapshot.version}, were {before}"
            self._latest = WeightsSnapshot(snapshot.version, held, snapshot.spec)
            self.received += 1
            self._cond.notify_all()

    def latest(self) -> WeightsSnapshot | None:
        with self._cond:
            self._ask("latest")
            return self._latest

    def wait_newer_than(self, version: int, timeout: float | None = None) -> WeightsSnapshot | None:
        assert timeout is not None, "wait_newer_than() without a timeout: the caller's stop flag goes unseen"
        assert version >= -1, f"wait_newer_than({version}): versions start at 0 (-1: any)"
        deadline = time.monotonic() + timeout
        with self._cond:
            self._ask("wait_newer_than")
            while self._latest is None or self._latest.version <= version:
                left = deadline - time.monotonic()
                if self._closed or left <= 0:
                    return None
                self._cond.wait(left)
            return self._latest

    def _ask(self, method: str) -> None:
        assert not self._closed, f"{method}() on a closed watcher"
        self.asked.append(method)


class FakePendingPush:
    """A push in flight (aggregator.client.PendingPush): its seq, its base version, its ack."""

    def __init__(self, client: FakeAggregatorClient, message: GradientPush, seq: int, ack: pb.GradientAck) -> None:
        self._client, self.seq, self.base_version, self._ack = client, seq, message.base_version, ack
        self.resolved = False

    def result(
        self, retry: bool = True, should_stop: Callable[[], bool] = lambda: False, on_wait: Callable = lambda: None
    ) -> pb.GradientAck:
        self.resolved = True
        return self._ack


class FakeAggregatorClient:
    """An AggregatorClient as a learner uses it, over an in-memory aggregator of `spec`: every
    push is applied (one plain gradient step of `lr`) and makes a new version, broadcast to
    each watcher it handed out.

        agg = FakeAggregatorClient(SPEC)
        weights = agg.watch("learner-0", LEARNER_GROUPS)     # version 0 at once
        ack = agg.push_gradients_async(push).result()         # the code under test pushes
        agg.assert_pushes(at_least=3)

    Checked where it happens: one float32 vector per gradient group, of the spec's size, all
    finite; norm_stats as nets.normalizer.norm_stats lays them out, counting 1..batch_size
    rows; base_version a version already broadcast (no gradient of weights nobody has seen);
    at most one push in flight (the learner's two gradient buffers are written again two
    pushes on). With `broadcast=False` versions move but watchers see none of them until
    broadcast(): an aggregator whose weights come late.
    """

    def __init__(self, spec: ModelSpec, lr: float = 1e-3, broadcast: bool = True) -> None:
        self.spec, self.lr, self.auto_broadcast = spec, lr, broadcast
        self.incarnation = 1
        self.shares_gradients = self.closed = False
        self.pushes: list[GradientPush] = []
        self.violations: list[str] = []
        self._watchers: list[FakeWeightsWatcher] = []
        self._pending: FakePendingPush | None = None
        self._lock = threading.RLock()
        model = SACModel(spec)
        self._weights = WeightsSnapshot(0, {g: model.get_flat(g) for g in GROUPS}, spec)
        self._broadcast = self._weights

    def __enter__(self) -> FakeAggregatorClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self.closed = True

    @property
    def version(self) -> int:
        return self._weights.version

    def watch(self, subscriber: str, groups: tuple[str, ...] = (), *args: object, **kw: object) -> FakeWeightsWatcher:
        """A watcher of `groups` (() = all) that holds the last version broadcast, at once."""
        watcher = FakeWeightsWatcher(groups)
        with self._lock:
            watcher.publish(self._broadcast)
            self._watchers.append(watcher)
        return watcher

    def broadcast(self) -> None:
        """Send the newest version to every watcher (what `broadcast=False` holds back)."""
        with self._lock:
            self._broadcast = self._weights
            for watcher in self._watchers:
                watcher.publish(self._weights)

    def share_gradients(self, sizes: dict[str, int]) -> bool:
        return False  # no shared-memory segment: gradients go as bytes

    def push_gradients(self, push: GradientPush) -> pb.GradientAck:
        return self.push_gradients_async(push).result()

    def push_gradients_async(self, push: GradientPush) -> FakePendingPush:
        with self._lock:
            if self.closed:
                self._violated("push_gradients_async() on a closed client")
            if self._pending is not None and not self._pending.resolved:
                self._violated(f"push {len(self.pushes) + 1} sent while push {self._pending.seq} awaits its ack")
            self._check(push)
            self.pushes.append(push)
            grads = {g: push.grads[g] for g in GRADIENT_GROUPS}
            tensors = {g: t - self.lr * grads[g] if g in grads else t for g, t in self._weights.tensors.items()}
            self._weights = WeightsSnapshot(self.version + 1, tensors, self.spec)
            if self.auto_broadcast:
                self.broadcast()
            ack = pb.GradientAck(applied=True, version=self.version)
            self._pending = FakePendingPush(self, push, len(self.pushes), ack)
            return self._pending

    def _check(self, push: GradientPush) -> None:
        sizes = {g: self._weights.tensors[g].size for g in GRADIENT_GROUPS}
        got = {g: v.shape for g, v in push.grads.items()}
        if got != {g: (n,) for g, n in sizes.items()}:
            self._violated(f"gradient shapes {got}, expected {sizes} (one flat vector per group)")
        if not all(v.dtype == np.float32 and np.isfinite(v).all() for v in push.grads.values()):
            self._violated("gradients must be finite float32")
        rows, width = self.spec.norm_rows, 1 + 2 * self.spec.input_dim
        if push.norm_stats.shape != (rows * width,):
            self._violated(f"norm_stats shape {push.norm_stats.shape}, expected ({rows * width},)")
        count = float(push.norm_stats.reshape(rows, width)[:, 0].sum())
        if not 1 <= count <= push.batch_size:
            self._violated(f"norm_stats count {count}: a batch of {push.batch_size} rows counts 1..{push.batch_size}")
        if not 0 <= push.base_version <= self._broadcast.version:
            self._violated(f"base_version {push.base_version}: broadcast so far 0..{self._broadcast.version}")
        if push.batch_size < 1 or push.wire_dtype not in WIRE_DTYPES:
            self._violated(f"batch_size {push.batch_size}, wire_dtype {push.wire_dtype!r}")

    def _violated(self, message: str) -> None:
        self.violations.append(message)
        raise AssertionError(message)

    def assert_pushes(self, *, at_least: int, learner_id: int = 0) -> None:
        """No broken contract; at least `at_least` pushes from `learner_id`, base versions never
        going back."""
        assert not self.violations, self.violations
        assert len(self.pushes) >= at_least, f"{len(self.pushes)} pushes, expected at least {at_least}"
        assert {p.learner_id for p in self.pushes} == {learner_id}, [p.learner_id for p in self.pushes]
        bases = [p.base_version for p in self.pushes]
        assert bases == sorted(bases), f"base versions went back: {bases}"
