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

import ml_dtypes
import numpy as np

# name, ONNX TensorProto data type, numpy type
FLOAT_TYPES = (("float32", 1, np.float32), ("float16", 10, np.float16), ("bfloat16", 16, ml_dtypes.bfloat16))
NAMES = tuple(name for name, _, _ in FLOAT_TYPES)
_BY_ONNX = {onnx_type: name for name, onnx_type, _ in FLOAT_TYPES}
_BY_NUMPY = {np.dtype(np_type): name for name, _, np_type in FLOAT_TYPES}
_ONNX_BY_NAME = {name: onnx_type for name, onnx_type, _ in FLOAT_TYPES}
_NUMPY_BY_NAME = {name: np.dtype(np_type) for name, _, np_type in FLOAT_TYPES}


def onnx_dtype_name(onnx_type: int, default: str | None = None) -> str | None:
    """'float16' for ONNX type 10; `default` for a type that is not one of FLOAT_TYPES."""
    return _BY_ONNX.get(int(onnx_type), default)


def numpy_dtype_name(dtype, default: str | None = None) -> str | None:
    """'float32' for np.float32 (a type or a dtype); `default` for a type that is not one of FLOAT_TYPES."""
    return _BY_NUMPY.get(np.dtype(dtype), default) if dtype is not None else default


def onnx_type_of(name: str) -> int:
    return _ONNX_BY_NAME[name]


def numpy_type(name: str) -> np.dtype:
    return _NUMPY_BY_NAME[name]


def itemsize(name: str) -> int:
    """Bytes per element: 4 for float32, 2 for float16 and bfloat16."""
    return _NUMPY_BY_NAME[name].itemsize


def torch_to_numpy(tensor) -> np.ndarray:
    """A CPU torch tensor as a numpy array of the same dtype and bits (bfloat16 through a 16-bit integer view)."""
    import torch

    if tensor.dtype == torch.bfloat16:
        return tensor.contiguous().view(torch.int16).numpy().view(ml_dtypes.bfloat16)
    return tensor.numpy()


def numpy_to_torch(array: np.ndarray):
    """A numpy array as a CPU torch tensor of the same dtype and bits (bfloat16 through a 16-bit integer view);
    a read-only array (a memory map) is copied, since torch tensors are writable."""
    import torch

    array = np.require(array, requirements=["C", "W"])
    if array.dtype == np.dtype(ml_dtypes.bfloat16):
        return torch.from_numpy(array.view(np.int16)).view(torch.bfloat16)
    return torch.from_numpy(array)
