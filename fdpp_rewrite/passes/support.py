"""What the kernels can serve, read from the op contracts (plugins/<Op>Plugin/contract.json), so a pass leaves a
match the kernels lack as is instead of aborting the rewrite. The contract is the one source of truth: when the
kernels add a head size, its `head_dim` choices grow and every pass follows.

    unsupported("AsyncSoftmaxAttention", {"head_dim": 32}, {"query": "float32"})
        -> "head_dim 32: the kernels are built for 64, 128"
    unsupported("FlatGemm", {}, {"weight": "float64"})
        -> "float64 weight: the kernels take float16, bfloat16, float32"
"""

from __future__ import annotations

import onnx_graphsurgeon as gs

from fdpp_rewrite.contracts import load_contract
from fdpp_rewrite.passes.common import dtype_name


def _number(value) -> str:
    return f"{value:g}" if isinstance(value, float) else str(value)


def unsupported(op: str, attrs: dict, dtypes: dict) -> str | None:
    """Why the kernels of `op` cannot serve a node with these model-given attribute values and input dtypes
    (input name -> dtype name), in one short phrase; None when they can. Attributes the contract does not know
    and inputs it does not list are not judged here (validate_attributes refuses those: a pass bug, not a model
    the kernels lack)."""
    contract = load_contract(op)
    for name, value in attrs.items():
        spec = contract.attributes.get(name)
        if spec is None:
            continue
        if "choices" in spec and value not in spec["choices"]:
            return f"{name} {_number(value)}: the kernels are built for {', '.join(map(_number, spec['choices']))}"
        if "range" in spec and not spec["range"][0] <= value <= spec["range"][1]:
            low, high = spec["range"]
            return f"{name} {_number(value)}: the kernels take {_number(low)} to {_number(high)}"
    inputs = {spec["name"]: spec["dtypes"] for spec in contract.inputs}
    for name, dtype in dtypes.items():
        if name in inputs and dtype not in inputs[name]:
            return f"{dtype} {name}: the kernels take {', '.join(inputs[name])}"
    return None


def supports_attribute(op: str, name: str) -> bool:
    """Whether the contract (and so the kernels) has attribute `name`, e.g. a soft-capping `softcap`."""
    return name in load_contract(op).attributes


def dtypes_of(**tensors: gs.Tensor) -> dict:
    """Input name -> dtype name for the tensors whose dtype the graph knows (the others are not judged)."""
    return {name: dtype_name(tensor) for name, tensor in tensors.items() if tensor.dtype is not None}
