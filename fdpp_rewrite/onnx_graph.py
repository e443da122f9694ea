"""Two small tools for building big ONNX graphs directly: a node/constant builder, and a writer that streams
initializer bytes into one external data file as they are produced (so a 13 GB model never sits in memory)."""

from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from fdpp_rewrite.dtypes import numpy_dtype_name, onnx_type_of

ALIGNMENT = 4096  # every external tensor starts on a page boundary, so engines can mmap tensors directly

_OTHER_TYPES = {np.dtype(np.int64): TensorProto.INT64, np.dtype(np.bool_): TensorProto.BOOL}


def onnx_type(dtype: np.dtype) -> int:
    """The ONNX data type of a numpy dtype this module writes (the float types from fdpp_rewrite.dtypes)."""
    name = numpy_dtype_name(dtype)
    return onnx_type_of(name) if name else _OTHER_TYPES[np.dtype(dtype)]


class ExternalDataWriter:
    """Appends tensors to `path` and returns TensorProtos that point at them (data_location=EXTERNAL)."""

    def __init__(self, path: Path):
        self.path = Path(path)
        self._file = open(self.path, "wb")
        self.offset = 0
        self.num_tensors = 0

    def write(self, name: str, array: np.ndarray) -> TensorProto:
        array = np.ascontiguousarray(array)
        padding = -self.offset % ALIGNMENT
        if padding:
            self._file.write(b"\0" * padding)
            self.offset += padding
        self._file.write(array.reshape(-1).view(np.uint8).data)
        tensor = TensorProto(name=name, data_type=onnx_type(array.dtype), dims=array.shape)
        tensor.data_location = TensorProto.EXTERNAL
        for key, value in (("location", self.path.name), ("offset", str(self.offset)),
                           ("length", str(array.nbytes))):
            entry = tensor.external_data.add()
            entry.key, entry.value = key, value
        self.offset += array.nbytes
        self.num_tensors += 1
        return tensor

    def close(self):
        self._file.close()


class GraphBuilder:
    """Collects nodes and initializers. `op` returns output names; `const` makes small inline initializers
    (deduplicated); `weight` streams a big one to the external data file. Node names follow `scope`."""

    def __init__(self, external: ExternalDataWriter):
        self.external = external
        self.nodes: list[onnx.NodeProto] = []
        self.initializers: list[TensorProto] = []
        self.scope = "model"
        self._counter = 0
        self._consts: dict[tuple, str] = {}

    def _fresh(self, op_type: str) -> str:
        self._counter += 1
        return f"{self.scope}/{op_type}_{self._counter}"

    def op(self, op_type: str, inputs: list[str], outputs: int | list[str] = 1, **attrs):
        """Add one node. `outputs` is a count (fresh names) or explicit names; returns one name or a list."""
        name = self._fresh(op_type)
        names = [f"{name}:{k}" for k in range(outputs)] if isinstance(outputs, int) else list(outputs)
        self.nodes.append(helper.make_node(op_type, inputs, names, name=name, **attrs))
        return names[0] if len(names) == 1 else names

    def const(self, value, dtype) -> str:
        """A small constant (shape, scale, index) stored inside the model file."""
        array = np.array(value, dtype=dtype)
        key = (array.dtype.str, array.shape, array.tobytes())
        if key not in self._consts:
            name = f"const_{len(self._consts)}"
            self.initializers.append(numpy_helper.from_array(array, name))
            self._consts[key] = name
        return self._consts[key]

    def weight(self, name: str, array: np.ndarray) -> str:
        self.initializers.append(self.external.write(name, array))
        return name


def widen_bfloat16(model: onnx.ModelProto) -> onnx.ModelProto:
    """A copy of `model` (its weights loaded) with every bfloat16 tensor float32: initializers (widened exactly),
    graph inputs, outputs and value infos, Cast targets, Constant and ConstantOfShape values. The same graph in
    float32 math, for onnxruntime, whose CPU kernels mostly lack bfloat16 (no Where, MatMul, Softmax)."""
    bf16, f32 = onnx_type_of("bfloat16"), TensorProto.FLOAT
    wide = onnx.ModelProto()
    wide.CopyFrom(model)
    graph = wide.graph

    def widened(tensor: TensorProto) -> TensorProto:
        if tensor.data_type != bf16:
            return tensor
        return numpy_helper.from_array(numpy_helper.to_array(tensor).astype(np.float32), tensor.name)

    for index, tensor in enumerate(graph.initializer):
        if tensor.data_type == bf16:
            graph.initializer[index].CopyFrom(widened(tensor))
    for value in list(graph.input) + list(graph.output) + list(graph.value_info):
        if value.type.tensor_type.elem_type == bf16:
            value.type.tensor_type.elem_type = f32
    for node in graph.node:
        for attribute in node.attribute:
            if node.op_type == "Cast" and attribute.name == "to" and attribute.i == bf16:
                attribute.i = f32
            elif attribute.type == onnx.AttributeProto.TENSOR and attribute.t.data_type == bf16:
                attribute.t.CopyFrom(widened(attribute.t))
    return wide


def widened_dtype(dtype) -> np.dtype:
    """The numpy dtype a value of `dtype` has in widen_bfloat16's graph: float32 for bfloat16 (a numpy dtype, or
    ONNX's 16 as onnx-graphsurgeon gives it), else `dtype` itself."""
    if isinstance(dtype, (int, np.integer)):
        dtype = helper.tensor_dtype_to_np_dtype(int(dtype))  # bfloat16: ml_dtypes' numpy type
    return np.dtype(np.float32) if numpy_dtype_name(dtype) == "bfloat16" else np.dtype(dtype)
