"""foundation/shm.py: the weights segment a same-host subscriber maps (unit tests, real files)."""

from __future__ import annotations

import os
import threading

import numpy as np
import pytest

from foundation.shm import SEQ, VERSION, SharedWeightsReader, SharedWeightsWriter

SIZES = {"actor": 5, "critic": 7}

pytestmark = pytest.mark.skipif(not os.path.isdir("/dev/shm"), reason="needs /dev/shm")


def _tensors(seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {g: rng.normal(size=n).astype(np.float32) for g, n in SIZES.items()}


@pytest.fixture
def writer():
    w = SharedWeightsWriter(SIZES)
    yield w
    w.close()


def test_reader_gets_what_was_written_as_copies(writer):
    reader = SharedWeightsReader(writer.path, writer.key, SIZES)
    assert reader.read() is None  # nothing written yet
    first = _tensors(0)
    writer.write(3, first)
    version, got = reader.read()
    assert version == 3
    for g in SIZES:
        np.testing.assert_array_equal(got[g], first[g])
    writer.write(4, _tensors(1))
    np.testing.assert_array_equal(got["actor"], first["actor"])  # a copy: the next write leaves it alone
    assert reader.read()[0] == 4
    assert oct(os.stat(writer.path).st_mode & 0o777) == "0o600"
    reader.close()


def test_a_write_in_progress_is_never_read(writer):
    reader = SharedWeightsReader(writer.path, writer.key, SIZES)
    writer.write(1, _tensors(0))
    writer._header[SEQ] += 1  # as a writer would leave it mid-copy
    assert reader.read() is None
    writer._header[SEQ] += 1
    assert reader.read()[0] == 1
    reader.close()


def test_a_reader_waits_out_a_writer_preempted_mid_write(writer):
    """On a busy host the writer can lose its core mid-copy for a time slice or more; a reader
    given a wait takes the write once it finishes instead of giving up (the learners' watchers
    once fell back to gRPC this way, minutes into a FetchPush run)."""
    reader = SharedWeightsReader(writer.path, writer.key, SIZES)
    writer.write(1, _tensors(0))
    new = _tensors(1)
    writer._header[SEQ] += 1  # a write begins, and its writer is preempted

    def rest_of_the_write() -> None:
        for group, view in writer._data.items():
            view[:] = new[group]
        writer._header[VERSION] = 2
        writer._header[SEQ] += 1

    finish = threading.Timer(0.05, rest_of_the_write)
    finish.start()
    try:
        read = reader.read(wait_sec=10.0)
    finally:
        finish.join()
    assert read is not None and read[0] == 2
    np.testing.assert_array_equal(read[1]["critic"], new["critic"])
    reader.close()


def test_a_wrong_key_size_or_path_is_refused(writer, tmp_path):
    with pytest.raises(ValueError, match="key or size"):
        SharedWeightsReader(writer.path, writer.key + 1, SIZES)  # another aggregator's segment
    with pytest.raises(ValueError, match="bytes, expected"):
        SharedWeightsReader(writer.path, writer.key, {"actor": 5})
    with pytest.raises(ValueError, match="is not a"):
        SharedWeightsReader(str(tmp_path / "x"), writer.key, SIZES)  # only our own segment names
    with pytest.raises(FileNotFoundError):
        SharedWeightsReader("/dev/shm/fleetrl-weights-1-0123456789abcdef", 1, SIZES)  # another host's


def test_close_removes_the_file_and_orphans_of_dead_aggregators_are_swept():
    first = SharedWeightsWriter(SIZES)
    first.close()
    assert not os.path.exists(first.path)
    orphan = "/dev/shm/fleetrl-weights-999999999-0123456789abcdef"  # no such pid
    open(orphan, "wb").close()
    second = SharedWeightsWriter(SIZES)
    try:
        assert not os.path.exists(orphan)
        assert os.path.exists(second.path)
    finally:
        second.close()
