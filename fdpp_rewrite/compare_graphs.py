"""Do the two graphs `compare` is given belong together? Checked from their structure before anything runs: the
order (exported model first, rewrite second), the same inputs and outputs (names, dtypes, static sizes), and the
external data files each one names."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from fdpp_rewrite.errors import FdppError

if TYPE_CHECKING:  # onnx is imported when a comparison runs, not for --help
    import onnx


def graph_inputs(model: onnx.ModelProto) -> list:
    initializers = {init.name for init in model.graph.initializer}  # old IR versions list them as inputs
    return [value for value in model.graph.input if value.name not in initializers]


def signature(value) -> tuple[int, list | None]:
    """(element type, dims) of a graph input or output; a dim is an int, a symbol name, or None."""
    tensor = value.type.tensor_type
    if not tensor.HasField("shape"):
        return tensor.elem_type, None
    return tensor.elem_type, [d.dim_value if d.HasField("dim_value") else (d.dim_param or None)
                              for d in tensor.shape.dim]


def _describe(value_signature) -> str:
    import onnx

    elem_type, dims = value_signature
    dtype = onnx.helper.tensor_dtype_to_np_dtype(elem_type).name if elem_type else "untyped"  # e.g. float32
    return dtype if dims is None else f"{dtype} [{', '.join('?' if d is None else str(d) for d in dims)}]"


def _same(a, b) -> bool:
    """Same element type and rank, and equal sizes wherever both dims are static."""
    (type_a, dims_a), (type_b, dims_b) = a, b
    if type_a and type_b and type_a != type_b:
        return False
    if dims_a is None or dims_b is None:
        return True
    return len(dims_a) == len(dims_b) and all(
        not (isinstance(x, int) and isinstance(y, int)) or x == y for x, y in zip(dims_a, dims_b))


def check_interfaces(original: onnx.ModelProto, rewritten: onnx.ModelProto, original_name: str = "the original",
                     rewritten_name: str = "the rewrite") -> None:
    """One-line FdppError unless both graphs take the same inputs and give the same outputs (names, dtypes and
    static sizes): a rewrite of another model (another family, size or cache length) is refused before anything
    runs. e.g. "... input key_cache.0 is float32 [batch, 3, 32, 64] in a.onnx but float32 [batch, 1, 32, 64]
    in b.fdpp.onnx ..." """
    fix = f"compare a model with its own rewrite (python -m fdpp_rewrite rewrite {original_name})"
    for kind, ours, theirs in (("input", graph_inputs(original), graph_inputs(rewritten)),
                               ("output", original.graph.output, rewritten.graph.output)):
        a, b = {v.name: signature(v) for v in ours}, {v.name: signature(v) for v in theirs}
        only_a, only_b = [n for n in a if n not in b], [n for n in b if n not in a]
        if only_a or only_b:
            parts = [f"{', '.join(names[:3])}{' ...' if len(names) > 3 else ''} only in {where}"
                     for names, where in ((only_a, original_name), (only_b, rewritten_name)) if names]
            raise FdppError(f"{rewritten_name} does not belong to {original_name}: their {kind}s differ "
                            f"({'; '.join(parts)}); {fix}")
        for name, ours_signature in a.items():
            if not _same(ours_signature, b[name]):
                raise FdppError(f"{rewritten_name} does not belong to {original_name}: {kind} {name} is "
                                f"{_describe(ours_signature)} in {original_name} but {_describe(b[name])} in "
                                f"{rewritten_name}; {fix}")


def check_data_files(path: Path, model: onnx.ModelProto) -> None:
    """The external data files the model names exist beside it."""
    import onnx

    locations = {entry.value for init in model.graph.initializer if init.data_location == onnx.TensorProto.EXTERNAL
                 for entry in init.external_data if entry.key == "location"}
    for location in sorted(locations):
        if not (path.parent / location).is_file():
            raise FdppError(f"cannot load {path}: its weights file {path.parent / location} is missing; "
                            "re-export or re-run rewrite")


def check_order(original: onnx.ModelProto, rewritten: onnx.ModelProto | None = None) -> None:
    """The exported model comes first, its rewrite (fdpp nodes) second; `rewritten` None for an engine folder."""
    if rewritten is not None and not any(node.domain == "fdpp" for node in rewritten.graph.node):
        raise FdppError("the second model has no fdpp nodes; pass the rewritten model (model.fdpp.onnx) second")
    if any(node.domain == "fdpp" for node in original.graph.node):
        raise FdppError("the first model has fdpp nodes; pass the exported model (model.onnx) first")


def is_bfloat16(model: onnx.ModelProto) -> bool:
    """Whether the graph's outputs are bfloat16 (compare then runs both graphs widened to float32)."""
    from fdpp_rewrite.dtypes import onnx_type_of

    return any(signature(value)[0] == onnx_type_of("bfloat16") for value in model.graph.output)
