import sys
from pathlib import Path

import pytest

# Shared test helpers (hand-built graphs, the attention reference, CLI output checks) import by module name.
sys.path.insert(0, str(Path(__file__).resolve().parent / "helpers"))


def _gpu_skip_reason():
    try:
        import torch
    except ImportError:
        return "no torch installed"
    if not torch.cuda.is_available():
        return "no CUDA GPU visible (run GPU tests on the H200 via scripts/device_job.sh)"
    from fdpp_rewrite.gpu.lib import library_path

    if not library_path().exists():
        return f"plugin library {library_path()} not built (cmake -B build && cmake --build build -j)"
    return None


def pytest_collection_modifyitems(config, items):
    reason = _gpu_skip_reason()
    if reason is None:
        return
    skip = pytest.mark.skip(reason=reason)
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
