"""Pure parts of the buffer (no server): record layout, key names, position math, dedup."""

from __future__ import annotations

import numpy as np
import pytest

from buffer.layout import RecordLayout, Segment
from foundation.config import BufferConfig
from foundation.wire import TransitionSchema

SCHEMA = TransitionSchema(obs_dim=3, goal_dim=2, act_dim=2)


def layout(window: int = 8) -> RecordLayout:
    return RecordLayout("run1", SCHEMA, BufferConfig(window_size_transitions=window, key_prefix="fr"))


def test_key_names_put_each_window_under_its_own_hash_tag():
    lay = layout()
    assert lay.head_key == "fr:{run1}:head"
    assert lay.oldest_key == "fr:{run1}:oldest"
    assert lay.window_key(12) == "fr:{run1:w12}:data"
    assert lay.window_key(12, stripe=3) == "fr:{run1:w12.s3}:data"


@pytest.mark.parametrize("run_id", ["", "a{b", "a}b"])
def test_run_ids_that_would_break_hash_tags_are_refused(run_id):
    with pytest.raises(ValueError, match="run_id"):
        RecordLayout(run_id, SCHEMA, BufferConfig())


def test_record_is_row_floats_then_three_uint32():
    assert layout().record_bytes == 4 * SCHEMA.row_floats + 12


@pytest.mark.parametrize(
    "start,count,expected",
    [
        (0, 5, [Segment(0, 0, 0, 5)]),
        (5, 3, [Segment(0, 5, 0, 3)]),
        (5, 4, [Segment(0, 5, 0, 3), Segment(1, 0, 3, 4)]),
        (6, 20, [Segment(0, 6, 0, 2), Segment(1, 0, 2, 10), Segment(2, 0, 10, 18), Segment(3, 0, 18, 20)]),
        (16, 8, [Segment(2, 0, 0, 8)]),
    ],
)
def test_segments_split_at_window_boundaries(start, count, expected):
    assert list(layout().segments(start, count)) == expected


def test_reserved_slots_per_window():
    lay = layout()
    assert [lay.reserved_in(w, 19) for w in range(4)] == [8, 8, 3, 0]
    assert lay.windows_below(0) == 0
    assert lay.windows_below(16) == 2
    assert lay.windows_below(17) == 3


def test_encode_decode_roundtrip(make_transitions):
    lay = layout()
    t = make_transitions(5, first_id=10)
    records = lay.encode(t, task_id=7, policy_version=3)
    back = lay.decode(records.tobytes())
    np.testing.assert_array_equal(back["row"], t.pack())
    assert back["task_id"].tolist() == [7] * 5
    assert back["policy_version"].tolist() == [3] * 5
    assert back["valid"].tolist() == [1] * 5
    np.testing.assert_array_equal(lay.transitions(back).reward, t.reward)


def test_encode_refuses_versions_that_do_not_fit_uint32(make_transitions):
    with pytest.raises(ValueError, match="policy_version"):
        layout().encode(make_transitions(1), task_id=0, policy_version=2**32)


def test_encode_refuses_rows_of_another_schema(make_transitions):
    other = TransitionSchema(obs_dim=4, goal_dim=2, act_dim=2)
    with pytest.raises(ValueError, match="floats per row"):
        layout().encode(make_transitions(2, schema=other), task_id=0, policy_version=0)
