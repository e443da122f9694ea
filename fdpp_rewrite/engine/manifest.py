"""An engine folder's manifest.json and plan.json: reading them against their schemas, checking the weights against
the manifest's sha256, and checking the engine against this machine before a load.

    manifest = read_manifest("engines/m")     # FdppError (one line) for anything that is not a valid engine
    plan = read_plan("engines/m", manifest)   # plan.json, checked against PLAN_SCHEMA and the manifest
    verify_weights("engines/m", manifest)     # weights.safetensors against manifest["weights_sha256"]
    check_device(manifest, "engines/m")       # a cuda engine on another GPU or library build: FdppError

Every violation is one line naming the file and the field, and saying to rebuild the engine.

Fast path of verify_weights: hashing a 13 GB weights file costs seconds, so the first full check that succeeds
records a stamp, `.weights.verified` in the engine folder (written atomically): the file's size, mtime_ns,
ctime_ns, inode and device, and the sha256 it matched. A later load whose weights file still has that stat and
whose manifest still names that sha256 skips the hash; any change to the file (a write, a copy, a replacement)
changes its stat, and the next load hashes it again. An engine folder that cannot be written (a read-only mount)
gets no stamp and is hashed on every load. The stamp guards against accidents (a bad copy, a disk error, an
edit), not against someone who can write the folder: they can write the manifest too. `fdpp verify ENGINE`
always hashes in full.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import re
from dataclasses import dataclass
from pathlib import Path

from fdpp_rewrite.atomic import leftovers, temp_name
from fdpp_rewrite.cli_args import ENGINE_BACKENDS
from fdpp_rewrite.dtypes import FLOAT_TYPES
from fdpp_rewrite.engine import FORMAT_VERSION
from fdpp_rewrite.errors import FdppError

MANIFEST, PLAN, WEIGHTS, TOKENIZER, STAMP = ("manifest.json", "plan.json", "weights.safetensors", "tokenizer.json",
                                             ".weights.verified")
ENGINE_DTYPES = tuple(name for name, _, _ in FLOAT_TYPES)
REBUILD = "rebuild the engine (build MODEL -o {folder} --force)"


@dataclass(frozen=True)
class Field:
    """One key of a JSON object: its kind (a key of KINDS), whether it must be there, whether null is allowed, and
    the lowest value (numbers) or the allowed values."""

    kind: str
    required: bool = True
    nullable: bool = False
    minimum: int | None = None
    choices: tuple | None = None


# kind -> (test, how the error names it)
KINDS = {
    "int": (lambda v: type(v) is int, "an integer"),  # `type is`: JSON true is no count
    "str": (lambda v: isinstance(v, str), "a string"),
    "object": (lambda v: isinstance(v, dict), "an object"),
    "list": (lambda v: isinstance(v, list), "a list"),
    "strings": (lambda v: isinstance(v, list) and all(isinstance(s, str) for s in v), "a list of strings"),
    "sha256": (lambda v: isinstance(v, str) and re.fullmatch(r"[0-9a-f]{64}", v) is not None, "a sha256 hex digest"),
}

# Dotted keys name nested fields; a nested field is checked when its parent object is there.
MANIFEST_SCHEMA = {
    "format": Field("str", choices=("fdpp-engine",)),
    "format_version": Field("int", minimum=1),
    "backend": Field("str", choices=ENGINE_BACKENDS),
    "dtype": Field("str", choices=ENGINE_DTYPES),
    "max_batch": Field("int", minimum=1),
    "max_seq": Field("int", minimum=2),
    "num_layers": Field("int", minimum=1),
    "weights_sha256": Field("sha256", required=False),  # required of every folder that holds weights (_consistent)
    "tensor_parallel": Field("int", required=False, minimum=1),
    "gpu": Field("object", required=False, nullable=True),  # a cuda engine's: required (_consistent)
    "gpu.name": Field("str"),
    "gpu.compute_capability": Field("str"),
    "library": Field("object", required=False, nullable=True),
    "library.sha256": Field("sha256"),
    "tokenizer": Field("object", required=False, nullable=True),
    "tokenizer.file": Field("str"),
    "model": Field("object", required=False),
    "model.config": Field("object", required=False, nullable=True),
    "model.config.max_position": Field("int", required=False, nullable=True, minimum=1),
    "kv_cache": Field("object", required=False),  # a paged engine's (build --kv-memory); absent: contiguous slots
    "kv_cache.layout": Field("str", choices=("paged",)),
    "kv_cache.block_size": Field("int", minimum=1),
    "kv_cache.kv_memory": Field("str"),
}

PLAN_SCHEMA = {
    "interface": Field("str", required=False, choices=("fdpp", "hf")),
    "inputs": Field("strings"),
    "outputs": Field("strings"),
    "cache_inputs": Field("strings"),
    "num_layers": Field("int", minimum=1),
    "num_kv_heads": Field("int", minimum=1),
    "head_dim": Field("int", minimum=1),
    "dtype": Field("str", choices=ENGINE_DTYPES),
    "vocab_size": Field("int", nullable=True, minimum=1),
    "nodes": Field("list"),
    "gemm_plans": Field("object"),
    "host_values": Field("strings"),
    "scalar_values": Field("strings", required=False),
}

NODE_SCHEMA = {"name": Field("str"), "op": Field("str"), "domain": Field("str"), "inputs": Field("strings"),
               "outputs": Field("strings"), "attrs": Field("object")}
GEMM_PLAN_SCHEMA = {"m1": Field("int", minimum=0), "m2": Field("int", minimum=0), "implb": Field("object"),
                    "m3": Field("int", minimum=0, required=False), "wgmma": Field("object", required=False)}


def _lookup(data: dict, key: str):
    """(found, value) of a dotted key; found is None when a parent is absent or null (the parent's own field
    decides whether that is allowed)."""
    *parents, last = key.split(".")
    for part in parents:
        data = data.get(part) if isinstance(data, dict) else None
        if not isinstance(data, dict):
            return None, None
    return last in data, data.get(last)


def _describe(field: Field) -> str:
    text = KINDS[field.kind][1]
    if field.minimum is not None:
        text += f" >= {field.minimum}"
    if field.choices:
        text += f" (one of {', '.join(field.choices)})"
    return text + (" or null" if field.nullable else "")


def schema_problem(data, schema: dict, prefix: str = "") -> str | None:
    """The first field of `data` that breaks `schema`, as words ("max_batch is "eight", expected an integer >= 1"),
    or None."""
    if not isinstance(data, dict):
        return f"{prefix.rstrip('.') or 'the file'} is {_shown(data)}, expected an object"
    for key, field in schema.items():
        found, value = _lookup(data, key)
        if found is None:
            continue
        name = prefix + key
        if not found:
            if field.required:
                return f"{name} is missing, expected {_describe(field)}"
            continue
        if value is None and field.nullable:
            continue
        test = KINDS[field.kind][0]
        if (not test(value) or (field.minimum is not None and value < field.minimum)
                or (field.choices and value not in field.choices)):
            return f"{name} is {_shown(value)}, expected {_describe(field)}"
    return None


def _shown(value) -> str:
    text = json.dumps(value) if not isinstance(value, float) or math.isfinite(value) else str(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _refuse(path: Path, folder: Path, problem: str) -> FdppError:
    return FdppError(f"{path}: {problem}; {REBUILD.format(folder=folder)}")


def _read_json(path: Path, folder: Path):
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError:
        raise FdppError(f"{path} is not valid JSON (a truncated engine?); {REBUILD.format(folder=folder)}") from None
    except UnicodeDecodeError:
        raise FdppError(f"{path} is not a text file; {REBUILD.format(folder=folder)}") from None


def read_manifest(folder: Path) -> dict:
    """The folder's manifest, checked against MANIFEST_SCHEMA and for consistency (see _consistent)."""
    folder = Path(folder)
    path = folder / MANIFEST
    if not folder.is_dir() or not path.is_file():
        raise FdppError(f"{folder} is not an engine folder (no manifest.json); build one with `build model.fdpp.onnx "
                        f"-o {folder}`")
    manifest = _read_json(path, folder)
    if not isinstance(manifest, dict) or manifest.get("format") != "fdpp-engine":
        raise FdppError(f"{path} is not an fdpp engine manifest; {REBUILD.format(folder=folder)}")
    version = manifest.get("format_version")
    if type(version) is int and version > FORMAT_VERSION:
        raise FdppError(f"{folder} has engine format {version}, newer than this fdpp_rewrite reads "
                        f"({FORMAT_VERSION}); update fdpp_rewrite or rebuild the engine with this version")
    problem = schema_problem(manifest, MANIFEST_SCHEMA) or _consistent(manifest)
    if problem:
        raise _refuse(path, folder, problem)
    from fdpp_rewrite.engine.tensor_parallel import rank_folder_name

    size = manifest.get("tensor_parallel")
    names = [f"{rank_folder_name(rank)}/{MANIFEST}" for rank in range(size)] if size else [PLAN, WEIGHTS]
    for name in names:
        if not (folder / name).is_file():
            raise FdppError(f"{folder} lacks {name} (a truncated engine?); {REBUILD.format(folder=folder)}")
    return manifest


def _consistent(manifest: dict) -> str | None:
    """The rules between fields that a per-field schema cannot say."""
    positions = ((manifest.get("model") or {}).get("config") or {}).get("max_position")
    if positions and manifest["max_seq"] > positions:
        return (f"max_seq {manifest['max_seq']} exceeds the model's {positions} positions "
                f"(model.config.max_position; build with --max-seq {positions} or less)")
    if manifest["backend"] == "cuda":
        for key in ("gpu", "library"):
            if not isinstance(manifest.get(key), dict):
                return f"{key} is {_shown(manifest.get(key))}, expected an object for a cuda engine"
    cache = manifest.get("kv_cache")
    if cache:
        from fdpp_rewrite.engine.paged.blocks import KV_BLOCK_SIZE
        from fdpp_rewrite.engine.paged.sizing import parse_kv_memory

        if cache["block_size"] != KV_BLOCK_SIZE:
            return f"kv_cache.block_size is {cache['block_size']}, this version's KV blocks hold {KV_BLOCK_SIZE} tokens"
        try:
            parse_kv_memory(cache["kv_memory"])
        except FdppError as exc:
            return f"kv_cache.kv_memory: {exc}"
    if not manifest.get("tensor_parallel") and "weights_sha256" not in manifest:
        return f"weights_sha256 is missing, expected {KINDS['sha256'][1]}"
    return None


def read_plan(folder: Path, manifest: dict | None = None) -> dict:
    """plan.json of an engine folder (a rank folder of a tensor-parallel one), checked against PLAN_SCHEMA, its
    nodes and GEMM plans against theirs, and against `manifest` (dtype and layers) when given."""
    folder = Path(folder)
    path = folder / PLAN
    if not path.is_file():
        raise FdppError(f"{folder} lacks {PLAN} (a truncated engine?); {REBUILD.format(folder=folder)}")
    plan = _read_json(path, folder)
    problem = schema_problem(plan, PLAN_SCHEMA) or _as_manifest(plan, manifest) or _plan_parts(plan)
    if problem:
        raise _refuse(path, folder, problem)
    return plan


def _as_manifest(plan: dict, manifest: dict | None) -> str | None:
    for key in ("dtype", "num_layers") if manifest is not None else ():
        if plan[key] != manifest.get(key):
            return f"{key} is {_shown(plan[key])}, but the manifest says {_shown(manifest.get(key))}"
    return None


def _plan_parts(plan: dict) -> str | None:
    for index, node in enumerate(plan["nodes"]):
        problem = schema_problem(node, NODE_SCHEMA, f"nodes[{index}].")
        if problem:
            return problem
    for name, gemm in plan["gemm_plans"].items():
        problem = schema_problem(gemm, GEMM_PLAN_SCHEMA, f"gemm_plans.{name}.")
        if problem:
            return problem
    if len(plan["cache_inputs"]) != 2 * plan["num_layers"]:
        return (f"cache_inputs has {len(plan['cache_inputs'])} names, expected 2 per layer "
                f"({2 * plan['num_layers']})")
    if "logits" not in plan["outputs"]:
        return "outputs lacks logits"
    flat_gemms = [n["name"] for n in plan["nodes"] if n["domain"] == "fdpp" and n["op"] == "FlatGemm"]
    unplanned = [name for name in flat_gemms if name not in plan["gemm_plans"]]
    if unplanned:
        return f"gemm_plans lacks FlatGemm {unplanned[0]}"
    return None


# ---- weights ------------------------------------------------------------------------------------------------

def _stat_key(path: Path) -> dict:
    stat = path.stat()
    return {"size": stat.st_size, "mtime_ns": stat.st_mtime_ns, "ctime_ns": stat.st_ctime_ns, "inode": stat.st_ino,
            "device": stat.st_dev}


def _stamp_matches(folder: Path, key: dict, sha256: str) -> bool:
    try:
        stamp = json.loads((folder / STAMP).read_text())
    except (OSError, ValueError):
        return False
    return stamp == dict(key, sha256=sha256)


def _write_stamp(folder: Path, key: dict, sha256: str) -> None:
    """Record a verified weights file; a folder we cannot write (read-only) keeps hashing on each load."""
    path = folder / STAMP
    temp = temp_name(path)
    try:
        for leftover in leftovers(path):  # stamps half-written by killed loads
            leftover.unlink(missing_ok=True)
        temp.write_text(json.dumps(dict(key, sha256=sha256)) + "\n")
        os.replace(temp, path)
    except OSError:
        with contextlib.suppress(OSError):
            temp.unlink(missing_ok=True)


def hash_weights(folder: Path, manifest: dict) -> str:
    """Hash the weights in full against the manifest (no stamp consulted), record the stamp, return the sha256."""
    from fdpp_rewrite.gpu.device import sha256_file

    folder = Path(folder)
    path = folder / WEIGHTS
    if not path.is_file():
        raise FdppError(f"{folder} lacks {WEIGHTS} (a truncated engine?); {REBUILD.format(folder=folder)}")
    before = _stat_key(path)
    digest = sha256_file(path)
    if digest != manifest["weights_sha256"]:
        raise FdppError(f"{path} does not match the sha256 in its manifest (corrupted or changed after the build); "
                        f"{REBUILD.format(folder=folder)}")
    if _stat_key(path) == before:  # unchanged while hashed: the stamp vouches for what was read
        _write_stamp(folder, before, digest)
    return digest


def verify_weights(folder: Path, manifest: dict) -> None:
    """weights.safetensors against manifest["weights_sha256"]: hashed in full unless the stamp of an earlier full
    check still matches the file (see the module docstring); each rank of a tensor-parallel engine in turn."""
    from fdpp_rewrite.engine.tensor_parallel import rank_folder_name

    folder = Path(folder)
    if manifest.get("tensor_parallel"):
        for rank in range(manifest["tensor_parallel"]):
            rank_path = folder / rank_folder_name(rank)
            verify_weights(rank_path, read_manifest(rank_path))
        return
    path = folder / WEIGHTS
    if path.is_file() and _stamp_matches(folder, _stat_key(path), manifest["weights_sha256"]):
        return
    hash_weights(folder, manifest)


# ---- this machine -------------------------------------------------------------------------------------------

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
