"""The audit of a run's kept replay buffer (buffer.durable) after its fleet is gone.

    audit = audit_kept_buffer(run_dir, read_acks(run_dir / "acks", "sampler-"))
    audit.lost, audit.doubled, audit.acked_twice     # 0, 0, 0: every acked push is stored once

A whole-fleet SIGKILL followed by `fleetrl train --resume` must lose nothing acked. This reads
what the run's Redis data holds by starting a cluster of its own on <run_dir>/redis (other
ports, no password: the folder is the whole state) and matches it against the samplers' ack
ledgers (fleet/chaos/audit.py), trusting no service counter.
"""

from __future__ import annotations

import pathlib
from collections import Counter

from buffer.storage import TemporalStorage
from fleet.chaos.audit import BatchAudit, audit_batches
from fleet.launch.local_cluster import LocalRedisCluster
from foundation.config import RunConfig
from sampler.pusher import row_fingerprint
from sim.tasks import TaskSet


class EvictedError(RuntimeError):
    """The buffer dropped windows: pushes acked into them cannot be found any more."""


def audit_kept_buffer(run_dir: str | pathlib.Path, acks: list[dict]) -> BatchAudit:
    """`acks` (the samplers' ledger rows) against the rows the run's kept Redis data holds. The
    run's fleet must be stopped; a buffer that evicted a window raises EvictedError."""
    run_dir = pathlib.Path(run_dir)
    config = RunConfig.load(run_dir / "config.json")
    with LocalRedisCluster(appendonly=True, data_dir=run_dir / "redis") as cluster:
        client = cluster.client()
        try:
            storage = TemporalStorage(client, config.run_id, TaskSet.for_run(config).schema(), config.buffer)
            if storage.snapshot().oldest_window != 0:
                raise EvictedError(f"{run_dir}: the buffer evicted windows; the audit needs all of them")
            stored = Counter(row_fingerprint(row) for row in storage.committed_rows())
        finally:
            client.close()
    return audit_batches(acks, stored)
