"""Network faults on the link between the services' host and the sampler host (fleet/chaos/netns.py).

    faults = LinkFaults(net, shaping_unavailable())
    fault = faults.draw(PARTITION, SAMPLER_HOST, rng, NetFaultRanges())   # how long, how slow: seeded
    faults.apply(fault)        # the link goes down (or slow) ...
    faults.undo()              # ... and back, `fault.for_sec` later (fleet/chaos/faults.py times it)

The faults, one in effect at a time:
    PARTITION sampler-host   the sampler host's end of the link down for 5-20 s
    PARTITION services-host  the services' host's end down for 5-20 s (the samplers lose the
                             buffer and the aggregator; on one machine the learner, evaluator and
                             Redis share the services' namespace and keep them)
    SLOW link                netem on both ends for 5-20 s: 50-200 ms delay, 1-10% loss each way;
                             on a kernel without netem, tbf: a rate cap of 256-2048 kbit/s each
                             way (what queues past 200 ms is dropped), and no fixed delay
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Protocol

from fleet.chaos.netns import Shaping

SLOW_QDISCS = ("netem", "tbf")  # a slow link's qdisc: the first this kernel has

PARTITION, SLOW = "PARTITION", "SLOW"
SAMPLER_HOST, SERVICES_HOST, LINK = "sampler-host", "services-host", "link"
NETWORK_FAULTS = ((PARTITION, SAMPLER_HOST), (PARTITION, SERVICES_HOST), (SLOW, LINK))
SIDE = {SAMPLER_HOST: "sampler", SERVICES_HOST: "services"}  # the end of the link a partition takes down


class Link(Protocol):
    """What a network fault does to the link (fleet/chaos/netns.py's SamplerHost; a fake in tests)."""

    def set_link(self, side: str, up: bool) -> None: ...
    def shape(self, shaping: Shaping) -> None: ...
    def unshape(self) -> None: ...


@dataclass(frozen=True)
class NetFaultRanges:
    """The ranges a soak draws each network fault's duration and severity from (uniform)."""

    down_sec: tuple[float, float] = (5.0, 20.0)  # a partition lasts this long
    slow_sec: tuple[float, float] = (5.0, 20.0)  # a slow link lasts this long
    delay_ms: tuple[int, int] = (50, 200)  # netem delay per end
    loss_pct: tuple[float, float] = (1.0, 10.0)  # netem loss per end
    rate_kbit: tuple[int, int] = (256, 2048)  # tbf rate per end (without netem)

    def __post_init__(self) -> None:
        for name in ("down_sec", "slow_sec", "delay_ms", "loss_pct", "rate_kbit"):
            low, high = getattr(self, name)
            if not 0 <= low <= high:
                raise ValueError(f"{name} ({low}, {high}) must be 0 <= low <= high")


@dataclass(frozen=True)
class NetFault:
    kind: str  # PARTITION or SLOW
    target: str  # SAMPLER_HOST, SERVICES_HOST or LINK
    for_sec: float  # then undone
    shaping: Shaping | None = None  # SLOW: the qdisc and its settings

    def detail(self) -> dict:
        """What the fault's record says about it."""
        out: dict = {"for_sec": self.for_sec}
        if self.shaping is not None:
            out["qdisc"] = self.shaping.qdisc
            if self.shaping.qdisc == "netem":
                out |= {"delay_ms": self.shaping.delay_ms, "loss_pct": self.shaping.loss_pct}
            else:
                out["rate_kbit"] = self.shaping.rate_kbit
        return out


def draw(kind: str, target: str, rng: random.Random, ranges: NetFaultRanges, qdisc: str = "netem") -> NetFault:
    """One network fault's duration (and, for a slow link with `qdisc`, its delay and loss or its
    rate), drawn from `ranges`."""
    if (kind, target) not in NETWORK_FAULTS:
        raise ValueError(f"network fault {kind} {target}: must be one of {[' '.join(f) for f in NETWORK_FAULTS]}")
    if kind == PARTITION:
        return NetFault(kind, target, round(rng.uniform(*ranges.down_sec), 1))
    for_sec = round(rng.uniform(*ranges.slow_sec), 1)
    if qdisc == "netem":
        shaping = Shaping(
            "netem", delay_ms=rng.randint(*ranges.delay_ms), loss_pct=round(rng.uniform(*ranges.loss_pct), 1)
        )
    else:
        shaping = Shaping(qdisc, rate_kbit=rng.randint(*ranges.rate_kbit))
    return NetFault(kind, target, for_sec, shaping)


class LinkFaults:
    """The network faults a soak can inject on `link`, and the one in effect now."""

    def __init__(self, link: Link, shaping_unavailable: dict[str, str | None]) -> None:
        """`shaping_unavailable`: for each qdisc, why it cannot shape a link here (None: it can;
        fleet/chaos/netns.py). A slow link uses netem, else tbf; without either it is off the menu."""
        self.link = link
        self.slow_qdisc = next((q for q in SLOW_QDISCS if shaping_unavailable.get(q, "not probed") is None), None)
        self.unavailable: dict[str, str] = {}  # what the soak cannot inject as asked, and why
        if self.slow_qdisc != "netem":
            instead = "; the slow link is a tbf rate cap instead" if self.slow_qdisc == "tbf" else ""
            self.unavailable[f"{SLOW} {LINK} with netem (delay and loss)"] = (
                f"{shaping_unavailable.get('netem')}{instead}"
            )
        if self.slow_qdisc is None:
            self.unavailable[f"{SLOW} {LINK}"] = f"tbf: {shaping_unavailable.get('tbf')}"
        self.menu = [(k, t) for k, t in NETWORK_FAULTS if k != SLOW or self.slow_qdisc is not None]
        self.active: NetFault | None = None

    def draw(self, kind: str, target: str, rng: random.Random, ranges: NetFaultRanges) -> NetFault:
        """One fault of the menu, drawn from `ranges` (a slow link with the qdisc this kernel has)."""
        return draw(kind, target, rng, ranges, self.slow_qdisc or "netem")

    def apply(self, fault: NetFault) -> None:
        if self.active is not None:
            raise RuntimeError(f"{self.active.kind} {self.active.target} is in effect: one network fault at a time")
        if (fault.kind, fault.target) not in self.menu:
            raise ValueError(f"{fault.kind} {fault.target} is not available: {self.unavailable}")
        if fault.kind == PARTITION:
            self.link.set_link(SIDE[fault.target], up=False)
        else:
            assert fault.shaping is not None
            try:
                self.link.shape(fault.shaping)
            except Exception:
                self.link.unshape()  # one end may have taken it: neither keeps it
                raise
        self.active = fault

    def undo(self) -> None:
        """The link back as it was (nothing when no fault is in effect)."""
        fault, self.active = self.active, None
        if fault is None:
            return
        if fault.kind == PARTITION:
            self.link.set_link(SIDE[fault.target], up=True)
        else:
            self.link.unshape()
