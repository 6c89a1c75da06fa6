"""How a learner's batch draws positions from its replica: one strategy per name.

    strategy = make_strategy(config.learner.replay_sampling, half_life=..., max_policy_lag=...)
    span = strategy.span(ring, version)                  # where this batch may draw, and how old
    positions = strategy.positions(rng, span, n)         # n draws in [span.first, span.high)

- 'uniform': every live row alike.
- 'recency': a row's weight halves every `half_life` positions of age (an exponential draw of
  the age, truncated at the oldest live row).
- 'version': uniform over the rows whose policy version is at most `max_policy_lag` behind the
  learner's, the buffer bucketed by version as the design's is. Positions are time-ordered and
  versions rise with time, so the eligible rows are a suffix of the ring, found by bisection;
  buffer/draw.py checks each drawn row's version.

A strategy only proposes positions: buffer/draw.py redraws the invalid ones and applies task
quotas, the same for every strategy.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import NamedTuple, Protocol

import numpy as np

from buffer.replica import ReplicaRing


class Span(NamedTuple):
    """Positions [first, high) may be drawn; rows older than `oldest_version` are refused."""

    first: int
    high: int
    oldest_version: int | None = None


class SamplingStrategy(Protocol):
    def span(self, ring: ReplicaRing, version: int) -> Span:
        """Where a batch for a learner at weights `version` may draw from."""
        ...

    def positions(self, rng: np.random.Generator, span: Span, n: int) -> np.ndarray:
        """`n` positions in [span.first, span.high), as the strategy weighs them."""
        ...


class Uniform:
    def span(self, ring: ReplicaRing, version: int) -> Span:
        return Span(*ring.live())

    def positions(self, rng: np.random.Generator, span: Span, n: int) -> np.ndarray:
        return rng.integers(span.first, span.high, size=n)


@dataclass(frozen=True)
class Recency:
    half_life: int  # positions of age that halve a row's weight

    def __post_init__(self) -> None:
        if self.half_life < 1:
            raise ValueError(f"half_life ({self.half_life}) must be >= 1 position")

    def span(self, ring: ReplicaRing, version: int) -> Span:
        return Span(*ring.live())

    def positions(self, rng: np.random.Generator, span: Span, n: int) -> np.ndarray:
        # Inverse CDF of a geometric-like age with weight 2^(-age / half_life), truncated at
        # the oldest live row.
        size, rate = span.high - span.first, np.log(2.0) / self.half_life
        u = rng.random(n)
        age = np.floor(-np.log1p(-u * -np.expm1(-rate * size)) / rate).astype(np.int64)
        return span.high - 1 - np.minimum(age, size - 1)


@dataclass(frozen=True)
class ByVersion:
    max_policy_lag: int  # versions a row may be behind the learner's

    def span(self, ring: ReplicaRing, version: int) -> Span:
        low, high = ring.live()
        oldest = version - self.max_policy_lag
        return Span(first_at_least(ring, oldest, low, high), high, oldest)

    def positions(self, rng: np.random.Generator, span: Span, n: int) -> np.ndarray:
        return rng.integers(span.first, span.high, size=n)


def first_at_least(ring: ReplicaRing, version: int, low: int, high: int) -> int:
    """The first position in [low, high) whose policy version is >= `version`, by bisection
    (versions rise with position; an invalid row counts as old)."""
    while low < high:
        mid = (low + high) // 2
        row = ring.row(mid)
        if row["valid"] and int(row["policy_version"]) >= version:
            high = mid
        else:
            low = mid + 1
    return low


# learner.replay_sampling -> the strategy, from (half_life, max_policy_lag).
STRATEGIES: dict[str, Callable[[int, int], SamplingStrategy]] = {
    "uniform": lambda half_life, max_policy_lag: Uniform(),
    "recency": lambda half_life, max_policy_lag: Recency(half_life),
    "version": lambda half_life, max_policy_lag: ByVersion(max_policy_lag),
}


def make_strategy(name: str, half_life: int = 200_000, max_policy_lag: int = 20_000) -> SamplingStrategy:
    """The strategy `name` (learner.replay_sampling) names; ValueError naming the choices."""
    if name not in STRATEGIES:
        raise ValueError(f"sampling {name!r}: expected one of {tuple(STRATEGIES)}")
    return STRATEGIES[name](half_life, max_policy_lag)
