"""The soak's network faults for real: a sampler host in a network namespace (fleet/chaos/netns.py),
its link cut from either end and slowed, first alone, then under a FetchReach fleet.

benchmarks/chaos_soak.py --hosts netns as a user runs it: the samplers run in their own
namespace, joined to the buffer and aggregator by a veth pair; a partition of the sampler host, a
partition of the services' host and a slow link (netem, or tbf on a kernel without netem) come
one after another, each undone 2-3 s later; the run ends once the samplers ack again after the
last, and the auditor finds every acked batch in Redis once, no gradient applied twice and no
version reused. Needs root and iproute2; skipped with the reason otherwise.
"""

from __future__ import annotations

import json
import os
import pathlib
import socket
import subprocess
import sys

import pytest

from fleet.chaos.netns import SamplerHost, Shaping, shaping_unavailable, unavailable

pytestmark = pytest.mark.e2e
REPO = pathlib.Path(__file__).resolve().parents[1]


@pytest.fixture
def net():
    reason = unavailable()
    if reason is not None:
        pytest.skip(reason)
    with SamplerHost.create(f"{(os.getpid() + 1) % 4096:03x}") as made:
        yield made
    names = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    links = subprocess.run(["ip", "-br", "link"], capture_output=True, text=True).stdout
    assert made.namespace not in names.split() and made.links["services"] not in links, "left behind"


def _reaches(net: SamplerHost, port: int) -> bool:
    """A TCP connection from the sampler host to the services' address succeeds within 1 s."""
    probe = f"import socket; socket.create_connection(({net.addresses['services']!r}, {port}), timeout=1.0)"
    done = subprocess.run([*net.exec_prefix, sys.executable, "-c", probe], capture_output=True, timeout=30)
    return done.returncode == 0


def _qdiscs(net: SamplerHost) -> list[str]:
    """The root qdisc kind on each end: services' end, then the sampler host's."""
    here = subprocess.run(["tc", "qdisc", "show", "dev", net.links["services"]], capture_output=True, text=True)
    there = subprocess.run(["tc", "-n", net.namespace, "qdisc", "show", "dev", net.links["sampler"]],
                           capture_output=True, text=True)  # fmt: skip
    return [out.stdout.split()[1] if out.stdout else "" for out in (here, there)]


def test_a_partition_from_either_end_cuts_the_link_and_a_slow_link_shapes_both_ends(net):
    with socket.create_server((net.addresses["services"], 0)) as server:
        port = server.getsockname()[1]
        assert _reaches(net, port)
        for side in ("sampler", "services"):
            net.set_link(side, up=False)
            assert not _reaches(net, port), f"the link passed traffic with the {side} end down"
            net.set_link(side, up=True)
            assert _reaches(net, port), f"the link did not come back after the {side} end went up"
    usable = [q for q, why in shaping_unavailable().items() if why is None]
    for qdisc in usable:
        net.shape(Shaping(qdisc, delay_ms=80, loss_pct=2.0, rate_kbit=512))
        assert _qdiscs(net) == [qdisc, qdisc]
        net.unshape()
        assert qdisc not in _qdiscs(net)
    print(f"\nshaped with {usable}; not here: {[f'{q}: {w}' for q, w in shaping_unavailable().items() if w]}")


def test_netem_delays_the_link_where_the_kernel_has_it(net):
    reason = shaping_unavailable()["netem"]
    if reason is not None:
        pytest.skip(reason)
    net.shape(Shaping("netem", delay_ms=100, loss_pct=1.0))
    shown = subprocess.run(["tc", "qdisc", "show", "dev", net.links["services"]], capture_output=True, text=True)
    assert "delay 100ms" in shown.stdout and "loss 1%" in shown.stdout, shown.stdout


def test_a_soak_over_two_hosts_rides_out_partitions_and_a_slow_link_and_loses_nothing(tmp_path):
    reason = unavailable()
    if reason is not None:
        pytest.skip(reason)
    slow = any(why is None for why in shaping_unavailable().values())
    plan = ["PARTITION sampler-host", "PARTITION services-host", *(["SLOW link"] if slow else [])]
    out = tmp_path / "soak.json"
    # Each fault lasts 2-3 s, one every 6 s; the run ends once the samplers ack again after the
    # last (the cap is a bound against hanging); one score at the start, none after.
    argv = [sys.executable, "benchmarks/chaos_soak.py", "--task", "FetchReach-v4", "--hosts", "netns", "--every", "6",
            "--first", "4", "--net-fault-sec", "2,3", "--plan", ",".join(plan), "--max-wall-sec", "300",
            "--target-success", "1.0", "--run-dir", str(tmp_path / "run"), "--out", str(out),
            "--set", "eval.final_episodes=0", "--set", "eval.min_interval_sec=3600",
            "--set", "eval.max_interval_sec=3600"]  # fmt: skip
    done = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=600)
    assert out.exists(), done.stdout[-3000:] + done.stderr[-3000:]
    figures = json.loads(out.read_text())["figures"]
    faults = {f["fault"]: f for f in figures["faults"]}
    assert list(faults) == plan, (figures["skipped_faults"], done.stdout[-3000:])
    assert figures["summary"]["stop_reason"] == f"fault plan done: {len(plan)} faults, every one recovered"
    for fault in faults.values():  # undone on time, and the samplers acked again after
        assert fault["pid"] is None and 2.0 <= fault["detail"]["for_sec"] <= 3.0, fault
        assert fault["cont_sec"] - fault["at_sec"] >= fault["detail"]["for_sec"] - 0.01, fault
        assert fault["recovered_sec"] > fault["detail"]["for_sec"], fault
    batches, gradients = figures["batches"], figures["gradients"]
    per_batch = batches["acked_env_steps"] / batches["acked_batches"]
    for cut in ("PARTITION sampler-host", "PARTITION services-host"):  # nothing through a cut link but
        assert faults[cut]["detail"]["acked_env_steps_during"] <= 2 * per_batch, faults[cut]  # an ack on the wire
    if slow:
        assert faults["SLOW link"]["detail"]["qdisc"] in ("netem", "tbf")
    assert batches["acked_batches"] > 0 and gradients["acked"] > 0
    assert figures["evicted_windows"] == 0
    assert (batches["lost"], batches["doubled"], batches["acked_twice"]) == (0, 0, 0), batches
    assert (gradients["applied_twice"], gradients["versions_reused"]) == (0, 0), gradients
    assert figures["errors"] == []
    assert done.returncode == 0, done.stdout[-3000:]
    print(f"\n{[(f['fault'], f['detail'], f['recovered_sec']) for f in figures['faults']]}; "
          f"not injected: {figures['not_available']}")  # fmt: skip
