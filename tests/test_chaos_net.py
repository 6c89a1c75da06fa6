"""Network faults (fleet/chaos/network.py) and the injector's handling of them, with a fake link:
what is drawn, which end goes down, when it comes back, and when the samplers count as recovered."""

from __future__ import annotations

import json
import random
import time
from typing import Any, cast

import pytest

from fleet.chaos.faults import Fault, Injector
from fleet.chaos.netns import NetnsError, SamplerHost, Shaping
from fleet.chaos.network import (
    PARTITION,
    SAMPLER_HOST,
    SERVICES_HOST,
    SLOW,
    LinkFaults,
    NetFaultRanges,
    draw,
)
from fleet.launch.watchdog import Watchdog
from tests.test_chaos import FakeDog, beat

ALL = {"netem": None, "tbf": None}
NO_NETEM = {"netem": "no netem qdisc", "tbf": None}


class FakeLink:
    def __init__(self) -> None:
        self.calls: list[tuple] = []

    def set_link(self, side: str, up: bool) -> None:
        self.calls.append(("link", side, up))

    def shape(self, shaping: Shaping) -> None:
        self.calls.append(("shape", shaping.qdisc))

    def unshape(self) -> None:
        self.calls.append(("unshape",))


def test_each_draw_stays_in_its_ranges_and_follows_the_seed():
    ranges = NetFaultRanges(down_sec=(5, 20), slow_sec=(2, 3), delay_ms=(50, 200), loss_pct=(1, 10))
    rng = random.Random(0)
    for _ in range(200):
        down = draw(PARTITION, SAMPLER_HOST, rng, ranges)
        assert 5 <= down.for_sec <= 20 and down.shaping is None
        slow = draw(SLOW, "link", rng, ranges)
        assert slow.shaping is not None and 2 <= slow.for_sec <= 3
        assert 50 <= slow.shaping.delay_ms <= 200 and 1 <= slow.shaping.loss_pct <= 10
    capped = draw(SLOW, "link", rng, NetFaultRanges(rate_kbit=(256, 512)), qdisc="tbf")
    assert capped.shaping is not None and 256 <= capped.shaping.rate_kbit <= 512
    assert capped.detail().keys() == {"for_sec", "qdisc", "rate_kbit"}

    def picks(seed: int) -> list:
        rng = random.Random(seed)
        return [draw(SLOW, "link", rng, ranges) for _ in range(5)]

    assert picks(1) == picks(1) != picks(2)


@pytest.mark.parametrize(
    "kwargs,field",
    [
        ({"down_sec": (20.0, 5.0)}, "down_sec"),  # low above high
        ({"slow_sec": (-1.0, 5.0)}, "slow_sec"),
        ({"loss_pct": (5.0, 1.0)}, "loss_pct"),
        ({"rate_kbit": (-1, 10)}, "rate_kbit"),
    ],
)
def test_a_range_that_cannot_be_drawn_from_is_refused(kwargs, field):
    with pytest.raises(ValueError, match=field):
        NetFaultRanges(**kwargs)


@pytest.mark.parametrize(
    "kwargs,message",
    [({"qdisc": "red"}, "qdisc"), ({"qdisc": "tbf", "rate_kbit": 0}, "rate_kbit")],
)
def test_a_shaping_the_kernel_would_refuse_is_refused_first(kwargs, message):
    with pytest.raises(ValueError, match=message):
        Shaping(**kwargs)


def test_a_shaping_writes_the_qdisc_arguments_tc_takes():
    assert Shaping("netem", delay_ms=120, loss_pct=2.5).qdisc_args() == ["netem", "delay", "120ms", "loss", "2.5%"]
    assert Shaping("tbf", rate_kbit=512).qdisc_args()[:3] == ["tbf", "rate", "512kbit"]


def test_a_partition_takes_down_its_own_end_and_a_slow_link_shapes_both():
    link = FakeLink()
    faults = LinkFaults(link, ALL)
    assert faults.menu == [(PARTITION, SAMPLER_HOST), (PARTITION, SERVICES_HOST), (SLOW, "link")]
    assert faults.unavailable == {} and faults.slow_qdisc == "netem"
    rng, ranges = random.Random(0), NetFaultRanges()
    for target, side in ((SAMPLER_HOST, "sampler"), (SERVICES_HOST, "services")):
        faults.apply(faults.draw(PARTITION, target, rng, ranges))
        with pytest.raises(RuntimeError, match="one network fault at a time"):
            faults.apply(faults.draw(SLOW, "link", rng, ranges))
        faults.undo()
        assert link.calls[-2:] == [("link", side, False), ("link", side, True)]
    faults.apply(faults.draw(SLOW, "link", rng, ranges))
    faults.undo()
    faults.undo()  # nothing in effect: nothing to do
    assert link.calls[-2:] == [("shape", "netem"), ("unshape",)]


def test_without_netem_the_slow_link_is_a_rate_cap_and_says_so_and_without_tbf_it_is_off_the_menu():
    faults = LinkFaults(FakeLink(), NO_NETEM)
    assert faults.slow_qdisc == "tbf" and (SLOW, "link") in faults.menu
    [(fault, why)] = faults.unavailable.items()
    assert "netem" in fault and why.startswith("no netem qdisc") and "tbf rate cap instead" in why
    assert faults.draw(SLOW, "link", random.Random(0), NetFaultRanges()).detail()["qdisc"] == "tbf"
    neither = LinkFaults(FakeLink(), {"netem": "no netem", "tbf": "no tbf"})
    assert (SLOW, "link") not in neither.menu and len(neither.menu) == 2
    assert neither.unavailable["SLOW link"] == "tbf: no tbf"


def test_the_sampler_host_names_fit_an_interface_and_a_bad_tag_is_refused():
    net = SamplerHost("fff")
    assert all(len(name) <= 15 for name in net.links.values())
    assert net.exec_prefix == ("ip", "netns", "exec", "flfff")
    with pytest.raises(ValueError, match="tag"):
        SamplerHost("abcd")


def test_the_injector_restores_the_link_on_time_and_times_recovery_from_the_samplers_after(tmp_path):
    (tmp_path / "heartbeats").mkdir()

    def write(role: str, t: float, **counters: Any) -> None:
        pid = 104 if role == "sampler-0" else 105
        (tmp_path / "heartbeats" / f"{role}.json").write_text(json.dumps(beat(pid, t, **counters)))

    link = FakeLink()
    dog = cast(Watchdog, FakeDog())
    ranges = NetFaultRanges(down_sec=(0.2, 0.2))
    injector = Injector(tmp_path, every_sec=3600, seed=0, links=LinkFaults(link, ALL), net_ranges=ranges)
    for role in ("sampler-0", "sampler-1"):
        write(role, time.time(), acked_env_steps=100)
    record = injector.inject(dog, None, Fault(PARTITION, SAMPLER_HOST))  # type: ignore[arg-type]
    assert record is not None and record.pid is None and link.calls == [("link", "sampler", False)]
    assert injector.inject(dog, None, Fault(SLOW, "link")) is None  # type: ignore[arg-type]  # one at a time
    injector.tick(dog, None)  # type: ignore[arg-type]
    assert len(link.calls) == 1 and record.cont_sec is None  # still down
    write("sampler-0", time.time(), acked_env_steps=150)  # a heartbeat during the cut: it says nothing
    time.sleep(0.25)
    injector.tick(dog, None)  # type: ignore[arg-type]
    assert link.calls[-1] == ("link", "sampler", True) and record.cont_sec is not None
    assert record.detail["for_sec"] == 0.2
    assert record.detail["undone_time"] - record.detail["at_time"] >= 0.2  # the ledgers' window, epoch
    write("sampler-0", time.time() + 0.01, acked_env_steps=150)  # after the link is back, not moved yet
    write("sampler-1", time.time() + 0.01, acked_env_steps=120)
    injector.tick(dog, None)  # type: ignore[arg-type]
    assert record.recovered_sec is None  # sampler-0 has not acked since the link came back
    write("sampler-0", time.time() + 0.01, acked_env_steps=200)
    injector.tick(dog, None)  # type: ignore[arg-type]
    assert record.recovered_sec is not None and record.recovered_sec >= 0.2


def test_network_faults_join_the_random_menu_one_at_a_time_and_stopping_restores_the_link(tmp_path):
    link = FakeLink()
    dog = cast(Watchdog, FakeDog())
    minute = NetFaultRanges(down_sec=(60, 60), slow_sec=(60, 60))
    injector = Injector(tmp_path, every_sec=1e-9, first_sec=0.0, seed=0, kill=lambda pid, sig: None,
                        links=LinkFaults(link, ALL), net_ranges=minute)  # fmt: skip
    for _ in range(60):  # a fault every tick; a network fault lasts a minute: only one is ever made
        injector.tick(dog, None)  # type: ignore[arg-type]
    network = [r for r in injector.records if r.pid is None]
    assert len(network) == 1 and len(injector.records) == 60
    injector.stopping(dog, None)  # type: ignore[arg-type]
    assert link.calls[-1] in (("link", "sampler", True), ("link", "services", True), ("unshape",))
    assert network[0].cont_sec is not None


def test_a_fault_the_kernel_refuses_is_reported_and_the_soak_goes_on(tmp_path):
    class RefusingLink(FakeLink):
        def shape(self, shaping: Shaping) -> None:
            raise NetnsError("`tc qdisc replace ...` failed: Operation not permitted")

    dog = cast(Watchdog, FakeDog())
    injector = Injector(tmp_path, every_sec=3600, seed=0, links=LinkFaults(RefusingLink(), ALL))
    assert injector.inject(dog, None, Fault(SLOW, "link")) is None  # type: ignore[arg-type]
    assert injector.records == [] and "Operation not permitted" in injector.errors[0]
    assert link_calls(injector) == [("unshape",)]  # an end that took it gives it back
    assert injector.inject(dog, None, Fault(PARTITION, SAMPLER_HOST)) is not None  # type: ignore[arg-type]


def link_calls(injector: Injector) -> list[tuple]:
    assert injector.links is not None
    return cast(FakeLink, injector.links.link).calls
