"""What a fleet host keeps from one start to the next, and takes up again: its Redis nodes' data.

    nodes = host_nodes(spec, host, config, security)   # unformed; with buffer.durable in its redis_dir
    abandon_earlier_writes(spec.redis, security, config) # the buffer's host, before its ingest starts

With buffer.durable a host's Redis nodes keep their append-only files and nodes.conf in the
host's `redis_dir` (default <run_dir>/redis/<host>): a fleet restarted on the same spec, a Slurm
job requeued onto other nodes, starts them on their data, and the host that forms the cluster
meets them again where they are now (fleet/launch/cluster_admin.py form_cluster).
"""

from __future__ import annotations

import pathlib
from contextlib import closing

from fleet.launch.local_cluster import LocalRedisCluster
from fleet.launch.spec_model import FleetSpec, HostSpec
from foundation.config import RunConfig
from foundation.transport import Security, connect

NODE_START_SEC = 120.0  # a node loads its append-only file before it answers: a large buffer's takes a while


def host_nodes(spec: FleetSpec, host: HostSpec, config: RunConfig, security: Security) -> LocalRedisCluster:
    """`host`'s Redis nodes on its address and spec ports, unformed (the first Redis host forms
    the fleet's cluster); with buffer.durable persisted in the host's redis_dir."""
    durable = config.buffer.durable
    return LocalRedisCluster(
        len(host.redis),
        host=host.address,
        ports=list(host.redis),
        auth=security,
        form=False,
        appendonly=durable,
        data_dir=pathlib.Path(spec.redis_dir(host)) if durable else None,
        startup_timeout_sec=NODE_START_SEC,
    )


def abandon_earlier_writes(redis_addresses: str, security: Security, config: RunConfig) -> int:
    """A kept buffer, before its ingest service starts: no writer of an earlier start lives, so
    the ranges they reserved and never wrote never will be; readers skip them now, not
    buffer.stalled_write_timeout_sec after they were reserved. Safe only while the run's one
    writer, the ingest service, is not running. Returns the committed head."""
    from buffer.storage import TemporalStorage
    from sim.tasks import TaskSet

    with closing(connect(redis_addresses, security)) as client:
        storage = TemporalStorage(client, config.run_id, TaskSet.for_run(config).schema(), config.buffer)
        return storage.advance(abandon=True)
