"""Where weights live during a rewrite, so a 13 GB model never sits in memory twice.

* The input's weights stay lazy: onnx-graphsurgeon constants whose data is read from the input's external
  data file only when a pass needs them (`attach_external_data`), and read without caching (`load_values`).
* Concatenated weights (projection fusion) are lazy too (`concat_constant`): read and joined only when the
  flat gemm pass transposes them.
* The weights that end up in the output go through a WeightStore: in memory for small models and tests, or
  appended straight to the output's external data file (4096-byte aligned, as the exporter writes them)
  when the rewrite is written with external data.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnx_graphsurgeon as gs
from onnx import numpy_helper
from onnx_graphsurgeon.ir.tensor import LazyValues

from fdpp_rewrite.errors import FdppError

ALIGNMENT = 4096          # every external tensor starts on a page boundary (engines may mmap them)
STREAM_MIN_BYTES = 4096   # smaller tensors (biases, split sizes) stay inline in the .onnx file


class ExternalValues(LazyValues):
    """A lazy constant whose external data is relative to `base_dir` (gs's own LazyValues assumes the
    current directory)."""

    def __init__(self, tensor: onnx.TensorProto, base_dir: str):
        super().__init__(tensor)
        self.base_dir = base_dir

    def load(self) -> np.ndarray:
        return np.array(numpy_helper.to_array(self.tensor, self.base_dir))


class ConcatValues(LazyValues):
    """The concatenation of constants along `axis`, computed only when read: a fused projection weight costs
    nothing until the flat gemm pass transposes it into its final form."""

    def __init__(self, parts: list, axis: int):  # noqa: D107 - LazyValues' constructor needs a TensorProto
        self.parts, self.axis = list(parts), axis
        shapes = [list(p.shape) for p in self.parts]
        self.shape = list(shapes[0])
        self.shape[axis] = sum(shape[axis] for shape in shapes)
        self.dtype = self.parts[0].dtype
        self.nbytes = int(np.prod(self.shape)) * np.dtype(self.dtype).itemsize

    def load(self) -> np.ndarray:
        return np.concatenate([load_values(part) for part in self.parts], axis=self.axis)

    @property
    def tensor(self) -> onnx.TensorProto:
        """What onnx-graphsurgeon exports if the fused weight survives to the output (not in a full rewrite)."""
        return numpy_helper.from_array(self.load())

    def __str__(self):
        return f"ConcatValues(shape={self.shape}, dtype={self.dtype}, parts={len(self.parts)})"


def concat_constant(name: str, parts: list, axis: int) -> gs.Constant:
    return gs.Constant(name, ConcatValues(parts, axis))


def attach_external_data(graph: gs.Graph, base_dir: str) -> int:
    """Make the graph's external-data constants readable from `base_dir`; returns how many there are."""
    count = 0
    for tensor in graph.tensors().values():
        values = getattr(tensor, "_values", None)
        if isinstance(tensor, gs.Constant) and isinstance(values, LazyValues) \
                and onnx.external_data_helper.uses_external_data(values.tensor):
            tensor._values = ExternalValues(values.tensor, base_dir)
            count += 1
    return count


def load_values(tensor: gs.Constant) -> np.ndarray:
    """A constant's values without keeping them cached on the constant (gs's `.values` would hold every
    weight a pass touches until the graph is dropped)."""
    values = tensor._values  # noqa: SLF001 - gs has no public non-caching read
    return values.load() if isinstance(values, LazyValues) else values


class WeightStore:
    """Makes the constants the passes create. With `data_path`, big ones are appended to that file at once and
    stay lazy in the graph; without, they are ordinary in-memory constants."""

    def __init__(self, data_path: Path | None = None):
        self.data_path = Path(data_path) if data_path else None
        self._file = open(self.data_path, "wb") if self.data_path else None
        self.offset = 0

    @property
    def streaming(self) -> bool:
        return self._file is not None

    def constant(self, name: str, array: np.ndarray) -> gs.Constant:
        array = np.ascontiguousarray(array)
        if not self.streaming or array.nbytes < STREAM_MIN_BYTES:
            return gs.Constant(name, array)
        tensor = self._append(name, onnx.helper.np_dtype_to_tensor_dtype(array.dtype), array.shape,
                              array.reshape(-1).view(np.uint8).data)
        return gs.Constant(name, ExternalValues(tensor, str(self.data_path.parent)))

    def _append(self, name, data_type, dims, payload) -> onnx.TensorProto:
        padding = -self.offset % ALIGNMENT
        self._file.write(b"\0" * padding)
        self.offset += padding
        self._file.write(payload)
        self._file.flush()  # a later pass may read this weight back
        tensor = onnx.TensorProto(name=name, data_type=data_type, dims=list(dims))
        tensor.data_location = onnx.TensorProto.EXTERNAL
        length = len(payload) if isinstance(payload, (bytes, bytearray)) else payload.nbytes
        for key, value in (("location", self.data_path.name), ("offset", str(self.offset)), ("length", str(length))):
            entry = tensor.external_data.add()
            entry.key, entry.value = key, value
        self.offset += length
        return tensor

    def adopt(self, model: onnx.ModelProto, source_dir: str) -> None:
        """Move every big initializer of `model` that is not in our file yet (the input's weights, inline or
        in the input's data file) into it, one tensor at a time, so the model needs only our file."""
        for tensor in model.graph.initializer:
            external = onnx.external_data_helper.uses_external_data(tensor)
            if external and _location(tensor) == self.data_path.name:
                continue
            if external:
                payload = onnx.external_data_helper._read_external_data_bytes(tensor, source_dir)  # noqa: SLF001
            elif tensor.HasField("raw_data") and len(tensor.raw_data) >= STREAM_MIN_BYTES:
                payload = tensor.raw_data
            else:
                continue
            moved = self._append(tensor.name, tensor.data_type, tensor.dims, payload)
            tensor.ClearField("raw_data")
            del tensor.external_data[:]
            tensor.external_data.extend(moved.external_data)
            tensor.data_location = onnx.TensorProto.EXTERNAL

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None

    def discard(self) -> None:
        """Close and delete a partly written data file (the rewrite failed)."""
        self.close()
        if self.data_path is not None and self.data_path.exists():
            self.data_path.unlink()


def _location(tensor: onnx.TensorProto) -> str:
    for entry in tensor.external_data:
        if entry.key == "location":
            return entry.value
    raise FdppError(f"external tensor '{tensor.name}' names no data file; the model is corrupt, re-export it")
