"""The replay sampler's pure parts, without Redis: the replica ring (buffer/replica.py), the
sampling strategies (buffer/strategies.py), task quotas (buffer/quotas.py) and the batch draw
(buffer/draw.py). tests/test_buffer_client.py runs the whole ReplaySampler on real Redis."""

from __future__ import annotations

import numpy as np
import pytest

from buffer.draw import draw_slots
from buffer.layout import RecordLayout
from buffer.quotas import FILL_GIVE_UP, TaskQuotas
from buffer.replica import ReplicaRing
from buffer.strategies import STRATEGIES, ByVersion, Recency, Span, Uniform, make_strategy
from foundation.config import BufferConfig
from foundation.config_learning import REPLAY_SAMPLING
from foundation.wire import TransitionSchema

DTYPE = RecordLayout("run1", TransitionSchema(3, 2, 2), BufferConfig()).dtype


def rows(first: int, n: int, version: int = 0, task: int = 0, valid: bool = True) -> np.ndarray:
    """`n` records whose first row value is their position (first, first + 1, ...)."""
    chunk = np.zeros(n, DTYPE)
    chunk["row"][:, 0] = np.arange(first, first + n)
    chunk["policy_version"], chunk["task_id"], chunk["valid"] = version, task, int(valid)
    return chunk


def ring_of(*chunks: np.ndarray, slots: int = 4096) -> ReplicaRing:
    """A ring holding `chunks` one after the other from position 0."""
    ring = ReplicaRing(DTYPE, slots)
    at = 0
    for chunk in chunks:
        ring.store(at, chunk)
        at += len(chunk)
    return ring


def drawn_ids(ring: ReplicaRing, positions: np.ndarray) -> np.ndarray:
    return ring.at(positions)["row"][:, 0].astype(np.int64)


# The replica ring


def test_the_ring_counts_valid_rows_replaces_wrapped_slots_and_drops_evicted_ones():
    ring = ring_of(rows(0, 6), rows(6, 2, valid=False), slots=10)
    assert (ring.valid_count, ring.read_upto, ring.live()) == (6, 8, (0, 8))
    ring.store(8, rows(8, 4))  # positions 10, 11 wrap onto slots 0, 1
    assert ring.valid_count == 8 and ring.live() == (2, 12)
    assert drawn_ids(ring, np.array([10, 11, 2])).tolist() == [10, 11, 2]
    ring.drop_below(4)
    assert ring.valid_count == 6 and ring.live() == (4, 12)
    assert ring.newest_valid(3).tolist() == [11, 10, 9]
    assert ring.newest_valid(100).tolist() == [11, 10, 9, 8, 5, 4]  # 6, 7 were never valid


# Strategies


def test_the_strategy_table_is_the_configs_list_and_an_unknown_name_is_refused_naming_them():
    assert tuple(STRATEGIES) == REPLAY_SAMPLING
    assert isinstance(make_strategy("uniform"), Uniform)
    assert make_strategy("recency", half_life=400) == Recency(400)
    assert make_strategy("version", max_policy_lag=3) == ByVersion(3)
    with pytest.raises(ValueError, match=r"sampling 'newest': expected one of \('uniform', 'recency', 'version'\)"):
        make_strategy("newest")
    with pytest.raises(ValueError, match=r"half_life \(0\) must be >= 1"):
        Recency(0)


def test_uniform_draws_every_live_position_alike():
    ring = ring_of(rows(0, 1000))
    ring.drop_below(200)
    span = Uniform().span(ring, version=0)
    assert span == Span(200, 1000, None)
    positions = Uniform().positions(np.random.default_rng(0), span, 40_000)
    assert positions.min() == 200 and positions.max() == 999
    assert abs(np.mean(positions < 400) - 0.25) < 0.02


def test_recency_halves_a_rows_weight_every_half_life():
    span = Span(0, 1600)
    ages = 1599 - Recency(400).positions(np.random.default_rng(0), span, 40_000)
    assert ages.min() >= 0 and ages.max() <= 1599
    # Weight 2^(-age/400) truncated at 1600: P(age < 400) = 0.5 / (1 - 2^-4) = 0.533.
    assert abs(np.mean(ages < 400) - 0.5 / (1 - 2**-4)) < 0.02
    assert abs(np.mean((ages >= 400) & (ages < 800)) - 0.25 / (1 - 2**-4)) < 0.02


def test_version_spans_the_rows_within_the_lag_found_by_bisection():
    ring = ring_of(*[rows(100 * v, 100, version=v) for v in range(16)])
    assert ByVersion(3).span(ring, version=15) == Span(1200, 1600, 12)
    assert ByVersion(3).span(ring, version=5) == Span(200, 1600, 2)
    assert ByVersion(3).span(ring, version=100).first == 1600  # nothing young enough: empty
    skipped = ring_of(rows(0, 100, version=9), rows(100, 50, version=9, valid=False), rows(150, 50, version=9))
    assert ByVersion(0).span(skipped, version=9).first == 150  # an invalid row counts as old: past it
    assert ByVersion(0).span(ring_of(rows(0, 100, version=9, valid=False), rows(100, 50, version=9)), 9).first == 100


# Task quotas


def test_quotas_are_even_with_the_remainder_first_or_by_shares_summing_to_the_batch():
    quotas = TaskQuotas((0, 2, 5))
    assert quotas.quota(256).tolist() == [86, 85, 85]
    quotas.set_shares(np.array([1.0, 3.0, 6.0]))  # normalized: 0.1, 0.3, 0.6
    np.testing.assert_allclose(quotas.shares, [0.1, 0.3, 0.6])
    assert quotas.quota(256).tolist() == [26, 77, 153]
    quotas.set_shares(None)
    assert quotas.quota(7).tolist() == [3, 2, 2]


@pytest.mark.parametrize("bad", [[0.5, 0.5], [0.5, -0.1, 0.6], [0.0, 0.0, 0.0], [[0.2, 0.3, 0.5]]])
def test_a_bad_set_of_shares_is_refused_and_the_old_one_kept(bad):
    quotas = TaskQuotas((0, 1, 2))
    quotas.set_shares(np.array([0.2, 0.3, 0.5]))
    with pytest.raises(ValueError, match="need 3 values >= 0 with a positive sum"):
        quotas.set_shares(np.array(bad))
    np.testing.assert_allclose(quotas.shares, [0.2, 0.3, 0.5])


def test_fill_keeps_each_tasks_draws_up_to_its_quota_and_an_absent_task_gives_it_up():
    quotas = TaskQuotas((0, 1, 2))
    draws = np.arange(10)
    task = np.array([0, 1, 0, 1, 0, 1, 0, 0, 0, 0])
    kept, left = quotas.fill(draws, task, np.array([3, 5, 2]))
    assert kept.tolist() == [0, 2, 4, 1, 3, 5] and left.tolist() == [0, 2, 2]  # few draws: task 2 keeps hoping
    many = np.zeros(FILL_GIVE_UP, np.int64)
    assert quotas.fill(many, many, np.array([3, 5, 2])).left.tolist() == [0, 0, 0]  # 1, 2 never came
    with pytest.raises(ValueError, match="two or more distinct task ids"):
        TaskQuotas((3, 3))


# The batch draw


def test_a_draw_never_takes_an_invalid_row():
    ring = ring_of(rows(0, 50), rows(50, 900, valid=False), rows(950, 50))
    drawn = draw_slots(ring, Uniform(), None, np.random.default_rng(0), 500)
    ids = drawn_ids(ring, drawn.positions)
    assert len(ids) == 500 and not drawn.fell_back
    assert set(ids.tolist()) == set(range(50)) | set(range(950, 1000))


def test_a_version_draw_keeps_the_lag_and_falls_back_to_the_newest_when_nothing_is_young_enough():
    ring = ring_of(*[rows(100 * v, 100, version=v) for v in range(16)])
    drawn = draw_slots(ring, ByVersion(3), None, np.random.default_rng(0), 2000, version=15)
    versions = ring.at(drawn.positions)["policy_version"]
    assert set(versions.tolist()) == {12, 13, 14, 15} and not drawn.fell_back
    stale = draw_slots(ring, ByVersion(3), None, np.random.default_rng(0), 50, version=100)
    assert stale.fell_back and drawn_ids(ring, stale.positions).min() >= 1600 - 4 * 50


def test_a_quota_draw_gives_every_task_its_rows_whatever_the_buffer_holds():
    ring = ring_of(rows(0, 1800, task=0), rows(1800, 150, task=2), rows(1950, 50, task=5))
    quotas = TaskQuotas((0, 2, 5))
    drawn = draw_slots(ring, Uniform(), quotas, np.random.default_rng(0), 256)
    task = ring.at(drawn.positions)["task_id"]
    assert np.bincount(task, minlength=6)[[0, 2, 5]].tolist() == [86, 85, 85]
    assert len(set(drawn_ids(ring, drawn.positions[task == 5]).tolist())) > 40  # over the task's rows
    absent = TaskQuotas((0, 2, 7))  # task 7 has no row: the others fill its share
    filled = draw_slots(ring, Uniform(), absent, np.random.default_rng(0), 300)
    counts = np.bincount(ring.at(filled.positions)["task_id"], minlength=8)
    assert len(filled.positions) == 300 and counts[7] == 0 and counts[0] >= 100 and counts[2] >= 100
