"""The committed generated protobuf code matches fleetrl.proto (regenerate with foundation.proto.generate)."""

from __future__ import annotations

import pytest

from foundation.proto import generate


@pytest.mark.parametrize("name", generate.OUTPUTS)
def test_committed_generated_code_is_current(name):
    fresh = generate.generated_sources()[name]
    committed = (generate.PROTO_DIR / name).read_text()
    assert committed == fresh, f"{name} is stale: run `python -m foundation.proto.generate` and commit the result"


def test_generated_code_defines_every_service_rpc():
    from foundation.proto import fleetrl_pb2 as pb

    services = pb.DESCRIPTOR.services_by_name
    assert set(services["Aggregator"].methods_by_name) == {
        "PushGradients",
        "PushGradientsStream",
        "WatchWeights",
        "Stats",
        "ReportEval",
    }
    assert set(services["ReplayIngest"].methods_by_name) == {"Push", "Stats"}
