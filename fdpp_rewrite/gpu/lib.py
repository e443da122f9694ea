"""Loads libfdpp_plugins.so and turns its status codes into FdppError.

Where the library is looked up: fdpp_rewrite.resources.plugin_library_path."""

import ctypes
import functools
from pathlib import Path

from fdpp_rewrite.errors import FdppError
from fdpp_rewrite.resources import plugin_library_path

EXPECTED_ABI_VERSION = 7  # = fdpp_abi_version(); CHANGELOG.md says what each version changed
STATUS_NAMES = {1: "invalid argument", 2: "unsupported", 3: "CUDA error", 4: "internal error"}
DTYPE_CODES = {"float16": 0, "bfloat16": 1, "float32": 2}


def library_path() -> Path:
    return plugin_library_path()


@functools.lru_cache(maxsize=1)
def load() -> ctypes.CDLL:
    path = library_path()
    if not path.exists():
        raise FdppError(f"plugin library {path} not found; build it with `cmake -B build && cmake --build build -j` "
                        "or set FDPP_PLUGIN_LIB")
    lib = ctypes.CDLL(str(path))
    lib.fdpp_abi_version.restype = ctypes.c_int
    lib.fdpp_last_error.restype = ctypes.c_char_p
    found = lib.fdpp_abi_version()
    if found != EXPECTED_ABI_VERSION:
        raise FdppError(f"{path} has C ABI version {found}, this package expects {EXPECTED_ABI_VERSION}; "
                        "rebuild the library from this checkout")
    return lib


def check(status: int, what: str) -> None:
    """Raise FdppError with the library's message unless status is FDPP_OK."""
    if status != 0:
        message = load().fdpp_last_error().decode(errors="replace")
        raise FdppError(f"{what} failed ({STATUS_NAMES.get(status, status)}): {message}")


def stream_handle(stream=None) -> int:
    """The raw cudaStream_t of a torch stream (the current one by default)."""
    import torch

    stream = stream or torch.cuda.current_stream()
    return stream.cuda_stream
