"""deploy_npu: checkpoint -> ONNX export, op audit, torch/onnxruntime parity, latency, closed loop."""

from __future__ import annotations

import dataclasses

import numpy as np
import onnx
import pytest
import torch
from onnx import TensorProto, helper

from aggregator.core import AggregatorCore
from deploy_npu.audit import NPU_OPS, OpAuditError, audit_onnx
from deploy_npu.export import export_onnx
from deploy_npu.freeze import reference_actor
from deploy_npu.parity import (
    CONTROL_BUDGET_MS,
    OnnxPolicy,
    check_parity,
    closed_loop,
    env_inputs,
    measure_latency,
    random_inputs,
    task_for_spec,
)
from fleet.cli.main import main as fleetrl
from foundation.checkpoint import CheckpointError, load_checkpoint, load_policy_checkpoint, save_checkpoint
from foundation.config import AggregatorConfig
from nets.models import GRADIENT_GROUPS, ModelSpec, norm_stats
from sim import get_task

SPEC = ModelSpec(10, 3, 4, (64, 64))  # FetchReach-v4 dims
REACH = get_task("FetchReach-v4")


@pytest.fixture(scope="module")
def checkpoint_path(tmp_path_factory):
    """A saved checkpoint after 3 steps, whose normalizer is far from identity (Fetch-like scales)."""
    core = AggregatorCore(SPEC, AggregatorConfig(), grads_per_step=1, max_staleness=1)
    rng = np.random.default_rng(0)
    scale = np.array([0.2] * 3 + [0.03] * 2 + [0.005] * 5 + [0.1] * 3)
    for _ in range(3):
        grads = {g: rng.standard_normal(core.sizes[g]).astype(np.float32) for g in GRADIENT_GROUPS}
        core.submit(core.version, grads, norm_stats(rng.normal(0.8, scale, size=(256, SPEC.input_dim))))
    return save_checkpoint(tmp_path_factory.mktemp("ckpt"), core.state(), keep=1)


@pytest.fixture(scope="module")
def ckpt(checkpoint_path):
    return load_policy_checkpoint(checkpoint_path)


@pytest.fixture(scope="module")
def exported(checkpoint_path, tmp_path_factory):
    return export_onnx(checkpoint_path, tmp_path_factory.mktemp("onnx") / "policy.onnx")


def test_checkpoint_normalizer_is_not_identity(ckpt):
    dim = SPEC.input_dim
    assert np.abs(ckpt.obs_norm[:dim] - 0.8).max() < 0.05
    assert ckpt.obs_norm[dim:].min() < 0.02  # clamped to NORM_MIN_STD on the velocity-like columns


def test_export_writes_a_valid_static_model(exported, ckpt):
    model = onnx.load(exported.onnx_path)
    onnx.checker.check_model(model, full_check=True)
    (inp,), (out,) = model.graph.input, model.graph.output
    assert (inp.name, out.name) == ("obs_goal", "action")
    assert [d.dim_value for d in inp.type.tensor_type.shape.dim] == [1, SPEC.input_dim]
    assert [d.dim_value for d in out.type.tensor_type.shape.dim] == [1, SPEC.act_dim]
    props = {p.key: p.value for p in model.metadata_props}
    assert props["fleetrl.checkpoint_version"] == str(ckpt.version) == "3"
    assert ModelSpec.from_json(props["fleetrl.model_spec"]) == SPEC


def test_parity_on_random_and_env_inputs(exported, ckpt):
    inputs = np.concatenate([random_inputs(ckpt, 256, seed=1), env_inputs(REACH, 128, seed=1)])
    report = check_parity(OnnxPolicy(exported.onnx_path), reference_actor(ckpt).deterministic, inputs)
    assert report.num_inputs == 384
    assert report.max_abs_error <= 1e-5 and report.passed


def test_parity_catches_a_different_normalizer(exported, ckpt):
    shifted = dataclasses.replace(ckpt, obs_norm=ckpt.obs_norm * np.float32(1.01))
    inputs = random_inputs(ckpt, 64)
    report = check_parity(OnnxPolicy(exported.onnx_path), reference_actor(shifted).deterministic, inputs)
    assert not report.passed and report.max_abs_error > 1e-3


@pytest.mark.parametrize("batch_size", [4, None])
def test_other_batch_shapes_keep_parity(checkpoint_path, ckpt, tmp_path, batch_size):
    report = export_onnx(checkpoint_path, tmp_path / "p.onnx", batch_size=batch_size)
    policy = OnnxPolicy(report.onnx_path)
    assert policy.static_batch == batch_size
    inputs = random_inputs(ckpt, 7)  # not a multiple of 4: the last static chunk is padded
    assert check_parity(policy, reference_actor(ckpt).deterministic, inputs).passed


def test_audit_passes_exported_model_with_its_op_histogram(exported):
    report = audit_onnx(exported.onnx_path)
    assert report.passed
    assert report.op_histogram["Gemm"] == 3 and report.op_histogram["Relu"] == 2
    assert {"Sub", "Div", "Clip", "Tanh"} <= set(report.op_histogram) <= NPU_OPS


def test_audit_rejects_a_dynamic_batch_unless_allowed(checkpoint_path, tmp_path):
    path = export_onnx(checkpoint_path, tmp_path / "dyn.onnx", batch_size=None).onnx_path
    with pytest.raises(OpAuditError, match=r"input:obs_goal .*\['batch', 13\] is not static"):
        audit_onnx(path)
    assert audit_onnx(path, require_static_shapes=False).passed


def _value(name, shape=(1, 4)):
    return helper.make_tensor_value_info(name, TensorProto.FLOAT, list(shape))


def _model(nodes, inputs=("x",), initializers=(), input_shape=(1, 4)):
    graph = helper.make_graph(
        nodes, "g", [_value(n, input_shape) for n in inputs], [_value("y", input_shape)], list(initializers)
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _branch(name, op):
    return helper.make_graph(
        [helper.make_node(op, ["x"], [f"{name}_out"], name=f"{name}_node")], name, [], [_value(f"{name}_out")]
    )


def _if_model():
    cond = helper.make_node("ReduceSum", ["x"], ["s"], name="sum", keepdims=0)
    is_pos = helper.make_node("Greater", ["s", "zero"], ["c"], name="is_pos")
    branch = helper.make_node(
        "If",
        ["c"],
        ["y"],
        name="branch_on_data",
        then_branch=_branch("then", "Relu"),
        else_branch=_branch("else", "Neg"),
    )
    zero = helper.make_tensor("zero", TensorProto.FLOAT, [], [0.0])
    return _model([cond, is_pos, branch], initializers=[zero])


def _loop_model():
    body = helper.make_graph(
        [helper.make_node("Identity", ["cond_in"], ["cond_out"]), helper.make_node("Relu", ["v_in"], ["v_out"])],
        "body",
        [helper.make_tensor_value_info("i", TensorProto.INT64, []),
         helper.make_tensor_value_info("cond_in", TensorProto.BOOL, []), _value("v_in")],
        [helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []), _value("v_out")],
    )  # fmt: skip
    trip = helper.make_tensor("trip", TensorProto.INT64, [], [3])
    loop = helper.make_node("Loop", ["trip", "", "x"], ["y"], name="repeat", body=body)
    return _model([loop], initializers=[trip])


def _gather_model():
    gather = helper.make_node("Gather", ["x", "idx"], ["y"], name="pick_by_data", axis=1)
    graph = helper.make_graph(
        [gather], "g", [_value("x"), helper.make_tensor_value_info("idx", TensorProto.INT64, [4])], [_value("y")]
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.parametrize(
    ("build", "expected"),
    [
        (_if_model, r"branch_on_data \(If\): data-dependent control flow"),
        (_loop_model, r"repeat \(Loop\): data-dependent control flow"),
        (lambda: _model([helper.make_node("NonZero", ["x"], ["y"], name="nz")]), r"nz \(NonZero\)"),
        (lambda: _model([helper.make_node("Exp", ["x"], ["y"], name="e")]), r"e \(Exp\): op outside the NPU allowlist"),
        (_gather_model, r"pick_by_data \(Gather\): input 1 \('idx'\) is computed at run time"),
        (lambda: _model([helper.make_node("Fused", ["x"], ["y"], name="f", domain="com.vendor")]), r"custom-domain"),
        (lambda: _model([helper.make_node("Relu", ["x"], ["y"])], input_shape=("n", 4)), r"input:x .* not static"),
    ],
    ids=["if", "loop", "nonzero", "outside-allowlist", "gather-runtime-indices", "custom-domain", "dynamic-dim"],
)
def test_audit_rejects_graphs_an_npu_cannot_compile(build, expected):
    with pytest.raises(OpAuditError, match=expected) as info:
        audit_onnx(build())
    assert not info.value.report.passed


@pytest.mark.parametrize(
    ("op", "inputs", "reason"),
    [
        ("TopK", ["x", "k"], "dynamic routing: freeze it to a table"),
        ("Range", ["x", "x", "x"], "output length computed from data"),
        ("OneHot", ["x", "k", "x"], "data-dependent routing"),
        ("GatherND", ["x", "k"], "data-dependent routing"),
        ("GatherElements", ["x", "k"], "data-dependent routing"),
        ("Expand", ["x", "k"], "output shape taken from a tensor"),
        ("Erf", ["x"], "exact GELU"),
    ],
)
def test_audit_names_each_routing_and_dynamic_op_it_refuses(op, inputs, reason):
    k = helper.make_tensor("k", TensorProto.INT64, [1], [2])
    model = _model([helper.make_node(op, inputs, ["y"], name=f"the_{op.lower()}")], initializers=[k])
    with pytest.raises(OpAuditError, match=rf"the_{op.lower()} \({op}\): .*{reason}"):
        audit_onnx(model)


def test_audit_counts_ops_inside_subgraphs():
    with pytest.raises(OpAuditError) as info:
        audit_onnx(_if_model())
    histogram = info.value.report.op_histogram
    assert histogram["If"] == 1 and histogram["Relu"] == 1 and histogram["Neg"] == 1


def test_latency_is_measured_against_the_controller_budget(exported):
    report = measure_latency(OnnxPolicy(exported.onnx_path), num_calls=200)
    assert report.num_calls == 200 and report.budget_ms == pytest.approx(1000 / 120)
    assert 0 < report.p50_ms <= report.p99_ms
    assert report.within_budget == (report.p99_ms <= CONTROL_BUDGET_MS)


def test_closed_loop_of_an_untrained_policy_reports_a_rate(exported):
    report = closed_loop(OnnxPolicy(exported.onnx_path), REACH, episodes=3)
    assert (report.task, report.episodes) == ("FetchReach-v4", 3)
    assert 0.0 <= report.success_rate <= 1.0


class _ReachController(torch.nn.Module):
    """A scripted FetchReach policy: move the gripper (obs[0:3]) toward the goal (last 3 inputs)."""

    def forward(self, obs_goal):
        move = (10.0 * (obs_goal[:, 10:13] - obs_goal[:, 0:3])).clamp(-1.0, 1.0)
        return torch.cat([move, torch.zeros_like(move[:, :1])], dim=1)


def test_closed_loop_counts_successes_of_a_policy_that_reaches(tmp_path):
    path = tmp_path / "reach.onnx"
    torch.onnx.export(_ReachController(), (torch.zeros(1, 13),), path, dynamo=False, input_names=["obs_goal"])
    report = closed_loop(OnnxPolicy(path), REACH, episodes=3)
    assert report.successes == 3 and report.success_rate == 1.0


def test_task_is_inferred_from_dims_or_must_match():
    assert task_for_spec(SPEC) == REACH
    with pytest.raises(ValueError, match=r"fit task\(s\) \['FetchPush-v4', .*--task"):
        task_for_spec(ModelSpec(25, 3, 4))
    with pytest.raises(ValueError, match="FetchPush-v4 has .* dims"):
        task_for_spec(SPEC, "FetchPush-v4")


def _bad_checkpoints(tmp_path, checkpoint_path):
    garbage = tmp_path / "ckpt_0000000001.pt"
    garbage.write_bytes(b"not a torch file")
    (tmp_path / "empty").mkdir()
    state = load_checkpoint(checkpoint_path)
    no_actor = {**state, "weights": {"obs_norm": state["weights"]["obs_norm"]}}
    wrong_size = {**state, "weights": {**state["weights"], "actor": np.zeros(7, np.float32)}}
    nan = {**state, "weights": {**state["weights"], "obs_norm": np.full(26, np.nan, np.float32)}}
    return {
        "missing-path": (tmp_path / "nope.pt", FileNotFoundError, r"nope\.pt' does not exist"),
        "empty-dir": (tmp_path / "empty", FileNotFoundError, r"no checkpoint \(ckpt_<version>\.pt\)"),
        "garbage-file": (garbage, CheckpointError, r"cannot read checkpoint .*save_checkpoint"),
        "no-spec": ({"version": 1, "weights": {}}, CheckpointError, r"lacks \['spec'\]"),
        "no-actor": (no_actor, CheckpointError, r"no weight group\(s\) \['actor'\]"),
        "wrong-size": (wrong_size, CheckpointError, r"actor flat vector shape \(7,\)"),
        "nan-weights": (nan, CheckpointError, r"obs_norm'\] contain NaN"),
    }


@pytest.mark.parametrize(
    "case", ["missing-path", "empty-dir", "garbage-file", "no-spec", "no-actor", "wrong-size", "nan-weights"]
)
def test_bad_checkpoint_gives_a_clear_error(tmp_path, checkpoint_path, case):
    source, error, message = _bad_checkpoints(tmp_path, checkpoint_path)[case]
    with pytest.raises(error, match=message):
        export_onnx(source, tmp_path / "out.onnx")
    assert not (tmp_path / "out.onnx").exists()


def test_cli_reports_every_check_and_passes(checkpoint_path, tmp_path, capsys):
    out = tmp_path / "policy.onnx"
    lenient = ["--budget-ms", "1000"]  # the checks' wiring is tested, not this machine's load (no timed asserts)
    assert (
        fleetrl(["export", "--checkpoint", str(checkpoint_path.parent), "--out", str(out), "--episodes", "2", *lenient])
        == 0
    )
    text = capsys.readouterr().out
    for line in ("export    ok", "audit     ok", "parity    ok", "latency   ok", "success rate", "result    PASS"):
        assert line in text
    assert out.exists()


@pytest.mark.parametrize("existing", [True, False])
def test_cli_out_as_a_folder_writes_the_tasks_file_in_it(checkpoint_path, tmp_path, existing):
    folder = tmp_path / "deploy"
    if existing:
        folder.mkdir()
    out = str(folder) if existing else f"{folder}/"  # an existing folder, or a path that says it is one
    args = ["--checkpoint", str(checkpoint_path.parent), "--out", out, "--episodes", "1", "--budget-ms", "1000"]
    assert fleetrl(["export", *args]) == 0
    written = sorted(p.name for p in folder.iterdir())
    assert len(written) == 2 and written[0].endswith(".onnx") and written[1] == written[0] + ".manifest.json"


def test_cli_bad_checkpoint_exits_2_with_the_path(tmp_path, capsys):
    missing = tmp_path / "missing.pt"
    assert fleetrl(["export", "--checkpoint", str(missing), "--out", str(tmp_path / "p.onnx")]) == 2
    assert f"fleetrl export: error: --checkpoint {missing}: no such file" in capsys.readouterr().err


def test_int8_is_reported_beside_the_float_graph(checkpoint_path, tmp_path):
    import json

    from deploy_npu.pipeline import DeployCheckConfig, export_and_check

    config = DeployCheckConfig(episodes=1, latency_calls=50, random_inputs=64, env_inputs=256, int8=True)
    report = export_and_check(checkpoint_path, tmp_path / "policy.onnx", config)
    q = report.int8
    assert q is not None and q.onnx_path == tmp_path / "policy.int8.onnx" and q.onnx_path.exists()
    assert q.audit.passed and "QuantizeLinear" in q.audit.op_histogram  # QDQ around the Gemms
    assert 0.0 < q.max_abs_error < 0.5  # int8 moves the actions, within reason
    assert report.parity.passed  # the float graph's own check is unchanged
    assert "int8" in report.summary()
    manifest = json.loads((tmp_path / "policy.onnx.manifest.json").read_text())
    assert manifest["int8"]["max_abs_error_vs_float"] == q.max_abs_error


def test_export_for_another_rate_retimes_the_velocity_inputs_in_the_normalizer(checkpoint_path, tmp_path, capsys):
    """--hz 120 on a policy of a 25 Hz run (no config.json beside this checkpoint: Fetch's own rate):
    the graph at x acts as the 25 Hz graph at x with its velocity columns re-timed, and says so."""
    import json

    from deploy_npu.retime import retime_factor
    from sim.rate import velocity_columns

    native, fast = tmp_path / "native.onnx", tmp_path / "fast.onnx"
    common = ["--checkpoint", str(checkpoint_path.parent), "--episodes", "1", "--budget-ms", "1000"]
    assert fleetrl(["export", *common, "--out", str(native)]) == 0
    assert fleetrl(["export", *common, "--out", str(fast), "--hz", "120"]) == 0
    assert "a 120 Hz controller; trained at 25 Hz, velocity inputs re-timed" in capsys.readouterr().out
    manifest = json.loads(fast.with_name(fast.name + ".manifest.json").read_text())
    assert manifest["control_rate"] == {"hz": 120.0, "trained_hz": 25.0, "retimed": True}
    x = np.random.default_rng(0).normal(0.5, 0.2, (1, SPEC.input_dim)).astype(np.float32)
    scaled = x.copy()
    scaled[:, velocity_columns(REACH.obs_dim)] *= retime_factor(REACH, 25.0, 120.0)
    np.testing.assert_allclose(OnnxPolicy(fast)(x), OnnxPolicy(native)(scaled), rtol=1e-5, atol=1e-6)
    assert not np.allclose(OnnxPolicy(fast)(x), OnnxPolicy(native)(x), atol=1e-4)
