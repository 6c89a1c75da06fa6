"""A multi-task run's policy exports per task, on that task's own input (deploy_npu)."""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
import torch

from aggregator.core import AggregatorCore
from deploy_npu.freeze import TaskInput, freeze_policy, reference_actor
from deploy_npu.pipeline import DeployCheckConfig, export_and_check
from foundation.checkpoint import load_policy_checkpoint
from foundation.config import AggregatorConfig
from nets.models import GRADIENT_GROUPS, ModelSpec, norm_stats
from sim.tasks import TaskSet

TASKS = TaskSet.of(("FetchReach-v4", "FetchPush-v4"))
CHECK = DeployCheckConfig(episodes=1, calibration_episodes=2, latency_calls=100, random_inputs=64, env_inputs=64)


def _checkpoint(
    kind: str, task_norm: bool = True, task_onehot: bool = True, task_heads: bool = False, shared: int = 0
) -> dict:
    """A multi-task checkpoint after 3 steps, its normalizer far from identity (and, with
    per-task statistics, each task's far from the other's); `shared` experts per layer beside
    two routed ones."""
    spec = ModelSpec(
        TASKS.obs_dim,
        TASKS.goal_dim,
        TASKS.act_dim,
        (32, 32),
        kind=kind,
        experts=4,
        top_k=2 + shared,
        shared_experts=shared,
        tasks=2,
        task_norm=task_norm,
        task_onehot=task_onehot,
        router="task" if task_heads else "state",
        task_heads=task_heads,
    )
    core = AggregatorCore(spec, AggregatorConfig(seed=2), 1, 1, TASKS.label)
    rng = np.random.default_rng(0)
    for _ in range(3):
        grads = {g: rng.standard_normal(core.sizes[g]).astype(np.float32) * 0.1 for g in GRADIENT_GROUPS}
        task = rng.integers(0, 2, 256)
        rows = rng.normal(0.5, 0.2, size=(256, spec.input_dim)) + 0.8 * task[:, None]  # Push's rows elsewhere
        rows[:, TASKS.obs_dim - 2 : TASKS.obs_dim] = np.eye(2)[task]  # the task one-hot
        core.submit(core.version, grads, norm_stats(rows, task, spec.norm_rows))
    return core.state()


@pytest.mark.parametrize("task_onehot", [True, False], ids=["onehot-read", "onehot-hidden"])
@pytest.mark.parametrize("task_norm", [True, False], ids=["per-task-norm", "shared-norm"])
@pytest.mark.parametrize("kind", ["dense", "moe"])
def test_folding_the_padding_into_the_first_layer_is_exact(kind, task_norm, task_onehot):
    ckpt = load_policy_checkpoint(_checkpoint(kind, task_norm, task_onehot))
    for index, task in enumerate(TASKS.tasks):
        task_input = TaskInput(TASKS, index)
        own = np.random.default_rng(index).normal(0.5, 0.3, (200, task_input.input_dim)).astype(np.float32)
        padded = torch.from_numpy(task_input.pad(own))
        if kind == "moe":
            from deploy_npu.routing import freeze_routing

            routing = freeze_routing(reference_actor(ckpt), task.name, padded.numpy(), task_index=index)
            full = freeze_policy(ckpt, routing)
            folded = freeze_policy(ckpt, routing, task_input)
        else:
            full, folded = freeze_policy(ckpt), freeze_policy(ckpt, task_input=task_input)
        with torch.no_grad():
            np.testing.assert_allclose(folded(torch.from_numpy(own)), full(padded), atol=1e-6)
        assert folded.norm.mean.numel() == task.obs_dim + 3


@pytest.mark.parametrize(
    ("kind", "task_onehot", "task_heads"),
    [
        ("dense", True, False),
        ("dense", False, False),
        ("moe", True, False),
        ("moe", False, False),
        ("moe", False, True),
        ("moe-shared", False, True),  # the multi-task MoE recipe: task router, one shared expert
    ],
)
def test_each_task_exports_on_its_own_input_and_passes_every_check(kind, task_onehot, task_heads, tmp_path):
    shared = int(kind == "moe-shared")
    kind = "moe" if shared else kind
    state = _checkpoint(kind, task_onehot=task_onehot, task_heads=task_heads, shared=shared)
    for task, width in (("FetchReach-v4", 13), ("FetchPush-v4", 28)):
        config = DeployCheckConfig(**{**CHECK.__dict__, "task": task})
        report = export_and_check(state, tmp_path / f"{task}.onnx", config)
        assert report.export.input_shape == (1, width), report.summary()
        assert report.audit.passed and report.parity.passed, report.summary()
        assert report.parity.max_abs_error <= 1e-5
        props = {p.key: p.value for p in onnx.load(tmp_path / f"{task}.onnx").metadata_props}
        assert props["fleetrl.task"] == task
        if kind == "moe":
            routing = json.loads(props["fleetrl.routing"])
            assert routing["task_index"] == TASKS.names.index(task)
            if shared:  # every layer's table holds the shared expert 0 and the task's two routed ones
                assert all(0 in layer["experts"] and len(layer["experts"]) == 3 for layer in routing["layers"]), routing


def test_a_multi_task_checkpoint_needs_one_of_its_tasks_named(tmp_path):
    state = _checkpoint("dense")
    with pytest.raises(ValueError, match="multi-task run: name one of"):
        export_and_check(state, tmp_path / "p.onnx", CHECK)
    with pytest.raises(ValueError, match="not one of the checkpoint's tasks"):
        export_and_check(state, tmp_path / "p.onnx", DeployCheckConfig(**{**CHECK.__dict__, "task": "FetchSlide-v4"}))


@pytest.mark.parametrize("kind", ["dense", "moe"])
def test_fleetrl_export_writes_every_task_and_one_multi_task_graph_with_manifests(kind, tmp_path, capsys):
    from fleet.cli.main import main as fleetrl
    from foundation.checkpoint import save_checkpoint

    path = save_checkpoint(tmp_path / "ckpt", _checkpoint(kind), keep=1)
    out = tmp_path / "deploy"
    args = ["--checkpoint", str(path), "--out", str(out), "--episodes", "1", "--latency-calls", "100"]
    args += ["--budget-ms", "1000"]  # what this test checks is the graphs, not this machine's load (no timed asserts)
    status, printed = fleetrl(["export", *args]), capsys.readouterr().out
    assert status == 0, printed
    names = {"FetchReach-v4.onnx", "FetchPush-v4.onnx", "multitask.onnx"}
    assert {p.name for p in out.glob("*.onnx")} == names
    for name in names:
        manifest = json.loads((out / f"{name}.manifest.json").read_text())
        assert manifest["sha256"] == __import__("hashlib").sha256((out / name).read_bytes()).hexdigest()
        assert manifest["checks"]["audit_passed"] and manifest["checks"]["parity_max_abs_error"] <= 1e-5
        assert manifest["weight_version"] == 3 and manifest["output"]["shape"] == [1, 4]
    multi = json.loads((out / "multitask.onnx.manifest.json").read_text())
    assert multi["tasks"] == list(TASKS.names) and multi["input"]["shape"] == [1, TASKS.obs_dim + 3]
    if kind == "moe":  # every task's routing table, and the graph looks it up with no Gather
        assert set(multi["routing"]) == set(TASKS.names)
        assert all(multi["routing"][t]["task_index"] == i for i, t in enumerate(TASKS.names))
        assert "Gather" not in multi["checks"]["ops"] and "TopK" not in multi["checks"]["ops"]
        props = {p.key: p.value for p in onnx.load(out / "multitask.onnx").metadata_props}
        assert json.loads(props["fleetrl.routing"]) == multi["routing"]
        # The printed report: each per-task graph's routing line, then every task's for the multi-task graph.
        routed = [line.split(":")[0] for line in printed.splitlines() if line.startswith("routing")]
        assert routed == [f"routing   info {t}" for t in (*TASKS.names, *TASKS.names)], printed
    own = json.loads((out / "FetchReach-v4.onnx.manifest.json").read_text())
    assert own["tasks"] == ["FetchReach-v4"] and own["input"]["shape"] == [1, 13]


@pytest.mark.parametrize("task_heads", [False, True], ids=["one-head", "task-heads"])
def test_the_multi_task_graph_routes_each_row_by_its_task_one_hot(task_heads):
    from deploy_npu.multitask import MultiTaskPolicy
    from deploy_npu.routing import FrozenRoutingPolicy, freeze_routing

    ckpt = load_policy_checkpoint(_checkpoint("moe", task_heads=task_heads))
    actor = reference_actor(ckpt)
    tables, rows = [], []
    for index, task in enumerate(TASKS.tasks):
        own = np.random.default_rng(index).normal(0.5, 0.3, (50, task.obs_dim + 3)).astype(np.float32)
        rows.append(TaskInput(TASKS, index).pad(own))
        tables.append(freeze_routing(actor, task.name, rows[-1], task_index=index))
    module = MultiTaskPolicy(actor, TASKS, tables)
    with torch.no_grad():
        for index, table in enumerate(tables):  # each task's rows as that task's frozen policy acts
            expected = FrozenRoutingPolicy(actor, table)(torch.from_numpy(rows[index]))
            np.testing.assert_allclose(module(torch.from_numpy(rows[index])), expected, atol=1e-6)
