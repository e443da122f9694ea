"""The C ABI of libfdpp_plugins.so, checked without a GPU: loading, version, the error path, the argument checks
that need no device, and the exported symbols."""

import ctypes
import re
import subprocess
import sys
from pathlib import Path

import pytest

from fdpp_rewrite.contracts import load_contract
from fdpp_rewrite.gpu import lib as fdpp_lib

pytestmark = pytest.mark.skipif(not fdpp_lib.library_path().exists(),
                                reason="plugin library not built (make lib)")

FDPP_ERR_INVALID_ARGUMENT, FDPP_ERR_UNSUPPORTED = 1, 2


def test_abi_version_matches_package():
    assert fdpp_lib.load().fdpp_abi_version() == fdpp_lib.EXPECTED_ABI_VERSION


def test_invalid_argument_comes_back_as_code_and_message():
    from fdpp_rewrite.gpu import gemm

    library = gemm.library()
    status = library.fdpp_gemm_select(1, None, None)
    assert status == FDPP_ERR_INVALID_ARGUMENT
    assert b"must not be NULL" in library.fdpp_last_error()
    with pytest.raises(fdpp_lib.FdppError, match="invalid argument"):
        fdpp_lib.check(status, "select")


def test_the_mirror_structs_match_the_library():
    from fdpp_rewrite.gpu import attention

    attention.library()  # raises when fdpp_attention_args_size() differs from ctypes.sizeof(AttentionArgs)


_CTYPES_OF_C = {"int32_t": ctypes.c_int32, "int64_t": ctypes.c_int64, "float": ctypes.c_float}


def _c_struct_fields(header: str, struct: str) -> list:
    """(name, ctypes type) of each field of `typedef struct <struct> { ... }` in a plugins/capi header, in order;
    every pointer as c_void_p."""
    text = (Path(__file__).resolve().parents[3] / "plugins" / "capi" / header).read_text()
    body = text.split(f"typedef struct {struct} {{", 1)[1].split(f"}} {struct};", 1)[0]
    body = re.sub(r"//[^\n]*", "", body)
    fields = []
    for declaration in filter(None, (d.strip() for d in body.split(";"))):
        match = re.fullmatch(r"(?:const\s+)?([\w\s]+?)\s*(\*?)\s*(\w+(?:\s*,\s*\w+)*)", declaration)
        base, pointer, names = match.groups()
        kind = ctypes.c_void_p if pointer else _CTYPES_OF_C[base]
        fields += [(name.strip(), kind) for name in names.split(",")]
    return fields


@pytest.mark.parametrize("header, struct, mirror", [
    ("attention_capi.h", "fdpp_attention_args", "AttentionArgs"),
    ("attention_capi.h", "fdpp_rope_append_args", "RopeAppendArgs"),
])
def test_the_mirror_structs_have_the_headers_fields_in_order(header, struct, mirror):
    """Field by field, not only the size: a swapped pair of same-size fields would pass the size check."""
    from fdpp_rewrite.gpu import attention

    mirrored = getattr(attention, mirror)._fields_
    declared = _c_struct_fields(header, struct)
    assert [name for name, _ in mirrored] == [name for name, _ in declared]
    for (name, kind), (_, c_kind) in zip(mirrored, declared):
        assert ctypes.sizeof(kind) == ctypes.sizeof(c_kind), name
        assert (kind is ctypes.c_void_p) == (c_kind is ctypes.c_void_p), name
    assert attention.AttentionArgs._fields_[-1] == ("window", ctypes.c_int32)


def _attention_args(**changes):
    """Arguments the checks accept up to the launch: a forced prefill needs no device query for its workspace."""
    from fdpp_rewrite.gpu import attention

    args = attention.AttentionArgs()
    args.dtype, args.batch, args.num_heads, args.num_kv_heads, args.seq, args.head_dim = 0, 1, 4, 2, 16, 64
    args.kv_capacity, args.kernel, args.scale, args.guard_lo, args.guard_hi = 64, 2, 0.125, -60.0, 10.0
    fake = ctypes.c_void_p(1 << 20)  # 16-byte aligned; never dereferenced by a query
    args.query = args.key = args.value = args.output = args.past_len = fake
    args.q_stride_h, args.q_stride_s = 16 * 64, 64
    args.k_stride_h = args.v_stride_h = 64 * 64
    args.k_stride_s = args.v_stride_s = 64
    args.o_stride_h, args.o_stride_s = 16 * 64, 64
    for name, value in changes.items():
        setattr(args, name, value)
    return args


def _workspace_status(args):
    from fdpp_rewrite.gpu import attention

    size = ctypes.c_size_t()
    return attention.library().fdpp_attention_workspace_bytes(ctypes.byref(args), ctypes.byref(size))


def test_the_attention_checks_accept_the_contracts_head_dims_and_refuse_others():
    """The kernels' head_dim support comes from the contract's choices (through the generated header)."""
    choices = load_contract("AsyncSoftmaxAttention").attributes["head_dim"]["choices"]
    assert choices == [64, 80, 96, 128, 256]
    for head_dim in choices:
        assert _workspace_status(_attention_args(head_dim=head_dim)) == 0
    for head_dim in (32, 48, 112, 512):
        assert _workspace_status(_attention_args(head_dim=head_dim)) == FDPP_ERR_UNSUPPORTED
        message = fdpp_lib.load().fdpp_last_error().decode()
        assert f"head_dim {head_dim} is not supported" in message and "64, 80, 96, 128 and 256" in message


@pytest.mark.parametrize("change, message", [
    ({"prefill_config": 3}, "unknown prefill_config 3"),  # the rolled 128-row shape is gone
    ({"pdl": 2}, "pdl must be"),
    ({"guard_lo": 5.0, "guard_hi": 4.0}, "guard_lo < guard_hi"),
    ({"num_heads": 5}, "multiple of num_kv_heads"),
    ({"q_stride_s": 60}, "multiples of 8 elements"),
    ({"decode_combine": 4}, "unknown decode_combine 4 (0 plan, 1 kernel, 2 cluster, 3 last_block)"),
    ({"decode_combine": 3}, "decode_combine last_block needs combine_counters"),
    ({"decode_combine": 3, "combine_counters": 2}, "combine_counters is not 4-byte aligned"),
])
def test_the_attention_checks_name_the_argument(change, message):
    assert _workspace_status(_attention_args(**change)) == FDPP_ERR_INVALID_ARGUMENT
    assert message in fdpp_lib.load().fdpp_last_error().decode()


def test_the_last_block_combine_without_counters_is_refused_in_one_line():
    """Forced decode_combine 3 with no counters buffer: an argument error before any launch or device query, whose
    one line says what to pass; with a buffer the same arguments pass the checks."""
    from fdpp_rewrite.gpu import attention

    args = _attention_args(kernel=1, seq=1, decode_combine=attention.DECODE_COMBINES["last_block"])
    status = attention.library().fdpp_attention_forward(ctypes.byref(args), None, 0, None)
    message = fdpp_lib.load().fdpp_last_error().decode()
    assert status == FDPP_ERR_INVALID_ARGUMENT
    assert message.startswith("fdpp_attention_forward: decode_combine last_block needs combine_counters")
    assert "fdpp_attention_combine_counters" in message and "\n" not in message
    counters = (ctypes.c_uint32 * 4)()
    args.combine_counters = ctypes.addressof(counters)
    args.kernel = 2  # prefill: the checks pass and no device query follows
    assert _workspace_status(args) == 0


@pytest.mark.parametrize("change, count", [
    ({"kernel": 1}, 1 * 2 * 2),  # decode: G 2 x seq 16 = 32 rows per KV head, 2 row blocks of 16
    ({"kernel": 1, "seq": 17}, 1 * 2 * 3),
    ({"kernel": 0, "seq": 4}, 1 * 2 * 1),  # auto takes decode up to 8 query tokens
    ({"kernel": 0, "seq": 4, "batch": 3, "num_heads": 8, "num_kv_heads": 8}, 3 * 8 * 1),  # MHA: one row each
    ({"kernel": 2}, 0),  # prefill needs none
    ({"kernel": 1, "decode_combine": 3}, 1 * 2 * 2),  # asked before the buffer exists: shapes only
])
def test_the_combine_counters_a_call_needs(change, count):
    from fdpp_rewrite.gpu import attention

    args = _attention_args(**change)
    args.query = args.key = args.value = args.output = args.past_len = None  # shapes only
    size = ctypes.c_size_t(99)
    assert attention.library().fdpp_attention_combine_counters(ctypes.byref(args), ctypes.byref(size)) == 0
    assert size.value == count


def _gemm_args(**changes):
    from fdpp_rewrite.gpu import gemm

    fake = 1 << 20
    args = gemm.Args(fake, fake, None, None, fake, 4, 256, 256, 0, 0, 0)
    for name, value in changes.items():
        setattr(args, name, value)
    return args


def test_the_gemm_pdl_field_is_checked():
    from fdpp_rewrite.gpu import gemm

    status = gemm.library().fdpp_gemm_run_impl(ctypes.byref(_gemm_args(pdl=7)), 2, None, 8, 0, None, 0, None)
    assert status == FDPP_ERR_INVALID_ARGUMENT
    assert b"pdl must be" in fdpp_lib.load().fdpp_last_error()


def test_the_padding_ablation_is_a_bench_build_option():
    """pad_m 16 and 64 run only in a library built with FDPP_BENCH_ABLATIONS=ON (refused before any device
    query, so this holds on the CPU)."""
    from fdpp_rewrite.gpu import gemm

    status = gemm.library().fdpp_gemm_run_impl(ctypes.byref(_gemm_args()), 2, None, 16, 0, None, 0, None)
    if status == FDPP_ERR_UNSUPPORTED:
        assert b"FDPP_BENCH_ABLATIONS" in fdpp_lib.load().fdpp_last_error()
    else:  # an ablation build goes on to the device query, which fails without a GPU
        assert b"FDPP_BENCH_ABLATIONS" not in fdpp_lib.load().fdpp_last_error()


def test_cublaslt_is_loaded_from_the_path_given():
    """fdpp_gemm_load_cublaslt takes the library's location as an argument (a fresh process: the first
    library loaded stays)."""
    code = (
        "import ctypes\n"
        "from fdpp_rewrite.gpu import gemm\n"
        "lib = gemm.library()\n"
        "status = lib.fdpp_gemm_load_cublaslt(b'/nonexistent/libcublasLt.so.99')\n"
        "print(status, lib.fdpp_last_error().decode())\n"
    )
    env = {key: value for key, value in __import__("os").environ.items() if key != "FDPP_CUBLASLT_LIBRARY"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True).stdout
    status, message = out.split(" ", 1)
    assert int(status) == FDPP_ERR_UNSUPPORTED
    assert "/nonexistent/libcublasLt.so.99" in message and "fdpp_gemm_load_cublaslt" in message


def test_only_the_c_abi_is_exported():
    out = subprocess.run(["nm", "-D", "--defined-only", str(fdpp_lib.library_path())],
                         capture_output=True, text=True, check=True).stdout
    exported = {line.split()[-1] for line in out.splitlines() if " T " in line}
    unexpected = {name for name in exported
                  if not name.startswith("fdpp_") and name not in ("getCreators", "setLoggerFinder")}
    assert not unexpected, f"symbols leaked from the library: {sorted(unexpected)[:10]}"
    assert "fdpp_axpy_f32" not in exported and "fdpp_gemm_set_pdl" not in exported
