"""Fakes of the role interfaces and clients that record every call and check its contract.

    FakeBatchSource       buffer/api.py's BatchSource: the learner's replay sampler
    FakeIngestClient      buffer/ingest_client.py's IngestClient: the sampler's Pusher
    FakeWeightsWatcher    aggregator/watcher.py's WeightsWatcher: samplers and learners
    FakeAggregatorClient  aggregator/client.py's AggregatorClient: the learner's pushes

    source = FakeBatchSource()
    batches = Batches(source, 8, torch.device("cpu"), prefetch=False)   # the code under test
    ...
    source.assert_calls(samples=3, batch_size=8)                        # what it asked, and how

A fake fails the test at the wrong call, not later: sample() before wait_to_sample() said
yes is a broken flow-control contract, and raises AssertionError where it happens (a
prefetch thread passes it on to the loop that reads its batches; a pusher thread, to the
sampler's put(), waiting or not). Fakes stand in only in unit tests of pure logic; end-to-end
tests use the real services.
"""

from tests.fakes.aggregator import FakeAggregatorClient, FakePendingPush, FakeWeightsWatcher
from tests.fakes.buffer import Call, FakeBatchSource, FakeIngestClient, Pushed

__all__ = [
    "Call",
    "FakeAggregatorClient",
    "FakeBatchSource",
    "FakeIngestClient",
    "FakePendingPush",
    "FakeWeightsWatcher",
    "Pushed",
]
