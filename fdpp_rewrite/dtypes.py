"""The floating-point types fdpp handles, under each of the names other libraries give them (one table).

    onnx_dtype_name(10)            -> "float16"      (an ONNX TensorProto data type)
    numpy_dtype_name(np.float32)   -> "float32"
"""

from __future__ import annotations

import numpy as np

# name, ONNX TensorProto data type, numpy type (numpy has no bfloat16)
FLOAT_TYPES = (("float32", 1, np.float32), ("float16", 10, np.float16), ("bfloat16", 16, None))
_BY_ONNX = {onnx_type: name for name, onnx_type, _ in FLOAT_TYPES}
_BY_NUMPY = {np.dtype(np_type): name for name, _, np_type in FLOAT_TYPES if np_type is not None}
_ONNX_BY_NAME = {name: onnx_type for name, onnx_type, _ in FLOAT_TYPES}


def onnx_dtype_name(onnx_type: int, default: str | None = None) -> str | None:
    """'float16' for ONNX type 10; `default` for a type that is not one of FLOAT_TYPES."""
    return _BY_ONNX.get(int(onnx_type), default)


def numpy_dtype_name(dtype, default: str | None = None) -> str | None:
    """'float32' for np.float32 (a type or a dtype); `default` for a type that is not one of FLOAT_TYPES."""
    return _BY_NUMPY.get(np.dtype(dtype), default) if dtype is not None else default


def onnx_type_of(name: str) -> int:
    return _ONNX_BY_NAME[name]
