"""Where a task-routed MoE's routing under bfloat16 differs from its float32 routing.

    python3 benchmarks/routing_precision.py RUN_DIR [RUN_DIR ...] [--json OUT]

Samplers, the evaluator and `fleetrl export` route in float32, and so does a learner under
`learner.autocast` bf16 (nets/moe.py MoELinear.logits computes the gates in float32). Gates
computed in bfloat16 would differ where two experts' logits are closer than a bfloat16 step: the
learner would train another expert than the one the actors run. This reads each run's newest
checkpoint and lists, per network, layer and task, the experts float32 routing chooses and those
the gate Linear chooses under torch.autocast bf16, and flags every difference: the check on a
checkpoint trained with bfloat16 gates, and on one whose routing looks wrong.
"""

from __future__ import annotations

import argparse
import pathlib
import sys

import numpy as np
import torch
from harness import result_record, write_result  # benchmarks/harness.py (this script's folder)

from foundation.checkpoint import latest_checkpoint, load_checkpoint
from foundation.policy import ModelSpec
from nets.models import Body, SACModel
from sim.tasks import TaskSet


def _experts(layer: torch.nn.Module, embed: torch.Tensor, top_k: int, bf16: bool) -> list[list[int]]:
    """Each task's top_k experts, sorted, from the gate run in float32 or under bf16 autocast."""
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
        logits = layer.gate(embed)  # the raw gate, as bfloat16 gates compute it
    return [sorted(row) for row in logits.float().topk(top_k, dim=-1).indices.tolist()]


def run_routing(run: pathlib.Path) -> dict:
    newest = latest_checkpoint(run / "checkpoints")
    if newest is None:
        raise SystemExit(f"{run}: no checkpoint under {run / 'checkpoints'}")
    ckpt = load_checkpoint(newest)
    spec = ModelSpec.from_json(ckpt["spec"])
    if spec.kind != "moe" or spec.router != "task":
        raise SystemExit(f"{run}: a {spec.kind} model with router {spec.router!r}; this reads task-routed MoEs")
    names = list(TaskSet.parse(ckpt["task"]).names)
    model = SACModel(spec)
    for group in ("actor", "critic"):
        model.set_flat(group, np.asarray(ckpt["weights"][group], np.float32))
    layers, differ = {}, []
    for net, body in model.named_modules():
        if not isinstance(body, Body) or not body.moe or net.startswith("critic_target"):
            continue
        net = net.removesuffix(".body")
        for i, layer in enumerate(body.moe_layers()):
            f32 = _experts(layer, body.task_embed, spec.top_k, bf16=False)
            b16 = _experts(layer, body.task_embed, spec.top_k, bf16=True)
            pairs = list(zip(names, f32, b16, strict=True))
            layers[f"{net}.l{i}"] = {name: {"float32": a, "bfloat16": b} for name, a, b in pairs}
            differ += [f"{net}.l{i} {name}: {a} / {b}" for name, a, b in pairs if a != b]
    return {"version": int(ckpt["version"]), "tasks": names, "layers": layers, "differ": differ}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="+", type=pathlib.Path)
    parser.add_argument("--json", type=pathlib.Path, help="write the raw result here")
    args = parser.parse_args(argv)
    figures = {str(run): run_routing(run) for run in args.runs}
    if args.json:
        write_result(result_record("routing_precision", figures), args.json)
    for run, found in figures.items():  # figures last
        print(f"{run} (v{found['version']}): {len(found['differ'])} routes differ (float32 / bfloat16)")
        for line in found["differ"]:
            print(f"  {line}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
