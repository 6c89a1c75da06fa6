"""What a whole-fleet crash costs: time to the target of a run SIGKILLed and resumed ÷ the same
seed uninterrupted, with the replay buffer kept (buffer.durable, the default) and thrown away.

    python3 benchmarks/resume_cost.py --task FetchPush-v4 --seeds 0 1 2 --out-dir runs/resume \\
        [--kill-fraction 0.5 | --kill-at-sec 900] [--arms uninterrupted,kept,thrown-away] \\
        [--max-wall-sec 1200] [--json out.json] [-- --set FIELD=VALUE ...]

Each seed runs its arms one after the other, each a real `fleetrl train` (its own process
group): `uninterrupted` to the target; `kept` and `thrown-away` SIGKILLed whole (launcher,
roles and redis-servers together, nothing saved) at `--kill-fraction` of the same seed's
uninterrupted time to the target (or at `--kill-at-sec`), then `fleetrl train --resume` until
the target. `thrown-away` runs with buffer.durable=false, so its resumed life starts with an
empty buffer.

Every figure is counted by this script's own clock and files, beside what the run's summary
says: time to the target is the killed life's seconds up to the kill plus the resumed life's
up to the first complete full score at or above the target (evals.jsonl's times); a score
after the resume against the last before it, with one 50-episode standard error of the one
before; acked transitions lost, audited from the samplers' ack ledgers against the rows the
kept Redis data holds (fleet/chaos/kept_buffer.py); versions acked after the kill at or below
one acked before it. Arms already in `--json` are not run again, so the script continues
where it stopped.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import pathlib
import signal
import statistics
import subprocess
import sys
import time
from typing import Any

import psutil
from harness import (  # benchmarks/harness.py (this script's folder)
    result_record,
    start_train,
    stopped_on_ctrl_c,
    wait_train,
    write_result,
)

from fleet.chaos.audit import read_acks, versions_reused
from fleet.chaos.kept_buffer import EvictedError, audit_kept_buffer
from fleet.report.progress import read_jsonl
from foundation.config import RunConfig

ARMS = ("uninterrupted", "kept", "thrown-away")
SCORE_EPISODES = 50  # the standard error a score after the resume is held to


def _target_time(run_dir: pathlib.Path, since: float) -> float | None:
    """Unix time of the first complete full score at or above the run's target after `since`."""
    config = RunConfig.load(run_dir / "config.json")
    for row in read_jsonl(run_dir / "evals.jsonl"):
        complete = row.get("kind") == "full" and row["episodes"] >= config.eval.episodes
        if complete and row["time"] >= since and row["success_rate"] >= config.target_success:
            return float(row["time"])
    return None


def _kill_whole(proc: subprocess.Popen) -> float:
    """SIGKILL to the run's process group; returns once every member is gone, with the kill's time."""
    members = [psutil.Process(proc.pid), *psutil.Process(proc.pid).children(recursive=True)]
    killed_at = time.time()
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(timeout=60)
    _, alive = psutil.wait_procs(members, timeout=60)
    if alive:
        raise RuntimeError(f"alive after SIGKILL: {[p.name() for p in alive]}")
    return killed_at


def uninterrupted(run_dir: pathlib.Path, base: list[str]) -> dict[str, Any]:
    started = time.time()
    proc = start_train([*base, "--run-dir", str(run_dir)], run_dir.with_suffix(".log"))
    wait_train(proc)
    reached = _target_time(run_dir, started)
    summary = json.loads((run_dir / "summary.json").read_text())
    return {
        "run_dir": str(run_dir),
        "exit_status": proc.returncode,
        "sec_to_target": None if reached is None else round(reached - started, 1),
        "summary_wall_sec_to_target": summary.get("wall_sec_to_target"),
        "env_steps_to_target": summary.get("env_steps_to_target"),
    }


def _score_around(run_dir: pathlib.Path, killed_at: float, resumed_at: float) -> dict[str, Any]:
    """The last curve score before the kill and the first after the resume."""
    curve = [r for r in read_jsonl(run_dir / "evals.jsonl") if r.get("kind") == "curve"]
    before = [r for r in curve if r["time"] < killed_at]
    after = [r for r in curve if r["time"] >= resumed_at]
    if not before or not after:
        return {"before": None, "after": None}
    last, first = before[-1], after[0]
    p = float(last["success_rate"])
    stderr = math.sqrt(p * (1 - p) / SCORE_EPISODES)
    return {
        "before": {k: last[k] for k in ("version", "success_rate", "episodes", "env_steps")},
        "after": {k: first[k] for k in ("version", "success_rate", "episodes", "env_steps")},
        "stderr_50_episodes": round(stderr, 3),
        "drop_within_one_stderr": p - float(first["success_rate"]) <= stderr,
    }


def killed(run_dir: pathlib.Path, base: list[str], kill_at_sec: float, kept: bool) -> dict[str, Any]:
    log = run_dir.with_suffix(".log")
    extra = [] if kept else ["--set", "buffer.durable=false"]
    started = time.time()
    first = start_train([*base, *extra, "--run-dir", str(run_dir)], log)
    with stopped_on_ctrl_c(first):
        while time.time() - started < kill_at_sec and first.poll() is None:
            time.sleep(0.5)
    if first.poll() is not None:
        return {"run_dir": str(run_dir), "error": f"the run ended ({first.returncode}) before the kill"}
    killed_at = _kill_whole(first)
    acked_before = [r for r in read_acks(run_dir / "acks", "sampler-") if r["time"] < killed_at]
    learner_before = [r for r in read_acks(run_dir / "acks", "learner-") if r["time"] < killed_at]
    resumed_at = time.time()
    second = start_train(["--resume", str(run_dir)], log)  # the run's config, buffer.durable included
    wait_train(second)
    reached = _target_time(run_dir, resumed_at)
    summary = json.loads((run_dir / "summary.json").read_text())
    result: dict[str, Any] = {
        "run_dir": str(run_dir),
        "exit_status": second.returncode,
        "killed_after_sec": round(killed_at - started, 1),
        "sec_to_target": None if reached is None else round(killed_at - started + reached - resumed_at, 1),
        "summary_wall_sec_to_target": summary.get("wall_sec_to_target"),
        "env_steps_to_target": summary.get("env_steps_to_target"),
        "resumes": summary.get("resumes"),
        "version_acked_before_kill": max((int(r["version"]) for r in learner_before), default=None),
        "versions_reused": versions_reused(read_acks(run_dir / "acks", "learner-"), [killed_at]),
        "acked_transitions_before_kill": sum(int(r["transitions"]) for r in acked_before),
        "score": _score_around(run_dir, killed_at, resumed_at),
    }
    if kept:
        try:
            audit = audit_kept_buffer(run_dir, read_acks(run_dir / "acks", "sampler-"))
            result["audit"] = {
                "acked_transitions": audit.acked_transitions,
                "lost": audit.lost,
                "doubled": audit.doubled,
                "acked_twice": audit.acked_twice,
            }
        except EvictedError as e:
            result["audit"] = {"error": str(e)}
    return result


def _ratios(arms: dict[str, dict[str, Any]]) -> dict[str, float | None]:
    base = arms.get("uninterrupted", {}).get("sec_to_target")
    out = {}
    for arm in ("kept", "thrown-away"):
        t = arms.get(arm, {}).get("sec_to_target")
        out[arm] = round(t / base, 3) if t and base else None
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--task", required=True, help="the task, with its preset")
    p.add_argument("--seeds", type=int, nargs="+", default=[0])
    p.add_argument("--arms", default=",".join(ARMS), help=f"comma-separated, of {', '.join(ARMS)}")
    p.add_argument("--kill-fraction", type=float, default=0.5, help="of the seed's uninterrupted time to target")
    p.add_argument("--kill-at-sec", type=float, help="kill at this many seconds instead (no uninterrupted arm needed)")
    p.add_argument("--max-wall-sec", type=float, default=1200.0, help="every run's budget, both lives together")
    p.add_argument("--out-dir", required=True, help="the runs' directories and logs")
    p.add_argument("--json", help="the raw result, written after every arm; arms already in it are kept")
    p.add_argument("overrides", nargs="*", help="after --: more fleetrl train arguments for every run")
    args = p.parse_args(argv)
    arms = [a for a in args.arms.split(",") if a]
    unknown = sorted(set(arms) - set(ARMS))
    if unknown:
        p.error(f"--arms: unknown {', '.join(unknown)} (known: {', '.join(ARMS)})")
    out_dir = pathlib.Path(args.out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    done: dict[str, dict[str, Any]] = {}
    if args.json and pathlib.Path(args.json).exists():
        done = json.loads(pathlib.Path(args.json).read_text())["figures"]["seeds"]
    for seed in args.seeds:
        base = ["--task", args.task, "--seed", str(seed), "--max-wall-sec", str(args.max_wall_sec), *args.overrides]
        results = done.setdefault(str(seed), {})
        for arm in arms:
            if arm in results and "error" not in results[arm]:
                continue
            run_dir = out_dir / f"seed{seed}-{arm}"
            if run_dir.exists():
                raise SystemExit(f"{run_dir} exists: remove it or pass another --out-dir")
            if arm == "uninterrupted":
                results[arm] = uninterrupted(run_dir, base)
            else:
                to_target = results.get("uninterrupted", {}).get("sec_to_target")
                kill_at = args.kill_at_sec or (to_target and args.kill_fraction * to_target)
                if not kill_at:
                    raise SystemExit(f"seed {seed}: no uninterrupted time to target to kill at a fraction of")
                results[arm] = killed(run_dir, base, kill_at, kept=arm == "kept")
            results["ratio_to_uninterrupted"] = _ratios(results)
            print(f"seed {seed} {arm}: {json.dumps(results[arm])}", flush=True)
            if args.json:
                write_result(result_record("resume_cost", _figures(done)), args.json)
    print(json.dumps(_figures(done)["medians"], indent=2))
    return 0


def _figures(seeds: dict[str, dict[str, Any]]) -> dict[str, Any]:
    medians: dict[str, float | None] = {}
    for arm in ("kept", "thrown-away"):
        ratios = [
            r["ratio_to_uninterrupted"][arm] for r in seeds.values() if r.get("ratio_to_uninterrupted", {}).get(arm)
        ]
        medians[f"{arm}_ratio_median"] = statistics.median(ratios) if ratios else None
        medians[f"{arm}_ratio_worst"] = max(ratios) if ratios else None
    return {"seeds": seeds, "medians": medians}


if __name__ == "__main__":
    sys.exit(main())
