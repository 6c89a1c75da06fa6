"""The command line: each role's help lists the flags that role reads, and no other."""

from __future__ import annotations

import pytest

from fleet.cli import main

SERVICE_FLAGS = ("--port", "--listen", "--advertise", "--ready-file")


@pytest.mark.parametrize(
    "role,has,lacks",
    [
        ("buffer", ("--redis", *SERVICE_FLAGS), ("--run-dir", "--ack-log", "--aggregator")),
        ("aggregator", (*SERVICE_FLAGS, "--run-dir"), ("--redis", "--ack-log", "--buffer")),
        ("learner", ("--redis", "--aggregator", "--ack-log"), (*SERVICE_FLAGS, "--run-dir", "--buffer")),
        ("sampler", ("--buffer", "--aggregator", "--ack-log"), (*SERVICE_FLAGS, "--run-dir", "--redis")),
        ("evaluator", ("--buffer", "--aggregator"), (*SERVICE_FLAGS, "--run-dir", "--ack-log", "--redis")),
    ],
)
def test_a_role_help_lists_only_the_flags_it_reads(role, has, lacks, capsys):
    with pytest.raises(SystemExit) as done:
        main([role, "--help"])
    assert done.value.code == 0
    words = set(capsys.readouterr().out.replace(",", " ").split())
    assert {"--id", "--heartbeat", "--metrics", "--config", *has} <= words
    assert not words & set(lacks), words & set(lacks)


def test_a_flag_a_role_does_not_read_is_refused(capsys):
    with pytest.raises(SystemExit) as done:
        main(["learner", "--redis", "127.0.0.1:7000", "--aggregator", "127.0.0.1:50052", "--listen", "0.0.0.0:1"])
    assert done.value.code == 2 and "unrecognized arguments: --listen" in capsys.readouterr().err
