"""The mask of a matched attention chain as the op sees it (passes/attention.py): mask_mode "past_len" (4th input: the
graph input past_len) when its values come from past_len alone and evaluating it agrees with the contract's causal
rule, with the op's `window` where the mask also hides keys older than a sliding window; otherwise "bias" (4th
input: the mask itself, squeezed and cast as the op takes it), or "none" without a mask. Hugging Face graphs build
their mask in-graph from the 2-D attention_mask (padding) and the causal rule, and add it as Where(mask, 0,
finfo.min): that is a "bias" (padding is not a past_len rule), and a fully padded query row, which the original
averages over nothing, gives 0 in the op.
"""

from __future__ import annotations

import numpy as np
import onnx
import onnx_graphsurgeon as gs

from fdpp_rewrite.calibration.settings import OP
from fdpp_rewrite.contracts import load_contract
from fdpp_rewrite.onnx_graph import widen_bfloat16, widened_dtype
from fdpp_rewrite.passes.attention_match import AttentionMatch
from fdpp_rewrite.passes.common import (PAST_LEN_INPUT, NameMaker, PassReport, ancestors, dtype_name, is_constant,
                                        rank, static_dim)

SHAPE_ONLY_OPS = ("Shape", "Size")  # their output depends on the input's shape, never on its values


# A cache length's size in the second evaluation of a mask: a sliding window shorter than this is seen even where
# the graph's cache length is symbolic (Mistral's and Gemma 2's 4,096, Gemma 3's 512 and 1,024). The mask is
# [B, 1, S, L] with S small, so evaluating it stays cheap.
LONG_CACHE_PROBE = 16384


def _symbol_values(graph: gs.Graph) -> dict:
    """Concrete sizes for symbolic dims when evaluating a mask: distinct, with later ones larger, so a cache
    length named after the sequence length comes out longer (2, 3, 11, 13, ...)."""
    values, pool = {}, [2, 3, 11, 13, 17, 19, 23, 29]
    tensors = list(graph.inputs) + list(graph.tensors().values())
    for tensor in tensors:
        for dim in tensor.shape or ():
            if isinstance(dim, str) and dim not in values:
                values[dim] = pool[len(values)] if len(values) < len(pool) else 31 + len(values)
    return values


def _past_len_window(graph: gs.Graph, mask: gs.Tensor, past_len: gs.Tensor) -> int | None:
    """Evaluate the mask's subgraph for a few past_len values and check the contract's rule: 0 where key j is
    visible (j <= past_len[b] + i, and (past_len[b] + i) - j < W with a sliding window W), at or below the masked
    threshold elsewhere. Evaluated at small sizes, then again with every symbol that is neither the batch nor the
    query length (a cache length) at LONG_CACHE_PROBE and up. Returns W (0: causal only, or a window no probed row
    reaches), None when the mask follows no such rule or cannot be evaluated."""
    symbols = _symbol_values(graph)
    probes = _probe_mask(graph, mask, past_len, symbols)
    if probes is None:
        return None
    batch, seq = probes[0][0].shape
    cache_symbols = sorted(dim for dim, size in symbols.items() if size not in (batch, seq))
    if cache_symbols:
        long = dict(symbols, **{dim: LONG_CACHE_PROBE + i for i, dim in enumerate(cache_symbols)})
        long_probes = _probe_mask(graph, mask, past_len, long)
        if long_probes is None:
            return None
        probes += long_probes
    return _window_of(probes, load_contract(OP).raw["bias_mask_threshold"])


def _probe_mask(graph: gs.Graph, mask: gs.Tensor, past_len: gs.Tensor, symbols: dict) -> list | None:
    """The mask's values for two spreads of past_len over the batch, at these symbol sizes: a list of (each
    row's own position [B, S], the values [B, S, L]); None when it cannot be evaluated or is not [B|1, 1, S, L]."""
    import onnxruntime as ort

    nodes, _ = ancestors(mask, stop_ops=SHAPE_ONLY_OPS)
    shape_fed = {n.inputs[0].name for n in nodes if n.op in SHAPE_ONLY_OPS and not is_constant(n.inputs[0])}
    sub = graph.copy()
    tensors = sub.tensors()
    feeds = {}
    for name in sorted(shape_fed):
        tensor = tensors[name]
        if tensor.shape is None or tensor.dtype is None or any(d is None for d in tensor.shape):
            return None
        shape = [symbols[d] if isinstance(d, str) else int(d) for d in tensor.shape]
        tensor.inputs.clear()
        feeds[name] = np.zeros(shape, dtype=widened_dtype(tensor.dtype))
    sub_past = tensors[past_len.name]
    sub.inputs = [sub_past] + [tensors[name] for name in sorted(shape_fed) if name != past_len.name]
    sub.outputs = [tensors[mask.name]]
    sub.cleanup()
    batch_dim = (past_len.shape or [None])[0]
    batch = symbols.get(batch_dim, batch_dim) if batch_dim is not None else 2
    try:
        options = ort.SessionOptions()
        options.log_severity_level = 4  # a mask that cannot be evaluated is an answer here, not an error to log
        sub_model = widen_bfloat16(gs.export_onnx(sub, do_type_check=False))  # onnxruntime's CPU lacks bfloat16
        session = ort.InferenceSession(sub_model.SerializeToString(), options, providers=["CPUExecutionProvider"])
        probe = session.run(None, {**feeds, past_len.name: np.zeros(batch, np.int64)})[0]
        seq, kv_len = probe.shape[-2], probe.shape[-1]
        if seq < 2 or kv_len <= seq:
            return None  # the evaluation would not exercise the causal structure
        most = kv_len - seq
        probes = []
        for past in (np.linspace(most, 0, batch).astype(np.int64), np.linspace(0, most, batch).astype(np.int64)):
            values = session.run(None, {**feeds, past_len.name: past})[0].astype(np.float64)
            values = values.reshape(values.shape[0], -1, seq, kv_len)
            if values.shape[1] != 1 or values.shape[0] not in (1, batch):
                return None
            position = past[:, None] + np.arange(seq)[None, :]
            probes.append((position, np.broadcast_to(values[:, 0], (batch, seq, kv_len))))
    except Exception:  # noqa: BLE001 - any failure to evaluate means "not proven": the bias form is used
        return None
    return probes


def _window_of(probes: list, threshold: float) -> int | None:
    """The one window W every probed row follows (see _past_len_window), from the rows whose oldest visible key is
    past key 0; 0 where no row shows one; None where the rows disagree or break the rule."""
    windows = set()
    for position, values in probes:
        visible = values == 0.0
        oldest = np.where(visible.any(-1), visible.argmax(-1), 0)
        windows |= set((position - oldest + 1)[oldest > 0].tolist())
    if len(windows) > 1:
        return None
    window = windows.pop() if windows else 0
    for position, values in probes:
        keys = np.arange(values.shape[-1])[None, None, :]
        expected = keys <= position[:, :, None]
        if window:
            expected &= position[:, :, None] - keys < window
        if not (np.all(values[expected] == 0.0) and np.all(values[~expected] <= threshold)):
            return None
    return int(window)


def mask_mode(graph: gs.Graph, mask: gs.Tensor | None, cache: dict, report: PassReport) -> tuple[str, int]:
    """(mask_mode, window) of the op for this mask: ("past_len", W) where the mask is the causal rule (within a
    sliding window of W keys; 0: none) computed from past_len alone, else ("bias", 0), or ("none", 0)."""
    if mask is None:
        return "none", 0
    if mask.name in cache:
        return cache[mask.name]
    _, sources = ancestors(mask, stop_ops=SHAPE_ONLY_OPS)
    graph_inputs = {t.name for t in graph.inputs}
    value_inputs = {t.name for t in sources if t.name in graph_inputs}
    past_len = next((t for t in graph.inputs if t.name == PAST_LEN_INPUT), None)
    mode = ("bias", 0)
    if value_inputs == {PAST_LEN_INPUT}:
        window = _past_len_window(graph, mask, past_len)
        if window is not None:
            mode = ("past_len", window)
        else:
            report.warnings.append(f"mask '{mask.name}' is computed from past_len but follows neither the causal "
                                   "rule j <= past_len + i nor a sliding window of it; passed to the op as a bias")
    cache[mask.name] = mode
    return mode


def bias_input(graph: gs.Graph, match: AttentionMatch, names: NameMaker, cache: dict):
    """The mask as the op's bias input: [.., S, L] broadcastable to [B, 1, S, L], in the query dtype."""
    key = (match.mask.name, match.mask_rank5)
    if key in cache:
        return cache[key]
    bias = match.mask
    mask_rank = rank(bias)
    if match.mask_rank5 and mask_rank == 5:
        if static_dim(bias, 1) != 1 or static_dim(bias, 2) != 1:
            return "the 5-D mask varies per head; the op takes one bias per sequence [B, 1, S, L]"
        squeezed = gs.Variable(names("bias"), dtype=bias.dtype,
                               shape=[bias.shape[0], 1, bias.shape[3], bias.shape[4]])
        axes = gs.Constant(names("squeeze_axes"), np.array([2], np.int64))
        graph.nodes.append(gs.Node("Squeeze", name=names("squeeze"), inputs=[bias, axes], outputs=[squeezed]))
        bias = squeezed
    elif mask_rank is None or mask_rank > 4 or (mask_rank == 4 and static_dim(bias, 1) != 1):
        return f"the mask has shape {bias.shape}; the op takes a bias broadcastable to [B, 1, S, L]"
    if dtypes_differ(bias, match.query):
        cast = gs.Variable(names("bias_cast"), dtype=match.query.dtype, shape=bias.shape)
        to = onnx_dtype(match.query)
        graph.nodes.append(gs.Node("Cast", name=names("cast"), attrs={"to": to}, inputs=[bias], outputs=[cast]))
        bias = cast
    cache[key] = bias
    return bias


def dtypes_differ(a: gs.Tensor, b: gs.Tensor) -> bool:
    return a.dtype is not None and b.dtype is not None and dtype_name(a) != dtype_name(b)


def onnx_dtype(tensor: gs.Tensor) -> int:
    name = dtype_name(tensor)
    return onnx.TensorProto.BFLOAT16 if name == "bfloat16" else onnx.helper.np_dtype_to_tensor_dtype(np.dtype(name))
