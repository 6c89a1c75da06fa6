"""The test tiers: how a test is classified, the lists naming tests that exist, and the guard
that refuses every way out of a pure test."""

from __future__ import annotations

import ast
import os
import pathlib
import socket
import subprocess
import sys
from types import SimpleNamespace

import grpc
import pytest
import redis

from tests.tier_lists import INTEGRATION, SLOW
from tests.tiers import TierViolation, guard, tier_of

TESTS = pathlib.Path(__file__).resolve().parent


def _item(module: str, name: str, fixtures: tuple[str, ...] = (), e2e: bool = False) -> SimpleNamespace:
    marker = object() if e2e else None
    return SimpleNamespace(
        path=TESTS / module,
        originalname=name,
        name=f"{name}[x]",
        fixturenames=list(fixtures),
        get_closest_marker=lambda m: marker if m == "e2e" else None,
    )


CLASSIFIED = [
    (_item("test_x.py", "test_pure"), "fast"),
    (_item("test_x.py", "test_a", fixtures=("redis_client", "clean_redis_cluster", "redis_cluster")), "integration"),
    (_item("test_sac.py", "test_compiled_losses_give_the_eager_gradients"), "integration"),
    (_item("test_buffer_service.py", "test_anything_new"), "integration"),
    (_item("test_sac.py", "test_a_few_hundred_sac_steps_reduce_the_critic_loss"), "slow"),
    (_item("test_controller.py", "test_anything_new"), "slow"),
    (_item("test_e2e_fleet.py", "test_a_fleet", fixtures=("redis_cluster",), e2e=True), "e2e"),
]


@pytest.mark.parametrize("item,tier", CLASSIFIED, ids=[f"{i.originalname}-{t}" for i, t in CLASSIFIED])
def test_each_test_gets_one_tier(item, tier):
    assert tier_of(item) == tier


@pytest.mark.parametrize("table", [INTEGRATION, SLOW], ids=["INTEGRATION", "SLOW"])
def test_every_listed_test_exists_so_a_rename_cannot_drop_it_into_the_fast_tier(table):
    for module, names in table.items():
        path = TESTS / module
        assert path.exists(), f"{module} is listed but not in tests/"
        tree = ast.parse(path.read_text())
        defined = {n.name for n in tree.body if isinstance(n, ast.FunctionDef) and n.name.startswith("test_")}
        missing = sorted(set(names) - defined - {"*"})
        assert not missing, f"{module}: no such test {missing}: rename it in tests/tier_lists.py"


def test_a_test_is_either_integration_or_slow_never_both():
    both = {m: set(INTEGRATION[m]) & set(SLOW[m]) for m in set(INTEGRATION) & set(SLOW)}
    assert not any(both.values()), both


def _tcp_connect() -> None:
    with socket.socket() as sock:
        sock.connect(("127.0.0.1", 1))


REFUSED = [
    ("starts a subprocess", lambda: subprocess.run([sys.executable, "-c", "pass"])),
    ("forks", lambda: os.fork() == 0 and os._exit(0)),  # a child, were the guard off, leaves at once
    ("connects to Redis", lambda: redis.Redis(port=1, socket_connect_timeout=0.1).ping()),
    ("makes a gRPC server", lambda: grpc.server(None)),
    ("opens a gRPC channel", lambda: grpc.insecure_channel("127.0.0.1:1")),
    ("connects over TCP", _tcp_connect),
]


@pytest.mark.parametrize("what,reach_out", REFUSED, ids=[r[0] for r in REFUSED])
def test_the_guard_refuses_each_way_out_and_records_it_even_when_the_code_catches_it(what, reach_out):
    reached: list[str] = []
    with guard("tests/test_x.py::test_y", reached.append):
        try:
            reach_out()
        except BaseException as err:  # code under test may catch anything: the record stays
            assert isinstance(err, TierViolation), err
    assert len(reached) == 1 and what in reached[0] and "tests/tier_lists.py" in reached[0], reached


def test_the_guard_lets_a_pure_test_use_local_sockets(tmp_path):
    reached: list[str] = []
    with guard("tests/test_x.py::test_y", reached.append):
        left, right = socket.socketpair()
        with left, right, socket.socket(socket.AF_UNIX) as unix:
            left.sendall(b"x")
            assert right.recv(1) == b"x"
            with pytest.raises(FileNotFoundError):
                unix.connect(str(tmp_path / "nobody"))
    assert reached == []
