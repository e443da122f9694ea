"""Talking to tests/plugins/trt/trt_harness.cpp: a spec from a real fdpp node and concrete shapes, and its answers
parsed back. The spec's format is described at the top of the C++ file."""

from __future__ import annotations

import subprocess
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

HARNESS_TYPES = {"float16": "half", "bfloat16": "bf16", "float32": "float", "int64": "int64"}


@dataclass
class TensorSpec:
    dtype: str  # "float16", "bfloat16", "float32" or "int64"
    shape: tuple
    file: Path | None = None


@dataclass
class CaseSpec:
    label: str
    inputs: list
    output: Path | None = None


def plugin_version(node: onnx.NodeProto) -> str:
    """What TensorRT's ONNX parser looks the creator up by: the node's plugin_version, "1" when absent."""
    for attr in node.attribute:
        if attr.name == "plugin_version":
            return attr.s.decode()
    return "1"


def field_lines(node: onnx.NodeProto, overrides: dict | None = None, drop: tuple = ()) -> list[str]:
    """The node's attributes as the ONNX parser passes them (every one, plugin_version included), with test edits."""
    values = {attr.name: onnx.helper.get_attribute_value(attr) for attr in node.attribute}
    values.update(overrides or {})
    lines = []
    for name, value in values.items():
        if name in drop:
            continue
        if isinstance(value, bytes):
            value = value.decode()
        kind = "string" if isinstance(value, str) else "float" if isinstance(value, float) else "int"
        lines.append(f"field {name} {kind} {value!r}" if kind == "float" else f"field {name} {kind} {value}")
    return lines


def write_spec(path: Path, node: onnx.NodeProto, cases: list, overrides=None, drop=()) -> Path:
    lines = [f"plugin {node.op_type} {plugin_version(node)}", *field_lines(node, overrides, drop)]
    for case in cases:
        lines.append(f"case {case.label}")
        for t in case.inputs:
            shape = ",".join(str(d) for d in t.shape)
            lines.append(f"input {HARNESS_TYPES[t.dtype]} {shape} {t.file or ''}".rstrip())
        if case.output is not None:
            lines.append(f"output {case.output}")
    path.write_text("\n".join(lines) + "\n")
    return path


@dataclass
class HarnessResult:
    returncode: int
    lines: list
    cases: dict = field(default_factory=dict)  # label -> {key: [values...]} of that case's build-phase answers

    def values(self, key: str) -> list[str]:
        """The rest of every top-level line starting with `key`."""
        return [line[len(key) + 1:] for line in self.lines if line.split(" ", 1)[0] == key]

    @property
    def logs(self) -> str:
        return "\n".join(self.values("log"))


def run_harness(harness: Path, library: Path, spec: Path) -> HarnessResult:
    done = subprocess.run([str(harness), str(library), str(spec)], capture_output=True, text=True, timeout=300)
    lines = done.stdout.splitlines()
    result = HarnessResult(done.returncode, lines)
    current = None
    for line in lines:
        key, _, rest = line.partition(" ")
        if key == "case":
            current = result.cases.setdefault(rest, {})
        elif current is not None and key not in ("serialized", "roundtrip", "log", "creator", "creator_field"):
            current.setdefault(key, []).append(rest)
    return result


def to_bits(array: np.ndarray, dtype: str) -> bytes:
    """Raw bytes of `array` in `dtype`; bfloat16 is float32's upper half, rounded to nearest even."""
    if dtype == "bfloat16":
        bits = np.ascontiguousarray(array, dtype=np.float32).view(np.uint32).astype(np.uint64)
        rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16
        return rounded.astype(np.uint16).tobytes()
    return np.ascontiguousarray(array, dtype=np.dtype(dtype)).tobytes()


def from_bits(data: bytes, dtype: str, shape) -> np.ndarray:
    if dtype == "bfloat16":
        return (np.frombuffer(data, dtype=np.uint16).astype(np.uint32) << 16).view(np.float32).reshape(shape)
    return np.frombuffer(data, dtype=np.dtype(dtype)).reshape(shape).astype(np.float32)


def rounded(array: np.ndarray, dtype: str) -> np.ndarray:
    """`array` as the plugin sees it after the host wrote it in `dtype` (float32 values)."""
    return from_bits(to_bits(array, dtype), dtype, array.shape)


def fdpp_nodes_graph(model: onnx.ModelProto, dtype: str) -> onnx.ModelProto:
    """A graph of the rewritten model's first FlatGemm (its weight, loaded) and first attention node alone, fed by
    graph inputs with the exporter's dimension names, in `dtype`: the two big plugins in a plan of their own, at
    real-size shapes too (scripts/trt_job.sh llama2)."""
    elem = {"float16": TensorProto.FLOAT16, "bfloat16": TensorProto.BFLOAT16}[dtype]
    gemm = next(n for n in model.graph.node if n.op_type == "FlatGemm")
    attention = next(n for n in model.graph.node if n.op_type == "AsyncSoftmaxAttention")
    weight = numpy_helper.to_array(next(t for t in model.graph.initializer if t.name == gemm.input[1]))
    n, k = weight.shape
    attrs = {a.name: helper.get_attribute_value(a) for a in attention.attribute}
    heads, kv_heads, dim = attrs["num_heads"], attrs["num_kv_heads"], attrs["head_dim"]
    capacity = next(i for i in model.graph.input if i.name == "key_cache.0").type.tensor_type.shape.dim[2].dim_value
    gemm_attrs = {a.name: helper.get_attribute_value(a) for a in gemm.attribute}
    constants = {"weight": weight}
    if gemm_attrs.get("has_bias", 0):
        constants["bias"] = numpy_helper.to_array(next(t for t in model.graph.initializer if t.name == gemm.input[2]))
    initializers = [helper.make_tensor(name, elem, value.shape, to_bits(value, dtype), raw=True)
                    for name, value in constants.items()]
    epilogue = gemm_attrs.get("epilogue", b"none").decode()
    out_n = n // 2 if epilogue == "silu_mul" else n
    residual = [helper.make_tensor_value_info("residual", elem, ["batch", "seq", n])] if epilogue == "residual" else []
    new_gemm = helper.make_node("FlatGemm", ["x", *constants, *(r.name for r in residual)], ["y"], name="gemm",
                                domain="fdpp")
    new_gemm.attribute.extend(gemm.attribute)
    new_attention = helper.make_node("AsyncSoftmaxAttention", ["q", "key_cache.0", "value_cache.0", "past_len"],
                                     ["attn"], name="attention", domain="fdpp")
    new_attention.attribute.extend(attention.attribute)
    graph = helper.make_graph(
        [new_gemm, new_attention], "fdpp-nodes",
        [helper.make_tensor_value_info("x", elem, ["batch", "seq", k]),
         helper.make_tensor_value_info("q", elem, ["batch", heads, "seq", dim]),
         helper.make_tensor_value_info("key_cache.0", elem, ["batch", kv_heads, capacity, dim]),
         helper.make_tensor_value_info("value_cache.0", elem, ["batch", kv_heads, capacity, dim]),
         helper.make_tensor_value_info("past_len", TensorProto.INT64, ["batch"]), *residual],
        [helper.make_tensor_value_info("y", elem, ["batch", "seq", out_n]),
         helper.make_tensor_value_info("attn", elem, ["batch", heads, "seq", dim])],
        initializers)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("fdpp", 4)])


def as_bfloat16(model: onnx.ModelProto) -> onnx.ModelProto:
    """A float16 graph (weights loaded) retyped to bfloat16: inputs, outputs, value infos, initializers, Constant
    values and Cast targets (the exporter writes float16 and float32 only; the TensorRT build takes both halves)."""
    bf16, f16 = TensorProto.BFLOAT16, TensorProto.FLOAT16
    out = onnx.ModelProto()
    out.CopyFrom(model)
    graph = out.graph

    def retype(tensor: onnx.TensorProto) -> None:
        if tensor.data_type == f16:
            values = numpy_helper.to_array(tensor).astype(np.float32)
            tensor.CopyFrom(helper.make_tensor(tensor.name, bf16, values.shape, to_bits(values, "bfloat16"), raw=True))

    for info in (*graph.input, *graph.output, *graph.value_info):
        if info.type.tensor_type.elem_type == f16:
            info.type.tensor_type.elem_type = bf16
    for tensor in graph.initializer:
        retype(tensor)
    for node in graph.node:
        for attr in node.attribute:
            if node.op_type == "Cast" and attr.name == "to" and attr.i == f16:
                attr.i = bf16
            elif attr.type == onnx.AttributeProto.TENSOR:
                retype(attr.t)
    return out
