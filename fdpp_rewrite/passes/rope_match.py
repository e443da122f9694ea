"""The rotary embedding of one tensor, by structure (passes/rope_append.py proves its positions and fuses it):

    rotate(x), pairs (j, j + R/2):  Add(Mul(x, cos), Mul(Concat(Neg(x1), x0), sin)), the halves x0, x1 either
                                    Split(x, [R/2, R/2]) (our exporter) or Slice(x, 0, R/2), Slice(x, R/2, end)
                                    (transformers' rotate_half, as torch.onnx.export writes it)
    rotate(x), pairs (2j, 2j + 1):  Reshape(Concat(Sub(Mul(x0, cos), Mul(x1, sin)), Add(Mul(x1, cos), Mul(x0, sin))))
                                    with x0, x1 = Split(Reshape(x, [.., R/2, 2]), [1, 1])
    partial rotary (R < D):         Concat(rotate(Slice(x, 0, R)), Slice(x, R, D))
    cos / sin = Unsqueeze(Cast?(Mul?(Cos / Sin(angles), 1.0))), angles = Concat?(Mul(float(positions), inv_freq))

inv_freq_of reads the rotary table constant behind cos, so any rope scaling the exporter baked in is kept (the
Mul by 1.0 is transformers' attention_scaling; any other factor is not a rotation the op computes).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx_graphsurgeon as gs

from fdpp_rewrite.passes.common import constant_value, is_constant, producer_op, rank, scalar_value, static_dim

SLICE_TO_END = 2 ** 62  # an end at least this large is "to the end of the axis" (torch writes INT64_MAX)


@dataclass
class Rotation:
    source: gs.Tensor  # x before RoPE
    cos: gs.Tensor
    sin: gs.Tensor
    rope_dim: int
    interleaved: bool


def ints(tensor: gs.Tensor) -> list | None:
    value = constant_value(tensor)
    return None if value is None else [int(v) for v in value.reshape(-1)]


def _last_axis(node: gs.Node, tensor_rank: int | None) -> bool:
    axis = node.attrs.get("axis", 0)
    return axis == -1 or (tensor_rank is not None and axis == tensor_rank - 1)


def _mul_by(tensor: gs.Tensor, data: gs.Tensor) -> gs.Tensor | None:
    """If tensor = Mul(data, t) or Mul(t, data): t, else None."""
    node = producer_op(tensor, "Mul")
    if node is None:
        return None
    a, b = node.inputs
    return b if a is data else a if b is data else None


def _split_halves(tensor: gs.Tensor, outputs: int = 2) -> gs.Node | None:
    split = producer_op(tensor, "Split")
    if split is None or len(split.outputs) != outputs or not _last_axis(split, rank(split.inputs[0])):
        return None
    return split


def last_axis_slice(tensor: gs.Tensor) -> tuple[gs.Tensor, int, int] | None:
    """(x, start, end) when `tensor` = Slice(x, start, end) on x's last axis with step 1 (an end past the axis
    clamped to its static size, or SLICE_TO_END when that is unknown), else None."""
    node = producer_op(tensor, "Slice")
    if node is None or len(node.inputs) < 3:
        return None
    source = node.inputs[0]
    bounds = [ints(t) for t in node.inputs[1:]]
    if any(b is None or len(b) != 1 for b in bounds):
        return None
    start, end = bounds[0][0], bounds[1][0]
    axis = bounds[2][0] if len(bounds) > 2 else 0
    step = bounds[3][0] if len(bounds) > 3 else 1
    source_rank, dim = rank(source), static_dim(source, -1)
    if step != 1 or start < 0 or not (axis == -1 or (source_rank is not None and axis == source_rank - 1)):
        return None
    if end >= SLICE_TO_END or (dim is not None and end >= dim):
        end = dim if dim is not None else SLICE_TO_END
    return source, start, end


def _sliced_halves(first: gs.Tensor, second: gs.Tensor) -> tuple[gs.Tensor, int] | None:
    """(x, R) when first = x[..., :R/2] and second = x[..., R/2:R] and R is all of x's last axis."""
    low, high = last_axis_slice(first), last_axis_slice(second)
    if low is None or high is None or low[0] is not high[0] or low[1] != 0 or low[2] != high[1] or low[2] <= 0:
        return None
    half, dim = low[2], static_dim(low[0], -1)
    if high[2] != 2 * half or (dim is not None and dim != 2 * half):
        return None
    return low[0], 2 * half


def _halves(concat: gs.Node) -> tuple[gs.Tensor, int] | None:
    """(x, R) when concat = Concat(Neg(x1), x0) over x's two halves (a Split or two Slices)."""
    neg = producer_op(concat.inputs[0], "Neg")
    if neg is None:
        return None
    split = _split_halves(neg.inputs[0])
    if split is not None:
        sizes = ints(split.inputs[1]) if len(split.inputs) > 1 else None
        if neg.inputs[0] is not split.outputs[1] or concat.inputs[1] is not split.outputs[0] or sizes is None \
                or len(sizes) != 2 or sizes[0] != sizes[1]:
            return None
        return split.inputs[0], 2 * sizes[0]
    return _sliced_halves(concat.inputs[1], neg.inputs[0])


def _rotate_half(rotated: gs.Tensor):
    """Pairs (j, j + R/2): (x_rot, cos, sin, R) or None."""
    add = producer_op(rotated, "Add")
    if add is None:
        return None
    for cos_side, sin_side in (add.inputs, add.inputs[::-1]):
        cos_mul, sin_mul = producer_op(cos_side, "Mul"), producer_op(sin_side, "Mul")
        if cos_mul is None or sin_mul is None:
            continue
        for turned, sin in (sin_mul.inputs, sin_mul.inputs[::-1]):
            concat = producer_op(turned, "Concat")
            if concat is None or len(concat.inputs) != 2 or not _last_axis(concat, rank(turned)):
                continue
            found = _halves(concat)
            if found is None:
                continue
            x_rot, rope_dim = found
            cos = _mul_by(cos_side, x_rot)
            if cos is not None:
                return x_rot, cos, sin, rope_dim
    return None


def _rotate_pairs(rotated: gs.Tensor):
    """Pairs (2j, 2j + 1): (x_rot, cos, sin, R) or None."""
    reshape = producer_op(rotated, "Reshape")
    concat = None if reshape is None else producer_op(reshape.inputs[0], "Concat")
    if concat is None or len(concat.inputs) != 2:
        return None
    sub, add = producer_op(concat.inputs[0], "Sub"), producer_op(concat.inputs[1], "Add")
    first = None if sub is None else producer_op(sub.inputs[0], "Mul")
    if add is None or first is None:
        return None
    for x0 in first.inputs:
        split = _split_halves(x0)
        if split is None or x0 is not split.outputs[0]:
            continue
        x1 = split.outputs[1]
        cos, sin = _mul_by(sub.inputs[0], x0), _mul_by(sub.inputs[1], x1)
        if cos is None or sin is None:
            continue
        a, b = add.inputs
        if not any(_mul_by(t1, x1) is cos and _mul_by(t0, x0) is sin for t1, t0 in ((a, b), (b, a))):
            continue
        pairs = producer_op(split.inputs[0], "Reshape")
        target = None if pairs is None else ints(pairs.inputs[1])
        if target is None or len(target) != 5 or target[-1] != 2:
            continue
        return pairs.inputs[0], cos, sin, 2 * target[3]
    return None


def _partial_source(x_rot: gs.Tensor, passed: gs.Tensor, rope_dim: int) -> gs.Tensor | None:
    """x when x_rot = x[..., :R] and passed = x[..., R:] (the rest of x's last axis)."""
    rot_slice, pass_slice = last_axis_slice(x_rot), last_axis_slice(passed)
    if rot_slice is None or pass_slice is None or rot_slice[0] is not pass_slice[0]:
        return None
    source = rot_slice[0]
    dim = static_dim(source, -1)
    if rot_slice[1:] != (0, rope_dim) or pass_slice[1] != rope_dim or (dim is not None and pass_slice[2] != dim) \
            or (dim is None and pass_slice[2] != SLICE_TO_END):
        return None
    return source


def match_rotation(tensor: gs.Tensor) -> Rotation | None:
    """The RoPE chain that produces `tensor`, or None."""
    head_dim = static_dim(tensor, -1)
    concat = producer_op(tensor, "Concat")
    candidates = [(tensor, None)]
    if concat is not None and len(concat.inputs) == 2 and _last_axis(concat, rank(tensor)):
        candidates.insert(0, (concat.inputs[0], concat.inputs[1]))  # partial rotary: (rotated, passed through)
    for rotated, passed in candidates:
        for interleaved, core in ((False, _rotate_half), (True, _rotate_pairs)):
            found = core(rotated)
            if found is None:
                continue
            x_rot, cos, sin, rope_dim = found
            if passed is None:
                if head_dim is not None and rope_dim != head_dim:
                    continue
                return Rotation(x_rot, cos, sin, rope_dim, interleaved)
            source = _partial_source(x_rot, passed, rope_dim)
            if source is not None:
                return Rotation(source, cos, sin, rope_dim, interleaved)
    return None


def _below_table(tensor: gs.Tensor) -> gs.Tensor:
    """Through the Unsqueeze / Cast / Mul-by-1.0 (attention_scaling) steps between a cos/sin table and its Cos/Sin."""
    while True:
        node = producer_op(tensor, "Unsqueeze", "Cast", "Mul")
        if node is None:
            return tensor
        if node.op == "Mul":
            factors = [scalar_value(t) for t in node.inputs]
            if 1.0 not in factors:
                return tensor
            node_input = node.inputs[1 - factors.index(1.0)]
        else:
            node_input = node.inputs[0]
        tensor = node_input


def inv_freq_of(rotation: Rotation) -> np.ndarray | None:
    """The rotary table constant behind cos: cos = Cos(Concat?(Mul(positions, inv_freq))) below _below_table."""
    cos = producer_op(_below_table(rotation.cos), "Cos")
    if cos is None:
        return None
    angles = cos.inputs[0]
    concat = producer_op(angles, "Concat")
    if concat is not None and len(concat.inputs) == 2 and concat.inputs[0] is concat.inputs[1]:
        angles = concat.inputs[0]
    mul = producer_op(angles, "Mul")
    if mul is None:
        return None
    for operand in mul.inputs:
        if is_constant(operand):
            value = constant_value(operand)
            if value is not None and value.dtype == np.float32 and value.size == rotation.rope_dim // 2:
                return value.reshape(-1).copy()
    return None


def same_rotation(a: Rotation, b: Rotation) -> bool:
    """q and k rotated with the same tables and pairing."""
    return a.cos is b.cos and a.sin is b.sin and (a.rope_dim, a.interleaved) == (b.rope_dim, b.interleaved)

