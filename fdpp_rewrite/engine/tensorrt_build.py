"""`build --backend tensorrt`: a serialized TensorRT engine (a plan file) from a rewritten graph (docs/tensorrt.md).

It needs TensorRT's Python module, `tensorrt` (NVIDIA TensorRT) or else `tensorrt_rtx_bindings` (TensorRT-RTX),
and libfdpp_plugins.so built with the TensorRT adapters (`-DTensorRT_INCLUDE_DIR=...`). The library is loaded into
TensorRT's plugin registry, TensorRT's ONNX parser maps each fdpp node to the plugin creator of its op type and
plugin_version, and the builder writes a plan with two optimization profiles: decode (seq = 1) and prefill (seq up
to --max-seq), each for batch 1 .. --max-batch. Where something is missing, one line names what to install.
"""

from __future__ import annotations

import importlib
from pathlib import Path

import onnx

from fdpp_rewrite.atomic import AtomicOutputs
from fdpp_rewrite.errors import FdppError

# TensorRT first: the runtime users deploy; TensorRT-RTX has the same builder and parser API under another name.
MODULES = ("tensorrt", "tensorrt_rtx_bindings")
INSTALL_TENSORRT = ("the tensorrt backend needs TensorRT's Python module: `pip install tensorrt` (NVIDIA TensorRT "
                    "10 or later) or `pip install tensorrt-rtx-cu13-bindings tensorrt-rtx-cu13-libs` (TensorRT-RTX)")
# The graph's dynamic dimensions (fdpp_rewrite export) and their range in each profile: (min, opt, max).
DECODE, PREFILL = "decode", "prefill"
_LOADED = set()  # (module, library) pairs already in a registry of this process


def import_tensorrt():
    """The first importable TensorRT module of MODULES, or FdppError naming what to install."""
    for name in MODULES:
        try:
            return importlib.import_module(name)
        except ImportError:
            continue
    raise FdppError(INSTALL_TENSORRT)


def check_rtx_parser(trt) -> None:
    """TensorRT-RTX's ONNX parser dlopens `libtensorrt_rtx.so` (beside itself) when it imports a plugin node, and
    the wheel ships only libtensorrt_rtx.so.1: without the link the parser aborts the process."""
    if trt.__name__ != "tensorrt_rtx_bindings":
        return
    try:
        libs = Path(importlib.import_module("tensorrt_rtx_libs").__file__).parent
    except ImportError:
        return  # a TensorRT-RTX installed from NVIDIA's archive, whose folder has the unversioned name
    if (libs / "libtensorrt_rtx.so.1").exists() and not (libs / "libtensorrt_rtx.so").exists():
        raise FdppError(f"TensorRT-RTX's ONNX parser loads libtensorrt_rtx.so, which its wheel lacks; run "
                        f"`ln -s libtensorrt_rtx.so.1 {libs}/libtensorrt_rtx.so` and build again")


def load_plugins(trt, library: Path, model: onnx.ModelProto) -> None:
    """Loads libfdpp_plugins.so into TensorRT's registry and checks that every fdpp node has a creator there."""
    from fdpp_rewrite.contracts import DOMAIN, node_attributes

    if not library.exists():
        raise FdppError(f"plugin library {library} not found; build it with `cmake -B build "
                        "-DTensorRT_INCLUDE_DIR=<TensorRT>/include && cmake --build build -j` or set FDPP_PLUGIN_LIB")
    registry = trt.get_plugin_registry()
    key = (trt.__name__, str(library.resolve()))
    if key not in _LOADED and registry.load_library(str(library)) is None:  # a second load of one library fails
        raise FdppError(f"TensorRT could not load {library} as a plugin library; rebuild it with "
                        "-DTensorRT_INCLUDE_DIR=<TensorRT>/include (it then exports getCreators)")
    _LOADED.add(key)
    missing = set()
    for node in model.graph.node:
        if node.domain == DOMAIN:
            version = str(node_attributes(node).get("plugin_version", "1"))
            if registry.get_creator(node.op_type, version, "") is None:
                missing.add(f"{node.op_type} (version {version})")
    if missing:
        raise FdppError(f"{library.name} has no TensorRT plugin for the graph's fdpp nodes {', '.join(sorted(missing))}"
                        "; rebuild the library from this checkout with -DTensorRT_INCLUDE_DIR=<TensorRT>/include, or "
                        "use --backend cuda")


def profile_shapes(model: onnx.ModelProto, max_batch: int, max_seq: int | None) -> dict:
    """{profile: {input: (min, opt, max)}} for the graph's inputs with dynamic dimensions, named as the exporter
    names them: batch (1 .. max_batch) and seq (1 in decode; 1 .. max_seq in prefill, default the cache length)."""
    initializers = {init.name for init in model.graph.initializer}
    inputs = [i for i in model.graph.input if i.name not in initializers]
    if max_seq is None:
        cache = next((i for i in inputs if i.name == "key_cache.0"), None)
        dims = cache.type.tensor_type.shape.dim if cache is not None else []
        if len(dims) != 4 or not dims[2].dim_value:
            raise FdppError("the graph has no key_cache.0 input with a static length; pass --max-seq")
        max_seq = dims[2].dim_value
    if max_batch < 1 or max_seq < 1:
        raise FdppError(f"--max-batch ({max_batch}) and --max-seq ({max_seq}) must be at least 1")
    ranges = {DECODE: {"batch": (1, max_batch, max_batch), "seq": (1, 1, 1)},
              PREFILL: {"batch": (1, 1, max_batch), "seq": (1, max_seq, max_seq)}}
    shapes = {DECODE: {}, PREFILL: {}}
    for tensor in inputs:
        dims = tensor.type.tensor_type.shape.dim
        if all(d.dim_value for d in dims):
            continue
        for profile, known in ranges.items():
            per_dim = []
            for d in dims:
                if d.dim_value:
                    per_dim.append((d.dim_value,) * 3)
                elif d.dim_param in known:
                    per_dim.append(known[d.dim_param])
                else:
                    raise FdppError(f"input {tensor.name} has a dimension '{d.dim_param or '?'}' the tensorrt backend "
                                    f"has no range for (it knows {', '.join(known)}); export with fdpp_rewrite export")
            shapes[profile][tensor.name] = tuple(tuple(p[i] for p in per_dim) for i in range(3))
    return shapes


def build_tensorrt_engine(source: Path, output: Path, *, max_batch: int = 8, max_seq: int | None = None,
                          force: bool = False, library: Path | None = None, stream=None) -> dict:
    """The tensorrt backend of `build` (see the module docstring). Returns what was built."""
    from fdpp_rewrite.resources import plugin_library_path

    source, output = Path(source), Path(output)
    outputs = AtomicOutputs([output], force=force, example="model.plan")
    outputs.check()
    if not source.is_file():
        raise FdppError(f"no rewritten graph at {source}; pass model.fdpp.onnx from `fdpp_rewrite rewrite`")
    model = onnx.load(str(source), load_external_data=False)
    shapes = profile_shapes(model, max_batch, max_seq)
    trt = import_tensorrt()
    check_rtx_parser(trt)
    library = Path(library) if library is not None else plugin_library_path()
    load_plugins(trt, library, model)

    logger = trt.Logger(trt.Logger.WARNING)
    builder = trt.Builder(logger)
    network = builder.create_network(0)
    parser = trt.OnnxParser(network, logger)
    if not parser.parse_from_file(str(source)):
        first = parser.get_error(0) if parser.num_errors else "no error reported"
        raise FdppError(f"TensorRT's ONNX parser refused {source.name}: {first}")
    config = builder.create_builder_config()
    # RopeAppend's cache outputs alias its cache inputs (getAliasedInput): without this TensorRT refuses the layer.
    config.set_preview_feature(trt.PreviewFeature.ALIASED_PLUGIN_IO_10_03, True)
    for profile in (DECODE, PREFILL):
        optimization = builder.create_optimization_profile()
        for name, (lo, opt, hi) in shapes[profile].items():
            optimization.set_shape(name, lo, opt, hi)
        config.add_optimization_profile(optimization)
    plan = builder.build_serialized_network(network, config)
    if plan is None:
        raise FdppError(f"TensorRT could not build {source.name} (its log above says why)")
    with outputs:
        with open(outputs.temp(output), "wb") as file:
            file.write(memoryview(plan))
    return {"module": trt.__name__, "version": trt.__version__, "bytes": plan.nbytes, "profiles": shapes,
            "output": str(output)}
