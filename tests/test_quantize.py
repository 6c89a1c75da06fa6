"""The int8 graph's build (deploy_npu/quantize.py): what it says on the user's terminal."""

from __future__ import annotations

import logging

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from deploy_npu.quantize import PRE_PROCESSING_ADVICE, quantize_int8


def _mlp(path) -> str:
    """A static-batch Gemm-Relu-Gemm-Tanh graph shaped like FetchReach's actor (obs 10 ++ goal 3 -> action 4)."""
    rng = np.random.default_rng(0)
    w1, w2 = rng.normal(size=(13, 16)).astype(np.float32), rng.normal(size=(16, 4)).astype(np.float32)
    nodes = [
        helper.make_node("Gemm", ["x", "w1"], ["h"]),
        helper.make_node("Relu", ["h"], ["r"]),
        helper.make_node("Gemm", ["r", "w2"], ["raw"]),
        helper.make_node("Tanh", ["raw"], ["a"]),
    ]
    graph = helper.make_graph(
        nodes, "mlp", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 13])],
        [helper.make_tensor_value_info("a", TensorProto.FLOAT, [1, 4])],
        [numpy_helper.from_array(w1, "w1"), numpy_helper.from_array(w2, "w2")],
    )  # fmt: skip
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    return str(path)


def test_building_the_int8_graph_prints_no_pre_processing_advice(tmp_path, caplog):
    rows = np.random.default_rng(1).normal(size=(32, 13)).astype(np.float32)
    filters = list(logging.getLogger().filters)
    with caplog.at_level(logging.WARNING):
        written = quantize_int8(_mlp(tmp_path / "mlp.onnx"), tmp_path / "mlp.int8.onnx", rows)
    assert written.exists() and "QuantizeLinear" in {n.op_type for n in onnx.load(written).graph.node}
    assert not [r for r in caplog.records if PRE_PROCESSING_ADVICE in r.getMessage()]
    assert logging.getLogger().filters == filters  # the filter lives for the call only
    logging.warning("Please consider pre-processing before quantization.")  # after the call it reaches the root
    assert PRE_PROCESSING_ADVICE in caplog.records[-1].getMessage()


def test_other_warnings_during_the_build_still_reach_the_root_logger(tmp_path, caplog, monkeypatch):
    """Only the advice is dropped: a stand-in quantize_static logs both and one passes."""
    import onnxruntime.quantization

    def quantize_static(fp32_path, int8_path, *args, **kwargs) -> None:
        logging.warning("Please consider to run pre-processing before quantization. Refer to example: ...")
        logging.warning("a tensor has no calibration range")
        logging.getLogger("onnxruntime.quantization").warning("a child logger's record")

    monkeypatch.setattr(onnxruntime.quantization, "quantize_static", quantize_static)
    with caplog.at_level(logging.WARNING):
        quantize_int8(_mlp(tmp_path / "mlp.onnx"), tmp_path / "mlp.int8.onnx", np.zeros((4, 13), np.float32))
    assert [r.getMessage() for r in caplog.records] == ["a tensor has no calibration range", "a child logger's record"]
