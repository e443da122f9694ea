"""The op contracts: plugins/<Op>Plugin/contract.json, read by the rewriter, the CPU reference, the tests and
the engines, so the names, attribute ranges and tolerances live in one place.

    contract = load_contract("FlatGemm")
    attrs = contract.validate_attributes({"m1": 1, "m2": 16}, where="node qkv")   # defaults filled in
    atol, rtol = contract.tolerance("float16")
    register_onnx_schemas()   # lets onnx shape inference and the checker understand fdpp nodes
"""

from __future__ import annotations

import functools
import json
import math
import re
from dataclasses import dataclass

from fdpp_rewrite.errors import FdppError
from fdpp_rewrite.resources import contract_path
from fdpp_rewrite.schemas import CONTRACT_SCHEMA

DOMAIN = "fdpp"
OP_NAMES = ("AsyncSoftmaxAttention", "FlatGemm")  # the ops with a TensorRT adapter (plugins/<Op>Plugin/*.cpp)
# glue ops the torch backend runs through the C ABI; no TensorRT adapter yet
GLUE_OP_NAMES = ("RMSNorm", "RopeAppend")
ALL_OP_NAMES = OP_NAMES + GLUE_OP_NAMES

# contract attribute type -> (python type check, onnx AttributeProto field)
_ATTR_TYPES = {
    "float": ((int, float), "f"),
    "int": ((int,), "i"),
    "string": ((str,), "s"),
}


@dataclass(frozen=True)
class OpContract:
    op: str
    domain: str
    version: int
    inputs: tuple        # dicts: name, dtypes, shape, present_when?, doc
    outputs: tuple
    attributes: dict     # name -> {type, default | required, range | choices, doc}
    constraints: tuple   # "a < b", "a <= b", "a % b == 0"
    tolerances: dict     # dtype -> {"atol", "rtol"}: one op against the CPU reference
    model_tolerances: dict  # dtype -> {"atol", "rtol"}: a whole rewritten model against its original
    raw: dict            # the whole file, for op-specific fields (e.g. bias_mask_threshold)

    def defaults(self) -> dict:
        return {name: spec["default"] for name, spec in self.attributes.items() if "default" in spec}

    def tolerance(self, dtype: str, scope: str = "op") -> tuple[float, float]:
        """(atol, rtol) in `dtype` ("float32", "float16", "bfloat16") for one op against the CPU reference
        (scope "op") or for a whole rewritten model against its original (scope "model")."""
        table = self.tolerances if scope == "op" else self.model_tolerances
        if dtype not in table:
            raise FdppError(f"the {self.op} contract has no {scope} tolerance for {dtype} "
                            f"(known: {', '.join(table)}); add it to {contract_path(self.op)}")
        entry = table[dtype]
        return float(entry["atol"]), float(entry["rtol"])

    def validate_attributes(self, attrs: dict, where: str = "") -> dict:
        """Check names, types, ranges, choices and constraints; return attrs with defaults filled in."""
        place = f" ({where})" if where else ""
        unknown = sorted(set(attrs) - set(self.attributes))
        if unknown:
            raise FdppError(f"{self.op}{place}: unknown attribute(s) {unknown}; the contract allows "
                            f"{sorted(self.attributes)}")
        full = self.defaults()
        full.update(attrs)
        for name, spec in self.attributes.items():
            if name not in full:
                raise FdppError(f"{self.op}{place}: required attribute '{name}' is missing ({spec['doc']})")
            _check_value(self.op, place, name, spec, full[name])
        for rule in self.constraints:
            if not _constraint_holds(rule, full):
                shown = {k: full[k] for k in re.findall(r"[a-z_][a-z_0-9]*", rule) if k in full}
                raise FdppError(f"{self.op}{place}: attributes break the contract rule '{rule}' ({shown})")
        return full

    def present_inputs(self, attrs: dict) -> list[str]:
        """Names of the inputs a node with these (validated) attributes takes, in order."""
        names = []
        for spec in self.inputs:
            condition = spec.get("present_when")
            if condition is None or all(attrs.get(key) == value for key, value in condition.items()):
                names.append(spec["name"])
        return names


def _check_value(op: str, place: str, name: str, spec: dict, value) -> None:
    python_types, _ = _ATTR_TYPES[spec["type"]]
    if isinstance(value, bool) or not isinstance(value, python_types):
        article = "an" if spec["type"] == "int" else "a"
        raise FdppError(f"{op}{place}: attribute '{name}' must be {article} {spec['type']}, got {value!r}")
    if spec["type"] == "float" and not math.isfinite(value):
        raise FdppError(f"{op}{place}: attribute '{name}' must be finite, got {value!r}")
    if "choices" in spec and value not in spec["choices"]:
        raise FdppError(f"{op}{place}: attribute '{name}' = {value!r} is not one of {spec['choices']}")
    if "range" in spec:
        low, high = spec["range"]
        if not low <= value <= high:
            raise FdppError(f"{op}{place}: attribute '{name}' = {value!r} is outside [{low}, {high}] ({spec['doc']})")


_RULES = (
    (re.compile(r"^(\w+) < (\w+)$"), lambda a, b: a < b),
    (re.compile(r"^(\w+) <= (\w+)$"), lambda a, b: a <= b),
    (re.compile(r"^(\w+) % (\w+) == 0$"), lambda a, b: b != 0 and a % b == 0),
)


def _constraint_holds(rule: str, attrs: dict) -> bool:
    for pattern, check in _RULES:
        match = pattern.match(rule)
        if match:
            return check(attrs[match.group(1)], attrs[match.group(2)])
    raise FdppError(f"contract rule '{rule}' is not understood (known forms: 'a < b', 'a <= b', 'a % b == 0')")


@functools.lru_cache(maxsize=None)
def load_contract(op: str) -> OpContract:
    path = contract_path(op)
    if not path.is_file():
        raise FdppError(f"no contract for op '{op}' at {path}; known ops: {', '.join(ALL_OP_NAMES)}")
    try:
        raw = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise FdppError(f"{path} is not valid JSON ({exc}); fix the file") from exc
    if raw.get("schema") != CONTRACT_SCHEMA or raw.get("op") != op:
        raise FdppError(f"{path}: expected schema '{CONTRACT_SCHEMA}' for op '{op}', found "
                        f"{raw.get('schema')!r} / {raw.get('op')!r}")
    for name, spec in raw["attributes"].items():
        if spec.get("type") not in _ATTR_TYPES or ("default" not in spec and not spec.get("required")):
            raise FdppError(f"{path}: attribute '{name}' needs a type in {list(_ATTR_TYPES)} and a default "
                            f"or required: true")
    return OpContract(op=op, domain=raw["domain"], version=int(raw["version"]), inputs=tuple(raw["inputs"]),
                      outputs=tuple(raw["outputs"]), attributes=dict(raw["attributes"]),
                      constraints=tuple(raw.get("constraints", ())), tolerances=dict(raw["tolerances"]),
                      model_tolerances=dict(raw.get("model_tolerances", {})), raw=raw)


@dataclass(frozen=True)
class Guard:
    """The attention contract's unified-max guard: the defaults of phi, guard_lo and guard_hi, and the ranges the
    guards may take (the widest window any calibration may use is [lo_range[0], hi_range[1]]).
        attention_guard() -> Guard(phi=0.0, lo=-60.0, hi=10.0, lo_range=(-80.0, 0.0), hi_range=(0.0, 60.0))"""

    phi: float
    lo: float
    hi: float
    lo_range: tuple
    hi_range: tuple


def attention_guard() -> Guard:
    attributes = load_contract("AsyncSoftmaxAttention").attributes
    return Guard(phi=float(attributes["phi"]["default"]), lo=float(attributes["guard_lo"]["default"]),
                 hi=float(attributes["guard_hi"]["default"]),
                 lo_range=tuple(float(v) for v in attributes["guard_lo"]["range"]),
                 hi_range=tuple(float(v) for v in attributes["guard_hi"]["range"]))


def node_attributes(node) -> dict:
    """Attributes of an onnx NodeProto as python values (str decoded)."""
    import onnx

    values = {}
    for attr in node.attribute:
        value = onnx.helper.get_attribute_value(attr)
        values[attr.name] = value.decode() if isinstance(value, bytes) else value
    return values


def validate_node(node) -> dict:
    """Validate an fdpp NodeProto against its contract (attributes and input count); return full attributes."""
    if node.domain != DOMAIN or node.op_type not in ALL_OP_NAMES:
        raise FdppError(f"node '{node.name}' ({node.domain}::{node.op_type}) is not an fdpp op")
    contract = load_contract(node.op_type)
    attrs = contract.validate_attributes(node_attributes(node), where=f"node '{node.name}'")
    expected = contract.present_inputs(attrs)
    if len(node.input) != len(expected) or any(not name for name in node.input):
        raise FdppError(f"{node.op_type} node '{node.name}' has inputs {list(node.input)} but its attributes "
                        f"ask for {expected}")
    return attrs


# --- onnx schemas: shape inference and the checker understand fdpp nodes ------------------------------------

def _attention_inference(ctx) -> None:
    import onnx

    out = onnx.TypeProto()
    out.CopyFrom(ctx.get_input_type(0))
    ctx.set_output_type(0, out)


def _flat_gemm_inference(ctx) -> None:
    import onnx

    x_type, w_type = ctx.get_input_type(0), ctx.get_input_type(1)
    out = onnx.TypeProto()
    out.CopyFrom(x_type)
    epilogue = ctx.get_attribute("epilogue")
    silu_mul = epilogue is not None and epilogue.s == b"silu_mul"
    dims = out.tensor_type.shape.dim
    w_dims = w_type.tensor_type.shape.dim if w_type is not None else []
    if len(dims) and len(w_dims) == 2:
        last = dims[len(dims) - 1]
        last.Clear()
        if w_dims[0].HasField("dim_value"):
            last.dim_value = w_dims[0].dim_value // 2 if silu_mul else w_dims[0].dim_value
    ctx.set_output_type(0, out)


def _outputs_like_inputs(*sources):
    """Shape inference where output i has the type and shape of input sources[i]."""

    def infer(ctx) -> None:
        import onnx

        for output, source in enumerate(sources):
            out = onnx.TypeProto()
            out.CopyFrom(ctx.get_input_type(source))
            ctx.set_output_type(output, out)

    return infer


_INFERENCE = {"AsyncSoftmaxAttention": _attention_inference, "FlatGemm": _flat_gemm_inference,
              "RMSNorm": _outputs_like_inputs(0), "RopeAppend": _outputs_like_inputs(0, 3, 4)}
_ONNX_ATTR = {"float": "FLOAT", "int": "INT", "string": "STRING"}
_ONNX_TYPES = {"float16": "tensor(float16)", "bfloat16": "tensor(bfloat16)", "float32": "tensor(float)",
               "int64": "tensor(int64)"}


@functools.lru_cache(maxsize=None)
def register_onnx_schemas() -> None:
    """Register every fdpp op with onnx (idempotent): shape inference then types fdpp outputs like their inputs."""
    from onnx import defs

    for op in ALL_OP_NAMES:
        contract = load_contract(op)
        try:
            defs.get_schema(op, contract.version, contract.domain)
            continue  # already registered in this process
        except defs.SchemaError:
            pass
        inputs, constraints = [], []
        for index, spec in enumerate(contract.inputs):
            type_name = f"T{index}"
            option = (defs.OpSchema.FormalParameterOption.Optional if "present_when" in spec
                      else defs.OpSchema.FormalParameterOption.Single)
            inputs.append(defs.OpSchema.FormalParameter(spec["name"], type_name, spec["doc"], param_option=option))
            constraints.append((type_name, [_ONNX_TYPES[d] for d in spec["dtypes"]], spec["name"]))
        outputs = [defs.OpSchema.FormalParameter(spec["name"], "T0", spec["doc"]) for spec in contract.outputs]
        attributes = [defs.OpSchema.Attribute(name, getattr(defs.OpSchema.AttrType, _ONNX_ATTR[spec["type"]]),
                                              spec["doc"], required=bool(spec.get("required")))
                      for name, spec in contract.attributes.items()]
        # Every version up to the contract's: a later version only adds optional attributes, so a model written
        # for an earlier one (an older rewrite) still type-checks.
        for since in range(1, contract.version + 1):
            schema = defs.OpSchema(op, contract.domain, since, contract.raw["doc"], inputs=inputs,
                                   outputs=outputs, type_constraints=constraints, attributes=attributes)
            schema.set_type_and_shape_inference_function(_INFERENCE[op])
            defs.register_schema(schema)
