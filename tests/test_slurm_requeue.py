"""A fleet's Slurm job warned and requeued mid-run completes its run, on the real slurmctld and
slurmd of tests/test_slurm.py.

The job runs the spec's two hosts as `fleetrl fleet slurm --submit` writes it. Once a trained
version is scored, the test sends the batch shell Slurm's warning (`scancel --signal=USR1
--batch`, what `--signal=B:USR1@<slurm.warning_sec>` sends before the time limit or, with
PreemptParameters=send_user_signal, at a preemption): the fleet checkpoints and stops, the job
requeues itself, waits out Slurm's requeue delay (cred_expire, 10 s here) and starts again in the
same run directory, where its hosts continue the run. The test checks the whole run: one
summary.json with `resumes` 1, the version going on from the clean checkpoint (none reused),
the Redis data kept (the buffer's counters go on from where they were), and the timeline of
the job in order, printed.
"""

from __future__ import annotations

import json
import pathlib
import re
import time
from collections.abc import Iterator

import pytest

from foundation.checkpoint import latest_checkpoint, load_checkpoint
from tests.conftest import wait_until
from tests.test_e2e_multihost import _last_version
from tests.test_slurm import Slurm, _job_log, _submit, _wait_job_gone, slurm_cluster

pytestmark = pytest.mark.e2e

REQUEUE_WAIT_SEC = 10  # cred_expire: how long Slurm holds a requeued job before it may start again


@pytest.fixture(scope="module")
def slurm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Slurm]:
    with slurm_cluster(tmp_path_factory, 2049, cred_expire_sec=REQUEUE_WAIT_SEC) as cluster:
        yield cluster


def _job_events(log: str) -> list[tuple[str, float]]:
    """(event, unix time) of every `fleetrl-job <time> <event>: ...` line of the job's output."""
    found = re.findall(r"^fleetrl-job (\d+\.\d+) ([a-z ]+?)(?::|$)", log, re.MULTILINE)
    return [(event, float(stamp)) for stamp, event in found]


def _progress(run_dir: pathlib.Path) -> list[dict]:
    path = run_dir / "progress.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []


def _warn_and_wait_for_the_requeue(slurm: Slurm, job: str, run_dir: pathlib.Path) -> dict:
    """Slurm's warning once a trained version is scored; what the first life left once the job
    has requeued itself (read before the requeued job starts, at least REQUEUE_WAIT_SEC later)."""

    def trained() -> bool:
        state = slurm.job_state(job)
        assert state in ("PENDING", "CONFIGURING", "RUNNING"), (
            f"job {job} {state} before the warning:\n" + _job_log(run_dir, job)[-3000:]
        )
        # Mid-run: a trained version scored, and the aggregator's host has read the services
        # (its first progress line). The first score can come before that read, and a warning
        # then would leave this life no line to count from.
        return _last_version(run_dir) > 0 and bool(_progress(run_dir))

    wait_until(trained, 300, lambda: "a score of a trained version and a progress line:\n" + _job_log(run_dir, job))
    slurm.run("scancel", "--signal=USR1", "--batch", job)
    requeued = lambda: "the job to requeue itself:\n" + _job_log(run_dir, job)  # noqa: E731
    wait_until(lambda: any(e == "requeued" for e, _ in _job_events(_job_log(run_dir, job))), 120, requeued)
    last = latest_checkpoint(run_dir / "checkpoints")
    assert last is not None, _job_log(run_dir, job)[-3000:]
    state = load_checkpoint(last)
    assert state["clean_shutdown"], f"{last.name}: the warned aggregator wrote no checkpoint on its way out"
    return {
        "version": int(state["version"]),
        "checkpointed": last.stat().st_mtime,
        "env_steps": _progress(run_dir)[-1]["env_steps"],
        "summary": json.loads((run_dir / "summary.json").read_text()),
    }


def _timeline(submitted: float, first: dict, run_dir: pathlib.Path, log: str) -> list[tuple[str, float]]:
    """The job's events in the order they must come, each at its time (the job's output, the
    clean checkpoint's file, lives.jsonl, summary.json)."""
    events = _job_events(log)
    names = [e for e, _ in events]
    assert names == ["started", "warned", "fleet stopped", "requeued", "resumed", "fleet stopped"], log[-3000:]
    lives = [json.loads(line) for line in (run_dir / "lives.jsonl").read_text().splitlines()]
    second_start = next(e["started_unix"] for e in lives if e["life"] == 1 and e["event"] == "start")
    at = dict(
        zip(["started", "warned", "stopped", "requeued", "resumed", "ended"], (t for _, t in events), strict=True)
    )
    return [
        ("submitted", submitted),
        ("started (job line)", at["started"]),
        ("warned (SIGUSR1 to the batch shell)", at["warned"]),
        ("checkpointed (clean checkpoint written)", first["checkpointed"]),
        ("fleet stopped", at["stopped"]),
        ("requeued (scontrol requeue)", at["requeued"]),
        ("resumed (job line, restart 1)", at["resumed"]),
        ("life 1 started (lives.jsonl)", second_start),
        ("summary.json written", (run_dir / "summary.json").stat().st_mtime),
        ("completed (fleet stopped, status 0)", at["ended"]),
    ]


@pytest.mark.timeout(1200)
def test_a_warned_and_requeued_job_resumes_the_same_run_and_completes_it(slurm: Slurm, tmp_path: pathlib.Path) -> None:
    submitted = time.time()
    job, run_dir = _submit(slurm, tmp_path, {"max_wall_sec": 240})
    first = _warn_and_wait_for_the_requeue(slurm, job, run_dir)
    assert first["summary"]["stop_reason"] == "interrupted (Ctrl-C or SIGTERM)"
    state = _wait_job_gone(slurm, job, run_dir, 600)
    log = _job_log(run_dir, job)
    timeline = _timeline(submitted, first, run_dir, log)
    print(f"\njob {job} timeline (seconds after submission):")
    print("\n".join(f"  {t - submitted:7.1f}  {what}" for what, t in timeline))
    assert [t for _, t in timeline] == sorted(t for _, t in timeline), timeline
    summary = json.loads((run_dir / "summary.json").read_text())
    print(f"job {job}: {state}; {summary['stop_reason']}; resumes {summary['resumes']}; version "
          f"{first['version']} at the requeue, {summary['final_version']} at the end")  # fmt: skip
    assert state == "COMPLETED", log[-3000:]
    assert (
        summary["resumes"] == 1 and [life["ended"] for life in summary["lives"]][0] == first["summary"]["stop_reason"]
    )
    assert summary["stop_reason"].startswith(("evaluation success", "max_wall_sec 240.0 reached"))
    # The version goes on from the clean checkpoint: the aggregator restored it, and no version
    # of the second life is below it (a version number never names two sets of weights).
    aggregator_log = (run_dir / "services" / "logs" / "aggregator.log").read_text()
    assert f"restored checkpoint version {first['version']}; resuming at version {first['version']}" in aggregator_log
    second = [row for row in _progress(run_dir) if row.get("life") == 1]
    assert second and min(row["version"] for row in second) >= first["version"]
    assert summary["final_version"] > first["version"], "the second life trained no further"
    # The buffer was kept: the Redis nodes started on their data, so its counters go on.
    assert "the buffer as it was" in log, log[-3000:]
    assert second[0]["env_steps"] >= first["env_steps"] and summary["final_env_steps"] > first["env_steps"]
    assert (run_dir / "redis" / "services" / "node0" / "nodes.conf").exists()
