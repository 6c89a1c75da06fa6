"""The chaos soak's table: faulted soaks against the same seeds without faults.

    python3 benchmarks/chaos_soak_table.py R1.json R2.json ... [--json out.json]

Each input is a raw result of `benchmarks/chaos_soak.py --out` (a soak, or with --no-faults its
baseline). Per task and seed, each faulted soak is paired with the baseline of the same task and
seed: wall-clock to the target with faults / without (goal <= 1.5), and per soak the faults
injected and what the audit found (acked transitions lost or doubled, gradients applied twice,
versions reused: goal 0 each). A faulted soak without a baseline is listed, unpaired. Figures
come last.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import sys

from harness import print_table, result_record, write_result  # benchmarks/harness.py (this script's folder)

RATIO_GOAL = 1.5


def _soak(record: dict) -> dict:
    f = record["figures"]
    s, b, g = f["summary"], f.get("batches") or {}, f.get("gradients") or {}
    return {
        "task": f["task"],
        "seed": f["seed"],
        "every_sec": f["every_sec"],
        "reached": bool(s.get("reached_target")),
        "minutes_to_target": None if s.get("wall_sec_to_target") is None else round(s["wall_sec_to_target"] / 60, 2),
        # updates to the target and their rate: a ratio of minutes is the faults' cost in
        # throughput (the rate) times how many more updates the run needed (learning variance too)
        "updates_to_target": s.get("version_to_target"),
        "updates_per_sec": _rate(s.get("version_to_target"), s.get("wall_sec_to_target"))
        or _rate(s.get("final_version"), s.get("wall_sec")),
        "faults": len(f.get("faults", [])),
        "lost": b.get("lost"),
        "doubled": b.get("doubled"),
        "applied_twice": g.get("applied_twice"),
        "versions_reused": g.get("versions_reused"),
        "rolled_back": g.get("rolled_back"),  # acked gradients an aggregator crash undid (by design)
        "rollback_bound": f.get("rollback_bound"),  # at most this many (None where a result does not record it)
        "fault_kinds": _kinds(f.get("faults", [])),
        "hosts": f.get("hosts", "local"),
        "problems": f.get("problems"),
        "commit": record.get("commit"),
    }


def _rate(count: float | None, seconds: float | None) -> float | None:
    return round(count / seconds, 2) if count and seconds else None


def _kinds(faults: list[dict]) -> dict[str, int]:
    """How many faults of each kind ('SIGKILL', 'SIGSTOP', 'PARTITION', ...) the soak injected."""
    kinds: dict[str, int] = {}
    for fault in faults:
        kind = str(fault.get("fault", "?")).split()[0]
        kinds[kind] = kinds.get(kind, 0) + 1
    return dict(sorted(kinds.items()))


def table(records: list[dict]) -> dict:
    soaks = [_soak(r) for r in records]
    baselines = {(s["task"], s["seed"]): s for s in soaks if s["every_sec"] is None}
    rows = []
    for soak in (s for s in soaks if s["every_sec"] is not None):
        base = baselines.get((soak["task"], soak["seed"]))
        ratio = rate_ratio = None
        if base and base["minutes_to_target"] and soak["minutes_to_target"]:
            ratio = round(soak["minutes_to_target"] / base["minutes_to_target"], 3)
        if base and base["updates_per_sec"] and soak["updates_per_sec"]:
            rate_ratio = round(soak["updates_per_sec"] / base["updates_per_sec"], 3)
        rows.append(
            soak
            | {
                "baseline_minutes": base["minutes_to_target"] if base else None,
                "ratio": ratio,
                "baseline_updates_to_target": base["updates_to_target"] if base else None,
                "updates_per_sec_ratio": rate_ratio,  # the faults' cost in throughput alone
            }
        )
    paired = [r for r in rows if r["baseline_minutes"] is not None]
    return {
        "rows": rows,
        "baselines": list(baselines.values()),
        "goals": {
            "ratio_le_1.5_every_paired_soak": bool(paired)
            and all(r["ratio"] is not None and r["ratio"] <= RATIO_GOAL for r in paired),
            "nothing_lost_doubled_or_applied_twice": all(r["problems"] == 0 for r in rows),
        },
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("results", nargs="+", help="raw results of benchmarks/chaos_soak.py --out")
    p.add_argument("--json", help="write the raw result (figures, commit, command) here")
    args = p.parse_args(argv)
    records = [json.loads(pathlib.Path(r).read_text()) for r in args.results]
    bad = [r for r, rec in zip(args.results, records, strict=True) if rec.get("benchmark") != "chaos_soak"]
    if bad:
        p.error(f"results: not raw results of benchmarks/chaos_soak.py: {bad}")
    figures = table(records)
    if args.json:
        write_result(result_record("chaos_soak_table", figures), args.json)
    columns = ["faults", "minutes_to_target", "baseline_minutes", "ratio", "lost", "doubled", "applied_twice",
               "versions_reused", "rolled_back", "updates_to_target", "baseline_updates_to_target",
               "updates_per_sec_ratio"]  # fmt: skip
    rows = {f"{r['task']} seed {r['seed']}, every {r['every_sec']:g} s": r for r in figures["rows"]}
    print_table("faulted soaks against their seeds' baselines", rows, columns)
    print(f"\ngoals: {json.dumps(figures['goals'])}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
