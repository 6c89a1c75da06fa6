"""Local fleet runs side by side: each arm is `fleetrl train` with its own options, same task.

    python3 benchmarks/fleet_arms.py --task FetchPush-v4 --arm base= \\
        --arm threads2="--set learner.torch_threads=2" [--max-wall-sec 240] [--repeats 2] [--out R.json]

An arm's options may start with environment settings (`--arm passive="OMP_WAIT_POLICY=PASSIVE
--set learner.torch_threads=2"`): every process of that arm's fleet inherits them.

Arms run one after another, interleaved (a, b, a, b, ...), so a noisy machine affects them
alike; nothing else should run. Per run: updates and env steps per second in steady state (from
`--steady-from` seconds on, from progress.jsonl), the learner's CPU share of the machine, the
fleet overhead share (summary.json cpu), the best curve success, and the gradients the learners
pushed per second with the share of them dropped as stale (summary.json counters: with several
learners, what separates gradients computed from versions made). Medians over repeats, and
each arm's over the first arm's, printed last.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import shlex
import subprocess
import sys
import tempfile

from harness import (
    REPO,
    median_figures,
    print_table,
    ratio,
    repeats_arg,  # benchmarks/harness.py (this script's folder)
    result_record,
    run_interleaved,
    write_result,
)

KEYS = (
    "steady_updates_per_sec",
    "steady_env_steps_per_sec",
    "learner_share",
    "overhead_share",
    "best_success",
    "gradients_per_sec",
    "stale_share",
)

RATIO_KEYS = (*KEYS[:3], "gradients_per_sec")


def steady(run_dir: pathlib.Path, since_sec: float, key: str) -> float | None:
    """Rate of progress.jsonl's `key` from the first row at or after `since_sec` to the last."""
    rows = [json.loads(line) for line in (run_dir / "progress.jsonl").read_text().splitlines() if line.strip()]
    later = [r for r in rows if r["wall_sec"] >= since_sec]
    if len(later) < 2 or later[-1]["wall_sec"] <= later[0]["wall_sec"]:
        return None
    return (later[-1][key] - later[0][key]) / (later[-1]["wall_sec"] - later[0]["wall_sec"])


def gradient_counts(summary: dict) -> tuple[float | None, float | None]:
    """(gradients the learners pushed per second of the run, the share of them the aggregator
    dropped as stale) from summary.json's aggregator counters. With several learners and
    aggregator.grads_per_step 1, versions/s is what is left of gradients/s after the stale ones."""
    counts = summary.get("counters", {}).get("aggregator", {})
    applied, stale = counts.get("gradients_applied"), counts.get("gradients_stale")
    if applied is None or stale is None or not summary.get("wall_sec"):
        return None, None
    pushed = applied + stale
    return pushed / summary["wall_sec"], (stale / pushed if pushed else None)


def split_env(options: list[str]) -> tuple[dict[str, str], list[str]]:
    """Leading KEY=VALUE words (environment settings), then the fleetrl train options."""
    env: dict[str, str] = {}
    while options and "=" in options[0] and not options[0].startswith("-"):
        key, _, value = options.pop(0).partition("=")
        env[key] = value
    return env, options


def run(name: str, options: list[str], args: argparse.Namespace, repeat: int, root: pathlib.Path) -> dict:
    run_dir = root / f"{name}-{repeat}"
    env, options = split_env(list(options))
    cmd = [sys.executable, "-m", "fleet.cli.main", "train", "--task", args.task, "--seed", str(args.seed), *options]
    cmd += ["--run-dir", str(run_dir), "--max-wall-sec", str(args.max_wall_sec), "--set", "eval.final_episodes=0"]
    print(f"{name} #{repeat}: {' '.join(f'{k}={v}' for k, v in env.items())} {shlex.join(cmd[3:])}", flush=True)
    subprocess.run(cmd, cwd=REPO, env=os.environ | env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                   timeout=args.max_wall_sec + 600)  # fmt: skip
    s = json.loads((run_dir / "summary.json").read_text())
    cpu = s["cpu"]
    gradients_per_sec, stale_share = gradient_counts(s)
    return {
        "repeat": repeat,
        "steady_updates_per_sec": steady(run_dir, args.steady_from, "version"),
        "steady_env_steps_per_sec": steady(run_dir, args.steady_from, "env_steps"),
        "learner_share": cpu["groups"]["learner"]["share"],
        "overhead_share": cpu["overhead_share"],
        "best_success": s["best_success"],
        "gradients_per_sec": gradients_per_sec,
        "stale_share": stale_share,
        "updates": s["final_version"],
        "env_steps": s["final_env_steps"],
        "wall_sec": s["wall_sec"],
        "stop_reason": s["stop_reason"],
    }


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--task", default="FetchPush-v4")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--arm", action="append", required=True, help='NAME="fleetrl train options" (may be empty)')
    p.add_argument("--max-wall-sec", type=float, default=240.0)
    p.add_argument("--steady-from", type=float, default=60.0, help="steady-state rates from this second on")
    p.add_argument("--repeats", type=repeats_arg, default=2)
    p.add_argument("--out", help="write the raw result here")
    return p


def over_first(medians: dict[str, dict[str, float | None]]) -> dict[str, dict[str, float | None]]:
    """Each arm's RATIO_KEYS medians over the first arm's."""
    base = next(iter(medians))
    return {name: {k: ratio(m[k], medians[base][k]) for k in RATIO_KEYS} for name, m in medians.items() if name != base}


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    arms = {name: shlex.split(options) for name, _, options in (a.partition("=") for a in args.arm)}
    root = pathlib.Path(tempfile.mkdtemp(prefix="fleetrl-arms-"))
    runs = run_interleaved(
        {name: (lambda r, n=name, o=options: run(n, o, args, r, root)) for name, options in arms.items()}, args.repeats
    )
    medians = {name: {k: m.get(k) for k in KEYS} for name, m in median_figures(runs).items()}
    ratios = over_first(medians)
    if args.out:
        figures = {"task": args.task, "arms": {n: shlex.join(o) for n, o in arms.items()}, "runs": runs}
        write_result(result_record("fleet_arms", figures | {"medians": medians, "over_first": ratios}), args.out)
    print_table(f"{args.task}, {args.max_wall_sec:.0f} s runs, medians of {args.repeats}", medians)
    print_table(f"over {next(iter(arms))}", ratios)
    return 0


if __name__ == "__main__":
    sys.exit(main())
