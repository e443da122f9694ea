"""The AMD build (cmake -DFDPP_HIP=ON: libfdpp_plugins_hip.so, hipcc) loads and answers on a machine without an AMD
GPU: its C ABI version, the 64-lane wavefronts its kernels are built for, its heuristics (the same header as the
CUDA library's), and the gfx90a code objects in its fat binary. .ci/run builds it and sets FDPP_HIP_PLUGIN_LIB."""

import ctypes
import os
from pathlib import Path

import pytest

from fdpp_rewrite import REPO_ROOT
from fdpp_rewrite.gpu.lib import EXPECTED_ABI_VERSION

HIP_LIBRARY = Path(os.environ.get("FDPP_HIP_PLUGIN_LIB") or Path(REPO_ROOT) / "build-hip" / "libfdpp_plugins_hip.so")

pytestmark = pytest.mark.skipif(not HIP_LIBRARY.exists(),
                                reason=f"{HIP_LIBRARY} not built (cmake -B build-hip -DFDPP_HIP=ON)")


@pytest.fixture(scope="module")
def hip():
    lib = ctypes.CDLL(str(HIP_LIBRARY))
    lib.fdpp_portable_decode_splits.argtypes = [ctypes.c_int64, ctypes.c_int64, ctypes.c_int32]
    lib.fdpp_last_error.restype = ctypes.c_char_p
    return lib


def test_abi_version_and_wavefront_width(hip):
    assert hip.fdpp_abi_version() == EXPECTED_ABI_VERSION
    assert hip.fdpp_portable_warp_size() == 64


def test_heuristics_answer_the_worked_examples(hip):
    assert hip.fdpp_portable_decode_splits(32, 4096, 104) == 7
    assert hip.fdpp_portable_decode_splits(256, 4096, 104) == 1
    kernel, m_tile, pairs, k_chunk = (ctypes.c_int32() for _ in range(4))
    status = hip.fdpp_portable_gemm_plan(ctypes.c_int64(9), ctypes.c_int64(4096), 0, 104, 64, ctypes.byref(kernel),
                                         ctypes.byref(m_tile), ctypes.byref(pairs), ctypes.byref(k_chunk))
    assert status == 0
    assert (kernel.value, m_tile.value, pairs.value, k_chunk.value) == (2, 16, 2, 512)
    status = hip.fdpp_portable_gemm_plan(ctypes.c_int64(17), ctypes.c_int64(4096), 0, 104, 64, None, None, None, None)
    assert status == 2 and b"outside 1..16" in hip.fdpp_last_error()


def test_fat_binary_holds_mi210_code_of_the_portable_kernels():
    data = HIP_LIBRARY.read_bytes()
    assert b"amdgcn-amd-amdhsa--gfx90a" in data
    assert b"decode_split_kernel" in data and b"flat_kernel" in data and b"gemv_kernel" in data
