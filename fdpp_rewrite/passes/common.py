"""What every rewrite pass shares: graph queries on onnx-graphsurgeon graphs, the sanitize fixpoint, and the
per-pass report (how many instances replaced, which near-misses were left alone and why)."""

from __future__ import annotations

import sys
from collections import Counter
from dataclasses import dataclass, field

import numpy as np
import onnx
import onnx_graphsurgeon as gs

from fdpp_rewrite.contracts import register_onnx_schemas
from fdpp_rewrite.dtypes import numpy_type
from fdpp_rewrite.passes.weights import ExternalValues, load_values

# ops that change neither values nor layout (absorbed when walking a chain)
# the exported graph's input name (the export contract, fdpp_rewrite/onnx_builder.py), not an exporter-made node name
PAST_LEN_INPUT = "past_len"
PASS_THROUGH_OPS = ("Identity", "Dropout")


# --- reports ------------------------------------------------------------------------------------------------

@dataclass
class PassReport:
    """What one pass did: `replaced` instances (by kind), the matches `left` as is (reason -> [(what, name)]: one
    warning line per reason, however many layers share it) and other `warnings` (one line each)."""

    name: str
    replaced: Counter = field(default_factory=Counter)
    left: dict = field(default_factory=dict)
    warnings: list = field(default_factory=list)
    notes: list = field(default_factory=list)

    @property
    def total(self) -> int:
        return sum(self.replaced.values())

    def leave(self, what: str, name: str, reason: str) -> None:
        """Record that `what` '`name`' (e.g. Softmax '/layers.0/Softmax') stays as is, and why."""
        self.left.setdefault(reason, []).append((what, name))

    def reasons(self) -> dict:
        """name -> why it was left as is."""
        return {name: reason for reason, entries in self.left.items() for _, name in entries}

    @property
    def near_misses(self) -> list[str]:
        """The warning lines: one per reason a match was left as is, then the other warnings."""
        lines = []
        for reason, entries in self.left.items():
            shown = ", ".join(f"{what} '{name}'" for what, name in entries[:3]) + (" ..." if len(entries) > 3 else "")
            lines.append(f"{len(entries)} left as is ({reason}): {shown}")
        return lines + list(self.warnings)

    def print(self, stream=None) -> None:
        stream = stream or sys.stdout
        kinds = ", ".join(f"{kind} x{count}" for kind, count in sorted(self.replaced.items()))
        print(f"{self.name}: replaced {self.total}" + (f" ({kinds})" if kinds else ""), file=stream)
        for note in self.notes:
            print(f"  {note}", file=stream)
        for miss in self.near_misses:
            print(f"  warning: {miss}", file=stream)


# --- graph queries ------------------------------------------------------------------------------------------

def producer(tensor: gs.Tensor) -> gs.Node | None:
    """The node that writes `tensor`, or None for graph inputs and constants."""
    return tensor.inputs[0] if len(tensor.inputs) == 1 else None


def is_standard(node: gs.Node) -> bool:
    """A node of the default ONNX domain (gs leaves the domain None for those)."""
    return node.domain in (None, "", "ai.onnx")


def collect_matches(graph: gs.Graph, anchor_op: str, match, report) -> list:
    """match(graph, node) for every standard `anchor_op` node, in topological order: the matches it returns; a node
    where it returns a reason (a str) instead is left as is with that reason in `report`.
        collect_matches(graph, "Softmax", match_attention, report) -> [AttentionMatch, ...]"""
    graph.toposort()
    matches = []
    for node in graph.nodes:
        if node.op != anchor_op or not is_standard(node):
            continue
        named(graph, node)  # a match the pass leaves later (the kernels lack it) is reported by this name too
        found = match(graph, node)
        if isinstance(found, str):
            report.leave(anchor_op, node.name, found)
        else:
            matches.append(found)
    return matches


def named(graph: gs.Graph, node: gs.Node) -> str:
    """The node's name, after giving it a unique one if it had none: the reports and the rewrite's summary tell the
    nodes left as is apart by name."""
    if not node.name:
        node.name = NameMaker(graph, "fdpp_left")(node.op)
    return node.name


def producer_op(tensor: gs.Tensor, *ops: str) -> gs.Node | None:
    node = producer(tensor)
    return node if node is not None and node.op in ops and is_standard(node) else None


def sole_consumer(graph: gs.Graph, tensor: gs.Tensor) -> gs.Node | None:
    """The only node reading `tensor` (None if it has several readers or is a graph output)."""
    if len(tensor.outputs) != 1 or tensor in graph.outputs:
        return None
    return tensor.outputs[0]


def constant_value(tensor: gs.Tensor) -> np.ndarray | None:
    """The value of a constant tensor (initializer or Constant node), else None. Weights are read from disk
    each time, never cached on the graph (see passes/weights.py)."""
    if isinstance(tensor, gs.Constant):
        return load_values(tensor)
    node = producer(tensor)
    if node is not None and node.op == "Constant" and "value" in node.attrs:
        value = node.attrs["value"]
        return value.values if isinstance(value, gs.Constant) else np.asarray(value)
    return None


def is_constant(tensor: gs.Tensor) -> bool:
    if isinstance(tensor, gs.Constant):
        return True
    node = producer(tensor)
    return node is not None and node.op == "Constant"


def scalar_value(tensor: gs.Tensor) -> float | None:
    value = constant_value(tensor)
    if value is None or value.size != 1:
        return None
    return float(value.reshape(()))


def constant_shape(tensor: gs.Tensor) -> tuple | None:
    """Shape of a constant without loading its data (initializers stay lazy)."""
    if isinstance(tensor, gs.Constant):
        return tuple(tensor.shape)
    value = constant_value(tensor)
    return None if value is None else tuple(value.shape)


def constant_dtype(tensor: gs.Tensor) -> str | None:
    """dtype name of a constant without loading its data."""
    if isinstance(tensor, gs.Constant):
        return dtype_name(tensor)
    value = constant_value(tensor)
    return None if value is None else value.dtype.name


def weight_tensor(tensor: gs.Tensor) -> bool:
    """A constant 2-D tensor: what a linear layer multiplies by."""
    shape = constant_shape(tensor)
    return shape is not None and len(shape) == 2


def rank(tensor: gs.Tensor) -> int | None:
    return None if tensor.shape is None else len(tensor.shape)


def static_dim(tensor: gs.Tensor, axis: int) -> int | None:
    if tensor.shape is None or not -len(tensor.shape) <= axis < len(tensor.shape):
        return None
    dim = tensor.shape[axis]
    return int(dim) if isinstance(dim, (int, np.integer)) and dim >= 0 else None


def np_dtype(tensor: gs.Tensor):
    """numpy dtype of a tensor if known (gs stores numpy dtypes, or onnx enums for some types)."""
    if tensor.dtype is None:
        return None
    try:
        return np.dtype(tensor.dtype)
    except TypeError:
        return None


def numpy_bfloat16(graph: gs.Graph) -> None:
    """onnx-graphsurgeon types a bfloat16 tensor as ONNX's 16 (numpy has no bfloat16 of its own); give each one
    ml_dtypes' numpy bfloat16 (fdpp_rewrite.dtypes), so every pass reads a numpy dtype."""
    bf16 = numpy_type("bfloat16")
    for tensor in graph.tensors().values():
        if isinstance(tensor.dtype, (int, np.integer)) and int(tensor.dtype) == onnx.TensorProto.BFLOAT16:
            if isinstance(tensor, gs.Constant):
                tensor._values.dtype = bf16  # a lazily loaded constant reports its values' dtype
            else:
                tensor.dtype = bf16


def dtype_name(tensor: gs.Tensor) -> str:
    """'float16' / 'float32' / 'bfloat16' / ... for messages and profile keys."""
    dtype = tensor.dtype
    if isinstance(dtype, (int, np.integer)):
        return onnx.helper.tensor_dtype_to_np_dtype(int(dtype)).name if dtype != onnx.TensorProto.BFLOAT16 \
            else "bfloat16"
    if dtype is None:
        return "unknown"
    name = getattr(dtype, "name", None) or str(dtype)
    return "bfloat16" if "bfloat16" in name.lower() else np.dtype(dtype).name


def skip_forward(graph: gs.Graph, tensor: gs.Tensor, ops=("Cast",) + PASS_THROUGH_OPS):
    """Follow `tensor` through single-reader Cast/Identity/Dropout nodes; return (last tensor, nodes passed)."""
    passed = []
    while True:
        node = sole_consumer(graph, tensor)
        if node is None or node.op not in ops or node.inputs[0] is not tensor:
            return tensor, passed
        passed.append(node)
        tensor = node.outputs[0]


def skip_backward(graph: gs.Graph, tensor: gs.Tensor, ops=("Cast",) + PASS_THROUGH_OPS):
    """Walk up from `tensor` through Cast/Identity/Dropout producers, each tensor on the way having that one
    reader; return (first tensor above them, nodes passed)."""
    passed = []
    while True:
        node = producer(tensor)
        if node is None or node.op not in ops or sole_consumer(graph, tensor) is None:
            return tensor, passed
        passed.append(node)
        tensor = node.inputs[0]


def ancestors(tensor: gs.Tensor, stop_ops=()) -> tuple[list, list]:
    """(nodes, graph-input/constant tensors) upstream of `tensor`; the inputs of `stop_ops` nodes are not
    followed (e.g. stop_ops=("Shape",): what a tensor depends on through values, not only shapes)."""
    seen_nodes, sources, stack, seen = [], [], [tensor], set()
    while stack:
        current = stack.pop()
        if id(current) in seen:
            continue
        seen.add(id(current))
        node = producer(current)
        if node is None:
            sources.append(current)
            continue
        if node not in seen_nodes:
            seen_nodes.append(node)
        if node.op in stop_ops:
            continue
        stack.extend(node.inputs)
    return seen_nodes, sources


def reaches(graph: gs.Graph, tensor: gs.Tensor, predicate, max_nodes: int = 64) -> gs.Node | None:
    """The first node downstream of `tensor` (breadth first, at most max_nodes visited) matching predicate."""
    frontier, seen = list(tensor.outputs), set()
    while frontier and len(seen) < max_nodes:
        node = frontier.pop(0)
        if id(node) in seen:
            continue
        seen.add(id(node))
        if predicate(node):
            return node
        for out in node.outputs:
            frontier.extend(out.outputs)
    return None


class NameMaker:
    """Unique names for new nodes and tensors (never reusing one already in the graph)."""

    def __init__(self, graph: gs.Graph, prefix: str):
        self.taken = set(graph.tensors()) | {node.name for node in graph.nodes}
        self.prefix = prefix
        self.counter = Counter()

    def __call__(self, what: str) -> str:
        while True:
            name = f"{self.prefix}/{what}_{self.counter[what]}"
            self.counter[what] += 1
            if name not in self.taken:
                self.taken.add(name)
                return name


# --- sanitize: cleanup, constant folding and shape inference until nothing changes ---------------------------

def infer_shapes(graph: gs.Graph) -> None:
    """Fill in dtypes and shapes of the graph's tensors (where inference knows more than the graph does).
    Inference runs on a skeleton of the graph whose big constants are declared inputs, so weights are never
    copied."""
    register_onnx_schemas()
    skeleton = graph.copy()
    big = [t for t in skeleton.tensors().values() if isinstance(t, gs.Constant) and _volume(t.shape) > 64]
    stand_ins = []
    for tensor in big:
        stand_in = gs.Variable(tensor.name, dtype=tensor.dtype, shape=list(tensor.shape))
        for node in list(tensor.outputs):
            for index, current in enumerate(node.inputs):
                if current is tensor:
                    node.inputs[index] = stand_in
        stand_ins.append(stand_in)
    skeleton.inputs = list(skeleton.inputs) + stand_ins
    model = gs.export_onnx(skeleton, do_type_check=False)
    known = _inferred_shapes(model)
    for name, tensor in graph.tensors().items():
        if not isinstance(tensor, gs.Variable) or name not in known:
            continue
        elem, dims = known[name]
        if tensor.dtype is None:
            tensor.dtype = onnx.helper.tensor_dtype_to_np_dtype(elem)
        if _information(dims) > _information(tensor.shape):
            tensor.shape = dims


def _information(shape) -> tuple:
    """How much a shape says: (known at all, static dims, named dims)."""
    if shape is None:
        return (0, 0, 0)
    return (1, sum(isinstance(d, (int, np.integer)) for d in shape),
            sum(isinstance(d, str) and not d.startswith("unk__") for d in shape))


def _inferred_shapes(model: onnx.ModelProto) -> dict:
    """name -> (elem type, dims) from onnxruntime's symbolic shape inference (it keeps names like 'seq'
    through Reshape(-1)), falling back to onnx's own inference where that one gives up (e.g. fdpp ops)."""
    found = {}
    attempts = [_onnx_inference]
    try:
        from onnxruntime.tools.symbolic_shape_infer import SymbolicShapeInference

        attempts.insert(0, lambda m: SymbolicShapeInference.infer_shapes(m, auto_merge=True))
    except ImportError:
        pass
    for attempt in attempts:
        try:
            inferred = attempt(model)
        except Exception:  # noqa: BLE001 - an inference engine that gives up just adds nothing
            continue
        if inferred is None:
            continue
        for info in list(inferred.graph.value_info) + list(inferred.graph.output):
            tensor_type = info.type.tensor_type
            if not tensor_type.elem_type or not tensor_type.HasField("shape"):
                continue
            dims = [d.dim_value if d.HasField("dim_value") else (d.dim_param or None) for d in tensor_type.shape.dim]
            if info.name not in found or _information(dims) > _information(found[info.name][1]):
                found[info.name] = (tensor_type.elem_type, dims)
    return found


def _onnx_inference(model: onnx.ModelProto) -> onnx.ModelProto:
    return onnx.shape_inference.infer_shapes(model, data_prop=True)


def _volume(shape) -> int:
    total = 1
    for dim in shape:
        total *= int(dim)
    return total


def _reads_external_data(node: gs.Node) -> bool:
    return any(isinstance(getattr(t, "_values", None), ExternalValues) for t in node.inputs)


def sanitize(graph: gs.Graph, max_rounds: int = 8) -> gs.Graph:
    """Cleanup, constant folding and shape inference until the node count stops changing."""
    for _ in range(max_rounds):
        before = len(graph.nodes)
        graph.cleanup(remove_unused_graph_inputs=False).toposort()
        # nodes reading weights from an external data file are not folded: onnxruntime evaluates the folded
        # subgraph from memory and could not find the file (our exporter has no such nodes anyway)
        graph.fold_constants(fold_shapes=True, error_ok=True, should_exclude_node=_reads_external_data)
        graph.cleanup(remove_unused_graph_inputs=False)
        infer_shapes(graph)
        graph.toposort()
        if len(graph.nodes) == before:
            break
    return graph
