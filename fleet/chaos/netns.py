"""A second host on one machine: a network namespace for the samplers, joined by a veth pair.

    with SamplerHost.create(tag="1a2") as net:     # root and `ip` (iproute2) needed
        argv = (*net.exec_prefix, python, "-m", "fleet.cli.main", "sampler", ...)  # runs on the sampler host
        net.set_link("sampler", up=False)           # a partition: the sampler host's end goes down
        net.shape(Shaping("netem", delay_ms=120, loss_pct=4.0))  # a slow link on both ends, until unshape()

    this namespace  fl<tag>s  10.232.N.1 --- veth --- 10.232.N.2  fl<tag>h  namespace fl<tag>
    (the services' host: buffer, aggregator; Redis, learner and evaluator beside them)

Everything made here goes away on close, also after a failure half-way: the namespace (and
with it the inner end of the veth, its qdiscs and the pair) and our end of the veth. Nothing
touches the machine's other interfaces. `unavailable()` says, in a sentence, why a namespace cannot be
made here, and `shaping_unavailable()` why netem or tbf cannot shape a link (None: it can).
"""

from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import dataclass

SUBNET = "10.232"  # tests/test_e2e_multihost.py uses 10.231
SIDES = ("services", "sampler")  # the two ends of the link: "services" is this namespace's


def _ip(*args: str) -> None:
    done = subprocess.run(["ip", *args], capture_output=True, text=True)
    if done.returncode != 0:
        raise NetnsError(f"`ip {' '.join(args)}` failed: {done.stderr.strip()}")


class NetnsError(RuntimeError):
    """A namespace, link or qdisc could not be made or changed; the message has `ip`'s or `tc`'s."""


def unavailable() -> str | None:
    """Why a sampler host cannot be made here, or None."""
    if os.geteuid() != 0:
        return "network namespaces need root"
    if shutil.which("ip") is None:
        return "iproute2 (`ip`) is not installed"
    probe = f"flprobe{os.getpid() % 100000}"
    made = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True)
    if made.returncode != 0:
        return f"`ip netns add` failed: {made.stderr.strip()}"
    subprocess.run(["ip", "netns", "del", probe], capture_output=True)
    return None


def shaping_unavailable() -> dict[str, str | None]:
    """For each qdisc a slow link may use ("netem", "tbf"): why it cannot shape a link here
    (None: it can). Tried on the loopback of a throwaway namespace (never on this namespace's
    interfaces), after `modprobe` of its module where modprobe exists."""
    reason = unavailable() or (None if shutil.which("tc") else "`tc` (iproute2) is not installed")
    if reason is not None:
        return {qdisc: reason for qdisc in QDISC_PROBES}
    out: dict[str, str | None] = {}
    for qdisc, args in QDISC_PROBES.items():
        if shutil.which("modprobe"):
            subprocess.run(["modprobe", f"sch_{qdisc}"], capture_output=True)
        probe = f"flq{qdisc}{os.getpid() % 100000}"
        subprocess.run(["ip", "netns", "add", probe], capture_output=True)
        try:
            done = subprocess.run(["tc", "-n", probe, "qdisc", "add", "dev", "lo", "root", *args], capture_output=True,
                                  text=True)  # fmt: skip
        finally:
            subprocess.run(["ip", "netns", "del", probe], capture_output=True)
        out[qdisc] = None if done.returncode == 0 else (
            f"`tc qdisc add ... {qdisc}` failed ({done.stderr.strip()}): this kernel has no {qdisc} qdisc "
            f"(CONFIG_NET_SCH_{qdisc.upper()}, module sch_{qdisc})"
        )  # fmt: skip
    return out


TBF_BURST, TBF_LATENCY_MS = "16kb", 200  # a token bucket of 16 KB; a packet queued past 200 ms is dropped


@dataclass(frozen=True)
class Shaping:
    """How a slow link is slowed, on each end's egress (so either way; a round trip twice):
    netem: every packet waits `delay_ms` and `loss_pct` percent of them are dropped;
    tbf (a kernel without netem): at most `rate_kbit`, and what queues past TBF_LATENCY_MS dropped."""

    qdisc: str  # "netem" or "tbf"
    delay_ms: int = 0
    loss_pct: float = 0.0
    rate_kbit: int = 0

    def __post_init__(self) -> None:
        if self.qdisc not in QDISC_PROBES:
            raise ValueError(f"qdisc ({self.qdisc!r}) must be one of {list(QDISC_PROBES)}")
        if self.qdisc == "tbf" and self.rate_kbit <= 0:
            raise ValueError(f"rate_kbit ({self.rate_kbit}) must be > 0 for tbf: a rate of 0 passes nothing")

    def qdisc_args(self) -> list[str]:
        if self.qdisc == "netem":
            return ["netem", "delay", f"{self.delay_ms}ms", "loss", f"{self.loss_pct:g}%"]
        return ["tbf", "rate", f"{self.rate_kbit}kbit", "burst", TBF_BURST, "latency", f"{TBF_LATENCY_MS}ms"]


QDISC_PROBES = {  # what shaping_unavailable tries
    "netem": ["netem", "delay", "1ms", "loss", "1%"],
    "tbf": ["tbf", "rate", "1mbit", "burst", TBF_BURST, "latency", f"{TBF_LATENCY_MS}ms"],
}


class SamplerHost:
    """The sampler host's namespace and its link to this namespace (the services' host)."""

    def __init__(self, tag: str) -> None:
        """`tag`: up to 3 hex digits, unique among the runs on this machine (names <= 15 chars)."""
        if not (1 <= len(tag) <= 3) or any(c not in "0123456789abcdef" for c in tag):
            raise ValueError(f"tag ({tag!r}) must be 1-3 lowercase hex digits: it names interfaces (<= 15 chars)")
        self.namespace = f"fl{tag}"
        self.links = {"services": f"fl{tag}s", "sampler": f"fl{tag}h"}  # services' end here, sampler's in the ns
        subnet = f"{SUBNET}.{int(tag, 16) % 250}"
        self.addresses = {"services": f"{subnet}.1", "sampler": f"{subnet}.2"}
        self.shaped: Shaping | None = None

    @classmethod
    def create(cls, tag: str) -> SamplerHost:
        """Make the namespace and the link (both ends up); NetnsError (all undone) if not."""
        net = cls(tag)
        try:
            net._make()
        except BaseException:
            net.close()
            raise
        return net

    def _make(self) -> None:
        ns, here, there = self.namespace, self.links["services"], self.links["sampler"]
        _ip("netns", "add", ns)
        _ip("link", "add", here, "type", "veth", "peer", "name", there, "netns", ns)
        _ip("addr", "add", f"{self.addresses['services']}/24", "dev", here)
        _ip("-n", ns, "addr", "add", f"{self.addresses['sampler']}/24", "dev", there)
        _ip("link", "set", here, "up")
        _ip("-n", ns, "link", "set", there, "up")
        _ip("-n", ns, "link", "set", "lo", "up")

    def __enter__(self) -> SamplerHost:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Delete the namespace (its end of the veth, the pair and the qdiscs go with it) and our
        end if it is still there; quiet about what is already gone."""
        subprocess.run(["ip", "netns", "del", self.namespace], capture_output=True)
        subprocess.run(["ip", "link", "del", self.links["services"]], capture_output=True)

    @property
    def exec_prefix(self) -> tuple[str, ...]:
        """An argv prefix that runs a command on the sampler host (`ip netns exec` execs it: the
        pid is the command's own, so signals reach it)."""
        return ("ip", "netns", "exec", self.namespace)

    def _on(self, side: str) -> tuple[str, ...]:
        if side not in SIDES:
            raise ValueError(f"side ({side!r}) must be one of {SIDES}")
        return ("-n", self.namespace) if side == "sampler" else ()

    def set_link(self, side: str, up: bool) -> None:
        """Take one end of the link down (both ends then lose carrier: nothing passes) or up."""
        _ip(*self._on(side), "link", "set", self.links[side], "up" if up else "down")

    def shape(self, shaping: Shaping) -> None:
        """The shaping on both ends (replacing any earlier shaping)."""
        for side in SIDES:
            _tc(*self._on(side), "qdisc", "replace", "dev", self.links[side], "root", *shaping.qdisc_args())
        self.shaped = shaping

    def unshape(self) -> None:
        """Both ends back to their default qdisc."""
        for side in SIDES:
            _tc(*self._on(side), "qdisc", "del", "dev", self.links[side], "root", missing_ok=True)
        self.shaped = None


def _tc(*args: str, missing_ok: bool = False) -> None:
    """`tc ARGS` (`-n NS` first: in that namespace); `missing_ok`: no error for a qdisc not there."""
    done = subprocess.run(["tc", *args], capture_output=True, text=True)
    if done.returncode != 0 and not missing_ok:
        raise NetnsError(f"`tc {' '.join(args)}` failed: {done.stderr.strip()}")
