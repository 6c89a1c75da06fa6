"""Op audit: is an ONNX graph something an NPU compiler takes whole, with static shapes?

    report = audit_onnx("policy.onnx")      # raises OpAuditError listing every offending node
    report.op_histogram                     # {'Gemm': 3, 'Relu': 2, 'Sub': 1, ...}

An NPU compiles the graph once, ahead of time, into a fixed schedule. It cannot branch on data
(If, Loop, Scan), cannot size a tensor from data (NonZero, Unique, TopK, NonMaxSuppression,
Compress) and falls back to the host CPU, at a cost the 120 Hz budget cannot absorb, on ops it
does not know. So the audit allows a short list of ops and rejects everything else:

- any node whose op is not in `NPU_OPS` (forbidden control-flow/dynamic-shape ops are named
  as such), or lives in a custom domain;
- shape-defining inputs that are not constants (Gather indices, Slice bounds, Reshape shape,
  Split sizes, Squeeze/Unsqueeze axes): those make the output shape or layout data-dependent;
- with `require_static_shapes`, any graph input or output with a symbolic or unknown dim.

Subgraphs (the branches of an If, the body of a Loop) are walked too and counted in the histogram.
"""

from __future__ import annotations

import collections
import os
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

import onnx

from foundation.errors import FleetrlError

# Never compilable ahead of time, whatever the target: op -> why (named in the finding).
_CONTROL = "data-dependent control flow or output shape"
FORBIDDEN = {
    **dict.fromkeys(("If", "Loop", "Scan", "NonZero", "Unique", "NonMaxSuppression", "Compress"), _CONTROL),
    "TopK": f"{_CONTROL} (dynamic routing: freeze it to a table)",
    "Range": "output length computed from data",
    "OneHot": "one-hot of run-time indices: data-dependent routing",
    "GatherND": "gather by run-time indices: data-dependent routing",
    "GatherElements": "gather by run-time indices: data-dependent routing",
    "Expand": "output shape taken from a tensor",
    "Erf": "transcendental outside NPU vector units (exact GELU): use a Tanh approximation",
}
FORBIDDEN_OPS = frozenset(FORBIDDEN)

# Dense math, elementwise activations and static layout ops: what NPU toolchains map to their
# matrix and vector units. Extend per target with `allowed_ops=NPU_OPS | {...}`.
NPU_OPS = frozenset(
    {
        "Gemm", "MatMul", "Add", "Sub", "Mul", "Div", "Neg",
        "Relu", "Tanh", "Sigmoid", "Clip", "Min", "Max",
        "Concat", "Slice", "Split", "Reshape", "Flatten", "Transpose", "Unsqueeze", "Squeeze", "Gather",
        "Constant", "Identity",
    }
)  # fmt: skip

# op -> input positions that must be constant, else the output's shape depends on data (opset >= 13).
CONSTANT_INPUTS = {
    "Gather": (1,),
    "Slice": (1, 2, 3, 4),
    "Reshape": (1,),
    "Split": (1,),
    "Unsqueeze": (1,),
    "Squeeze": (1,),
}

_DEFAULT_DOMAINS = ("", "ai.onnx")


@dataclass(frozen=True)
class Finding:
    """One reason the graph is not NPU-ready; `where` is a node name or `input:NAME`/`output:NAME`."""

    where: str
    op_type: str
    reason: str

    def __str__(self) -> str:
        return f"{self.where} ({self.op_type}): {self.reason}"


@dataclass(frozen=True)
class AuditReport:
    op_histogram: dict[str, int]  # op_type -> node count, subgraphs included
    findings: tuple[Finding, ...]

    @property
    def passed(self) -> bool:
        return not self.findings


class OpAuditError(FleetrlError, ValueError):
    """The graph failed the audit; `report` holds the histogram and every finding."""

    def __init__(self, report: AuditReport) -> None:
        lines = "\n  ".join(str(f) for f in report.findings)
        super().__init__(f"ONNX graph is not NPU-ready ({len(report.findings)} finding(s)):\n  {lines}")
        self.report = report


def _subgraphs(node: onnx.NodeProto) -> Iterator[tuple[str, onnx.GraphProto]]:
    for attr in node.attribute:
        if attr.type == onnx.AttributeProto.GRAPH:
            yield attr.name, attr.g
        elif attr.type == onnx.AttributeProto.GRAPHS:
            for i, graph in enumerate(attr.graphs):
                yield f"{attr.name}[{i}]", graph


def _node_findings(node: onnx.NodeProto, where: str, constants: set[str], allowed: frozenset[str]) -> list[Finding]:
    if node.domain not in _DEFAULT_DOMAINS:
        return [Finding(where, node.op_type, f"custom-domain op ({node.domain!r}) no NPU compiler knows")]
    if node.op_type in FORBIDDEN:
        return [Finding(where, node.op_type, FORBIDDEN[node.op_type])]
    if node.op_type not in allowed:
        return [Finding(where, node.op_type, "op outside the NPU allowlist")]
    found = []
    for pos in CONSTANT_INPUTS.get(node.op_type, ()):
        name = node.input[pos] if pos < len(node.input) else ""
        if name and name not in constants:  # "" marks an omitted optional input
            found.append(Finding(where, node.op_type, f"input {pos} ({name!r}) is computed at run time, not constant"))
    return found


def _walk(
    graph: onnx.GraphProto, prefix: str, outer_constants: set[str], allowed: frozenset[str]
) -> Iterator[tuple[onnx.NodeProto, list[Finding]]]:
    graph_inputs = {i.name for i in graph.input}
    # An initializer that is also a graph input is only a default: callers may override it.
    constants = outer_constants | {t.name for t in graph.initializer if t.name not in graph_inputs}
    for i, node in enumerate(graph.node):
        where = f"{prefix}{node.name or f'node{i}'}"
        yield node, _node_findings(node, where, constants, allowed)
        if node.op_type == "Constant" or (node.input and all(n in constants for n in node.input if n)):
            constants |= set(node.output)  # folds to a constant at compile time
        for attr_name, sub in _subgraphs(node):
            yield from _walk(sub, f"{where}/{attr_name}/", constants, allowed)


def _dynamic_dims(values: Iterable[onnx.ValueInfoProto], kind: str) -> list[Finding]:
    found = []
    for value in values:
        dims = value.type.tensor_type.shape.dim
        shape = [d.dim_value if d.HasField("dim_value") else (d.dim_param or "?") for d in dims]
        if not value.type.tensor_type.HasField("shape") or any(not isinstance(d, int) or d < 1 for d in shape):
            found.append(Finding(f"{kind}:{value.name}", "-", f"shape {shape} is not static"))
    return found


def audit_onnx(
    model: onnx.ModelProto | str | os.PathLike,
    *,
    allowed_ops: frozenset[str] = NPU_OPS,
    require_static_shapes: bool = True,
) -> AuditReport:
    """Audit every node (subgraphs included); raise OpAuditError listing all findings, else return the report."""
    if not isinstance(model, onnx.ModelProto):
        model = onnx.load(os.fspath(model))
    histogram: collections.Counter[str] = collections.Counter()
    findings: list[Finding] = []
    for node, node_findings in _walk(model.graph, "", set(), allowed_ops):
        histogram[node.op_type] += 1
        findings += node_findings
    if require_static_shapes:
        initializers = {t.name for t in model.graph.initializer}
        findings += _dynamic_dims((i for i in model.graph.input if i.name not in initializers), "input")
        findings += _dynamic_dims(model.graph.output, "output")
    report = AuditReport(dict(sorted(histogram.items())), tuple(findings))
    if findings:
        raise OpAuditError(report)
    return report
