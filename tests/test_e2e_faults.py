"""Fault injection on the real data and gradient paths, counted from both ends.

Real redis-server nodes, a real ingest service, aggregator, sampler and learner processes
(the `fleetrl` CLI). The sampler, the ingest service and the aggregator are SIGKILLed mid-run
and started again; afterwards an independent reader (this test, straight from Redis and from
the checkpoint files) checks against the processes' ack ledgers (foundation/ledger.py): every
acked batch is stored once, and every acked gradient is applied once or rolled back with the
weights of a crash, never lost otherwise and never applied twice.
"""

from __future__ import annotations

import os
import pathlib
import re
import signal
import subprocess
import time
from collections import Counter

import numpy as np
import pytest
import redis

from buffer.ingest_client import IngestClient
from buffer.layout import RecordLayout
from buffer.storage import TemporalStorage
from fleet.launch.cluster_admin import answers, cluster_ok
from fleet.launch.local_cluster import LocalRedisCluster
from fleet.launch.local_fleet import free_port
from fleet.launch.watchdog import Watchdog
from foundation.checkpoint import load_checkpoint
from foundation.config import RunConfig, WatchdogConfig, with_overrides
from foundation.ledger import read_ledgers
from sampler.pusher import row_fingerprint
from sim.registry import get_task
from tests.conftest import wait_until
from tests.helpers import TASK, role_args, start_role, stop_all

pytestmark = pytest.mark.e2e


def _wait_for_acks(acks: pathlib.Path, more_than: int, timeout_sec: float, procs: dict) -> int:
    def count() -> int:
        n = len(read_ledgers(acks, "sampler-"))
        return n if n > more_than else 0

    return wait_until(count, timeout_sec, f"more than {more_than} acked batches", procs)


def _stored_rows(cluster: LocalRedisCluster, config: RunConfig) -> np.ndarray:
    """Every valid committed record's packed row, read straight from Redis."""
    client = cluster.client()
    storage = TemporalStorage(client, config.run_id, get_task(config.sim.task).schema(), config.buffer)
    assert storage.snapshot().oldest_window == 0, "the test's buffer must not evict"
    rows = storage.committed_rows()
    client.close()
    return rows


def test_sigkill_of_a_sampler_and_of_the_ingest_service_loses_and_doubles_nothing(tmp_path: pathlib.Path) -> None:
    overrides = [f'sim.task="{TASK}"', 'run_id="faults"', "sampler.max_env_steps_per_update=0"]
    config = with_overrides(RunConfig(), [*overrides, "buffer.capacity_transitions=10000000"])
    config_path = tmp_path / "config.json"
    config_path.write_text(config.to_json())
    logs, acks = tmp_path / "logs", tmp_path / "acks"
    logs.mkdir()
    buffer, aggregator = f"127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}"
    with LocalRedisCluster(num_primaries=3) as cluster:
        buffer_args = ("--port", buffer.split(":")[1], "--redis", cluster.addresses)
        sampler_args = ("--buffer", buffer, "--aggregator", aggregator, "--ack-log", str(acks))
        procs = {
            "aggregator": start_role("aggregator", config_path, logs, "--port", aggregator.split(":")[1]),
            "buffer": start_role("buffer", config_path, logs, *buffer_args),
            "sampler": start_role("sampler", config_path, logs, *sampler_args),
        }
        try:
            seen = _wait_for_acks(acks, 5, 120, procs)
            procs["sampler"].send_signal(signal.SIGKILL)  # mid-push, most likely: one batch in flight
            procs["sampler"].wait()
            procs["sampler"] = start_role("sampler", config_path, logs, *sampler_args)  # a new incarnation
            seen = _wait_for_acks(acks, seen + 5, 120, procs)
            procs["buffer"].send_signal(signal.SIGKILL)  # the sampler retries until it is back
            procs["buffer"].wait()
            time.sleep(1.0)
            procs["buffer"] = start_role("buffer", config_path, logs, *buffer_args)
            _wait_for_acks(acks, seen + 5, 120, procs)
            procs["sampler"].send_signal(signal.SIGTERM)  # a clean stop: its last acks are logged
            assert procs["sampler"].wait(30) == 0
            stored = _stored_rows(cluster, config)
            with IngestClient(buffer, sampler_id=0, run_id=config.run_id) as ingest:
                stats = ingest.stats(wait_for_ready=True, timeout_sec=60)  # the restarted service's figures
        finally:
            stop_all(procs)
    ledger = read_ledgers(acks, "sampler-")
    # A batch's first row (step 0 with the episode's own goal) is unique to it: HER's relabeled
    # copies share observations but carry other goals, so count whole batches by it.
    copies = Counter(row_fingerprint(row) for row in stored)
    acked = {(r["incarnation"], r["seq"]): r for r in ledger}
    assert len({r["incarnation"] for r in ledger}) == 2  # two sampler processes, two incarnations
    lost = [key for key, r in acked.items() if copies[r["fingerprint"]] == 0]
    doubled = [key for key, r in acked.items() if copies[r["fingerprint"]] > 1]
    assert not lost, f"acked but not stored: {lost}"
    assert not doubled, f"stored twice: {doubled}"
    acked_rows = sum(r["transitions"] for r in acked.values())
    # Stored beyond the acked: at most the one batch the killed sampler had in flight (stored,
    # never acked, never retried). Transitions per batch: 50 env steps x (1 + her_k).
    per_batch = 50 * (1 + config.sampler.her_k)
    acked_steps = sum(r["env_steps"] for r in acked.values())
    print(  # the figures of the fault table (pytest -s)
        f"\nfaults: acked batches {len(acked)}, acked env steps {acked_steps}, acked transitions {acked_rows}, "
        f"stored transitions {len(stored)}, lost {len(lost)}, doubled {len(doubled)}"
    )
    assert acked_rows <= len(stored) <= acked_rows + per_batch, (acked_rows, len(stored))
    # The service's counters survived its SIGKILL (they are kept in Redis with the data): every
    # batch stored counted once, the acked ones and the killed sampler's push in flight, if stored.
    in_flight = (len(stored) - acked_rows) // per_batch
    print(f"faults: buffer stats after its restart: env steps {stats.env_steps}, batches {stats.batches}")
    assert (stats.batches, stats.env_steps) == (len(acked) + in_flight, acked_steps + 50 * in_flight)
    logs_text = "".join(p.read_text(errors="replace") for p in logs.iterdir())
    assert "Traceback" not in logs_text, logs_text[-3000:]


def test_a_sampler_whose_peers_never_answer_logs_it_and_stops_on_sigterm(tmp_path: pathlib.Path) -> None:
    """Buffer and aggregator addresses that accept connections and never answer (a hung host)."""
    import socket

    config = with_overrides(RunConfig(), [f'sim.task="{TASK}"', "sampler.push_timeout_sec=1.0"])
    config_path = tmp_path / "config.json"
    config_path.write_text(config.to_json())
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(64)  # the kernel completes handshakes; nobody ever reads or writes
        dead = f"127.0.0.1:{silent.getsockname()[1]}"
        proc = start_role("sampler", config_path, tmp_path, "--buffer", dead, "--aggregator", dead)
        log = tmp_path / "sampler.log"
        deadline = time.monotonic() + 120  # a bound against hanging, not a timing check
        while "unreachable" not in log.read_text():
            assert proc.poll() is None, log.read_text()[-2000:]
            assert time.monotonic() < deadline, log.read_text()[-2000:]
            time.sleep(0.25)
        time.sleep(3.0)  # long enough for the push queue to fill: acting now waits on a full queue
        proc.send_signal(signal.SIGTERM)
        try:
            code = proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            raise AssertionError("the sampler ignored SIGTERM while its buffer was unreachable") from None
    assert code == 0, log.read_text()[-2000:]
    text = log.read_text()
    assert f"ingest service {dead} unreachable" in text
    assert "batches dropped unacked" in text


def test_sigkill_of_the_aggregator_applies_every_acked_gradient_once_or_rolls_it_back(tmp_path: pathlib.Path) -> None:
    """Gradients sent against applied across an aggregator crash, counted from both ends.

    The learner's ack ledger says what was acked (and at which version); the final checkpoint
    says how many of this learner's gradients the weights' history holds. A crash rolls the
    weights back to the newest checkpoint C: gradients acked at versions past C are rolled back
    with them (those version numbers are never reused), every other acked gradient is applied
    exactly once. A push in flight at the kill is retried; if C already holds it, the restored
    dedup record answers it as a duplicate instead of applying it again.
    """
    overrides = [f'sim.task="{TASK}"', 'run_id="agg-faults"', "learner.min_replay_transitions=500"]
    overrides += ["aggregator.checkpoint_every_versions=25", "buffer.capacity_transitions=10000000"]
    config = with_overrides(RunConfig(), overrides)
    config_path = tmp_path / "config.json"
    config_path.write_text(config.to_json())
    logs, acks, run_dir = tmp_path / "logs", tmp_path / "acks", tmp_path / "run"
    logs.mkdir()
    with LocalRedisCluster(num_primaries=3) as cluster:
        args = role_args(cluster, acks, run_dir)
        procs = {role: start_role(role, config_path, logs, *a) for role, a in args.items()}
        try:
            wait_until(lambda: _applied(acks) >= 60, 180, "60 applied gradients", procs)
            procs["aggregator"].send_signal(signal.SIGKILL)  # one push in flight, most likely
            procs["aggregator"].wait()
            before = _applied(acks)
            time.sleep(1.0)
            procs["aggregator"] = start_role("aggregator", config_path, logs, *args["aggregator"])
            wait_until(lambda: _applied(acks) >= before + 60, 180, "60 more applied gradients", procs)
            for role in ("sampler", "learner", "aggregator"):  # clean stops: complete ledgers, a final checkpoint
                procs[role].send_signal(signal.SIGTERM)
                assert procs[role].wait(30) == 0, role
            stored = _stored_rows(cluster, config)
        finally:
            stop_all(procs)
    restored = re.findall(
        r"restored checkpoint version (\d+); resuming at version (\d+)", (logs / "aggregator.log").read_text()
    )
    assert len(restored) == 1, restored  # the first start had no checkpoint; the restart had one
    restored_version, resumed_at = (int(v) for v in restored[0])
    pushes = read_ledgers(acks, "learner-")
    assert len({r["incarnation"] for r in pushes}) == 1
    assert len({r["seq"] for r in pushes}) == len(pushes), "a push acked twice"
    applied = [r for r in pushes if r["applied"]]
    life1 = [r for r in applied if r["version"] < resumed_at]
    kept = [r for r in life1 if r["version"] <= restored_version] + [r for r in applied if r["version"] >= resumed_at]
    rolled_back = [r for r in life1 if r["version"] > restored_version]
    final = load_checkpoint(run_dir / "checkpoints")
    in_weights = final["pushes"][f"0:{pushes[0]['incarnation']}"]["applied"]
    print(  # the figures of the fault table (pytest -s)
        f"\naggregator SIGKILL: gradients acked {len(pushes)} (applied {len(applied)}, "
        f"stale {sum(not r['applied'] for r in pushes)}, duplicate answers {sum(r['duplicate'] for r in pushes)}), "
        f"in the final weights' history {in_weights}, rolled back with the crash {len(rolled_back)} "
        f"(checkpoint {restored_version}, resumed at {resumed_at})"
    )
    assert in_weights == len(kept), (in_weights, len(kept))  # none lost, none applied twice
    # The samplers' side of the same fault: every acked batch stored, once.
    batches = read_ledgers(acks, "sampler-")
    copies = Counter(row_fingerprint(row) for row in stored)
    assert all(copies[r["fingerprint"]] == 1 for r in batches)
    assert sum(r["transitions"] for r in batches) == len(stored)  # a clean stop: nothing in flight
    logs_text = "".join(p.read_text(errors="replace") for p in logs.iterdir())
    assert "Traceback" not in logs_text, logs_text[-3000:]


def _applied(acks: pathlib.Path) -> int:
    return sum(r["applied"] for r in read_ledgers(acks, "learner-"))


def test_sigkill_of_a_redis_primary_with_a_replica_loses_no_acked_transition(tmp_path: pathlib.Path) -> None:
    """A 3-primary cluster with one replica each; the ingest acks a batch only once a replica
    holds it (buffer.replicas_to_ack=1). A primary is SIGKILLed mid-run: its replica takes over,
    samplers and learners go on, and every acked batch is still stored, once. The nodes are
    supervised as `fleetrl train` supervises them: the killed node comes back as a replica."""
    overrides = [f'sim.task="{TASK}"', 'run_id="redis-faults"', "learner.min_replay_transitions=500"]
    # Small windows: the batches' windows spread over every primary, the killed one included.
    overrides += [
        "buffer.replicas_to_ack=1",
        "buffer.capacity_transitions=10000000",
        "buffer.window_size_transitions=256",
    ]
    config = with_overrides(RunConfig(), overrides)
    config_path = tmp_path / "config.json"
    config_path.write_text(config.to_json())
    logs, acks = tmp_path / "logs", tmp_path / "acks"
    logs.mkdir()
    with (
        LocalRedisCluster(num_primaries=3, replicas=1, node_timeout_ms=2000) as cluster,
        Watchdog(tmp_path / "redis-logs") as dog,
    ):
        cluster.supervise(dog, WatchdogConfig())
        procs = {role: start_role(role, config_path, logs, *a) for role, a in role_args(cluster, acks).items()}
        try:
            wait_until(lambda: len(read_ledgers(acks, "sampler-")) >= 10 and _applied(acks) >= 20, 180, "a warm fleet",
                      procs)  # fmt: skip
            batches, applied = len(read_ledgers(acks, "sampler-")), _applied(acks)
            host, port = _primary_of(cluster, config)
            os.kill(dog.pids()[f"redis-{port}"], signal.SIGKILL)  # its replica is promoted
            wait_until(lambda: len(read_ledgers(acks, "sampler-")) >= batches + 10, 180, "acks after the failover",
                      procs)  # fmt: skip
            wait_until(lambda: _applied(acks) >= applied + 50, 180, "training after the failover", procs)
            wait_until(lambda: dog.poll() is not None and _role_of(host, port, cluster) == "slave", 120,
                      "the killed primary back as a replica", procs)  # fmt: skip
            assert cluster_ok(cluster.nodes, cluster.auth)
            procs["sampler"].send_signal(signal.SIGTERM)
            assert procs["sampler"].wait(30) == 0
            stored = _stored_rows(cluster, config)
        finally:
            stop_all(procs)
    ledger = read_ledgers(acks, "sampler-")
    copies = Counter(row_fingerprint(row) for row in stored)
    lost = [r["seq"] for r in ledger if copies[r["fingerprint"]] == 0]
    doubled = [r["seq"] for r in ledger if copies[r["fingerprint"]] > 1]
    acked_rows = sum(r["transitions"] for r in ledger)
    print(  # the figures of the fault table (pytest -s)
        f"\nredis primary SIGKILL: acked batches {len(ledger)}, acked transitions {acked_rows}, "
        f"stored transitions {len(stored)}, lost {len(lost)}, doubled {len(doubled)}"
    )
    assert not lost and not doubled, (lost, doubled)
    # Beyond the acked: at most the batches in flight at the sampler's stop (stored, their ack
    # not awaited); its log says how many it dropped unacked.
    dropped = int(re.search(r"(\d+) batches dropped unacked", (logs / "sampler.log").read_text()).group(1))
    assert acked_rows <= len(stored) <= acked_rows + dropped * 50 * (1 + config.sampler.her_k)


def _primary_of(cluster: LocalRedisCluster, config: RunConfig) -> tuple[str, int]:
    """The primary holding the run's committed head: every push writes there."""
    client = cluster.client()
    layout = RecordLayout(config.run_id, get_task(config.sim.task).schema(), config.buffer)
    node = client.get_node_from_key(layout.committed_key)
    client.close()
    return node.host, node.port


def _role_of(host: str, port: int, cluster: LocalRedisCluster) -> str | None:
    """The node's replication role ("master", "slave"), or None while it does not answer."""
    if not answers(host, port, cluster.auth):
        return None
    conn = redis.Redis(host=host, port=port)
    try:
        role = conn.execute_command("ROLE")[0]
    finally:
        conn.close()
    return role.decode() if isinstance(role, bytes) else role
