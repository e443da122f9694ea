"""Where `build --backend migraphx` looks for libfdpp_migraphx.so: $FDPP_MIGRAPHX_LIB, else build/ of a checkout;
an installed package (no checkout) without the variable gets one line saying to set it, not an internal error."""

import pytest

from fdpp_rewrite.engine import migraphx_build
from fdpp_rewrite.errors import FdppError


def test_installed_package_without_the_variable_says_to_set_it(monkeypatch):
    monkeypatch.delenv(migraphx_build.LIBRARY_ENV, raising=False)
    monkeypatch.setattr(migraphx_build, "SOURCE_ROOT", None)
    with pytest.raises(FdppError, match=f"set {migraphx_build.LIBRARY_ENV} to its path"):
        migraphx_build.adapter_library()


def test_checkout_and_variable_paths(monkeypatch, tmp_path):
    monkeypatch.delenv(migraphx_build.LIBRARY_ENV, raising=False)
    monkeypatch.setattr(migraphx_build, "SOURCE_ROOT", tmp_path)
    with pytest.raises(FdppError, match=f"needs {tmp_path / 'build' / 'libfdpp_migraphx.so'}; build it"):
        migraphx_build.adapter_library()
    monkeypatch.setenv(migraphx_build.LIBRARY_ENV, str(tmp_path / "mine.so"))
    with pytest.raises(FdppError, match=f"needs {tmp_path / 'mine.so'}"):
        migraphx_build.adapter_library()
