import shutil
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


# -- exports shared by several test files (each costs seconds to a minute on two cores; made once per session) --

def _copy_files(source: Path, target: Path) -> None:
    """Copies, not links: onnx refuses external data with several hard links, and a test may write beside them."""
    target.mkdir(parents=True, exist_ok=True)
    for file in source.iterdir():
        shutil.copyfile(file, target / file.name)


# The demo's own file name for its export (so `fdpp demo --workdir` reuses a copy) and a cache long enough
# for every prompt the tests send.
SMOLLM2_NAME = "smollm2-135m"
SMOLLM2_MAX_CACHE = 128


@pytest.fixture(scope="session")
def smollm2_float32(tmp_path_factory):
    """smollm2-135m (the trained weights) exported by the CLI as the CPU demo exports it (float32), with a cache of
    SMOLLM2_MAX_CACHE: a function folder -> path of smollm2-135m.onnx copied there with its data, metadata and
    tokenizer."""
    from fdpp_rewrite import cli

    folder = tmp_path_factory.mktemp("smollm2-float32")
    assert cli.main(["export", SMOLLM2_NAME, "--dtype", "float32", "--max-cache", str(SMOLLM2_MAX_CACHE),
                     "-o", str(folder / f"{SMOLLM2_NAME}.onnx")]) == 0

    def copied_into(target: Path) -> Path:
        _copy_files(folder, target)
        return target / f"{SMOLLM2_NAME}.onnx"

    return copied_into


@pytest.fixture(scope="session")
def real_preset_export(tmp_path_factory):
    """preset -> path of its one-layer float16 export at the real dimensions (random weights, cache 16), made once
    by the CLI with --random-init; the folder is the caller's to read only (write outputs elsewhere)."""
    from fdpp_rewrite import cli

    made = {}

    def get(preset: str) -> Path:
        if preset not in made:
            path = tmp_path_factory.mktemp(f"real-{preset}") / "model.onnx"
            assert cli.main(["export", preset, "--dtype", "float16", "--layers", "1", "--max-cache", "16",
                             "--random-init", "-o", str(path)]) == 0
            made[preset] = path
        return made[preset]

    return get


@pytest.fixture(scope="session")
def hf_export(tmp_path_factory):
    """(family, dynamo, cache) -> path of tests/helpers/hf_exports.py's float32 graph, exported on first use (a skip
    with the exporter's reason where it cannot); the folder is the caller's to read only (write outputs elsewhere)."""
    hf_exports = pytest.importorskip("hf_exports")
    return hf_exports.cached_exporter(tmp_path_factory.mktemp("hf-exports"))
