"""The attention C ABI's mirror (plugins/capi/attention_capi.h): its enums as Python names, the ctypes argument
structs, the library with the signatures declared, and the library's host-side planning rules.
fdpp_rewrite.gpu.attention builds these arguments from torch tensors and launches."""

from __future__ import annotations

import ctypes
import functools

from fdpp_rewrite.contracts import load_contract
from fdpp_rewrite.errors import FdppError
from fdpp_rewrite.gpu import lib as fdpp_lib

MASK_MODES = {"past_len": 0, "bias": 1, "none": 2}
SOFTMAX_MODES = {"unified": 0, "synchronized": 1}
KERNELS = {"auto": 0, "decode": 1, "prefill": 2, "rowwise": 3}
KERNEL_NAMES = {v: k for k, v in KERNELS.items()}
CONTRACT = load_contract("AsyncSoftmaxAttention")
SUPPORTED_HEAD_DIMS = tuple(CONTRACT.attributes["head_dim"]["choices"])  # what the kernels are built for
# Prefill tile shapes: 0 = the plan's choice (4 where the GPU has it); 1 = 128 query rows x 32-key steps;
# 2 = 64 query rows x 64-key steps; 4 = 128 query rows on Hopper's warpgroup MMAs (sm_90 only); 5 = shape 4 with TMA
# loads, a setmaxnreg producer warpgroup and ping-pong consumer warpgroups (sm_90 only; forced, never planned yet).
PREFILL_CONFIGS = (0, 1, 2, 4, 5)
# How decode combines its splits: the plan's choice; a second kernel through the workspace; inside a thread block
# cluster of the splits (sm_90, 2 to 8 splits); in the last split CTA of each row block to finish (needs
# combine_counters).
DECODE_COMBINES = {"auto": 0, "kernel": 1, "cluster": 2, "last_block": 3}
# Keys per block of a paged KV cache: pools are [blocks, kv_heads, KV_BLOCK_SIZE, head_dim] (the contract's).
KV_BLOCK_SIZE = int(CONTRACT.raw["kv_block_size"])

_i32, _i64, _f32, _ptr = ctypes.c_int32, ctypes.c_int64, ctypes.c_float, ctypes.c_void_p


class AttentionArgs(ctypes.Structure):
    """Mirror of fdpp_attention_args (field order and types must match the C header)."""

    _fields_ = [
        ("dtype", _i32), ("batch", _i32), ("num_heads", _i32), ("num_kv_heads", _i32), ("seq", _i32),
        ("head_dim", _i32), ("kv_capacity", _i32), ("max_kv_len", _i32), ("mask_mode", _i32),
        ("softmax_mode", _i32), ("kernel", _i32), ("num_splits", _i32),
        ("scale", _f32), ("phi", _f32), ("guard_lo", _f32), ("guard_hi", _f32),
        ("query", _ptr), ("q_stride_b", _i64), ("q_stride_h", _i64), ("q_stride_s", _i64),
        ("key", _ptr), ("k_stride_b", _i64), ("k_stride_h", _i64), ("k_stride_s", _i64),
        ("value", _ptr), ("v_stride_b", _i64), ("v_stride_h", _i64), ("v_stride_s", _i64),
        ("output", _ptr), ("o_stride_b", _i64), ("o_stride_h", _i64), ("o_stride_s", _i64),
        ("past_len", _ptr),
        ("bias", _ptr), ("bias_stride_b", _i64), ("bias_stride_s", _i64), ("bias_stride_l", _i64),
        ("counters", _ptr), ("prefill_config", _i32), ("decode_combine", _i32), ("pdl", _i32),
        ("combine_counters", _ptr), ("block_table", _ptr), ("block_table_stride", _i64), ("kv_block_size", _i32),
        ("softcap", _f32), ("window", _i32),
    ]


class RopeAppendArgs(ctypes.Structure):
    """Mirror of fdpp_rope_append_args."""

    _fields_ = [
        ("dtype", _i32), ("batch", _i32), ("num_heads", _i32), ("num_kv_heads", _i32), ("seq", _i32),
        ("head_dim", _i32), ("kv_capacity", _i32), ("rope_interleaved", _i32), ("rope_theta", _f32),
        ("q_in", _ptr), ("q_out", _ptr), ("q_stride_b", _i64), ("q_stride_h", _i64), ("q_stride_s", _i64),
        ("k_new", _ptr), ("kn_stride_b", _i64), ("kn_stride_h", _i64), ("kn_stride_s", _i64),
        ("v_new", _ptr), ("vn_stride_b", _i64), ("vn_stride_h", _i64), ("vn_stride_s", _i64),
        ("k_cache", _ptr), ("kc_stride_b", _i64), ("kc_stride_h", _i64), ("kc_stride_s", _i64),
        ("v_cache", _ptr), ("vc_stride_b", _i64), ("vc_stride_h", _i64), ("vc_stride_s", _i64),
        ("past_len", _ptr), ("counters", _ptr), ("rope_dim", _i32), ("inv_freq", _ptr),
        ("block_table", _ptr), ("block_table_stride", _i64), ("kv_block_size", _i32),
    ]


@functools.lru_cache(maxsize=1)
def library() -> ctypes.CDLL:
    """The plugin library with the attention functions' signatures declared."""
    lib = fdpp_lib.load()
    args_p, size_p = ctypes.POINTER(AttentionArgs), ctypes.POINTER(ctypes.c_size_t)
    for name, argtypes in {
        "fdpp_attention_workspace_bytes": [args_p, size_p],
        "fdpp_attention_combine_counters": [args_p, size_p],
        "fdpp_attention_forward": [args_p, _ptr, ctypes.c_size_t, _ptr],
        "fdpp_attention_plan": [args_p, ctypes.POINTER(_i32), ctypes.POINTER(_i32)],
        "fdpp_attention_decode_cluster": [args_p, ctypes.POINTER(_i32)],
        "fdpp_attention_read_counters": [ctypes.POINTER(ctypes.c_ulonglong), ctypes.POINTER(ctypes.c_ulonglong),
                                         ctypes.c_int],
        "fdpp_rope_append": [ctypes.POINTER(RopeAppendArgs), _ptr],
        "fdpp_attention_decode_splits": [ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_int],
        "fdpp_attention_prefill_plan": [ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.POINTER(ctypes.c_int)],
        "fdpp_attention_cluster_combine_ok": [ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_int],
        "fdpp_attention_decode_stages": [ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_int],
    }.items():
        try:
            function = getattr(lib, name)
        except AttributeError as exc:
            raise FdppError(f"{fdpp_lib.library_path()} has no {name}; rebuild the library from this checkout") from exc
        function.argtypes = argtypes
        function.restype = ctypes.c_int
    for name in ("fdpp_attention_args_size", "fdpp_rope_append_args_size"):
        getattr(lib, name).restype = ctypes.c_int
    for name, mirror in (("fdpp_attention_args_size", AttentionArgs), ("fdpp_rope_append_args_size", RopeAppendArgs)):
        if getattr(lib, name)() != ctypes.sizeof(mirror):
            raise FdppError(f"{fdpp_lib.library_path()} was built from another version of attention_capi.h "
                            f"({name} mismatch); rebuild the library from this checkout")
    return lib


def decode_splits(units: int, tiles: int, sms: int, ctas_per_sm: int = 2) -> int:
    """The decode kernel's split-count heuristic (pure host code in the library)."""
    return int(library().fdpp_attention_decode_splits(units, tiles, sms, ctas_per_sm))


def cluster_combine_ok(splits: int, cc_major: int, ctas: int, sms: int) -> bool:
    """The decode's cluster-combine rule (pure host code in the library; the launcher also checks residency)."""
    return bool(library().fdpp_attention_cluster_combine_ok(splits, cc_major, ctas, sms))


def decode_stages(ctas: int, sms: int, cluster: bool, tiles_per_split: int) -> int:
    """The decode's pipeline-stage rule (pure host code in the library): 2, 3 or 4."""
    return int(library().fdpp_attention_decode_stages(ctas, sms, int(cluster), tiles_per_split))


def prefill_plan(heads: int, seq: int, slots: int) -> tuple[int, bool]:
    """The prefill heuristics off Hopper (pure host code in the library): (tile shape, see PREFILL_CONFIGS; whether
    a unified request runs the synchronized softmax). On sm_90 the plan is shape 4, synchronized."""
    synchronized = ctypes.c_int(0)
    config = library().fdpp_attention_prefill_plan(heads, seq, slots, ctypes.byref(synchronized))
    return int(config), bool(synchronized.value)
