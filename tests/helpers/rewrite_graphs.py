"""Hand-made ONNX graphs for the rewrite tests, built with onnx.helper in the exact shape the docstring of
fdpp_rewrite/onnx_builder.py fixes for `fdpp_rewrite export` (inputs input_ids, past_len, key_cache.i, value_cache.i;
outputs logits and the updated caches; the grouped 5-D attention chain; the causal mask computed from past_len), plus
variants: the 4-D Hugging Face layout with repeat_kv, a sliding-window mask, q/k/v biases.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

# the attention contract takes head_dim 64 and 128 (what the kernels support): 64 keeps the graphs small
HEAD_DIM = 64
ONNX_DTYPE = {"float32": TensorProto.FLOAT, "float16": TensorProto.FLOAT16}


@dataclass
class TinyConfig:
    hidden: int = 256
    heads: int = 4
    kv_heads: int = 2
    head_dim: int = HEAD_DIM
    layers: int = 2
    intermediate: int = 48
    vocab: int = 61
    max_cache: int = 24
    dtype: str = "float32"
    layout: str = "grouped-5d"   # or "4d" (Hugging Face style, repeat_kv, Div by sqrt(D))
    mask: str = "causal"         # or "sliding" (a window of 4 keys, computed from past_len)
    qkv_bias: bool = False
    seed: int = 0


class Builder:
    def __init__(self, dtype: str, seed: int):
        self.nodes, self.inits, self.count = [], [], 0
        self.dtype = np.dtype(dtype)
        self.rng = np.random.default_rng(seed)

    def op(self, op_type, inputs, **attrs):
        self.count += 1
        out = f"t{self.count}_{op_type.lower()}"
        self.nodes.append(helper.make_node(op_type, inputs, [out], name=f"n{self.count}", **attrs))
        return out

    def const(self, value, dtype=None):
        self.count += 1
        name = f"c{self.count}"
        self.inits.append(numpy_helper.from_array(np.asarray(value, dtype=dtype or self.dtype), name))
        return name

    def weight(self, rows, cols, scale=None):
        scale = scale or 1.0 / np.sqrt(rows)
        return self.const(self.rng.standard_normal((rows, cols)) * scale)


def rms_norm(b: Builder, x, size):
    squared = b.op("Mul", [x, x])
    mean = b.op("ReduceMean", [squared], axes=[-1], keepdims=1)
    root = b.op("Sqrt", [b.op("Add", [mean, b.const(1e-5)])])
    return b.op("Mul", [b.op("Div", [x, root]), b.const(1.0 + 0.1 * b.rng.standard_normal(size))])


def rope(b: Builder, x, cos, sin, head_dim):
    half = head_dim // 2
    i64 = np.int64
    first = b.op("Slice", [x, b.const([0], i64), b.const([half], i64), b.const([-1], i64)])
    second = b.op("Slice", [x, b.const([half], i64), b.const([head_dim], i64), b.const([-1], i64)])
    rotated = b.op("Concat", [b.op("Neg", [second]), first], axis=-1)
    return b.op("Add", [b.op("Mul", [x, cos]), b.op("Mul", [rotated, sin])])


def build_tiny_model(cfg: TinyConfig = TinyConfig()) -> onnx.ModelProto:
    b = Builder(cfg.dtype, cfg.seed)
    i64 = np.int64
    dt = ONNX_DTYPE[cfg.dtype]
    hq, hkv, d = cfg.heads, cfg.kv_heads, cfg.head_dim
    groups = hq // hkv

    # positions and the mask, from past_len alone (shapes from input_ids and the caches)
    ids_shape = b.op("Shape", ["input_ids"])
    batch = b.op("Gather", [ids_shape, b.const(0, i64)], axis=0)
    seq = b.op("Gather", [ids_shape, b.const(1, i64)], axis=0)
    kv_len = b.op("Gather", [b.op("Shape", ["key_cache.0"]), b.const(2, i64)], axis=0)
    steps = b.op("Range", [b.const(0, i64), seq, b.const(1, i64)])
    positions = b.op("Add", [b.op("Unsqueeze", ["past_len", b.const([1], i64)]),
                             b.op("Unsqueeze", [steps, b.const([0], i64)])])                    # [B, S]
    keys = b.op("Range", [b.const(0, i64), kv_len, b.const(1, i64)])                           # [L]
    visible = b.op("LessOrEqual", [keys, b.op("Unsqueeze", [positions, b.const([2], i64)])])    # [B, S, L]
    if cfg.mask == "sliding":
        window_start = b.op("Sub", [b.op("Unsqueeze", [positions, b.const([2], i64)]), b.const(3, i64)])
        visible = b.op("And", [visible, b.op("GreaterOrEqual", [keys, window_start])])
    mask4 = b.op("Unsqueeze", [b.op("Where", [visible, b.const(0.0), b.const(-np.inf)]), b.const([1], i64)])
    mask = mask4 if cfg.layout == "4d" else b.op("Unsqueeze", [mask4, b.const([2], i64)])

    angles = np.arange(cfg.max_cache)[:, None] / (10000.0 ** (np.arange(d // 2) / (d // 2)))[None, :]
    angles = np.concatenate([angles, angles], axis=1)
    cos = b.op("Unsqueeze", [b.op("Gather", [b.const(np.cos(angles)), positions], axis=0), b.const([1], i64)])
    sin = b.op("Unsqueeze", [b.op("Gather", [b.const(np.sin(angles)), positions], axis=0), b.const([1], i64)])

    # cache write indices [B, S, 2] = (b, past_len[b] + i)
    batch_index = b.op("Range", [b.const(0, i64), batch, b.const(1, i64)])
    batch_grid = b.op("Expand", [b.op("Unsqueeze", [batch_index, b.const([1], i64)]), b.op("Shape", [positions])])
    write_at = b.op("Concat", [b.op("Unsqueeze", [batch_grid, b.const([2], i64)]),
                               b.op("Unsqueeze", [positions, b.const([2], i64)])], axis=2)

    x = b.op("Gather", [b.weight(cfg.vocab, cfg.hidden, scale=1.0), "input_ids"], axis=0)
    outputs = []
    for layer in range(cfg.layers):
        h = rms_norm(b, x, cfg.hidden)
        projected = {}
        for name, heads in (("q", hq), ("k", hkv), ("v", hkv)):
            y = b.op("MatMul", [h, b.weight(cfg.hidden, heads * d)])
            if cfg.qkv_bias:
                y = b.op("Add", [y, b.const(0.1 * b.rng.standard_normal(heads * d))])
            y = b.op("Transpose", [b.op("Reshape", [y, b.const([0, 0, heads, d], i64)])], perm=[0, 2, 1, 3])
            projected[name] = y
        q = rope(b, projected["q"], cos, sin, d)
        k = rope(b, projected["k"], cos, sin, d)
        caches = []
        for name, new in (("key", k), ("value", projected["v"])):
            cache_t = b.op("Transpose", [f"{name}_cache.{layer}"], perm=[0, 2, 1, 3])
            updates = b.op("Transpose", [new], perm=[0, 2, 1, 3])
            written = b.op("ScatterND", [cache_t, write_at, updates])
            out_name = f"{name}_cache_out.{layer}"
            b.nodes.append(helper.make_node("Transpose", [written], [out_name], perm=[0, 2, 1, 3],
                                            name=f"cache_out_{name}_{layer}"))
            caches.append(out_name)
            outputs.append(out_name)
        k_all, v_all = caches
        if cfg.layout == "4d":
            expand_to = b.const([1, 1, groups, 1, 1], i64)
            k_rep = b.op("Reshape", [b.op("Expand", [b.op("Unsqueeze", [k_all, b.const([2], i64)]), expand_to]),
                                     b.const([0, hq, -1, d], i64)])
            v_rep = b.op("Reshape", [b.op("Expand", [b.op("Unsqueeze", [v_all, b.const([2], i64)]), expand_to]),
                                     b.const([0, hq, -1, d], i64)])
            scores = b.op("MatMul", [q, b.op("Transpose", [k_rep], perm=[0, 1, 3, 2])])
            scores = b.op("Div", [scores, b.const(np.sqrt(d))])
            probs = b.op("Softmax", [b.op("Add", [scores, mask])], axis=-1)
            attn = b.op("MatMul", [probs, v_rep])
        else:
            q5 = b.op("Reshape", [q, b.const([0, hkv, groups, -1, d], i64)])
            k5 = b.op("Unsqueeze", [k_all, b.const([2], i64)])
            v5 = b.op("Unsqueeze", [v_all, b.const([2], i64)])
            scores = b.op("MatMul", [q5, b.op("Transpose", [k5], perm=[0, 1, 2, 4, 3])])
            scores = b.op("Mul", [scores, b.const(1.0 / np.sqrt(d))])
            probs = b.op("Softmax", [b.op("Add", [scores, mask])], axis=-1)
            attn = b.op("Reshape", [b.op("MatMul", [probs, v5]), b.const([0, hq, -1, d], i64)])
        attn = b.op("Reshape", [b.op("Transpose", [attn], perm=[0, 2, 1, 3]), b.const([0, 0, -1], i64)])
        x = b.op("Add", [x, b.op("MatMul", [attn, b.weight(hq * d, cfg.hidden)])])
        h = rms_norm(b, x, cfg.hidden)
        gate = b.op("MatMul", [h, b.weight(cfg.hidden, cfg.intermediate)])
        up = b.op("MatMul", [h, b.weight(cfg.hidden, cfg.intermediate)])
        act = b.op("Mul", [b.op("Mul", [gate, b.op("Sigmoid", [gate])]), up])
        x = b.op("Add", [x, b.op("MatMul", [act, b.weight(cfg.intermediate, cfg.hidden)])])
    h = rms_norm(b, x, cfg.hidden)
    b.nodes.append(helper.make_node("MatMul", [h, b.weight(cfg.hidden, cfg.vocab)], ["logits"], name="lm_head"))

    inputs = [helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["batch", "seq"]),
              helper.make_tensor_value_info("past_len", TensorProto.INT64, ["batch"])]
    for layer in range(cfg.layers):
        for name in ("key", "value"):
            inputs.append(helper.make_tensor_value_info(f"{name}_cache.{layer}", dt, ["batch", hkv, cfg.max_cache, d]))
    graph_outputs = [helper.make_tensor_value_info("logits", dt, ["batch", "seq", cfg.vocab])]
    graph_outputs += [helper.make_tensor_value_info(name, dt, ["batch", hkv, cfg.max_cache, d]) for name in outputs]
    graph = helper.make_graph(b.nodes, "tiny", inputs, graph_outputs, initializer=b.inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], producer_name="tests")
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model


def decode_feeds(cfg: TinyConfig, batch=2, seq=1, past=(5, 9), seed=1) -> dict:
    """Inputs for one step: random caches (values beyond past_len are never visible), past_len per sequence."""
    rng = np.random.default_rng(seed)
    feeds = {"input_ids": rng.integers(0, cfg.vocab, (batch, seq)).astype(np.int64),
             "past_len": np.array(past[:batch], dtype=np.int64)}
    for layer in range(cfg.layers):
        for name in ("key", "value"):
            feeds[f"{name}_cache.{layer}"] = rng.standard_normal(
                (batch, cfg.kv_heads, cfg.max_cache, cfg.head_dim)).astype(cfg.dtype)
    return feeds


def build_attention_graph(layout="grouped-5d", heads=4, kv_heads=2, head_dim=HEAD_DIM, kv_len=19, mask="causal",
                          softmax_axis=-1, scale_op="Mul", mask_first=False, casts=False, probs_output=False,
                          dtype="float32", window=4) -> onnx.ModelProto:
    """One attention block with the caches as inputs: query [B, Hq, S, D], key/value [B, Hkv, L, D],
    past_len [B] (and attention_bias [B, 1, S, L] for mask="input"); kv_len may be a symbol (a dynamic cache
    length, "cache": attention_feeds gives it 40 keys). mask: "causal", "sliding" (a window of `window` keys) or
    "gap" (causal but for the key just before the diagonal: no rule of the op's; all three computed from
    past_len), "input" (a graph input), "none". casts: Cast to float32 before the softmax and back.
    probs_output: the probabilities are also a graph output (attention weights returned)."""
    b = Builder(dtype, 0)
    i64 = np.int64
    dt = ONNX_DTYPE[dtype]
    groups = heads // kv_heads
    outputs = [helper.make_tensor_value_info("attention_out", dt, ["batch", heads, "seq", head_dim])]
    inputs = [helper.make_tensor_value_info("query", dt, ["batch", heads, "seq", head_dim]),
              helper.make_tensor_value_info("key", dt, ["batch", kv_heads, kv_len, head_dim]),
              helper.make_tensor_value_info("value", dt, ["batch", kv_heads, kv_len, head_dim]),
              helper.make_tensor_value_info("past_len", TensorProto.INT64, ["batch"])]
    mask_name = None
    if mask in ("causal", "sliding", "gap"):
        seq = b.op("Gather", [b.op("Shape", ["query"]), b.const(2, i64)], axis=0)
        length = b.op("Gather", [b.op("Shape", ["key"]), b.const(2, i64)], axis=0)
        steps = b.op("Range", [b.const(0, i64), seq, b.const(1, i64)])
        last = b.op("Add", [b.op("Unsqueeze", ["past_len", b.const([1], i64)]),
                            b.op("Unsqueeze", [steps, b.const([0], i64)])])
        last = b.op("Unsqueeze", [last, b.const([2], i64)])
        keys = b.op("Range", [b.const(0, i64), length, b.const(1, i64)])
        visible = b.op("LessOrEqual", [keys, last])
        if mask == "sliding":
            visible = b.op("And", [visible, b.op("Greater", [keys, b.op("Sub", [last, b.const(window, i64)])])])
        if mask == "gap":
            gap = b.op("Equal", [keys, b.op("Sub", [last, b.const(1, i64)])])
            visible = b.op("And", [visible, b.op("Not", [gap])])
        mask_name = b.op("Unsqueeze", [b.op("Where", [visible, b.const(0.0), b.const(-np.inf)]), b.const([1], i64)])
        if layout == "grouped-5d":
            mask_name = b.op("Unsqueeze", [mask_name, b.const([2], i64)])
    elif mask == "input":
        mask_name = "attention_bias"
        shape = ["batch", 1, "seq", kv_len] if layout == "4d" else ["batch", 1, 1, "seq", kv_len]
        inputs.append(helper.make_tensor_value_info(mask_name, dt, shape))

    if layout == "grouped-5d":
        q = b.op("Reshape", ["query", b.const([0, kv_heads, groups, -1, head_dim], i64)])
        k = b.op("Unsqueeze", ["key", b.const([2], i64)])
        v = b.op("Unsqueeze", ["value", b.const([2], i64)])
        k_t = b.op("Transpose", [k], perm=[0, 1, 2, 4, 3])
    else:
        q, k, v = "query", "key", "value"
        if groups > 1:  # Hugging Face's repeat_kv
            expand_to = b.const([1, 1, groups, 1, 1], i64)
            k, v = (b.op("Reshape", [b.op("Expand", [b.op("Unsqueeze", [t, b.const([2], i64)]), expand_to]),
                                     b.const([0, heads, -1, head_dim], i64)]) for t in (k, v))
        k_t = b.op("Transpose", [k], perm=[0, 1, 3, 2])
    scores = b.op("MatMul", [q, k_t])
    if scale_op == "Mul":
        scores = b.op("Mul", [b.const(1.0 / np.sqrt(head_dim)), scores])
    elif scale_op == "Div":
        scores = b.op("Div", [scores, b.const(np.sqrt(head_dim))])
    elif scale_op == "MulVector":  # not a scalar: not an attention scale
        scores = b.op("Mul", [scores, b.const(np.linspace(0.1, 0.2, kv_len))])
    if mask_name is not None:
        scores = b.op("Add", [mask_name, scores] if mask_first else [scores, mask_name])
    if casts:
        scores = b.op("Cast", [scores], to=TensorProto.FLOAT)
    probs = b.op("Softmax", [scores], axis=softmax_axis)
    if casts:
        probs = b.op("Cast", [probs], to=dt)
    if probs_output:
        probs_shape = ["batch", heads, "seq", kv_len] if layout == "4d" else ["batch", kv_heads, groups, "seq", kv_len]
        outputs.append(helper.make_tensor_value_info(probs, dt, probs_shape))
    out = b.op("MatMul", [probs, v])
    if layout == "grouped-5d":
        out = b.op("Reshape", [out, b.const([0, heads, -1, head_dim], i64)])
    b.nodes.append(helper.make_node("Identity", [out], ["attention_out"], name="out"))
    graph = helper.make_graph(b.nodes, "attention", inputs, outputs, initializer=b.inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model


def attention_feeds(model: onnx.ModelProto, batch=3, seq=2, seed=0) -> dict:
    rng = np.random.default_rng(seed)
    feeds = {}
    for info in model.graph.input:
        dims = [d.dim_value if d.HasField("dim_value") else {"batch": batch, "seq": seq, "cache": 40}[d.dim_param]
                for d in info.type.tensor_type.shape.dim]
        dtype = helper.tensor_dtype_to_np_dtype(info.type.tensor_type.elem_type)
        if info.name == "past_len":
            kv_dim = next(i for i in model.graph.input if i.name == "key").type.tensor_type.shape.dim[2]
            kv_len = kv_dim.dim_value if kv_dim.HasField("dim_value") else 40  # "cache": 40 keys
            feeds[info.name] = rng.integers(0, kv_len - seq + 1, dims).astype(np.int64)
        elif info.name == "attention_bias":
            feeds[info.name] = np.where(rng.random(dims) < 0.3, -np.inf, rng.standard_normal(dims)).astype(dtype)
            feeds[info.name][..., 0] = 0.0  # every row sees key 0
        else:
            feeds[info.name] = rng.standard_normal(dims).astype(dtype)
    return feeds
