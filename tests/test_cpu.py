"""CpuMeter: CPU-seconds per role across restarts, shares of the machine, overhead groups."""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
import time
from types import SimpleNamespace

import psutil
import pytest

from foundation.cpu import CpuMeter, own_cpu_sec, role_group


@pytest.mark.parametrize(
    "name,group",
    [("sampler-3", "sampler"), ("redis-7001", "redis"), ("aggregator", "aggregator"), ("learner-10", "learner")],
)
def test_role_group_strips_the_index(name, group):
    assert role_group(name) == group


def _burn(seconds: float) -> subprocess.Popen:
    code = f"import time\nend = time.process_time() + {seconds}\nwhile time.process_time() < end: pass\ninput()"
    return subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE)


def test_a_role_total_sums_every_incarnation_and_the_report_splits_overhead():
    meter = CpuMeter()
    first, second = _burn(0.3), _burn(0.3)
    try:
        for proc in (first, second):  # wait until each has burnt its CPU, then sample it
            while True:
                meter.sample({"sampler-0": proc.pid})
                if meter.seconds().get("sampler-0", 0.0) >= (0.3 if proc is first else 0.6) - 0.02:
                    break
        meter.sample({"aggregator": os.getpid(), "no-such-role": 2**22 + 7})  # a gone pid is skipped
    finally:
        for proc in (first, second):
            proc.kill()
            proc.wait()
    seconds = meter.seconds()
    assert seconds["sampler-0"] >= 0.58 and "no-such-role" not in seconds
    report = meter.report(wall_sec=10.0, cores=2)
    sampler = report["roles"]["sampler-0"]
    assert sampler["share"] == pytest.approx(sampler["cpu_sec"] / 20.0, abs=1e-4)
    assert report["groups"]["sampler"]["cpu_sec"] == sampler["cpu_sec"]
    assert report["overhead_share"] == pytest.approx(report["groups"]["aggregator"]["cpu_sec"] / 20.0, abs=1e-4)
    assert report["peak_rss_mib"]["aggregator"] > 10  # this test process: a Python interpreter at least
    assert report["peak_locked_mib"]["aggregator"] >= 0


def test_readings_of_one_pid_replace_each_other_and_a_restart_adds_its_own():
    meter = CpuMeter()
    meter.record("sampler-0", 100, 1.0)
    meter.record("sampler-0", 100, 2.5)  # the same process later: its CPU so far, not more of it
    meter.record("sampler-0", 200, 0.5)  # restarted: a new pid, counted beside the first
    meter.record("launcher", 1, 0.25)
    assert meter.seconds() == {"sampler-0": 3.0, "launcher": 0.25}
    report = meter.report(wall_sec=10.0, cores=2)
    assert report["roles"]["sampler-0"] == {"cpu_sec": 3.0, "share": 0.15}
    assert report["overhead_share"] == 0.0125  # the launcher's 0.25 s of 20 core-seconds


def test_own_cpu_leaves_out_reaped_children():
    times = SimpleNamespace(user=1.5, system=0.5, children_user=70.0, children_system=8.0)  # psutil's fields
    assert own_cpu_sec(times) == 2.0


def test_a_process_is_not_charged_for_what_ran_before_it_exec_d():
    """`./scripts/train.sh` runs pip, then execs the launcher: the children's CPU a process
    inherits across exec is not the launcher's own."""
    burn = "import time\nend = time.process_time() + 0.5\nwhile time.process_time() < end: pass"
    script = f"{shlex.quote(sys.executable)} -c {shlex.quote(burn)}; exec {shlex.quote(sys.executable)} -c 'input()'"
    proc = subprocess.Popen(["bash", "-c", script], stdin=subprocess.PIPE)
    try:
        while True:  # until bash has exec'd Python: the burn is reaped and counted as children's
            times = psutil.Process(proc.pid).cpu_times()
            if times.children_user + times.children_system >= 0.45:
                break
            time.sleep(0.05)
        meter = CpuMeter()
        meter.sample({"launcher": proc.pid})
    finally:
        proc.kill()
        proc.wait()
    assert meter.seconds()["launcher"] < 0.45, meter.seconds()
