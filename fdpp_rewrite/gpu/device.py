"""Facts about this machine's GPU and plugin library, as an engine manifest records them and a loader checks them.

    gpu_facts()      -> {"name": "NVIDIA H200", "cc": "9.0", "driver": "13.0", "num_sms": 132, ...}
    library_facts()  -> {"path": ".../libfdpp_plugins.so", "abi_version": 4, "sha256": "..."} or None
    spec_memory_bandwidth("NVIDIA H200") -> 4.8e12 (bytes/s, the vendor's figure; None for a GPU not listed)
"""

from __future__ import annotations

import hashlib
from pathlib import Path

from fdpp_rewrite.errors import FdppError

# HBM bandwidth on the vendor's spec sheet, by torch's device name: what bench's "% of spec" divides by
SPEC_MEMORY_BYTES_PER_S = {"NVIDIA H200": 4.8e12, "NVIDIA H100 80GB HBM3": 3.35e12, "NVIDIA A100-SXM4-80GB": 2.039e12}


def sha256_file(path: Path, chunk: int = 1 << 24) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            digest.update(block)
    return digest.hexdigest()


def cuda_driver_version() -> str:
    import ctypes

    try:
        version = ctypes.c_int(0)
        ctypes.CDLL("libcuda.so.1").cuDriverGetVersion(ctypes.byref(version))
        return f"{version.value // 1000}.{version.value % 1000 // 10}"
    except OSError:
        return "unknown"


def gpu_facts() -> dict:
    import torch

    from fdpp_rewrite.gpu import gemm

    props = torch.cuda.get_device_properties(torch.cuda.current_device())
    info = gemm.device_info()
    return dict(info, name=props.name, cc=f"{props.major}.{props.minor}", driver=cuda_driver_version())


def library_facts() -> dict | None:
    """ABI version, path and sha256 of the plugin library, or None when it cannot be loaded."""
    from fdpp_rewrite.gpu import lib

    path = lib.library_path()
    if not path.is_file():
        return None
    try:
        abi = lib.load().fdpp_abi_version()
    except FdppError:
        return None
    return {"path": str(path), "abi_version": abi, "sha256": sha256_file(path)}


def spec_memory_bandwidth(name: str) -> float | None:
    return SPEC_MEMORY_BYTES_PER_S.get(name)
