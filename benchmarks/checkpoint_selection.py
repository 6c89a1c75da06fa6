"""Would shipping the version the evaluator scored best beat shipping the run's final policy?

    python3 benchmarks/checkpoint_selection.py RUN [RUN ...] [--top 3] [--minutes 60]
        [--first-seed 2000000] [--episodes 50] [--json benchmarks/results/OUT.json]

The evaluator scores every version on the same held-out seeds (eval.seed + i), and its full
scores stop early once the target is out of reach, so the number of successes a version
collects before its sixth failure (at 0.9 over 50) ranks versions. Picking the top one by
those very episodes flatters it (the winner of many noisy scores), so this scores the pick on
a second, disjoint set of seeds (`fleetrl evaluate --first-seed`), beside the run's final
checkpoint on the same set. Per run: the `--top` versions by the evaluator's full successes
within `--minutes` of the start, each through the checkpoint nearest its version (RUN/kept/,
where a hard-link keeper saved them, or RUN/checkpoints/: the aggregator writes one every
aggregator.checkpoint_every_versions, so the nearest may be a few hundred versions off), and
the newest checkpoint. Figures print last: the mean over runs of the top pick and of the final.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import statistics
import subprocess
import sys

from harness import print_table, result_record, write_result  # benchmarks/harness.py (this script's folder)

REPO = pathlib.Path(__file__).resolve().parent.parent


def checkpoints(run_dir: pathlib.Path) -> dict[int, pathlib.Path]:
    """Every ckpt_<version>.pt the run kept, by version (RUN/kept/ first, then RUN/checkpoints/)."""
    found: dict[int, pathlib.Path] = {}
    for folder in ("checkpoints", "kept"):
        for path in (run_dir / folder).glob("ckpt_*.pt"):
            found[int(path.stem.split("_")[1])] = path
    return found


def ranked_full_scores(run_dir: pathlib.Path, minutes: float) -> list[dict]:
    """The evaluator's full scores within `minutes` of the run's start, best first: most
    successes (early-stopped scores count theirs), then the newer version."""
    started = json.loads((run_dir / "summary.json").read_text())["started_unix"]
    rows = [json.loads(line) for line in (run_dir / "evals.jsonl").read_text().splitlines() if line.strip()]
    full = [r for r in rows if r.get("kind") == "full" and r["time"] - started <= 60 * minutes]
    for r in full:
        r["successes"] = round(r["success_rate"] * r["episodes"])
    return sorted(full, key=lambda r: (r["successes"], r["version"]), reverse=True)


def score(run_dir: pathlib.Path, checkpoint: pathlib.Path, first_seed: int, episodes: int) -> dict:
    cmd = [sys.executable, "-m", "fleet.cli.main", "evaluate", str(run_dir), "--checkpoint", str(checkpoint)]
    cmd += ["--first-seed", str(first_seed), "--episodes", str(episodes), "--json"]
    out = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True)
    if out.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{out.stderr.strip()[-1000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def select_run(run_dir: pathlib.Path, args: argparse.Namespace) -> dict:
    kept = checkpoints(run_dir)
    if not kept:
        raise SystemExit(f"{run_dir}: no ckpt_*.pt in checkpoints/ or kept/")
    picks = []
    for row in ranked_full_scores(run_dir, args.minutes)[: args.top]:
        near = min(kept, key=lambda v: (abs(v - row["version"]), v))
        result = score(run_dir, kept[near], args.first_seed, args.episodes)
        picks.append(
            {
                "version": row["version"],
                "evaluator_successes": row["successes"],
                "evaluator_episodes": row["episodes"],
                "checkpoint_version": near,
                "fresh_success": result["success_rate"],
            }
        )
        shown = f"v{row['version']} ({row['successes']}/{row['episodes']})"
        print(f"{run_dir.name}: {shown} -> {picks[-1]}", file=sys.stderr)
    final = max(kept)
    final_result = score(run_dir, kept[final], args.first_seed, args.episodes)
    print(f"{run_dir.name}: final v{final} -> {final_result['success_rate']}", file=sys.stderr)
    return {
        "run_dir": str(run_dir),
        "picks": picks,
        "final": {"checkpoint_version": final, "fresh_success": final_result["success_rate"]},
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("run_dirs", nargs="+", help="run directories (summary.json, evals.jsonl, checkpoints)")
    p.add_argument("--top", type=int, default=3, help="versions per run, best evaluator full scores first")
    p.add_argument("--minutes", type=float, default=60.0, help="only full scores this soon after the start")
    p.add_argument("--first-seed", type=int, default=2_000_000, help="the disjoint set's first episode seed")
    p.add_argument("--episodes", type=int, default=50, help="episodes per checkpoint on the disjoint set")
    p.add_argument("--json", help="write the raw result here")
    args = p.parse_args(argv)
    if args.top < 1 or args.episodes < 1 or args.first_seed < 0:
        p.error("--top and --episodes must be >= 1, --first-seed >= 0")
    runs = [select_run(pathlib.Path(d), args) for d in args.run_dirs]
    picked = [run["picks"][0]["fresh_success"] for run in runs if run["picks"]]
    finals = [run["final"]["fresh_success"] for run in runs if run["picks"]]
    figures = {
        "first_seed": args.first_seed,
        "episodes": args.episodes,
        "minutes": args.minutes,
        "runs": runs,
        "mean_top_pick": round(statistics.fmean(picked), 4) if picked else None,
        "mean_final": round(statistics.fmean(finals), 4) if finals else None,
    }
    if args.json:
        write_result(result_record("checkpoint_selection", figures), args.json)
    table = {
        pathlib.Path(run["run_dir"]).name: {
            "picks": ", ".join(f"v{x['version']} {x['fresh_success']:.2f}" for x in run["picks"]),
            "final": run["final"]["fresh_success"],
        }
        for run in runs
    }
    print_table(f"on seeds {args.first_seed}+, {args.episodes} episodes each", table)
    if picked:
        print(
            f"over {len(picked)} runs: the evaluator's top pick {figures['mean_top_pick']:.3f}, "
            f"the final checkpoint {figures['mean_final']:.3f}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
