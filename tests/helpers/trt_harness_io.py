"""Talking to tests/plugins/trt/trt_harness.cpp: a spec from a real fdpp node and concrete shapes, and its answers
parsed back. The spec's format is described at the top of the C++ file."""

from __future__ import annotations

import subprocess
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import onnx

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
