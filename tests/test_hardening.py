"""Sampler OS hardening: pinning, mlockall, OOM preference; each refusal degrades to a warning.

harden() changes the whole process (affinity, locked memory, OOM score), so the real calls run
in a child interpreter; the in-process tests patch the privileged calls and restore affinity.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from sampler import hardening

REPO = Path(__file__).resolve().parents[1]


def run_child(worker_index: int, pin: bool, mlock: bool) -> dict:
    script = textwrap.dedent(
        f"""
        import json, os
        import threading
        from foundation.process import locked_kib
        from sampler.hardening import harden
        allowed = sorted(os.sched_getaffinity(0))
        report = harden({worker_index}, pin={pin}, mlock={mlock})
        idle = [threading.Thread(target=threading.Event().wait, args=(0.2,)) for _ in range(8)]
        for t in idle: t.start()  # thread stacks mapped after mlockall: reserved, barely touched
        for t in idle: t.join()
        with open("/proc/self/oom_score_adj") as f:
            oom = int(f.read())
        print(json.dumps({{"allowed": allowed, "after": sorted(os.sched_getaffinity(0)), "cpu": report.cpu,
                          "mlocked": report.mlocked, "oom_score_adj": report.oom_score_adj, "oom": oom,
                          "locked_kib": locked_kib(),
                          "warnings": report.warnings}}))
        """
    )
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    done = subprocess.run([sys.executable, "-c", script], cwd=REPO, env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("worker_index", [0, 1, 5])
def test_harden_pins_the_process_to_one_allowed_cpu(worker_index):
    report = run_child(worker_index, pin=True, mlock=False)
    assert report["cpu"] in report["allowed"]
    assert report["after"] == [report["cpu"]]
    assert report["mlocked"] is False


def test_workers_take_the_least_loaded_allowed_cpus_round_robin(monkeypatch):
    # Fake host: CPUs 0-4, this process may use 0-3; CPU 4 is idle but not allowed.
    pinned: list[set[int]] = []
    monkeypatch.setattr(hardening.os, "sched_getaffinity", lambda pid: {0, 1, 2, 3})
    monkeypatch.setattr(hardening.os, "sched_setaffinity", lambda pid, cpus: pinned.append(set(cpus)))
    monkeypatch.setattr(hardening.psutil, "cpu_percent", lambda interval, percpu: [50.0, 0.0, 30.0, 10.0, 0.0])
    cpus = [hardening.pin_to_cpu(i) for i in range(6)]
    assert cpus == [1, 3, 2, 0, 1, 3]
    assert pinned == [{c} for c in cpus]


def test_harden_locks_memory_and_lowers_oom_score_or_says_why_not():
    report = run_child(0, pin=False, mlock=True)
    assert report["cpu"] is None
    assert len(report["after"]) == len(report["allowed"])  # pin=False leaves affinity alone
    if not report["mlocked"]:
        assert any("mlockall failed" in w for w in report["warnings"]), report
    else:  # pinned on touch: eight 8 MiB thread stacks mapped later are not pinned whole
        assert 0 < report["locked_kib"] < 8 * 8 * 1024, report
    if report["oom_score_adj"] is None:
        assert any("oom_score_adj not lowered" in w for w in report["warnings"]), report
    else:
        assert report["oom_score_adj"] == report["oom"] == -500
    assert len(report["warnings"]) == (not report["mlocked"]) + (report["oom_score_adj"] is None)


@pytest.fixture
def restore_affinity():
    allowed, setaffinity = os.sched_getaffinity(0), os.sched_setaffinity  # the real call, even if patched
    yield allowed
    setaffinity(0, allowed)


def _refuse(*args, **kwargs):
    raise OSError(1, "Operation not permitted")


def test_refused_mlock_and_oom_score_give_warnings_not_errors(monkeypatch, restore_affinity):
    monkeypatch.setattr(hardening, "lock_memory", _refuse)
    monkeypatch.setattr(hardening, "prefer_survival", _refuse)
    report = hardening.harden(0, pin=True, mlock=True)
    assert report.cpu in restore_affinity
    assert os.sched_getaffinity(0) == {report.cpu}
    assert report.mlocked is False and report.oom_score_adj is None
    assert len(report.warnings) == 2
    assert "Operation not permitted" in report.warnings[0] and "swapped out" in report.warnings[0]
    assert report.warnings[1].startswith("oom_score_adj not lowered")


def test_refused_pinning_gives_a_warning_and_leaves_affinity(monkeypatch, restore_affinity):
    monkeypatch.setattr(hardening.os, "sched_setaffinity", _refuse)
    monkeypatch.setattr(hardening, "prefer_survival", _refuse)
    report = hardening.harden(3, pin=True, mlock=False)
    assert report.cpu is None
    assert os.sched_getaffinity(0) == restore_affinity
    assert report.warnings[0].startswith("CPU pinning refused")
    assert "floats across CPUs" in report.warnings[0]


def test_refused_mlockall_syscall_raises_oserror_with_errno(monkeypatch):
    class FakeLibc:
        def mlockall(self, flags):
            assert flags == hardening.MCL_CURRENT | hardening.MCL_FUTURE | hardening.MCL_ONFAULT
            return -1

    monkeypatch.setattr(hardening.ctypes, "CDLL", lambda *a, **k: FakeLibc())
    monkeypatch.setattr(hardening.ctypes, "get_errno", lambda: 12)
    monkeypatch.setattr(hardening.resource, "setrlimit", _refuse)
    with pytest.raises(OSError, match="mlockall failed") as err:
        hardening.lock_memory()
    assert err.value.errno == 12


def test_a_kernel_without_mcl_onfault_gets_current_and_future(monkeypatch):
    calls: list[int] = []

    class OldKernelLibc:
        def mlockall(self, flags):
            calls.append(flags)
            return -1 if flags & hardening.MCL_ONFAULT else 0

    monkeypatch.setattr(hardening.ctypes, "CDLL", lambda *a, **k: OldKernelLibc())
    monkeypatch.setattr(hardening.ctypes, "get_errno", lambda: hardening.errno.EINVAL)
    hardening.lock_memory()
    assert calls == [7, 3]


def test_samplers_the_buffer_and_the_evaluator_do_not_load_torch():
    """torch is ~200 MiB resident, and a sampler pins what it touches (mlockall): the roles that
    never encode or decode a checkpoint must not import it (the CLI once did, for an error type)."""
    code = (
        "import sys, fleet.cli.main, sampler.worker, sampler.evaluator, buffer.service; "
        "print(sorted(m for m in sys.modules if m == 'torch' or m.startswith('torch.')))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=REPO)
    assert out.stdout.strip() == "[]", out.stdout
