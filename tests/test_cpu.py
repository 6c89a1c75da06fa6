"""CpuMeter: CPU-seconds per role across restarts, shares of the machine, overhead groups."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from foundation.cpu import CpuMeter, role_group


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
