"""ctypes binding of fdpp::RMSNorm (plugins/capi/norm_capi.h) and its torch-facing function.

    from fdpp_rewrite.gpu.norm import rms_norm
    y = rms_norm(x, weight, 1e-5)             # x [..., H] on the GPU, weight [H]; one kernel launch
    rms_norm(x, weight, 1e-5, out=buffer)     # into a preallocated buffer (CUDA-graph friendly; may be x)

Semantics: plugins/RMSNormPlugin/contract.json. The launch is asynchronous on torch's current stream (or
`stream`) and never synchronizes or allocates (except `out` when it is not given).
"""

from __future__ import annotations

import ctypes
import functools
import math

from fdpp_rewrite.errors import FdppError
from fdpp_rewrite.gpu import lib as fdpp_lib

MAX_HIDDEN = 16384  # kRmsNormMaxHidden in plugins/kernels/norm/rms_norm.h
HIDDEN_MULTIPLE = 8  # 16-byte vectors of float16

_i32, _i64, _f32, _ptr = ctypes.c_int32, ctypes.c_int64, ctypes.c_float, ctypes.c_void_p


class RmsNormArgs(ctypes.Structure):
    """Mirror of fdpp_rms_norm_args (field order and types must match the C header)."""

    _fields_ = [
        ("dtype", _i32), ("hidden", _i32), ("rows", _i64), ("epsilon", _f32),
        ("x", _ptr), ("x_row_stride", _i64), ("weight", _ptr), ("y", _ptr), ("y_row_stride", _i64),
    ]


@functools.lru_cache(maxsize=1)
def library() -> ctypes.CDLL:
    """The plugin library with the norm functions' signatures declared and the struct size checked."""
    lib = fdpp_lib.load()
    try:
        lib.fdpp_rms_norm.argtypes = [ctypes.POINTER(RmsNormArgs), _ptr]
        lib.fdpp_rms_norm.restype = ctypes.c_int
        lib.fdpp_rms_norm_args_size.restype = ctypes.c_int
    except AttributeError as exc:
        raise FdppError(f"{fdpp_lib.library_path()} has no fdpp_rms_norm; rebuild the library from this "
                        "checkout") from exc
    if lib.fdpp_rms_norm_args_size() != ctypes.sizeof(RmsNormArgs):
        raise FdppError(f"{fdpp_lib.library_path()} was built from another version of norm_capi.h "
                        "(fdpp_rms_norm_args size mismatch); rebuild the library from this checkout")
    return lib


def rms_norm(x, weight, eps: float, out=None, stream=None):
    """fdpp::RMSNorm: y = to_dtype(to_dtype(x / sqrt(mean(x^2, -1) + eps)) * weight) for x [..., H] (float16,
    bfloat16 or float32, contiguous, on the GPU), weight [H] of x's dtype; H a multiple of 8 up to 16384.
    Writes `out` (x's shape, dtype and device, contiguous; may be x itself) or a new tensor; returns it.
    The kernel loads `weight` before it waits for the kernel before it in the stream (programmatic dependent
    launch): that kernel must not write the weight (cast a weight into its own buffer one launch earlier)."""
    import torch

    name = str(x.dtype).replace("torch.", "")
    if name not in fdpp_lib.DTYPE_CODES:
        raise FdppError(f"rms_norm takes float16, bfloat16 or float32 tensors, not {name}; cast x")
    if x.device.type != "cuda":
        raise FdppError(f"rms_norm runs on a CUDA GPU; x is on {x.device}")
    if x.dim() < 1 or not x.is_contiguous():
        raise FdppError(f"rms_norm: x must be a contiguous tensor [..., H], got shape {tuple(x.shape)} with "
                        f"strides {x.stride()}; call .contiguous()")
    hidden = x.shape[-1]
    if hidden % HIDDEN_MULTIPLE or not HIDDEN_MULTIPLE <= hidden <= MAX_HIDDEN:
        raise FdppError(f"rms_norm: hidden size {hidden} is not supported; the kernel takes a multiple of "
                        f"{HIDDEN_MULTIPLE} up to {MAX_HIDDEN}")
    if tuple(weight.shape) != (hidden,) or weight.dtype != x.dtype or weight.device != x.device \
            or not weight.is_contiguous():
        raise FdppError(f"rms_norm: weight must be a contiguous [{hidden}] {name} tensor on {x.device}, got "
                        f"{tuple(weight.shape)} {str(weight.dtype).replace('torch.', '')} on {weight.device}")
    if not (isinstance(eps, (int, float)) and math.isfinite(eps) and eps >= 0):
        raise FdppError(f"rms_norm: eps must be a finite number >= 0, got {eps!r}")
    if out is None:
        out = torch.empty_like(x)
    elif tuple(out.shape) != tuple(x.shape) or out.dtype != x.dtype or out.device != x.device \
            or not out.is_contiguous():
        raise FdppError(f"rms_norm: out must be a contiguous {tuple(x.shape)} {name} tensor on {x.device}, got "
                        f"{tuple(out.shape)} {str(out.dtype).replace('torch.', '')} on {out.device}")
    args = RmsNormArgs()
    args.dtype, args.hidden, args.rows, args.epsilon = fdpp_lib.DTYPE_CODES[name], hidden, x.numel() // hidden, eps
    args.x, args.x_row_stride = x.data_ptr(), hidden
    args.weight = weight.data_ptr()
    args.y, args.y_row_stride = out.data_ptr(), hidden
    fdpp_lib.check(library().fdpp_rms_norm(ctypes.byref(args), fdpp_lib.stream_handle(stream)), "rms_norm")
    return out
