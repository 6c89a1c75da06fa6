"""Prometheus metrics of one role process (prometheus-client), on a port of its own.

    metrics = RoleMetrics("sampler-0", "127.0.0.1:9101")   # serves /metrics on that address
    metrics.update(phase_sec={"rollout": 12.5}, counters={"env_steps": 5000})  # from the heartbeat

Exported, all labelled with `role`:
    fleetrl_phase_seconds{phase}   seconds spent per heartbeat phase (rollout, gradients, ...)
    fleetrl_counter{name}          the role's heartbeat counters (env_steps, pushed, version, ...)
    fleetrl_resident_bytes         resident set size
    fleetrl_locked_bytes           memory pinned by mlockall (resident and locked)

The local launcher gives every role a port and lists them in <run>/metrics.json, so a
Prometheus scrape config can be written from it.
"""

from __future__ import annotations

import time

import psutil
from prometheus_client import CollectorRegistry, Gauge, start_http_server

from foundation.process import locked_kib
from foundation.transport import parse_hostport

# Locked memory comes from /proc/self/smaps_rollup, which the kernel answers by walking every
# mapping: 4% of the aggregator's CPU when read every second (py-spy, a FetchPush run). It
# changes only when a sampler pins its memory, so it is read every 10 s.
LOCKED_EVERY_SEC = 10.0


class RoleMetrics:
    def __init__(self, role: str, listen: str) -> None:
        host, port = parse_hostport(listen, "--metrics")
        self.role = role
        self.registry = CollectorRegistry()
        self._phase = Gauge("fleetrl_phase_seconds", "seconds per phase", ["role", "phase"], registry=self.registry)
        self._counter = Gauge("fleetrl_counter", "role counters", ["role", "name"], registry=self.registry)
        self._rss = Gauge("fleetrl_resident_bytes", "resident set size", ["role"], registry=self.registry)
        self._locked = Gauge("fleetrl_locked_bytes", "memory pinned by mlockall", ["role"], registry=self.registry)
        self.server, self._thread = start_http_server(port, addr=host, registry=self.registry)
        self.port = self.server.server_port
        self._process = psutil.Process()
        self._locked_at = -LOCKED_EVERY_SEC

    def update(self, phase_sec: dict[str, float] | None = None, counters: dict[str, float] | None = None) -> None:
        for phase, seconds in (phase_sec or {}).items():
            self._phase.labels(self.role, phase).set(seconds)
        for name, value in (counters or {}).items():
            self._counter.labels(self.role, name).set(float(value))
        self._rss.labels(self.role).set(self._process.memory_info().rss)
        now = time.monotonic()
        if now - self._locked_at >= LOCKED_EVERY_SEC:  # the kernel walks every mapping to answer
            self._locked_at = now
            self._locked.labels(self.role).set(1024 * locked_kib())

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
