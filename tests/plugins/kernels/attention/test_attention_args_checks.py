"""The C ABI's checks of head_dim, softcap and window (contract version 4), without a GPU: the library refuses a head
size no kernel takes, a negative or non-finite cap, a negative window or one without mask_mode past_len, and a forced
prefill tile shape not built for the case, in one line naming the parameter, before any launch or device query; it
accepts 80, 96 and 256 with a cap and a window. The portable kernels, which have neither, refuse them."""

import ctypes
import math

import pytest

from fdpp_rewrite.gpu import lib as fdpp_lib

pytestmark = pytest.mark.skipif(not fdpp_lib.library_path().exists(), reason="plugin library not built (make lib)")

FDPP_OK, FDPP_ERR_INVALID_ARGUMENT, FDPP_ERR_UNSUPPORTED = 0, 1, 2
FAKE = 1 << 20  # a 16-byte aligned address no query dereferences


def _att():
    from fdpp_rewrite.gpu import attention

    return attention


def args(dim=128, **changes):
    """A forced prefill (no device query for its workspace) of 16 tokens against contiguous caches of 256 keys."""
    a = _att().AttentionArgs()
    a.dtype, a.batch, a.num_heads, a.num_kv_heads, a.seq, a.head_dim = 0, 2, 4, 2, 16, dim
    a.kv_capacity, a.max_kv_len, a.kernel, a.scale = 256, 200, 2, 0.125
    a.guard_lo, a.guard_hi = -60.0, 10.0
    a.query = a.key = a.value = a.output = a.past_len = FAKE
    a.q_stride_b, a.q_stride_h, a.q_stride_s = 4 * 16 * dim, 16 * dim, dim
    a.o_stride_b, a.o_stride_h, a.o_stride_s = 4 * 16 * dim, 16 * dim, dim
    a.k_stride_b = a.v_stride_b = 2 * 256 * dim
    a.k_stride_h = a.v_stride_h = 256 * dim
    a.k_stride_s = a.v_stride_s = dim
    for name, value in changes.items():
        setattr(a, name, value)
    return a


def status(a, fn="fdpp_attention_workspace_bytes"):
    size = ctypes.c_size_t()
    return getattr(_att().library(), fn)(ctypes.byref(a), ctypes.byref(size))


def last_error():
    return fdpp_lib.load().fdpp_last_error().decode()


def test_the_mirror_struct_ends_with_softcap_and_window():
    att = _att()
    assert att.AttentionArgs._fields_[-2:] == [("softcap", ctypes.c_float), ("window", ctypes.c_int32)]
    att.library()  # raises where the library's struct size differs from the mirror


@pytest.mark.parametrize("dim", [80, 96, 256])
def test_new_head_sizes_with_a_cap_and_a_window_are_accepted(dim):
    assert status(args(dim, softcap=50.0, window=4096)) == FDPP_OK, last_error()
    assert status(args(dim, prefill_config=2, softcap=30.0)) == FDPP_OK, last_error()


@pytest.mark.parametrize("dim,changes,code,message", [
    (48, {}, FDPP_ERR_UNSUPPORTED, "head_dim 48 is not supported; the kernels are built for head_dim 64, 80, 96, "
                                   "128 and 256"),
    (128, {"softcap": -1.0}, FDPP_ERR_INVALID_ARGUMENT, "softcap -1.000000 must be 0 (no soft-capping) or in"),
    (128, {"softcap": math.nan}, FDPP_ERR_INVALID_ARGUMENT, "softcap nan must be 0"),
    (128, {"softcap": 2000.0}, FDPP_ERR_INVALID_ARGUMENT, "softcap 2000.000000 must be 0"),
    (128, {"softcap": 1e-30}, FDPP_ERR_INVALID_ARGUMENT, "or in [0.001, 1000"),  # 2 / cap would overflow
    (128, {"window": -3}, FDPP_ERR_INVALID_ARGUMENT, "window -3 must be >= 0"),
    (128, {"window": 8, "mask_mode": 2}, FDPP_ERR_INVALID_ARGUMENT, "window 8 needs mask_mode past_len"),
    (256, {"prefill_config": 1}, FDPP_ERR_UNSUPPORTED, "prefill_config 1 is not built for head_dim 256"),
    (256, {"prefill_config": 4}, FDPP_ERR_UNSUPPORTED, "prefill_config 4 is not built for head_dim 256"),
    (256, {"prefill_config": 5}, FDPP_ERR_UNSUPPORTED, "prefill_config 5 is not built for head_dim 256"),
    (96, {"prefill_config": 5}, FDPP_ERR_UNSUPPORTED, "prefill_config 5 is not built for head_dim 96"),
    (128, {"prefill_config": 6}, FDPP_ERR_INVALID_ARGUMENT, "unknown prefill_config 6"),
    (80, {"prefill_config": 1}, FDPP_ERR_UNSUPPORTED, "prefill_config 1 is not built for head_dim 80"),
    (128, {"prefill_config": 1, "window": 64}, FDPP_ERR_UNSUPPORTED, "with softcap or window"),
])
def test_bad_head_dim_softcap_window_and_shapes_are_refused(dim, changes, code, message):
    assert status(args(dim, **changes)) == code
    assert message in last_error()


def test_a_plain_128_prefill_keeps_every_tile_shape():
    for config in (1, 2, 4, 5):
        assert status(args(128, prefill_config=config)) == FDPP_OK, last_error()


@pytest.mark.parametrize("changes,message", [
    ({"softcap": 50.0}, "the portable kernels have no softcap or window"),
    ({"window": 16}, "the portable kernels have no softcap or window"),
    ({"head_dim": 96}, "head_dim 96 is not supported by the portable kernels (built for 64 and 128)"),
])
def test_the_portable_kernels_refuse_what_they_lack(changes, message):
    a = args(96 if "head_dim" in changes else 128, **changes)
    assert status(a, "fdpp_portable_attention_workspace_bytes") == FDPP_ERR_UNSUPPORTED
    assert message in last_error()
