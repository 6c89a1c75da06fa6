"""End-to-end: the real fleet on real parts.

Real redis-server processes forming a Redis Cluster, real gRPC servers, every role its own OS
process started through the `fleetrl` CLI. Nothing here is mocked. Each test is bounded in
time and asserts what a user would see: data in Redis, versions advancing, samplers acting
with new weights, the evaluator reporting, a run directory with results.
"""

from __future__ import annotations

import json
import os
import pathlib
import signal
import subprocess
import sys

import numpy as np
import psutil
import pytest

from aggregator.client import AggregatorClient
from buffer.layout import RecordLayout
from fleet.launch.local_cluster import LocalRedisCluster
from fleet.launch.local_fleet import free_port
from foundation.config import RunConfig, with_overrides
from foundation.ledger import read_ledgers
from sim.registry import get_task
from tests.conftest import wait_until

pytestmark = pytest.mark.e2e

TASK = "FetchReach-v4"
# The evaluator scores once (the first version) and then waits longer than the run: a run
# with target 1.0 can then never end early by reaching it (FetchReach often scores 1.00).
ONCE = ("--set", "eval.min_interval_sec=1000", "--set", "eval.max_interval_sec=1000")


def _role(role: str, config_path: pathlib.Path, log_dir: pathlib.Path, *args: str) -> subprocess.Popen:
    with open(log_dir / f"{role}.log", "wb") as log:  # the child keeps its own copy of the fd
        return subprocess.Popen(
            [sys.executable, "-m", "fleet.cli.main", role, "--config", str(config_path), *args],
            stdout=log,
            stderr=subprocess.STDOUT,
        )


def _stop(procs) -> None:
    for _, proc in procs:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
    for _, proc in procs:
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _heartbeat(path: pathlib.Path) -> dict:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


def test_roles_started_by_address_form_a_learning_fleet(tmp_path: pathlib.Path) -> None:
    """Each role is started on its own with the addresses it needs, as across hosts."""
    config = with_overrides(RunConfig(), [f'sim.task="{TASK}"', 'run_id="e2e"', "learner.min_replay_transitions=500"])
    config_path = tmp_path / "config.json"
    config_path.write_text(config.to_json())
    logs = tmp_path / "logs"
    logs.mkdir()
    buffer, aggregator = f"127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}"
    beat = {name: tmp_path / f"{name}.json" for name in ("sampler", "learner", "evaluator")}
    with LocalRedisCluster(num_primaries=3) as cluster:
        # What a multi-host operator types: each role with only the addresses it needs.
        role_args = {
            "aggregator": ["--port", aggregator.split(":")[1], "--run-dir", str(tmp_path / "run")],
            "buffer": ["--port", buffer.split(":")[1], "--redis", cluster.addresses],
            "sampler": ["--buffer", buffer, "--aggregator", aggregator],
            "learner": ["--redis", cluster.addresses, "--aggregator", aggregator],
            "evaluator": ["--buffer", buffer, "--aggregator", aggregator],
        }
        for name, path in beat.items():
            role_args[name] += ["--id", "0", "--heartbeat", str(path)]
        procs = [(role, _role(role, config_path, logs, *args)) for role, args in role_args.items()]
        try:
            with AggregatorClient(aggregator) as agg:
                wait_until(lambda: _stats(agg) and _stats(agg).version >= 50, 150, "version >= 50", procs)
                wait_until(lambda: _stats(agg).last_eval.episodes > 0, 60, "an evaluator report", procs)
                # Sampler, learner and evaluator all watch weights. A role started before the
                # aggregator connects on its next reconnect attempt (at most 2 s apart).
                wait_until(lambda: _stats(agg).subscribers >= 3, 30, "3 weight subscribers", procs)
                stats = _stats(agg)
            assert stats.gradients_applied >= 50
            wait_until(
                lambda: _heartbeat(beat["sampler"]).get("counters", {}).get("version", 0) > 0,
                30,
                "the sampler acting with weights newer than version 0",
                procs,
            )
            _assert_transitions_in_redis(cluster, config)
        finally:
            _stop(procs)
    logs_text = "".join(p.read_text(errors="replace") for p in logs.iterdir())
    assert "Traceback" not in logs_text, logs_text[-3000:]


def _stats(agg: AggregatorClient):
    try:
        return agg.stats()
    except Exception:  # noqa: BLE001 - not up yet
        return None


def _assert_transitions_in_redis(cluster: LocalRedisCluster, config: RunConfig) -> None:
    task = get_task(TASK)
    layout = RecordLayout(config.run_id, task.schema(), config.buffer)
    client = cluster.client()
    try:
        head = int(client.get(layout.head_key) or 0)
        assert head > 0, "no transition reached Redis"
        data = client.get(layout.window_key(0))
        records = layout.decode(data)
        valid = records[records["valid"] == 1]
        assert len(valid) > 0
        transitions = layout.transitions(valid)
        assert transitions.obs.shape[1] == task.obs_dim
        assert np.all(np.isin(transitions.reward, [-1.0, 0.0]))  # sparse Fetch rewards, HER included
        assert np.all(valid["task_id"] == task.task_id)
    finally:
        client.close()


def _train(run_dir: pathlib.Path, *extra: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "fleet.cli.main", "train", "--task", TASK, "--run-dir", str(run_dir), *extra],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, "COLUMNS": "120"},
        start_new_session=True,  # its own process group, so a test can Ctrl-C it like a terminal
    )


def test_train_reaches_target_and_leaves_a_run_directory(tmp_path: pathlib.Path) -> None:
    run_dir = tmp_path / "run"
    proc = _train(run_dir, "--max-wall-sec", "240")
    out, _ = proc.communicate(timeout=300)
    assert proc.returncode == 0, out[-4000:]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["reached_target"], summary
    assert summary["env_steps_to_target"] > 0 and summary["final_version"] > 0
    assert summary["transitions_stored"] > summary["final_env_steps"]  # HER copies stored too
    assert RunConfig.load(run_dir / "config.json").sim.task == TASK
    code = json.loads((run_dir / "code.json").read_text())  # written before the roles started
    assert summary["code"] == code and code["libraries"]["torch"], code
    assert list((run_dir / "checkpoints").glob("ckpt_*.pt")), "no checkpoint written"
    assert list((run_dir / "tb").rglob("events.out.tfevents.*")), "no TensorBoard events"
    evals = [json.loads(line) for line in (run_dir / "evals.jsonl").read_text().splitlines()]
    assert max(e["success_rate"] for e in evals) >= 0.9
    assert "reached 90% evaluation success" in out
    assert "Traceback" not in out
    groups = summary["cpu"]["groups"]
    assert {"aggregator", "buffer", "evaluator", "learner", "sampler", "redis", "launcher"} <= set(groups)
    assert 0 < summary["fleet_overhead_share"] < 1 and groups["learner"]["cpu_sec"] > 0
    # Each process counted once, by itself: no role (the launcher included, whose children are
    # the roles) used more than the whole machine over the run.
    assert all(role["share"] <= 1 for role in summary["cpu"]["roles"].values()), summary["cpu"]["roles"]
    assert [json.loads(line) for line in (run_dir / "progress.jsonl").read_text().splitlines()]
    # Flow control held the run to its replay ratio: the sampler's env steps past its warm-up
    # are at most max_env_steps_per_update per gradient drawn, give or take ten episodes (the
    # pusher's queue, the heartbeats' age; unlimited, the sampler would run ~10x further).
    config = RunConfig.load(run_dir / "config.json")
    sampler, learner = summary["counters"]["sampler-0"], summary["counters"]["learner-0"]  # last heartbeats
    allowed = config.sampler.random_steps + config.sampler.max_env_steps_per_update * learner["pushed"]
    assert sampler["env_steps"] <= allowed + 10 * 50, (sampler, learner)
    assert "rate_limited_sec" in sampler and "rate_limited_sec" in learner
    # One host: the learner's weights and gradients went through /dev/shm, not gRPC, to the end
    # (a busy host once made the learner's watcher give up on the segment minutes into a run).
    aggregator = summary["counters"]["aggregator"]
    assert aggregator["gradients_shared"] > 0.9 * aggregator["gradients_applied"], aggregator
    assert aggregator["weights_shared"] > 0.9 * aggregator["version"], aggregator


def test_ctrl_c_stops_the_fleet_cleanly(tmp_path: pathlib.Path) -> None:
    run_dir = tmp_path / "run"
    proc = _train(run_dir, "--max-wall-sec", "300", "--target-success", "1.0")
    try:
        wait_until(
            lambda: (run_dir / "heartbeats" / "learner-0.json").exists(),
            120,
            "the learner's heartbeat",
            [("train", proc)],
        )
        endpoints = json.loads((run_dir / "metrics.json").read_text())
        assert {"aggregator", "buffer", "sampler-0", "learner-0", "evaluator-0"} <= set(endpoints)
        wait_until(
            lambda: "fleetrl_counter" in _scrape(endpoints["learner-0"]), 60, "learner metrics", [("train", proc)]
        )
        assert "fleetrl_resident_bytes" in _scrape(endpoints["aggregator"])
        children = psutil.Process(proc.pid).children(recursive=True)
        assert any("redis-server" in c.name() for c in children)
        os.killpg(proc.pid, signal.SIGINT)  # what Ctrl-C in a terminal does
        out, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, out[-3000:]
    assert "interrupted" in json.loads((run_dir / "summary.json").read_text())["stop_reason"]
    _, alive = psutil.wait_procs(children, timeout=10)
    assert not alive, f"left running after Ctrl-C: {[p.name() for p in alive]}"


def test_watchdog_restarts_killed_roles_and_training_continues(tmp_path: pathlib.Path) -> None:
    """SIGKILL a sampler, the learner and the aggregator mid-run: all come back, versions keep growing."""
    run_dir = tmp_path / "run"
    extra = ("--max-wall-sec", "300", "--target-success", "1.0", "--set", "aggregator.checkpoint_every_versions=50")
    extra += ONCE
    proc = _train(run_dir, *extra)
    try:
        evals = run_dir / "heartbeats" / "aggregator.json"  # the version, every second
        wait_until(lambda: _last_version(evals) >= 100, 150, "version 100", [("train", proc)])
        before = _last_version(evals)
        for role in ("sampler-0", "learner-0", "aggregator"):
            os.kill(_role_pid(proc, role), signal.SIGKILL)
        wait_until(lambda: _last_version(evals) > before + 50, 120, "versions past the kill", [("train", proc)])
        os.killpg(proc.pid, signal.SIGINT)
        out, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["restarts"] >= 3, out[-3000:]
    assert "sampler-0 exited" in out and "learner-0 exited" in out and "aggregator exited" in out
    events = [json.loads(line)["event"] for line in (run_dir / "events.jsonl").read_text().splitlines()]
    assert any(e.startswith("aggregator exited") for e in events)
    resumed_at = _resumed_versions(run_dir)
    assert resumed_at and resumed_at[0] > before, "a restarted aggregator reused a version already broadcast"
    # --resume continues the stopped run: weights, optimizer and version from its last checkpoint;
    # its wall-clock budget counts the whole run, so 25 s more than the stopped life's.
    final, budget = summary["final_version"], str(round(summary["wall_sec"] + 25))
    again = _train(run_dir, "--resume", str(run_dir), "--max-wall-sec", budget, "--target-success", "1.0")
    out, _ = again.communicate(timeout=120)
    assert _resumed_versions(run_dir)[-1] >= final, out[-3000:]  # a clean stop resumes where it ended
    assert json.loads((run_dir / "summary.json").read_text())["final_version"] > final


def test_the_summary_counts_every_acked_env_step_across_a_buffer_sigkill(tmp_path: pathlib.Path) -> None:
    """SIGKILL the ingest service mid-run; the watchdog restarts it and the run goes on to its
    env-step cap. The summary's env steps are the samplers' acked env steps (their ack ledgers,
    read after the samplers stopped), not a count that restarted from zero with the service."""
    run_dir, acks = tmp_path / "run", tmp_path / "run" / "acks"
    extra = ("--set", "max_env_steps=4000", "--target-success", "1.0", *ONCE)
    proc = _train(run_dir, "--max-wall-sec", "300", *extra)

    def acked_steps() -> int:
        return sum(r["env_steps"] for r in read_ledgers(acks, "sampler-"))

    try:
        wait_until(lambda: acked_steps() >= 1000, 150, "1000 acked env steps", [("train", proc)])
        os.kill(_role_pid(proc, "buffer"), signal.SIGKILL)  # the sampler retries until it is back
        out, _ = proc.communicate(timeout=240)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 1, out[-3000:]  # ended by the cap, short of the target: exit status 1
    assert "buffer exited" in out and "Traceback" not in out
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["stop_reason"] == "max_env_steps 4000 reached", summary["stop_reason"]
    ledger = read_ledgers(acks, "sampler-")
    assert len({(r["incarnation"], r["seq"]) for r in ledger}) == len(ledger)  # one line per acked push
    acked = sum(r["env_steps"] for r in ledger)
    # Counted by the buffer beyond the acked: at most the one push the stopping sampler had in
    # flight (stored, its ack never recorded): one 50-step episode.
    print(f"\nenv steps after a buffer SIGKILL: summary {summary['final_env_steps']}, ledger {acked}")
    assert acked <= summary["final_env_steps"] <= acked + 50, (summary["final_env_steps"], acked)


def test_a_fleet_with_n_step_returns_stores_every_episode(tmp_path: pathlib.Path) -> None:
    """learner.n_step 3 through the real fleet: a truncated episode's last 2 steps store no row,
    so without HER copies (as FetchPush stores an episode that never moved the object) an
    episode has fewer rows than env steps, and the ingest service takes it (it once refused the
    first one, and the sampler died with its pusher thread; only the sync mode had been tested)."""
    run_dir, acks = tmp_path / "run", tmp_path / "run" / "acks"
    n_step = ("--set", "learner.n_step=3", "--set", "sampler.her_k=0")
    extra = ("--set", "max_env_steps=1500", *n_step, "--target-success", "1.0", *ONCE)
    proc = _train(run_dir, "--max-wall-sec", "240", *extra)
    out, _ = proc.communicate(timeout=300)
    assert "Traceback" not in out, out[-4000:]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["stop_reason"] == "max_env_steps 1500 reached", summary["stop_reason"]
    assert summary["restarts"] == 0, out[-3000:]
    assert summary["counters"]["buffer"]["rejected"] == 0, summary["counters"]["buffer"]
    ledger = read_ledgers(acks, "sampler-")
    assert sum(r["env_steps"] for r in ledger) >= 1500
    assert summary["transitions_stored"] == summary["final_env_steps"] // 50 * 48  # 48 rows per episode
    logs = "".join(p.read_text(errors="replace") for p in (run_dir / "logs").iterdir())
    assert "Traceback" not in logs, logs[-3000:]


def test_sigstopped_roles_go_silent_and_are_replaced(tmp_path: pathlib.Path) -> None:
    """SIGSTOP a sampler, then the aggregator: each stops beating, the watchdog replaces it
    (SIGTERM and SIGCONT, so it stops cleanly), and training goes on; no version is reused."""
    run_dir = tmp_path / "run"
    extra = ("--set", "watchdog.heartbeat_timeout_sec=5", "--set", "aggregator.checkpoint_every_versions=50")
    extra += ONCE
    proc = _train(run_dir, "--max-wall-sec", "300", "--target-success", "1.0", *extra)
    events_path = run_dir / "events.jsonl"

    def events() -> list[str]:
        text = events_path.read_text() if events_path.exists() else ""
        return [json.loads(line)["event"] for line in text.splitlines()]

    try:
        evals = run_dir / "heartbeats" / "aggregator.json"  # the version, every second
        wait_until(lambda: _last_version(evals) >= 100, 150, "version 100", [("train", proc)])
        for role in ("sampler-0", "aggregator"):
            before = _last_version(evals)
            stopped = _role_pid(proc, role)
            os.kill(stopped, signal.SIGSTOP)
            silent = f"{role} stopped sending heartbeats"
            wait_until(lambda r=silent: any(e.startswith(r) for e in events()), 60, silent, [("train", proc)])
            assert not psutil.pid_exists(stopped) or psutil.Process(stopped).status() == psutil.STATUS_ZOMBIE
            if role == "aggregator":  # versions from its replacement, past the one it resumed at
                wait_until(lambda: _resumed_versions(run_dir), 60, "the aggregator's replacement", [("train", proc)])
                before = _resumed_versions(run_dir)[0]
            wait_until(lambda b=before: _last_version(evals) > b + 20, 120, f"versions past {role}", [("train", proc)])
        os.killpg(proc.pid, signal.SIGINT)
        out, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, out[-3000:]
    resumed = _resumed_versions(run_dir)
    assert len(resumed) == 1, resumed
    restarted = [e for e in events() if "restarted" in e]
    assert any(e.startswith("sampler-0") for e in restarted) and any(e.startswith("aggregator") for e in restarted)


def test_a_run_short_of_its_target_scores_its_last_checkpoint(tmp_path: pathlib.Path) -> None:
    """The evaluator scores once (the first version) and then waits longer than the run, so the
    run ends on max_wall_sec; the launcher then scores its last checkpoint on 50 episodes, and
    `fleetrl evaluate` scores the same checkpoint on the same held-out seeds alike."""
    run_dir = tmp_path / "run"
    proc = _train(run_dir, "--max-wall-sec", "20", *ONCE)
    out, _ = proc.communicate(timeout=180)
    assert (run_dir / "summary.json").exists(), out[-3000:]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert not summary["reached_target"] and summary["stop_reason"].startswith("max_wall_sec"), out[-3000:]
    newest = max(int(p.stem.split("_")[1]) for p in (run_dir / "checkpoints").glob("ckpt_*.pt"))
    assert summary["final_success_episodes"] == 50 and summary["final_success_version"] == newest, summary
    assert "final score: version" in out
    scored = subprocess.run(
        [sys.executable, "-m", "fleet.cli.main", "evaluate", str(run_dir), "--episodes", "50", "--json"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert scored.returncode == 0, scored.stderr
    result = json.loads(scored.stdout)
    assert (result["version"], result["episodes"]) == (newest, 50)
    assert result["success_rate"] == summary["final_success"]


def _scrape(address: str) -> str:
    import urllib.request

    try:
        return urllib.request.urlopen(f"http://{address}/metrics", timeout=5).read().decode()
    except OSError:
        return ""


def _resumed_versions(run_dir: pathlib.Path) -> list[int]:
    """Every 'resuming at version N' the aggregator logged, in order."""
    text = (run_dir / "logs" / "aggregator.log").read_text()
    return [int(line.rsplit(" ", 1)[1]) for line in text.splitlines() if "resuming at version" in line]


def _last_version(beat: pathlib.Path) -> int:
    """The version in the aggregator's heartbeat file (-1 while there is none)."""
    return int(_heartbeat(beat).get("counters", {}).get("version", -1))


def _role_pid(train: subprocess.Popen, role: str) -> int:
    """The pid of `fleetrl <role>` (sampler-0 -> `sampler --id 0`) under the train process."""
    name, _, index = role.partition("-")
    for child in psutil.Process(train.pid).children(recursive=True):
        try:
            cmd = child.cmdline()
        except psutil.Error:  # gone, or a zombie not reaped yet (a role that just exited)
            continue
        if name in cmd and (not index or cmd[cmd.index("--id") + 1] == index):
            return child.pid
    raise AssertionError(f"no {role} process under the launcher")
