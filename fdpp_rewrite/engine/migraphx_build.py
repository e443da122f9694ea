"""`build --backend migraphx`: the AMD path's entry (docs/amd.md).

What it needs: AMD MIGraphX's Python module (`migraphx`, from ROCm's migraphx package) and libfdpp_migraphx.so, the
custom ops for fdpp::AsyncSoftmaxAttention and fdpp::FlatGemm (cmake -DFDPP_HIP=ON -DMIGraphX_INCLUDE_DIR=...;
found through $FDPP_MIGRAPHX_LIB). Where either is missing the build stops with one line naming what to install.

MIGraphX's ONNX parser does not map unknown node types, so a rewritten graph's fdpp nodes cannot be parsed: the ops
are registered from the library (fdpp_migraphx_register_*) and inserted into the program after parsing. That
translation of the graph has not been written yet (no AMD GPU has been available to check it against); with both
pieces installed the build registers the ops and then says so.
"""

from __future__ import annotations

import ctypes
import importlib
import os
from pathlib import Path

from fdpp_rewrite.errors import FdppError
from fdpp_rewrite.resources import SOURCE_ROOT

INSTALL_MIGRAPHX = ("the migraphx backend needs AMD MIGraphX's Python module `migraphx` (ROCm's migraphx package, "
                    "e.g. `apt install migraphx` on a ROCm system); install it or use --backend cuda or cpu")
LIBRARY_ENV = "FDPP_MIGRAPHX_LIB"


def import_migraphx():
    """MIGraphX's Python module, or FdppError naming what to install."""
    try:
        return importlib.import_module("migraphx")
    except ImportError as exc:
        raise FdppError(INSTALL_MIGRAPHX) from exc


def adapter_library() -> ctypes.CDLL:
    """libfdpp_migraphx.so, from $FDPP_MIGRAPHX_LIB or build/ of this checkout (an installed package has no
    build/: it needs the variable)."""
    if os.environ.get(LIBRARY_ENV):
        path = Path(os.environ[LIBRARY_ENV])
    elif SOURCE_ROOT is not None:
        path = SOURCE_ROOT / "build" / "libfdpp_migraphx.so"
    else:
        raise FdppError(f"the migraphx backend needs libfdpp_migraphx.so; build it in a checkout (cmake "
                        f"-DFDPP_HIP=ON) and set {LIBRARY_ENV} to its path")
    if not path.exists():
        raise FdppError(f"the migraphx backend needs {path}; build it with `cmake -B build -DFDPP_HIP=ON "
                        f"-DMIGraphX_INCLUDE_DIR=/opt/rocm/include && cmake --build build` or set {LIBRARY_ENV}")
    try:
        return ctypes.CDLL(str(path))
    except OSError as exc:
        raise FdppError(f"cannot load {path} ({exc}); it needs ROCm's libamdhip64 and libmigraphx_c") from exc


def build_migraphx_engine(source: Path, output: Path, *, force: bool = False, **_options) -> dict:
    """The migraphx backend of `build` (see the module docstring)."""
    source, output = Path(source), Path(output)
    if output.exists() and not force:
        raise FdppError(f"{output} exists; pass --force to replace it")
    import_migraphx()
    adapter_library()
    raise FdppError(f"MIGraphX and libfdpp_migraphx.so are installed, but translating {source.name} into a MIGraphX "
                    "program (the fdpp ops inserted after parsing) is not implemented yet; see docs/amd.md")
