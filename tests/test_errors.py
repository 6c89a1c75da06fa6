"""One error root: every error fleetrl raises on purpose is a FleetrlError, and keeps its builtin base."""

from __future__ import annotations

import pytest

from aggregator.core import GradientError
from buffer.client import EmptyBufferError
from buffer.ingest_client import IngestUnavailable, PushRejected
from deploy_npu.audit import OpAuditError
from fleet.launch.cluster_admin import LocalClusterError
from fleet.launch.watchdog import RoleFailed
from fleet.report.render import ReportError
from foundation.checkpoint import CheckpointError
from foundation.config import ConfigError, RunConfig, with_overrides
from foundation.errors import FleetrlError
from foundation.transport import SecurityError
from foundation.wire import WireError
from sim.registry import UnknownTaskError

# (type, the builtin base callers already catch, the CLI's exit status)
ERRORS = [
    (ConfigError, ValueError, 2),
    (SecurityError, ValueError, 2),
    (CheckpointError, ValueError, 2),
    (WireError, ValueError, 2),
    (ReportError, ValueError, 2),
    (UnknownTaskError, ValueError, 2),
    (PushRejected, ValueError, 2),
    (GradientError, ValueError, 2),
    (OpAuditError, ValueError, 2),
    (EmptyBufferError, RuntimeError, 1),
    (RoleFailed, RuntimeError, 1),
    (LocalClusterError, RuntimeError, 1),
    (IngestUnavailable, ConnectionError, 1),
]


@pytest.mark.parametrize("error,base,status", ERRORS, ids=[e[0].__name__ for e in ERRORS])
def test_every_error_has_one_root_and_keeps_its_base(error, base, status):
    assert issubclass(error, FleetrlError) and issubclass(error, base)
    assert error.exit_status == status


def test_there_is_one_checkpoint_error():
    import deploy_npu
    from deploy_npu import freeze

    assert deploy_npu.CheckpointError is freeze.CheckpointError is CheckpointError


def test_a_config_error_names_its_field():
    with pytest.raises(ConfigError) as err:
        with_overrides(RunConfig(), ["sampler.her_k=-1"]).validate()
    assert err.value.field == "sampler.her_k"
    with pytest.raises(ConfigError) as err:
        with_overrides(RunConfig(), ["sim.task=FetchRaech-v4"]).validate()
    assert err.value.field == "sim.task"


def test_wire_and_gradient_errors_name_their_field():
    assert WireError("columns[obs].shape", "bad").field == "columns[obs].shape"
    assert GradientError("actor", "bad").field == "actor"
    assert FleetrlError("no field").field is None


def test_the_cli_catches_the_root_and_exits_with_its_status(monkeypatch, capsys):
    from fleet.cli import fleet_cmds, main

    def fail(args):
        raise RoleFailed("learner-0 kept dying")

    monkeypatch.setattr(fleet_cmds, "run_fleet", fail)
    assert main.main(["fleet", "up", "spec.yaml", "--host", "a"]) == 1
    assert "fleetrl fleet up: error: learner-0 kept dying" in capsys.readouterr().err
