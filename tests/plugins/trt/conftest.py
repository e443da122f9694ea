"""Fixtures of the TensorRT adapter tests: the harness binary built beside the plugin library, and a real rewritten
tiny model whose fdpp nodes the harness turns into plugins."""

from pathlib import Path

import onnx
import pytest

from fdpp_rewrite import cli
from fdpp_rewrite.gpu.lib import library_path

HARNESS = "fdpp_trt_harness"


def trt_library() -> Path | None:
    """The plugin library when it was built with the TensorRT adapters (it then exports getCreators)."""
    import subprocess

    path = library_path()
    if not path.exists():
        return None
    symbols = subprocess.run(["nm", "-D", "--defined-only", str(path)], capture_output=True, text=True).stdout
    return path if " getCreators" in symbols else None


@pytest.fixture(scope="session")
def plugin_library() -> Path:
    path = trt_library()
    if path is None:
        pytest.skip(f"{library_path()} is missing or was built without -DTensorRT_INCLUDE_DIR (no TensorRT adapters)")
    return path


@pytest.fixture(scope="session")
def harness(plugin_library) -> Path:
    path = plugin_library.parent / HARNESS
    if not path.exists():
        pytest.skip(f"{path} not built (CMake builds it beside the library when TensorRT headers are given)")
    return path


@pytest.fixture(scope="session")
def tiny_rewritten_path(tmp_path_factory) -> Path:
    """tiny-llama exported in float16 (cache length 64) and rewritten: model.fdpp.onnx and its .data file."""
    folder = tmp_path_factory.mktemp("tiny")
    exported, rewritten = folder / "model.onnx", folder / "model.fdpp.onnx"
    assert cli.main(["export", "tiny-llama", "--dtype", "float16", "--max-cache", "64", "-o", str(exported)]) == 0
    assert cli.main(["rewrite", str(exported), "-o", str(rewritten)]) == 0
    return rewritten


@pytest.fixture(scope="session")
def tiny_rewritten(tiny_rewritten_path) -> onnx.ModelProto:
    """The rewritten tiny-llama's graph as written (weights stay in the .data file)."""
    return onnx.load(str(tiny_rewritten_path), load_external_data=False)
