"""`build model.fdpp.onnx -o ENGINE_DIR`: lower a rewritten graph to an engine folder for this GPU (or the cpu
backend).

Lowering, in order: read the graph without its weights; turn Constant nodes into initializers; drop nodes no
output needs; check every op is one the interpreter knows (the glue ops fdpp::RMSNorm and fdpp::RopeAppend come
from the rewriter's passes; a graph rewritten without them runs their standard-op form); give every FlatGemm the
plan resolved by fdpp_rewrite.gemm_plans (the rewriter's, or the GPU's profile, profiling the shapes no profile
has, here and now: an engine never runs an unprofiled GEMM); write the folder atomically (a temporary folder
beside it, renamed into place):

    manifest.json        format version, backend, GPU name / compute capability / driver, plugin library ABI and
                         sha256, profile sha256, source ONNX sha256, dtype, limits, model config, tokenizer
    plan.json            graph inputs and outputs, the node list (op, inputs, outputs, attributes), which
                         initializers are host values, and each FlatGemm's plan
    weights.safetensors  every initializer, as the graph holds it (FlatGemm weights already [N, K])
    tokenizer.json       the tokenizer, when the export had one

With --tensor-parallel N the folder holds manifest.json (tensor_parallel N, each rank's GEMM shapes) and rank_0 ...
rank_{N-1}, each the folder above for its shard (tensor_parallel.py).
"""

from __future__ import annotations

import datetime
import json
import shutil
import sys
from pathlib import Path

import numpy as np

from fdpp_rewrite import __version__
from fdpp_rewrite.engine import FORMAT_VERSION, hf_interface, ops
from fdpp_rewrite.engine.folder import check_output, replace_folder, temp_folder
from fdpp_rewrite.dtypes import numpy_dtype_name, numpy_to_torch, numpy_type, onnx_dtype_name
from fdpp_rewrite.errors import FdppError, cannot_load
from fdpp_rewrite.gemm_plans import gemm_nodes, profiler, resolve_cpu_plans, resolve_cuda_plans
from fdpp_rewrite.gpu.device import gpu_facts, library_facts, sha256_file
from fdpp_rewrite.hf_graph import is_hf_interface

CACHE_PREFIXES = ("key_cache.", "value_cache.")
HOST_VALUE_MAX_ELEMENTS = 64  # initializers this small (shape constants, axes, scalars) are host values
ONNX_NP = {1: np.float32, 10: np.float16, 16: numpy_type("bfloat16"), 11: np.float64, 7: np.int64, 6: np.int32,
           9: np.bool_, 2: np.uint8, 3: np.int8}


# ---- reading the graph --------------------------------------------------------------------------------------

def _read_initializer(init, base_dir: Path) -> np.ndarray:
    """An initializer as a numpy array; external data is memory-mapped, not read into the protobuf."""
    from onnx import numpy_helper

    if init.data_type not in ONNX_NP:
        raise FdppError(f"initializer {init.name} has ONNX type {init.data_type}, which the engine does not support")
    if not init.external_data:
        return numpy_helper.to_array(init)
    fields = {entry.key: entry.value for entry in init.external_data}
    path = base_dir / fields["location"]
    if not path.is_file():
        raise FdppError(f"external data file {path} is missing; re-run rewrite")
    offset, length = int(fields.get("offset", 0)), int(fields.get("length", 0)) or None
    dtype = np.dtype(ONNX_NP[init.data_type])
    count = int(np.prod(init.dims, dtype=np.int64))
    if length is not None and length != count * dtype.itemsize:
        raise FdppError(f"initializer {init.name} has {length} bytes of data for {count} {dtype} values; "
                        "re-run rewrite")
    if offset + count * dtype.itemsize > path.stat().st_size:
        raise FdppError(f"{path} is truncated (initializer {init.name} runs past its end); re-run rewrite")
    return np.memmap(path, dtype=dtype, mode="r", offset=offset, shape=tuple(init.dims))


def _attributes(node) -> dict:
    from onnx import helper, numpy_helper

    attrs = {}
    for attribute in node.attribute:
        value = helper.get_attribute_value(attribute)
        if isinstance(value, bytes):
            value = value.decode()
        elif isinstance(value, list) and value and isinstance(value[0], bytes):
            value = [v.decode() for v in value]
        elif hasattr(value, "data_type"):  # a TensorProto (ConstantOfShape's value)
            array = numpy_helper.to_array(value)
            value = {"tensor": array.reshape(-1).tolist(), "onnx_type": value.data_type, "dims": list(array.shape)}
        elif not isinstance(value, (int, float, str, list)):
            raise FdppError(f"node {node.name} ({node.op_type}) has attribute {attribute.name} of a kind the "
                            "engine does not support")
        attrs[attribute.name] = value
    return attrs


def _dims(value_info) -> list:
    return [d.dim_value if d.HasField("dim_value") else d.dim_param for d in value_info.type.tensor_type.shape.dim]


def read_graph(path: Path):
    """(plan dict without GEMM plans, {initializer name: numpy array}) of a rewritten ONNX model."""
    import onnx
    from onnx import numpy_helper

    if not path.is_file():
        raise FdppError(f"no ONNX file at {path}; pass the rewritten model (python -m fdpp_rewrite rewrite ...)")
    try:
        model = onnx.load(str(path), load_external_data=False)
    except Exception as exc:  # noqa: BLE001 - protobuf raises many kinds for a corrupt file
        raise cannot_load(path, exc) from None
    if not any(node.domain == "fdpp" for node in model.graph.node):
        raise FdppError(f"{path} has no fdpp nodes; rewrite it first (python -m fdpp_rewrite rewrite {path})")
    initializers = {init.name for init in model.graph.initializer}
    if is_hf_interface({i.name for i in model.graph.input if i.name not in initializers}):
        model = hf_interface.fuse_cache_rope(model, path)
    graph = model.graph
    arrays = {init.name: _read_initializer(init, path.parent) for init in graph.initializer}
    nodes = []
    for index, node in enumerate(graph.node):
        if node.op_type == "Constant" and node.domain in ("", "ai.onnx"):
            value = next((a for a in node.attribute if a.name == "value"), None)
            if value is None:
                raise FdppError(f"Constant node {node.name} has no tensor 'value'; the engine needs one")
            arrays[node.output[0]] = numpy_helper.to_array(value.t)
            continue
        nodes.append({"name": node.name or f"node_{index}", "op": node.op_type, "domain": node.domain,
                      "inputs": list(node.input), "outputs": list(node.output), "attrs": _attributes(node)})

    inputs = {i.name: i for i in graph.input if i.name not in arrays}
    if is_hf_interface(inputs):
        caches = hf_interface.past_inputs(inputs, path)
        hf_interface.lower_cache_concats(nodes, caches, path)
        interface = "hf"
    else:
        for required in ("input_ids", "past_len", "key_cache.0", "value_cache.0"):
            if required not in inputs:
                raise FdppError(f"{path} has no input '{required}'; build engines from `fdpp_rewrite export` graphs "
                                "or from torch.onnx exports of Hugging Face models (with past_key_values)")
        caches = [name for name in inputs if name.startswith(CACHE_PREFIXES)]
        interface = "fdpp"
    first = inputs[caches[0]]
    cache_dims = _dims(first)
    if len(cache_dims) != 4 or not all(isinstance(d, int) for d in cache_dims[1:2] + cache_dims[3:]):
        raise FdppError(f"{caches[0]} has shape {cache_dims}; expected [batch, kv_heads, capacity, head_dim] with "
                        "static kv_heads and head_dim")
    elem = first.type.tensor_type.elem_type
    logits = next((o for o in graph.output if o.name == "logits"), None)
    if logits is None:
        raise FdppError(f"{path} has no output 'logits'")
    vocab = _dims(logits)[-1]
    plan = {
        "interface": interface, "inputs": list(inputs), "outputs": [o.name for o in graph.output],
        "cache_inputs": caches, "num_layers": len(caches) // 2, "num_kv_heads": cache_dims[1],
        "head_dim": cache_dims[3],
        "graph_capacity": cache_dims[2] if interface == "fdpp" and isinstance(cache_dims[2], int) else None,
        "dtype": onnx_dtype_name(elem, str(elem)), "vocab_size": vocab if isinstance(vocab, int) else None,
        "nodes": nodes,
    }
    if plan["vocab_size"] is None:  # a dynamo export leaves the logits dim symbolic: the embedding table has it
        plan["vocab_size"] = _embedding_rows(nodes, arrays)
    return plan, arrays


def _embedding_rows(nodes: list, arrays: dict) -> int | None:
    """Rows of the table the input_ids are gathered from (the vocabulary), or None."""
    for node in nodes:
        if node["op"] == "Gather" and len(node["inputs"]) == 2 and node["inputs"][1] == "input_ids":
            table = arrays.get(node["inputs"][0])
            return int(table.shape[0]) if table is not None and table.ndim == 2 else None
    return None


def prune(plan: dict) -> None:
    """Drop the nodes no graph output depends on (the rewriter leaves none today; a hand-edited graph may)."""
    needed = set(plan["outputs"])
    kept = []
    for node in reversed(plan["nodes"]):
        if any(name in needed for name in node["outputs"]):
            kept.append(node)
            needed.update(name for name in node["inputs"] if name)
    plan["nodes"] = kept[::-1]


def check_ops(plan: dict) -> None:
    from fdpp_rewrite.engine.backends import FDPP_OPS

    unknown = sorted({(n["domain"] + "::" if n["domain"] else "") + n["op"] for n in plan["nodes"]
                      if (n["domain"] == "fdpp" and n["op"] not in FDPP_OPS)
                      or (n["domain"] == ops.ENGINE_DOMAIN and n["op"] not in ops.ENGINE_OPS)
                      or (n["domain"] not in ("fdpp", ops.ENGINE_DOMAIN) and n["op"] not in ops.SUPPORTED)})
    if unknown:
        raise FdppError(f"the graph uses ops the engine does not support: {', '.join(unknown)}")


# ---- GEMM shapes (their plans: fdpp_rewrite.gemm_plans) -------------------------------------------------------

def gemm_shapes(plan: dict, arrays: dict) -> dict:
    """node name -> (n, k, dtype) of every FlatGemm."""
    shapes = {}
    for node in plan["nodes"]:
        if node["domain"] == "fdpp" and node["op"] == "FlatGemm":
            weight = arrays.get(node["inputs"][1])
            if weight is None or weight.ndim != 2:
                raise FdppError(f"FlatGemm {node['name']}: its weight '{node['inputs'][1]}' is not a 2-D initializer")
            dtype = numpy_dtype_name(weight.dtype, "unknown")
            shapes[node["name"]] = (int(weight.shape[0]), int(weight.shape[1]), dtype)
    return shapes


# ---- the command --------------------------------------------------------------------------------------------

def build_engine(source: Path, output: Path, *, backend: str = "auto", max_batch: int | None = None,
                 max_seq: int | None = None, dtype: str | None = None, profile: Path | None = None, force: bool = False,
                 tensor_parallel: int | None = None, kv_memory: str | None = None, stream=sys.stdout) -> dict:
    """Build the engine folder (see the module docstring); returns the manifest. kv_memory: a paged KV cache of
    that much memory ("0.9" of the free GPU memory after the weights, or "20GiB"; max_batch default 256)."""
    import torch

    from fdpp_rewrite.engine.buckets import DEFAULT_MAX_BATCH, PAGED_MAX_BATCH

    source, output = Path(source), Path(output)
    check_output(output, force)
    if backend == "auto":
        backend = "cuda" if torch.cuda.is_available() else "cpu"
    if backend not in ("cuda", "cpu"):
        raise FdppError(f"unknown backend {backend!r}; use cuda or cpu")
    plan, arrays = read_graph(source)
    if dtype and dtype != plan["dtype"]:
        raise FdppError(f"{source} is {plan['dtype']}; export with --dtype {dtype} to build a {dtype} engine")
    if backend == "cuda" and plan["dtype"] not in ("float16", "bfloat16"):
        raise FdppError(f"{source} is {plan['dtype']}; the GPU kernels take float16 or bfloat16, re-export with "
                        "--dtype float16")
    max_seq = int(max_seq or plan["graph_capacity"] or 2048)
    max_batch = max_batch or (PAGED_MAX_BATCH if kv_memory else DEFAULT_MAX_BATCH)
    metadata = _export_metadata(source)
    config = metadata.get("config") if metadata else None
    limit = (config or {}).get("max_position")
    if max_batch < 1 or max_seq < 2:
        raise FdppError(f"--max-batch must be >= 1 and --max-seq >= 2 (got {max_batch} and {max_seq})")
    if limit and max_seq > limit:
        raise FdppError(f"--max-seq {max_seq} exceeds the model's {limit} positions; pass --max-seq {limit} or less")

    prune(plan)
    check_ops(plan)
    kv_cache = paged_kv_cache(plan, kv_memory, tensor_parallel) if kv_memory else None
    op_types = [node["op"] for node in plan["nodes"]]
    glue_ops = {"rms_norm": op_types.count("RMSNorm"), "rope_append": op_types.count("RopeAppend")}
    unsharded_shapes = gemm_shapes(plan, arrays)  # the shapes the rewriter chose the nodes' plans for
    library = library_facts()
    manifest = {
        "format": "fdpp-engine", "format_version": FORMAT_VERSION, "fdpp_rewrite_version": __version__,
        "backend": backend, "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "source": str(source), "source_sha256": sha256_file(source), "interface": plan["interface"],
        "dtype": plan["dtype"],
        "max_batch": int(max_batch), "max_seq": max_seq, "num_layers": plan["num_layers"],
        "library": library, "gpu": None, "profile": None, "profile_sha256": None, "gemm_shapes_profiled_now": [],
        "glue_ops": glue_ops, "model": {"config": config, "source": (metadata or {}).get("source"),
                                  "origin": (metadata or {}).get("origin")}, "tokenizer": None,
    }
    if kv_cache:
        manifest["kv_cache"] = kv_cache
    if tensor_parallel:
        from fdpp_rewrite.engine import tensor_parallel as tp

        tp.check_tensor_parallel(plan, tensor_parallel)
        ranks = [tp.shard(plan, arrays, tensor_parallel, rank) for rank in range(tensor_parallel)]
    else:
        ranks = [(plan, arrays)]
    rank_shapes = [gemm_shapes(rank_plan, rank_arrays) for rank_plan, rank_arrays in ranks]
    nodes = {}
    for rank, ((rank_plan, _), shapes) in enumerate(zip(ranks, rank_shapes)):
        nodes.update(gemm_nodes(rank_plan, shapes, prefix=f"{rank}/", rewritten_shapes=unsharded_shapes))
    if backend == "cuda":
        if library is None:
            raise FdppError("the cuda backend needs the plugin library; build it (cmake) or set FDPP_PLUGIN_LIB")
        device = gpu_facts()
        manifest["gpu"] = {"name": device["name"], "compute_capability": device["cc"], "driver": device["driver"],
                           "num_sms": device["num_sms"]}
        resolved = resolve_cuda_plans(nodes, device["name"], profile, profiler(device), stream)
    else:
        resolved = resolve_cpu_plans(nodes, profile)
    manifest["profile"] = resolved.source
    manifest["profile_sha256"] = sha256_file(resolved.profile_file) if resolved.profile_file else None
    manifest["gemm_shapes_profiled_now"] = resolved.measured
    rank_plans = [{name: resolved.plans[f"{rank}/{name}"] for name in shapes}
                  for rank, shapes in enumerate(rank_shapes)]
    for (rank_plan, rank_arrays), plans, shapes in zip(ranks, rank_plans, rank_shapes):
        _finish_plan(rank_plan, rank_arrays, plans, shapes)
    if not tensor_parallel:
        _write_folder(output, manifest, plan, arrays, metadata, force)
        return manifest
    _write_tensor_parallel(output, manifest, ranks, metadata, force)
    return manifest


def paged_kv_cache(plan: dict, kv_memory: str, tensor_parallel: int | None) -> dict:
    """The manifest's kv_cache of a paged build, or a one-line refusal for a graph that cannot run paged steps."""
    from fdpp_rewrite.engine import mixed
    from fdpp_rewrite.engine.paged.blocks import KV_BLOCK_SIZE
    from fdpp_rewrite.engine.paged.sizing import parse_kv_memory

    parse_kv_memory(str(kv_memory))
    reason = ("tensor-parallel engines keep contiguous slots" if tensor_parallel else
              "a Hugging Face graph" if plan["interface"] == "hf" else mixed.unsupported_reason(plan))
    if reason:
        raise FdppError(f"--kv-memory needs a graph that runs mixed steps ({reason}); build without --kv-memory")
    return {"layout": "paged", "block_size": KV_BLOCK_SIZE, "kv_memory": str(kv_memory)}


def _finish_plan(plan: dict, arrays: dict, plans: dict, shapes: dict) -> None:
    plan["gemm_plans"] = plans
    plan["gemm_shapes"] = {name: list(shape) for name, shape in shapes.items()}
    plan["host_values"] = sorted(name for name, a in arrays.items()
                                 if a.size <= HOST_VALUE_MAX_ELEMENTS and a.dtype.kind in "iub")
    plan["host_values"] += sorted(name for name, a in arrays.items()
                                  if a.size <= HOST_VALUE_MAX_ELEMENTS and a.dtype.kind == "f"
                                  and not _used_as_weight(plan, name))


def _write_tensor_parallel(output: Path, manifest: dict, ranks: list, metadata: dict | None, force: bool) -> None:
    """One engine folder of N rank folders (each a plain engine folder of its shard) and a manifest naming N and
    every rank's GEMM shapes [N, K, dtype] (what a GPU build profiles)."""
    from fdpp_rewrite.engine.tensor_parallel import rank_folder_name

    tmp = temp_folder(output)
    try:
        for rank, (rank_plan, rank_arrays) in enumerate(ranks):
            rank_manifest = dict(manifest, tensor_parallel_rank={"rank": rank, "size": len(ranks)})
            _write_folder(tmp / rank_folder_name(rank), rank_manifest, rank_plan, rank_arrays, metadata, False)
        manifest.update(tensor_parallel=len(ranks), tokenizer=rank_manifest["tokenizer"],
                        rank_gemm_shapes=[rank_plan["gemm_shapes"] for rank_plan, _ in ranks])
        (tmp / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")
        replace_folder(tmp, output, force)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def _used_as_weight(plan: dict, name: str) -> bool:
    """Whether an initializer is a fdpp op's weight (kept on the device even when small)."""
    return any(node["domain"] == "fdpp" and name in node["inputs"] for node in plan["nodes"])


def _export_metadata(source: Path) -> dict | None:
    from fdpp_rewrite.export import read_metadata

    try:
        return read_metadata(source)
    except FdppError:
        return None


def _write_folder(output: Path, manifest: dict, plan: dict, arrays: dict, metadata: dict | None, force: bool):
    from safetensors.torch import save_file

    tmp = temp_folder(output)
    try:
        used = {name for node in plan["nodes"] for name in node["inputs"]}
        tensors = {name: np.ascontiguousarray(a) for name, a in arrays.items() if name in used}
        for name, a in tensors.items():
            if a.ndim == 0:
                tensors[name] = a.reshape(1)
        plan["scalar_values"] = sorted(name for name, a in arrays.items() if name in used and a.ndim == 0)
        save_file({name: numpy_to_torch(a) for name, a in tensors.items()}, str(tmp / "weights.safetensors"))
        if metadata and metadata.get("tokenizer"):
            fields = dict(metadata["tokenizer"])
            shutil.copyfile(Path(metadata["_directory"]) / fields["file"], tmp / "tokenizer.json")
            fields["file"] = "tokenizer.json"
            manifest["tokenizer"] = fields
        manifest["weights_sha256"] = sha256_file(tmp / "weights.safetensors")
        (tmp / "plan.json").write_text(json.dumps(plan, indent=1) + "\n")
        (tmp / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")
        replace_folder(tmp, output, force)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
