"""The standard ONNX ops the exporter emits, as torch functions the interpreter calls.

Each op is a *lowering*: `make(attrs, host) -> fn`, where `host` maps an input position to the host value of an
input that must be known before the step runs (a Reshape's shape, a Slice's starts, a Split's sizes); `fn` takes
the other inputs, in order, as tensors. The host positions of each op are listed in HOST_INPUTS: the interpreter
folds them from the graph's shape-only subgraphs per bucket, so a step never reads a shape back from the GPU.
Example: Reshape(x, shape) lowers to `fn(x)` with shape = [0, 0, 3, 64] baked in; with x [1, 5, 192] it returns
x.reshape(1, 5, 3, 64).

ScatterND into a graph input (the KV caches) is an in-place index write: the output is the input itself, as is
CacheAppend (the engine's own op for a Hugging Face graph's present = Concat(past, new); hf_interface.py).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from fdpp_rewrite.errors import FdppError

ONNX_TO_TORCH = {1: torch.float32, 10: torch.float16, 16: torch.bfloat16, 11: torch.float64, 7: torch.int64,
                 6: torch.int32, 9: torch.bool, 2: torch.uint8, 3: torch.int8}

# op type -> input positions whose values the interpreter must know on the host
HOST_INPUTS = {"Reshape": {1}, "Unsqueeze": {1}, "Squeeze": {1}, "Split": {1}, "Slice": {1, 2, 3, 4},
               "Expand": {1}, "Tile": {1}, "Range": {0, 1, 2}, "ConstantOfShape": {0}, "ReduceMean": {1},
               "ReduceSum": {1}}


def _ints(value) -> list[int]:
    return [int(v) for v in torch.as_tensor(value).reshape(-1).tolist()]


def _axis(axis: int, rank: int) -> int:
    return axis + rank if axis < 0 else axis


def _binary(fn):
    return lambda attrs, host: fn


def _unary(fn):
    return lambda attrs, host: fn


def _cast(attrs, host):
    dtype = ONNX_TO_TORCH.get(attrs["to"])
    if dtype is None:
        raise FdppError(f"Cast to ONNX type {attrs['to']} is not supported by the engine")
    return lambda x: x.to(dtype)


def _reshape(attrs, host):
    shape = _ints(host[1])
    allow_zero = attrs.get("allowzero", 0)

    def fn(x):
        target = [x.shape[i] if (d == 0 and not allow_zero) else d for i, d in enumerate(shape)]
        return x.reshape(target)
    return fn


def _unsqueeze(attrs, host):
    axes = _ints(host[1]) if 1 in host else list(attrs["axes"])

    def fn(x):
        rank = x.dim() + len(axes)
        for a in sorted(_axis(a, rank) for a in axes):
            x = x.unsqueeze(a)
        return x
    return fn


def _squeeze(attrs, host):
    axes = _ints(host[1]) if host.get(1) is not None else attrs.get("axes")

    def fn(x):
        if axes is None:
            return x.squeeze()
        for a in sorted((_axis(a, x.dim()) for a in axes), reverse=True):
            x = x.squeeze(a)
        return x
    return fn


def _transpose(attrs, host):
    perm = attrs.get("perm")
    return lambda x: x.permute(*(perm if perm is not None else reversed(range(x.dim()))))


def _concat(attrs, host):
    axis = attrs["axis"]
    return lambda *xs: torch.cat(xs, dim=axis)


def _split(attrs, host):
    axis = attrs.get("axis", 0)
    sizes = _ints(host[1]) if host.get(1) is not None else attrs.get("split")
    count = attrs.get("num_outputs")

    def fn(x):
        if sizes is not None:
            return tuple(torch.split(x, list(sizes), dim=axis))
        return tuple(torch.tensor_split(x, count, dim=axis))
    return fn


def _slice(attrs, host):
    starts, ends = _ints(host[1]), _ints(host[2])
    axes = _ints(host[3]) if host.get(3) is not None else list(range(len(starts)))
    steps = _ints(host[4]) if host.get(4) is not None else [1] * len(starts)

    def fn(x):
        index = [slice(None)] * x.dim()
        for start, end, axis, step in zip(starts, ends, axes, steps):
            if step != 1:
                raise FdppError(f"Slice with step {step} is not supported by the engine")
            size = x.shape[_axis(axis, x.dim())]
            index[_axis(axis, x.dim())] = slice(max(min(start, size), -size), max(min(end, size), -size - 1))
        return x[tuple(index)]
    return fn


def _expand(attrs, host):
    shape = _ints(host[1])
    return lambda x: x.expand(torch.broadcast_shapes(tuple(x.shape), tuple(shape)))


def _gather(attrs, host):
    axis = attrs.get("axis", 0)

    def fn(data, indices):
        a = _axis(axis, data.dim())
        if indices.device.type == "cpu" and indices.numel() and int(indices.min()) < 0:
            indices = torch.where(indices < 0, indices + data.shape[a], indices)
        picked = torch.index_select(data, a, indices.reshape(-1).to(torch.int64))
        return picked.reshape(data.shape[:a] + indices.shape + data.shape[a + 1:])
    return fn


def _range(attrs, host):
    start, limit, delta = (host[i].item() for i in range(3))
    dtype = host[0].dtype
    return lambda: torch.arange(start, limit, delta, dtype=dtype)


def _where(attrs, host):
    return lambda cond, a, b: torch.where(cond, a, b)


def _shape(attrs, host):
    start, end = attrs.get("start", 0), attrs.get("end")
    return lambda x: torch.tensor(list(x.shape)[start:end], dtype=torch.int64)


def _softmax(attrs, host):
    axis = attrs.get("axis", -1)
    return lambda x: torch.softmax(x, dim=axis)


def _reduce_mean(attrs, host):
    axes = _ints(host[1]) if host.get(1) is not None else attrs.get("axes")
    keep = bool(attrs.get("keepdims", 1))
    return lambda x: x.mean(dim=axes if axes is not None else None, keepdim=keep)


def _reduce_sum(attrs, host):
    axes = _ints(host[1]) if host.get(1) is not None else attrs.get("axes")
    keep = bool(attrs.get("keepdims", 1))
    return lambda x: x.sum(dim=axes if axes is not None else None, keepdim=keep)


def _layer_norm(attrs, host):
    axis, eps = attrs.get("axis", -1), attrs.get("epsilon", 1e-5)

    def fn(x, weight, bias=None):
        dims = tuple(x.shape[_axis(axis, x.dim()):])
        return F.layer_norm(x, dims, weight, bias, eps)
    return fn


def _matmul(attrs, host):
    return torch.matmul


def _gelu(attrs, host):
    approximate = attrs.get("approximate", "none")
    return lambda x: F.gelu(x, approximate=approximate)


def _constant_of_shape(attrs, host):
    shape = _ints(host[0])
    value = attrs.get("value")  # a one-element tensor (the interpreter turns attribute tensors into torch)
    fill, dtype = (0.0, torch.float32) if value is None else (value.reshape(-1)[0].item(), value.dtype)
    return lambda: torch.full(shape, fill, dtype=dtype)


def _tile(attrs, host):
    repeats = _ints(host[1])
    return lambda x: x.repeat(*repeats)


def _pow(attrs, host):
    return lambda x, y: torch.pow(x, y)


def _identity(attrs, host):
    return lambda x: x


def scatter_nd(in_place: bool):
    """ScatterND(data, indices, updates) with reduction none. in_place: data is a KV cache the runtime owns, so
    the rows are written into it and the output is data itself (a decode step writes O(new tokens), never a
    copy of the cache); otherwise a copy is written."""
    def fn(data, indices, updates):
        target = data if in_place else data.clone()
        index = tuple(indices.to(torch.int64).unbind(-1))
        target.index_put_(index, updates.to(target.dtype))
        return target
    return fn


def cache_append(new, buffer, write_pos):
    """CacheAppend (hf_interface.py): new [B, H, S, D] written into the cache view buffer [B, H, past + S, D] at rows
    write_pos[b] + s, in place; returns the view (a present output). Example: write_pos [3, 5], S 1: rows 3 and 5."""
    batch, heads, seq, _ = new.shape
    b_index = torch.arange(batch, device=new.device).reshape(batch, 1, 1)
    h_index = torch.arange(heads, device=new.device).reshape(1, heads, 1)
    rows = write_pos.reshape(batch, 1) + torch.arange(seq, device=new.device).reshape(1, seq)
    s_index = rows.reshape(batch, 1, seq)
    buffer.index_put_((b_index, h_index, s_index), new.to(buffer.dtype))
    return buffer


def _flatten(attrs, host):
    axis = attrs.get("axis", 1)

    def fn(x):
        a = _axis(axis, x.dim())
        return x.reshape(math.prod(x.shape[:a]), math.prod(x.shape[a:]))
    return fn


def _gather_nd(attrs, host):
    if attrs.get("batch_dims", 0) != 0:
        raise FdppError(f"GatherND with batch_dims {attrs['batch_dims']} is not supported by the engine")

    def fn(data, indices):
        # ONNX allows negative indices; the sizes stay Python ints (no host-to-device copy inside a CUDA graph)
        parts = [torch.where(i < 0, i + size, i) for i, size in zip(indices.to(torch.int64).unbind(-1), data.shape)]
        return data[tuple(parts)]
    return fn


LOWERINGS = {
    "Add": _binary(torch.add), "Sub": _binary(torch.sub), "Mul": _binary(torch.mul), "Div": _binary(torch.div),
    "Pow": _pow, "Equal": _binary(torch.eq), "Less": _binary(torch.lt), "LessOrEqual": _binary(torch.le),
    "Greater": _binary(torch.gt), "GreaterOrEqual": _binary(torch.ge), "And": _binary(torch.logical_and),
    "Or": _binary(torch.logical_or), "Not": _unary(torch.logical_not), "Max": _binary(torch.maximum),
    "Min": _binary(torch.minimum),
    "Neg": _unary(torch.neg), "Sqrt": _unary(torch.sqrt), "Reciprocal": _unary(torch.reciprocal),
    "Exp": _unary(torch.exp), "Cos": _unary(torch.cos), "Sin": _unary(torch.sin), "Tanh": _unary(torch.tanh),
    "Sigmoid": _unary(torch.sigmoid), "Relu": _unary(torch.relu), "Erf": _unary(torch.erf),
    "Gelu": _gelu, "Identity": _identity,
    "Cast": _cast, "Reshape": _reshape, "Unsqueeze": _unsqueeze, "Squeeze": _squeeze, "Transpose": _transpose,
    "Concat": _concat, "Split": _split, "Slice": _slice, "Expand": _expand, "Gather": _gather, "Range": _range,
    "Where": _where, "Shape": _shape, "Softmax": _softmax, "ReduceMean": _reduce_mean, "ReduceSum": _reduce_sum,
    "LayerNormalization": _layer_norm, "MatMul": _matmul, "ConstantOfShape": _constant_of_shape, "Tile": _tile,
    "Flatten": _flatten, "GatherND": _gather_nd,
}

SUPPORTED = set(LOWERINGS) | {"ScatterND", "Constant"}
ENGINE_DOMAIN = "fdpp.engine"  # ops the engine's build writes into its own plan (never found in an ONNX file)
ENGINE_OPS = {"CacheAppend": cache_append}


def rms_norm_torch(x, weight, eps: float):
    """RMSNorm as the exporter writes it: x / sqrt(mean(x^2) + eps) in float32, scaled by weight in x's dtype."""
    x32 = x.float()
    normed = (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)
    return normed * weight


def rotary(x, cos, sin, interleaved: bool):
    """RoPE on x [..., R] with cos/sin broadcastable to [..., R/2] (one angle per pair)."""
    if interleaved:  # pairs (2j, 2j + 1)
        x0, x1 = x[..., 0::2], x[..., 1::2]
        return torch.stack((x0 * cos - x1 * sin, x1 * cos + x0 * sin), dim=-1).flatten(-2)
    half = x.shape[-1] // 2
    x0, x1 = x[..., :half], x[..., half:]
    return torch.cat((x0 * cos - x1 * sin, x1 * cos + x0 * sin), dim=-1)
