"""An engine folder's manifest.json: reading it, and checking it against this machine before a load.

    manifest = read_manifest("engines/m")     # FdppError (one line) for anything that is not a loadable engine
    check_device(manifest, "engines/m")       # a cuda engine on another GPU or library build: FdppError
"""

from __future__ import annotations

import json
from pathlib import Path

from fdpp_rewrite.engine import FORMAT_VERSION
from fdpp_rewrite.errors import FdppError


def read_manifest(folder: Path) -> dict:
    folder = Path(folder)
    path = folder / "manifest.json"
    if not folder.is_dir() or not path.is_file():
        raise FdppError(f"{folder} is not an engine folder (no manifest.json); build one with `build model.fdpp.onnx "
                        f"-o {folder}`")
    try:
        manifest = json.loads(path.read_text())
    except json.JSONDecodeError:
        raise FdppError(f"{path} is not valid JSON (a truncated engine?); rebuild the engine") from None
    if manifest.get("format") != "fdpp-engine" or not isinstance(manifest.get("format_version"), int):
        raise FdppError(f"{path} is not an fdpp engine manifest; rebuild the engine")
    if manifest["format_version"] > FORMAT_VERSION:
        raise FdppError(f"{folder} has engine format {manifest['format_version']}, newer than this fdpp_rewrite "
                        f"reads ({FORMAT_VERSION}); update fdpp_rewrite or rebuild the engine with this version")
    size = manifest.get("tensor_parallel")
    names = [f"rank_{rank}/manifest.json" for rank in range(size)] if size else ["plan.json", "weights.safetensors"]
    for name in names:
        if not (folder / name).is_file():
            raise FdppError(f"{folder} lacks {name} (a truncated engine?); rebuild the engine")
    return manifest


def check_device(manifest: dict, folder: Path) -> None:
    """A cuda engine runs only on the GPU model and the plugin library build it was built with."""
    from fdpp_rewrite.gpu.device import gpu_facts, library_facts
    from fdpp_rewrite.errors import require_gpu

    if manifest["backend"] != "cuda":
        raise FdppError(f"{folder} was built for the cpu backend; build it on the GPU (build --backend cuda) or "
                        "run it with --backend cpu")
    require_gpu("running a cuda engine")
    device, built = gpu_facts(), manifest["gpu"]
    if device["name"] != built["name"] or device["cc"] != built["compute_capability"]:
        raise FdppError(f"{folder} was built for {built['name']} (compute capability {built['compute_capability']}), "
                        f"this GPU is {device['name']} ({device['cc']}); rebuild the engine on this GPU")
    library = library_facts()
    if library is None or library["sha256"] != manifest["library"]["sha256"]:
        found = "no loadable plugin library" if library is None else f"library {library['path']}"
        raise FdppError(f"{folder} was built with another plugin library build ({found} differs from the one in "
                        "its manifest); rebuild the engine with this library")
