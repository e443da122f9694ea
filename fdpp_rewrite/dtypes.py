"""The floating-point types fdpp handles, under each of the names other libraries give them (one table).

    onnx_dtype_name(10)            -> "float16"      (an ONNX TensorProto data type)
    numpy_dtype_name(np.float32)   -> "float32"
    numpy_type("bfloat16")         -> ml_dtypes.bfloat16 (what onnx's numpy_helper reads a type-16 tensor as)
    torch_to_numpy(tensor)         -> the same bits as a numpy array (torch cannot hand numpy a bfloat16 tensor)
    numpy_to_torch(array)          -> and back

numpy has no bfloat16 of its own; ml_dtypes (a dependency of onnx) adds it, and onnx reads and writes it.
A torch dtype has the same name as its row: getattr(torch, name).
"""

from __future__ import annotations

import functools

import numpy as np

# name, ONNX TensorProto data type, bytes per element
FLOAT_TYPES = (("float32", 1, 4), ("float16", 10, 2), ("bfloat16", 16, 2))
NAMES = tuple(name for name, _, _ in FLOAT_TYPES)
_BY_ONNX = {onnx_type: name for name, onnx_type, _ in FLOAT_TYPES}
_ONNX_BY_NAME = {name: onnx_type for name, onnx_type, _ in FLOAT_TYPES}
_ITEMSIZE = {name: size for name, _, size in FLOAT_TYPES}


@functools.lru_cache(maxsize=1)
def _numpy_by_name() -> dict:
    """Imported on first use: ml_dtypes takes most of a second to import, and the CLI's error paths need none of it."""
    import ml_dtypes

    return {"float32": np.dtype(np.float32), "float16": np.dtype(np.float16), "bfloat16": np.dtype(ml_dtypes.bfloat16)}


def onnx_dtype_name(onnx_type: int, default: str | None = None) -> str | None:
    """'float16' for ONNX type 10; `default` for a type that is not one of FLOAT_TYPES."""
    return _BY_ONNX.get(int(onnx_type), default)


def numpy_dtype_name(dtype, default: str | None = None) -> str | None:
    """'float32' for np.float32 (a type or a dtype); `default` for a type that is not one of FLOAT_TYPES."""
    if dtype is None:
        return default
    name = np.dtype(dtype).name  # ml_dtypes' bfloat16 is named so too
    return name if name in NAMES and _numpy_by_name()[name] == np.dtype(dtype) else default


def onnx_type_of(name: str) -> int:
    return _ONNX_BY_NAME[name]


def numpy_type(name: str) -> np.dtype:
    return _numpy_by_name()[name]


def itemsize(name: str) -> int:
    """Bytes per element: 4 for float32, 2 for float16 and bfloat16."""
    return _ITEMSIZE[name]


def torch_to_numpy(tensor) -> np.ndarray:
    """A CPU torch tensor as a numpy array of the same dtype and bits (bfloat16 through a 16-bit integer view)."""
    import torch

    if tensor.dtype == torch.bfloat16:
        return tensor.contiguous().view(torch.int16).numpy().view(numpy_type("bfloat16"))
    return tensor.numpy()


def numpy_to_torch(array: np.ndarray):
    """A numpy array as a CPU torch tensor of the same dtype and bits (bfloat16 through a 16-bit integer view);
    a read-only array (a memory map) is copied, since torch tensors are writable."""
    import torch

    array = np.require(array, requirements=["C", "W"])
    if array.dtype.name == "bfloat16":
        return torch.from_numpy(array.view(np.int16)).view(torch.bfloat16)
    return torch.from_numpy(array)
