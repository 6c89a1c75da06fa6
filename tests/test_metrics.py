"""Prometheus metrics of a role: served over HTTP, fed by its heartbeat."""

from __future__ import annotations

import urllib.request

from foundation import process
from foundation.metrics import RoleMetrics


def test_a_role_serves_its_heartbeat_phases_counters_and_memory(tmp_path):
    metrics = RoleMetrics("sampler-3", "127.0.0.1:0")
    try:
        process.use_metrics(metrics)
        beat = process.Heartbeat(tmp_path / "beat.json", interval_sec=0.0)
        with beat.phase("rollout"):
            pass
        beat.beat(env_steps=1234, version=7)
        process.Heartbeat(None, interval_sec=0.0).beat(queue_depth=3)  # a heartbeat without a file
        text = urllib.request.urlopen(f"http://127.0.0.1:{metrics.port}/metrics", timeout=5).read().decode()
    finally:
        process.use_metrics(None)
        metrics.close()
    assert 'fleetrl_counter{name="env_steps",role="sampler-3"} 1234.0' in text
    assert 'fleetrl_counter{name="queue_depth",role="sampler-3"} 3.0' in text
    assert 'fleetrl_phase_seconds{phase="rollout",role="sampler-3"}' in text
    assert 'fleetrl_resident_bytes{role="sampler-3"}' in text and "fleetrl_locked_bytes" in text
    assert (tmp_path / "beat.json").exists()  # the heartbeat file is still written
