"""ctypes bindings of the portable kernels' C ABI (plugins/capi/portable_capi.h): the one-source NVIDIA/AMD decode
attention and GEMM, run here on the CUDA library so that the H200 checks the source the AMD build compiles.

    from fdpp_rewrite.gpu import portable
    out = portable.attention(q, k_cache, v_cache, past_len, phi=phi)   # same inputs and options as attention()
    y = portable.linear(x, w, bias, epilogue="silu_mul")                # M <= 16

The pure host heuristics (decode_splits, gemm_plan) need the library but no GPU.
"""

from __future__ import annotations

import ctypes
import functools

from fdpp_rewrite.errors import FdppError
from fdpp_rewrite.gpu import attention as _attention
from fdpp_rewrite.gpu import gemm as _gemm
from fdpp_rewrite.gpu import lib as _lib

GEMM_KERNELS = {1: "gemv", 2: "flat"}
MAX_M = 16  # portable_heuristics.h: kFlatMaxM
MI210_CUS = 104


@functools.lru_cache(maxsize=1)
def library() -> ctypes.CDLL:
    """The plugin library with the portable functions' signatures declared."""
    lib = _lib.load()
    i32, i64, p32 = ctypes.c_int32, ctypes.c_int64, ctypes.POINTER(ctypes.c_int32)
    signatures = {
        "fdpp_portable_warp_size": ([], ctypes.c_int),
        "fdpp_portable_decode_splits": ([i64, i64, i32], ctypes.c_int),
        "fdpp_portable_gemm_plan": ([i64, i64, i32, i32, i32, p32, p32, p32, p32], ctypes.c_int),
        "fdpp_portable_attention_workspace_bytes": ([ctypes.POINTER(_attention.AttentionArgs),
                                                     ctypes.POINTER(ctypes.c_size_t)], ctypes.c_int),
        "fdpp_portable_attention_decode": ([ctypes.POINTER(_attention.AttentionArgs), ctypes.c_void_p, ctypes.c_size_t,
                                            ctypes.c_void_p], ctypes.c_int),
        "fdpp_portable_gemm": ([ctypes.POINTER(_gemm.Args), ctypes.c_void_p], ctypes.c_int),
    }
    for name, (argtypes, restype) in signatures.items():
        function = getattr(lib, name, None)
        if function is None:
            raise FdppError(f"{_lib.library_path()} has no {name}; rebuild the library from this checkout")
        function.argtypes, function.restype = argtypes, restype
    return lib


def warp_size() -> int:
    """Lanes per warp the library's portable kernels are built for (32: the CUDA library)."""
    return int(library().fdpp_portable_warp_size())


def decode_splits(rows: int, kv_len: int, cus: int) -> int:
    """The portable decode's split count for rows = batch x heads x query tokens (pure host code)."""
    return int(library().fdpp_portable_decode_splits(rows, kv_len, cus))


def gemm_plan(m: int, n: int, cus: int, warp: int = 64, epilogue: str = "none") -> dict:
    """The portable GEMM's choice for M rows and N weight rows: {"kernel": "gemv" | "flat", "m_tile",
    "pairs_per_warp", "k_chunk"} (pure host code; warp 64 = an AMD CDNA wavefront)."""
    if epilogue not in _gemm.EPILOGUES:
        raise FdppError(f"unknown epilogue {epilogue!r}; use one of {sorted(_gemm.EPILOGUES)}")
    out = [ctypes.c_int32() for _ in range(4)]
    _lib.check(library().fdpp_portable_gemm_plan(m, n, _gemm.EPILOGUES[epilogue], cus, warp,
                                                 *(ctypes.byref(v) for v in out)), "fdpp_portable_gemm_plan")
    kernel, m_tile, pairs, k_chunk = (v.value for v in out)
    return {"kernel": GEMM_KERNELS[kernel], "m_tile": m_tile, "pairs_per_warp": pairs, "k_chunk": k_chunk}


def attention(query, key, value, past_len=None, bias=None, *, out=None, workspace=None, stream=None, **kwargs):
    """fdpp_rewrite.gpu.attention.attention() on the portable kernels: the same inputs and options (kernel,
    prefill_config, decode_combine, pdl and combine_counters are accepted and ignored: one kernel family serves
    every shape)."""
    torch = _attention._torch()
    out = torch.empty_like(query) if out is None else out
    args = _attention._args(query, key, value, out, past_len, bias, **_attention._defaults(kwargs))
    lib = library()
    need = ctypes.c_size_t(0)
    _lib.check(lib.fdpp_portable_attention_workspace_bytes(ctypes.byref(args), ctypes.byref(need)),
               "portable attention workspace query")
    need = need.value
    if need and (workspace is None or workspace.numel() * workspace.element_size() < need):
        if workspace is not None:
            raise FdppError(f"portable attention: the workspace holds {workspace.numel() * workspace.element_size()} "
                            f"bytes, this call needs {need}")
        workspace = torch.empty(need, dtype=torch.uint8, device=query.device)
    _lib.check(lib.fdpp_portable_attention_decode(ctypes.byref(args), workspace.data_ptr() if need else None, need,
                                                  _lib.stream_handle(stream)), "portable attention")
    return out


def linear(x, w, bias=None, residual=None, epilogue: str = "none", out=None, stream=None):
    """Y = epilogue(x w^T + bias) + residual on the portable GEMV / flat GEMM (x's rows M <= 16)."""
    torch = _attention._torch()
    n = w.shape[0]
    n_out = n // 2 if epilogue == "silu_mul" else n
    if out is None:
        out = torch.empty(*x.shape[:-1], n_out, dtype=x.dtype, device=x.device)
    args = _gemm.make_args(x, w, bias, residual, out, epilogue)
    _lib.check(library().fdpp_portable_gemm(ctypes.byref(args), _lib.stream_handle(stream)), "portable GEMM")
    return out
