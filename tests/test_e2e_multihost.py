"""One fleet over five network namespaces, each its own host with its own address, started
from one fleet spec (`fleetrl fleet up spec.yaml --host NAME` in every namespace).

    redis-a  10.231.N.1   Redis nodes 7000, 7001 (and forms the cluster)
    redis-b  10.231.N.2   Redis node 7002
    services 10.231.N.3   buffer, aggregator
    learners 10.231.N.4   learner, evaluator
    samplers 10.231.N.5   2 samplers, a second learner (learners on two hosts, one aggregator)

The namespaces hang off one bridge (a switch) by veth pairs; the test itself sits on the
bridge at 10.231.N.254 and reads Redis and the run directory as an auditor. It checks that
the fleet learns FetchReach to 90% over the namespaces, then takes the sampler host's link
down: the samplers say their ingest service is unreachable, the other host's learner keeps
training on what the buffer holds (no step waits for the learner cut off with the samplers),
and once the link is back the samplers' acked env steps rise again.
Needs root and iproute2 (`ip netns`); skipped with the reason otherwise.
"""

from __future__ import annotations

import json
import os
import pathlib
import secrets
import signal
import subprocess
import sys
import time

import pytest
import yaml

from fleet.chaos.netns import unavailable as namespaces_unavailable
from foundation.ledger import read_ledgers
from tests.conftest import wait_until

pytestmark = pytest.mark.e2e

HOSTS = ("redis-a", "redis-b", "services", "learners", "samplers")


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, text=True)


RESERVED_PORTS = "7000-7999,17000-17999,50000-50999"  # what the tests' specs serve on, per namespace


class Network:
    """A bridge in this namespace and one namespace per host, each linked to it by a veth pair."""

    def __init__(self, tag: str, hosts: tuple[str, ...]) -> None:
        self.tag = tag
        self.subnet = f"10.231.{int(tag, 16) % 250}"
        self.bridge = f"flbr{tag}"
        self.namespaces = {host: f"fl{tag}-{host}" for host in hosts}
        self.links = {host: f"fl{tag}h{i}" for i, host in enumerate(hosts)}  # our end of each veth
        self.addresses = {host: f"{self.subnet}.{i + 1}" for i, host in enumerate(hosts)}

    def __enter__(self) -> Network:
        try:
            _ip("link", "add", self.bridge, "type", "bridge")
            _ip("addr", "add", f"{self.subnet}.254/24", "dev", self.bridge)
            _ip("link", "set", self.bridge, "up")
            for host, ns in self.namespaces.items():
                _ip("netns", "add", ns)
                inside = f"fl{self.tag}n"
                _ip("link", "add", self.links[host], "type", "veth", "peer", "name", inside, "netns", ns)
                _ip("link", "set", self.links[host], "master", self.bridge, "up")
                _ip("-n", ns, "addr", "add", f"{self.addresses[host]}/24", "dev", inside)
                _ip("-n", ns, "link", "set", inside, "up")
                _ip("-n", ns, "link", "set", "lo", "up")
                # The specs' fixed ports (Redis 7000s and their buses, buffer and aggregator 50051
                # and 50052) lie in Linux's ephemeral range (32768-60999): an outgoing connection
                # (a Redis bus link, a client) could take one as its local port and hold it, and the
                # role that serves there would fail to bind. Reserved ports are never handed out.
                _ip("netns", "exec", ns, "sysctl", "-qw", f"net.ipv4.ip_local_reserved_ports={RESERVED_PORTS}")
        except BaseException:
            self.__exit__()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        for ns in self.namespaces.values():
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)
        for link in self.links.values():
            subprocess.run(["ip", "link", "del", link], capture_output=True)
        subprocess.run(["ip", "link", "del", self.bridge], capture_output=True)

    def link(self, host: str, up: bool) -> None:
        _ip("link", "set", self.links[host], "up" if up else "down")


def _spec(net: Network, run_dir: pathlib.Path) -> dict:
    a = net.addresses
    return {
        "run_id": "netns",
        "run_dir": str(run_dir),
        "config": {"sim.task": "FetchReach-v4", "learner.min_replay_transitions": 500, "sampler.push_timeout_sec": 2.0},
        "hosts": {
            "redis-a": {"address": a["redis-a"], "redis": [7000, 7001]},
            "redis-b": {"address": a["redis-b"], "redis": [7002]},
            "services": {"address": a["services"], "buffer": 50051, "aggregator": 50052},
            "learners": {"address": a["learners"], "learner": 1, "evaluator": 1},
            "samplers": {"address": a["samplers"], "sampler": 2, "learner": 1},
        },
    }


def _full_scores(run_dir: pathlib.Path) -> list[dict]:
    path = run_dir / "evals.jsonl"
    if not path.exists():
        return []
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return [r for r in rows if r.get("kind") == "full"]


def _last_version(run_dir: pathlib.Path) -> int:
    path = run_dir / "evals.jsonl"
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []
    return max((r["version"] for r in rows), default=-1)


def _acked_steps(run_dir: pathlib.Path) -> int:
    return sum(r["env_steps"] for r in read_ledgers(run_dir / "samplers" / "acks", "sampler-"))


def _wait(condition, timeout_sec: float, what: str, procs: dict, run_dir: pathlib.Path) -> None:
    """wait_until, with each host's log tail in the message of a failure."""

    def hosts_up_and() -> bool:
        for host, proc in procs.items():
            assert proc.poll() is None, f"fleet up --host {host} exited {proc.returncode}:\n{_tail(run_dir, host)}"
        return condition()

    def tails() -> str:
        return f"{what}:\n" + "".join(_tail(run_dir, h) for h in procs)

    wait_until(hosts_up_and, timeout_sec, tails, interval_sec=0.5)


def _tail(run_dir: pathlib.Path, host: str) -> str:
    path = run_dir.parent / f"fleet-{host}.log"
    return f"--- {host}:\n" + (path.read_text(errors="replace")[-1500:] if path.exists() else "(no log)\n")


def test_one_spec_runs_a_fleet_over_five_namespaces_and_rides_out_a_link_failure(tmp_path: pathlib.Path) -> None:
    reason = namespaces_unavailable()
    if reason is not None:
        pytest.skip(reason)
    run_dir = tmp_path / "run"
    secrets_env = {"FLEETRL_TOKEN": secrets.token_urlsafe(16), "FLEETRL_REDIS_PASSWORD": secrets.token_urlsafe(16)}
    env = {**os.environ, **secrets_env}  # the same on every host, as an operator exports them
    with Network(f"{os.getpid() % 4096:03x}", HOSTS) as net:
        spec_path = tmp_path / "fleet.yaml"
        spec_path.write_text(yaml.safe_dump(_spec(net, run_dir)))
        procs: dict[str, subprocess.Popen] = {}
        try:
            for host in HOSTS:
                with open(tmp_path / f"fleet-{host}.log", "wb") as log:
                    procs[host] = subprocess.Popen(
                        ["ip", "netns", "exec", net.namespaces[host], sys.executable, "-m", "fleet.cli.main", "fleet",
                         "up", str(spec_path), "--host", host, "--until-signal"],  # on past the target: the link test
                        stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True,
                    )  # fmt: skip
            _wait(lambda: any(s["success_rate"] >= 0.9 for s in _full_scores(run_dir)), 400, "90% on FetchReach",
                  procs, run_dir)  # fmt: skip
            reached = next(s for s in _full_scores(run_dir) if s["success_rate"] >= 0.9)
            print(f"\nFetchReach over 5 namespaces: {reached['success_rate']:.2f} over {reached['episodes']} episodes "
                  f"at version {reached['version']}, {reached['env_steps']} env steps")  # fmt: skip
            # The sampler host drops off the network; the learners go on training on the buffer.
            acked, version = _acked_steps(run_dir), _last_version(run_dir)
            net.link("samplers", up=False)
            sampler_logs = run_dir / "samplers" / "logs"
            _wait(lambda: "unreachable" in "".join(p.read_text() for p in sampler_logs.glob("sampler-*.log")), 120,
                  "sampler saying its ingest service is unreachable", procs, run_dir)  # fmt: skip
            _wait(lambda: _last_version(run_dir) > version, 120, "a new version while the samplers are cut off",
                  procs, run_dir)  # fmt: skip
            during = _acked_steps(run_dir)
            time.sleep(5.0)
            assert _acked_steps(run_dir) == during, "acks arrived over a link that is down"
            net.link("samplers", up=True)
            _wait(lambda: _acked_steps(run_dir) > max(acked, during) + 500, 180, "acked env steps rising again",
                  procs, run_dir)  # fmt: skip
        finally:
            for proc in procs.values():
                if proc.poll() is None:
                    os.killpg(proc.pid, signal.SIGTERM)
            for proc in procs.values():
                try:
                    proc.wait(60)
                except subprocess.TimeoutExpired:
                    os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait()
    roles = {h: sorted(p.stem for p in (run_dir / h / "logs").glob("*.log")) for h in HOSTS if h != "redis-a"}
    assert roles["services"] == ["aggregator", "buffer"]
    assert roles["learners"] == ["evaluator-0", "learner-0"]
    assert roles["samplers"] == ["learner-1", "sampler-0", "sampler-1"]
    for host, learner in (("learners", "learner-0"), ("samplers", "learner-1")):  # both learners' gradients went in
        beat = json.loads((run_dir / host / "heartbeats" / f"{learner}.json").read_text())
        assert beat["counters"]["pushed"] > 0, (host, beat)
    for host, proc in procs.items():
        assert proc.returncode == 0, _tail(run_dir, host)
