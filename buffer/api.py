"""The buffer's role interfaces: what other roles may rely on, and nothing else.

Writers put transitions in (the ingest service, on behalf of samplers); sources take random
batches out (learners). Implementations: `buffer.storage.TemporalStorage` writes,
`buffer.client.ReplaySampler` samples. Samplers reach a writer over gRPC through
`buffer.ingest_client.IngestClient`.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

import numpy as np

from foundation.wire import Transitions

if TYPE_CHECKING:
    from buffer.storage import PushKey, WriteResult


@dataclass(frozen=True)
class SampledBatch:
    """Sampled rows and, per row, the tags they were stored with.

    `transitions` are the float32 columns (leading dim = batch size); `policy_version[i]` is
    the weight version that acted for row i (for policy-lag checks and importance weights);
    `task_id[i]` is its sim registry task id. Both are int64 arrays of the batch size.
    `demo[i]` (bool) says row i is an expert demonstration's (sampler.demo_episodes); None: no
    row is.
    """

    transitions: Transitions
    policy_version: np.ndarray
    task_id: np.ndarray
    demo: np.ndarray | None = None

    def __len__(self) -> int:
        return len(self.transitions)


class TransitionWriter(Protocol):
    """Appends batches of one task's transitions to the replay buffer, once per push key.

    writer = TemporalStorage(redis_client, run_id, schema, config)
    while collecting:
        transitions = collect_batch()
        result = writer.write(transitions, task_id=task_id, policy_version=version, key=key)
        # demonstration=True: an expert's episode, its rows marked demo for the learners
        # The rows are in Redis, below result.committed (readers see them); a retry with the
        # same key stores nothing and says result.duplicate.
    """

    def write(
        self,
        transitions: Transitions,
        *,
        task_id: int,
        policy_version: int,
        key: PushKey | None = None,
        env_steps: int = 0,
        demonstration: bool = False,
    ) -> WriteResult:
        """Store the rows, tagged with the task and the weight version that acted (and marked
        demo for a `demonstration`); count the batch, its `env_steps` and a demonstration (one
        episode of the key's sampler) in the run's counters once, with the rows."""
        ...


class BatchSource(Protocol):
    """Uniform random batches of stored transitions, for a learner.

    source = ReplaySampler(redis_client, run_id, schema, config, seed=learner_id)
    source.wait_for(config.min_replay_transitions, timeout_sec=60.0)
    while source.wait_to_sample(batch_size, stop, on_wait=heartbeat.beat):
        batch = source.sample(batch_size)   # SampledBatch
        grads = loss(batch.transitions)     # batch.policy_version: per-row weight version; batch.demo
    """

    def wait_to_sample(self, batch_size: int, stop: threading.Event, on_wait: Callable[[], object] = ...) -> bool:
        """Flow control: wait until `batch_size` more rows may be sampled; False once `stop`.
        `on_wait()` runs at every poll that finds no room (a heartbeat: waiting on the samplers
        is not hanging), never when there is room at once."""
        ...

    def sample(self, batch_size: int, version: int = 0) -> SampledBatch:
        """`batch_size` rows drawn with replacement from the live buffer (uniformly, or as the
        source's strategy says: 'version' sampling keeps rows at most a lag behind `version`)."""
        ...
