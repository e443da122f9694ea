"""The C ABI of libfdpp_plugins.so, checked without a GPU: loading, version, and the error path."""

import ctypes

import pytest

from fdpp_rewrite.gpu import lib as fdpp_lib

pytestmark = pytest.mark.skipif(not fdpp_lib.library_path().exists(),
                                reason="plugin library not built (make lib)")


def test_abi_version_matches_package():
    assert fdpp_lib.load().fdpp_abi_version() == fdpp_lib.EXPECTED_ABI_VERSION


def test_invalid_argument_comes_back_as_code_and_message():
    library = fdpp_lib.load()
    status = library.fdpp_axpy_f32(1.0, None, None, -1, None)
    assert status == 1  # FDPP_ERR_INVALID_ARGUMENT
    assert b"n must be >= 0" in library.fdpp_last_error()
    with pytest.raises(fdpp_lib.FdppError, match="invalid argument"):
        fdpp_lib.check(status, "axpy")


def test_null_pointers_rejected_before_launch():
    library = fdpp_lib.load()
    assert library.fdpp_axpy_f32(1.0, None, ctypes.c_void_p(16), 4, None) == 1


def test_only_the_c_abi_is_exported():
    import subprocess

    out = subprocess.run(["nm", "-D", "--defined-only", str(fdpp_lib.library_path())],
                         capture_output=True, text=True, check=True).stdout
    exported = {line.split()[-1] for line in out.splitlines() if " T " in line}
    unexpected = {name for name in exported
                  if not name.startswith("fdpp_") and name not in ("getCreators", "setLoggerFinder")}
    assert not unexpected, f"symbols leaked from the library: {sorted(unexpected)[:10]}"
