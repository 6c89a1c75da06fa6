"""One batch's draw from the replica: a strategy's positions, rejection of what may not be
drawn, and task quotas.

    drawn = draw_slots(ring, strategy, quotas, rng, batch_size, version)
    records = ring.at(drawn.positions)         # batch_size rows
    if drawn.fell_back: ...                    # no row was young enough: the newest stood in

Rejection sampling: draw positions, redraw the few that are invalid (skipped, unwritten or, by
version, too old), and with quotas those past their task's quota. When a task has no row, the
others fill its rows in; when no valid row is in the strategy's span at all ('version' with
samplers far behind), the newest valid rows stand in.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from buffer.quotas import TaskQuotas
from buffer.replica import ReplicaRing
from buffer.strategies import SamplingStrategy, Span

MAX_ROUNDS = 100  # redraw rounds before the newest rows stand in
NEWEST_PER_ROW = 4  # the stand-in draws from the newest 4 * batch_size valid rows


class Drawn(NamedTuple):
    positions: np.ndarray  # batch_size positions, with replacement
    fell_back: bool  # no eligible row: drawn from the newest valid rows instead


def draw_slots(
    ring: ReplicaRing,
    strategy: SamplingStrategy,
    quotas: TaskQuotas | None,
    rng: np.random.Generator,
    batch_size: int,
    version: int = 0,
) -> Drawn:
    """`batch_size` positions of valid rows of `ring` (which holds at least one)."""
    span = strategy.span(ring, version)
    left = quotas.quota(batch_size) if quotas is not None else None
    positions = np.empty(0, np.int64)
    for _ in range(MAX_ROUNDS if span.first < span.high else 0):
        wanted = batch_size - len(positions) if left is None else int(left.sum())
        draws = strategy.positions(rng, span, 2 * wanted * (1 if left is None else len(left)) + 8)
        draws = draws[_eligible(ring, span, draws)]
        if quotas is not None and left is not None:
            draws, left = quotas.fill(draws, ring.at(draws)["task_id"], left)
        positions = np.concatenate([positions, draws])
        if len(positions) >= batch_size or (left is not None and not left.any()):
            break
    if left is not None and 0 < len(positions) < batch_size:  # a task without rows: others fill in
        positions = np.concatenate([positions, rng.choice(positions, batch_size - len(positions))])
    if len(positions) < batch_size:
        newest = ring.newest_valid(NEWEST_PER_ROW * batch_size)
        return Drawn(rng.choice(newest, batch_size), fell_back=True)
    return Drawn(positions[:batch_size], fell_back=False)


def _eligible(ring: ReplicaRing, span: Span, draws: np.ndarray) -> np.ndarray:
    """Which draws are valid rows, young enough for the span."""
    rows = ring.at(draws)
    ok = rows["valid"] != 0
    if span.oldest_version is not None:
        ok &= rows["policy_version"].astype(np.int64) >= span.oldest_version
    return ok
