"""The paged KV cache's argument checks in the C ABI, without a GPU: the library refuses a block table with another
mask mode, block size, capacity, stride, bound or alignment in one line naming the parameter, before any launch or
device query; the Python mirror structs carry the three fields; combine_counters_size reads only shapes."""

import ctypes

import pytest

from fdpp_rewrite.gpu import lib as fdpp_lib

pytestmark = pytest.mark.skipif(not fdpp_lib.library_path().exists(), reason="plugin library not built (make lib)")

FDPP_ERR_INVALID_ARGUMENT, FDPP_ERR_UNSUPPORTED = 1, 2
FAKE = 1 << 20  # a 16-byte aligned address no query dereferences


def _att():
    from fdpp_rewrite.gpu import attention

    return attention


def paged_args(**changes):
    """A forced prefill (no device query for its workspace) of 16 tokens against pools of 64-token blocks through a
    table of 4 columns (kv_capacity 256), which the checks accept."""
    args = _att().AttentionArgs()
    args.dtype, args.batch, args.num_heads, args.num_kv_heads, args.seq, args.head_dim = 0, 2, 4, 2, 16, 64
    args.kv_capacity, args.max_kv_len, args.kernel, args.scale = 256, 200, 2, 0.125
    args.guard_lo, args.guard_hi = -60.0, 10.0
    args.query = args.key = args.value = args.output = args.past_len = FAKE
    args.q_stride_b, args.q_stride_h, args.q_stride_s = 4 * 16 * 64, 16 * 64, 64
    args.o_stride_b, args.o_stride_h, args.o_stride_s = 4 * 16 * 64, 16 * 64, 64
    args.k_stride_b = args.v_stride_b = 2 * 64 * 64  # between blocks
    args.k_stride_h = args.v_stride_h = 64 * 64
    args.k_stride_s = args.v_stride_s = 64
    args.block_table, args.block_table_stride, args.kv_block_size = FAKE, 4, _att().KV_BLOCK_SIZE
    for name, value in changes.items():
        setattr(args, name, value)
    return args


def workspace_status(args):
    size = ctypes.c_size_t()
    return _att().library().fdpp_attention_workspace_bytes(ctypes.byref(args), ctypes.byref(size))


def last_error():
    return fdpp_lib.load().fdpp_last_error().decode()


def test_the_mirror_structs_end_with_the_paged_fields():
    att = _att()
    tail = [("block_table", ctypes.c_void_p), ("block_table_stride", ctypes.c_int64), ("kv_block_size", ctypes.c_int32)]
    assert att.AttentionArgs._fields_[-5:-2] == tail  # then softcap and window (contract version 4)
    assert att.RopeAppendArgs._fields_[-3:] == tail
    att.library()  # raises where the library's struct sizes differ from the mirrors


def test_the_block_size_is_the_contracts():
    from fdpp_rewrite.ref_ops import kv_block_size

    assert _att().KV_BLOCK_SIZE == kv_block_size() == 64


def test_a_valid_paged_call_passes_the_checks():
    assert workspace_status(paged_args()) == 0, last_error()
    assert workspace_status(paged_args(block_table_stride=7)) == 0, "a view of a wider table"
    assert workspace_status(paged_args(max_kv_len=256)) == 0, "the whole table"


@pytest.mark.parametrize("change, message", [
    ({"mask_mode": 1, "bias": FAKE}, "a block_table (paged KV cache) needs mask_mode past_len (0)"),
    ({"mask_mode": 2}, "needs mask_mode past_len"),
    ({"kv_block_size": 32}, "kv_block_size 32 with a block_table; the kernels are built for blocks of 64 tokens"),
    ({"kv_block_size": 0}, "kv_block_size 0 with a block_table"),
    ({"kv_capacity": 250, "max_kv_len": 200}, "kv_capacity 250 with a block_table must be W x 64"),
    ({"block_table_stride": 3}, "block_table_stride 3 is below the table's 4 columns"),
    ({"max_kv_len": 257}, "max_kv_len 257 is above the block table's 256 keys (W x kv_block_size)"),
    ({"block_table": FAKE + 2}, "block_table is not 4-byte aligned"),
])
def test_the_paged_checks_name_the_parameter_in_one_line(change, message):
    assert workspace_status(paged_args(**change)) == FDPP_ERR_INVALID_ARGUMENT
    error = last_error()
    assert message in error and "\n" not in error


def test_without_a_table_the_block_size_is_ignored():
    """The TensorRT plugin leaves the three fields zero; a contiguous call with any kv_block_size is unchanged."""
    assert workspace_status(paged_args(block_table=None, block_table_stride=0, kv_block_size=0,
                                       k_stride_b=2 * 256 * 64, v_stride_b=2 * 256 * 64, k_stride_h=256 * 64,
                                       v_stride_h=256 * 64)) == 0, last_error()


def test_the_portable_kernels_refuse_a_table():
    status = fdpp_lib.load().fdpp_portable_attention_workspace_bytes(ctypes.byref(paged_args()),
                                                                     ctypes.byref(ctypes.c_size_t()))
    assert status == FDPP_ERR_UNSUPPORTED
    assert "the portable kernels take contiguous caches" in last_error()


def rope_args(**changes):
    att = _att()
    args = att.RopeAppendArgs()
    args.dtype, args.batch, args.num_heads, args.num_kv_heads, args.seq, args.head_dim = 0, 2, 4, 2, 3, 64
    args.kv_capacity, args.rope_theta, args.rope_dim = 256, 10000.0, 64
    args.q_in = args.q_out = args.k_new = args.v_new = args.k_cache = args.v_cache = args.past_len = FAKE
    args.block_table, args.block_table_stride, args.kv_block_size = FAKE, 4, att.KV_BLOCK_SIZE
    for name, value in changes.items():
        setattr(args, name, value)
    return args


@pytest.mark.parametrize("change, message", [
    ({"kv_block_size": 16}, "kv_block_size 16 with a block_table"),
    ({"kv_capacity": 100}, "kv_capacity 100 with a block_table must be W x 64"),
    ({"block_table_stride": 2}, "block_table_stride 2 is below the table's 4 columns"),
])
def test_rope_append_checks_the_table_before_any_launch(change, message):
    status = _att().library().fdpp_rope_append(ctypes.byref(rope_args(**change)), None)
    assert status == FDPP_ERR_INVALID_ARGUMENT
    assert message in last_error()


def test_combine_counters_size_of_a_paged_call_is_the_contiguous_one():
    """Shapes only: a key pool [blocks, Hkv, 64, D] asks for what the contiguous cache [B, Hkv, L, D] does."""
    torch = pytest.importorskip("torch")
    att = _att()
    query = torch.empty(3, 12, 1, 128, dtype=torch.float16)
    pool = torch.empty(50, 4, att.KV_BLOCK_SIZE, 128, dtype=torch.float16)
    cache = torch.empty(3, 4, 1000, 128, dtype=torch.float16)
    assert att.combine_counters_size(query, pool) == att.combine_counters_size(query, cache) == 3 * 4 * 1
