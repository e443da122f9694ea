"""Running a rewritten graph on the CPU: onnxruntime with each fdpp op as an onnxruntime-extensions Python op whose
math is fdpp_rewrite/ref_ops.py (float32 in and out; Casts around each op keep the graph's own dtypes).

    session = make_reference_session("model.fdpp.onnx")
    logits = session.run(["logits"], feeds)[0]
    session.counters   # fallback rows and the FlatGemm Impl each call would use (ref_ops.OpCounters)
"""

from __future__ import annotations

import os
import tempfile

import numpy as np

from fdpp_rewrite.contracts import DOMAIN, load_contract, register_onnx_schemas, validate_node
from fdpp_rewrite.errors import FdppError, cannot_load
from fdpp_rewrite.ref_ops import COUNTERS, OpCounters, async_softmax_attention, flat_gemm, rms_norm, rope_append

CONTRIB_DOMAIN = "ai.onnx.contrib"
# onnxruntime-extensions Python ops take no optional inputs, so each input variant is its own contrib op type:
# attention by mask_mode, FlatGemm by (has_bias, has a residual)
_ATTENTION_VARIANTS = {"past_len": "FdppAttentionPastLen", "bias": "FdppAttentionBias", "none": "FdppAttentionNoMask"}
_GEMM_VARIANTS = {(False, False): "FdppFlatGemm", (True, False): "FdppFlatGemmBias",
                  (False, True): "FdppFlatGemmResidual", (True, True): "FdppFlatGemmBiasResidual"}
_registered = False


def _run_attention(query, key, value, *mask, **attrs):
    attrs.pop("plugin_version", None)  # TensorRT's lookup key, not part of the math
    return async_softmax_attention(query, key, value, *(mask or (None,)), **attrs)


def _gemm_variant(has_bias: bool, has_residual: bool):
    def run_gemm(x, weight, *extra, **attrs):
        bias = extra[0] if has_bias else None
        residual = extra[-1] if has_residual else None
        return flat_gemm(x, weight, bias, residual, **{k: v for k, v in attrs.items() if k != "has_bias"})

    return run_gemm


def _register_python_ops() -> None:
    """Declare the contrib ops once per process (onnxruntime-extensions keeps them in a global table)."""
    global _registered
    if _registered:
        return
    from onnxruntime_extensions import PyCustomOpDef, onnx_op

    attr_codes = {"float": PyCustomOpDef.dt_float, "int": PyCustomOpDef.dt_int64, "string": PyCustomOpDef.dt_string}
    f32, i64 = PyCustomOpDef.dt_float, PyCustomOpDef.dt_int64

    attention = load_contract("AsyncSoftmaxAttention")
    attention_attrs = {name: attr_codes[spec["type"]] for name, spec in attention.attributes.items()}
    fourth_input = {"past_len": [i64], "bias": [f32], "none": []}
    for mode, op_type in _ATTENTION_VARIANTS.items():
        onnx_op(op_type=op_type, inputs=[f32, f32, f32] + fourth_input[mode], outputs=[f32],
                attrs=attention_attrs)(_run_attention)

    gemm = load_contract("FlatGemm")
    gemm_attrs = {name: attr_codes[spec["type"]] for name, spec in gemm.attributes.items()}
    for (has_bias, has_residual), op_type in _GEMM_VARIANTS.items():
        onnx_op(op_type=op_type, inputs=[f32] * (2 + has_bias + has_residual), outputs=[f32],
                attrs=gemm_attrs)(_gemm_variant(has_bias, has_residual))
    _register_glue_ops(onnx_op, attr_codes)
    _registered = True


def _tensor_types(model) -> dict:
    """name -> onnx elem type of every tensor: onnx shape inference on a skeleton of the model whose large
    initializers are declared as inputs (types and dims only), so the weights are never copied."""
    import onnx

    register_onnx_schemas()
    skeleton = onnx.ModelProto(ir_version=model.ir_version)
    skeleton.opset_import.extend(model.opset_import)
    graph = skeleton.graph
    graph.node.extend(model.graph.node)
    graph.input.extend(model.graph.input)
    graph.output.extend(model.graph.output)
    for init in model.graph.initializer:
        if int(np.prod(init.dims, dtype=np.int64)) <= 64 and not init.external_data:
            graph.initializer.append(init)  # small constants (shapes, axes) help inference along
        else:
            graph.input.append(onnx.helper.make_tensor_value_info(init.name, init.data_type, list(init.dims)))
    inferred = onnx.shape_inference.infer_shapes(skeleton)
    types = {}
    for info in list(inferred.graph.input) + list(inferred.graph.value_info) + list(inferred.graph.output):
        if info.type.tensor_type.elem_type:
            types[info.name] = info.type.tensor_type.elem_type
    for init in model.graph.initializer:
        types[init.name] = init.data_type
    return types


def to_reference_model(model, in_place: bool = False):
    """A copy of a rewritten model (or the model itself with in_place=True) whose fdpp nodes are contrib
    Python ops with float32 inputs and outputs."""
    import onnx
    from onnx import TensorProto, helper

    types = _tensor_types(model)
    if in_place:
        cpu = model
    else:
        cpu = onnx.ModelProto()
        cpu.CopyFrom(model)
    new_nodes = []
    for node in cpu.graph.node:
        if node.domain != DOMAIN:
            new_nodes.append(node)
            continue
        attrs = validate_node(node)
        if node.op_type == "AsyncSoftmaxAttention":
            op_type = _ATTENTION_VARIANTS[attrs["mask_mode"]]
        elif node.op_type == "FlatGemm":
            op_type = _GEMM_VARIANTS[(bool(attrs["has_bias"]), attrs["epilogue"] == "residual")]
        else:
            op_type = _GLUE_CONTRIB_OPS[node.op_type]
        inputs, casts = [], {}
        for name in node.input:
            elem = types.get(name)
            if elem in (TensorProto.FLOAT16, TensorProto.BFLOAT16, TensorProto.DOUBLE):
                if name not in casts:  # a tensor read twice by one node is cast once
                    casts[name] = f"{name}__fdpp_f32_{node.name}"
                    new_nodes.append(helper.make_node("Cast", [name], [casts[name]], to=TensorProto.FLOAT,
                                                      name=f"{node.name}__cast_in_{len(casts)}"))
                inputs.append(casts[name])
            elif elem is None:
                raise FdppError(f"cannot tell the dtype of '{name}' (input of {node.op_type} node '{node.name}'); "
                                "is the model valid ONNX?")
            else:
                inputs.append(name)
        out_type = types[node.input[0]]  # every fdpp output has the first input's dtype
        outputs = [name if out_type == TensorProto.FLOAT else f"{name}__fdpp_f32" for name in node.output]
        new_nodes.append(helper.make_node(op_type, inputs, outputs, name=node.name, domain=CONTRIB_DOMAIN, **attrs))
        for index, (output, name) in enumerate(zip(outputs, node.output)):
            if output != name:
                suffix = "" if index == 0 else f"_{index}"
                new_nodes.append(helper.make_node("Cast", [output], [name], to=out_type,
                                                  name=f"{node.name}__cast_out{suffix}"))
    del cpu.graph.node[:]
    cpu.graph.node.extend(new_nodes)
    imports = [op for op in cpu.opset_import if op.domain != DOMAIN]
    del cpu.opset_import[:]
    cpu.opset_import.extend(imports + [helper.make_opsetid(CONTRIB_DOMAIN, 1)])
    return cpu


class ReferenceSession:
    """onnxruntime over the CPU copy of a rewritten model: `.run(output_names, feeds)` like InferenceSession,
    `.counters` says how many attention rows took the fallback and which FlatGemm Impl each call would use."""

    def __init__(self, model, counters: OpCounters = COUNTERS, owns_model: bool = False):
        import onnxruntime as ort
        from onnxruntime_extensions import get_library_path

        _register_python_ops()
        cpu = to_reference_model(model, in_place=owns_model)
        options = ort.SessionOptions()
        options.register_custom_ops_library(get_library_path())
        options.log_severity_level = 3
        self.counters = counters
        if cpu.ByteSize() < (1 << 31) - (1 << 26):
            self._session = ort.InferenceSession(cpu.SerializeToString(), options, providers=["CPUExecutionProvider"])
        else:  # protobuf cannot hold it: write the copy with external data to a temporary folder
            import onnx

            with tempfile.TemporaryDirectory(prefix="fdpp_ref_") as folder:
                path = os.path.join(folder, "model.onnx")
                onnx.save_model(cpu, path, save_as_external_data=True, location="model.onnx.data")
                self._session = ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])

    def run(self, output_names, feeds):
        return self._session.run(output_names, feeds)

    def get_inputs(self):
        return self._session.get_inputs()

    def get_outputs(self):
        return self._session.get_outputs()


def make_reference_session(path_or_model) -> ReferenceSession:
    """A session that runs a rewritten model (a path or an onnx.ModelProto) with the CPU reference ops."""
    import onnx

    if isinstance(path_or_model, (str, os.PathLike)):
        if not os.path.isfile(path_or_model):
            raise FdppError(f"no ONNX file at {path_or_model}; pass the rewritten model (*.fdpp.onnx)")
        try:
            return ReferenceSession(onnx.load(os.fspath(path_or_model)), owns_model=True)
        except FdppError:
            raise
        except Exception as exc:  # noqa: BLE001 - corrupt protobuf, missing data file, onnxruntime load errors
            raise cannot_load(path_or_model, exc) from None
    return ReferenceSession(path_or_model)


_GLUE_CONTRIB_OPS = {"RMSNorm": "FdppRMSNorm", "RopeAppend": "FdppRopeAppend"}


def _register_glue_ops(onnx_op, attr_codes: dict) -> None:
    """The contrib ops of RMSNorm and RopeAppend (called once by _register_python_ops)."""
    from onnxruntime_extensions import PyCustomOpDef

    f32, i64 = PyCustomOpDef.dt_float, PyCustomOpDef.dt_int64
    norm_attrs = {name: attr_codes[spec["type"]] for name, spec in load_contract("RMSNorm").attributes.items()}
    onnx_op(op_type=_GLUE_CONTRIB_OPS["RMSNorm"], inputs=[f32, f32], outputs=[f32],
            attrs=norm_attrs)(lambda x, weight, **attrs: rms_norm(x, weight, **attrs))
    rope_attrs = {name: attr_codes[spec["type"]] for name, spec in load_contract("RopeAppend").attributes.items()}
    onnx_op(op_type=_GLUE_CONTRIB_OPS["RopeAppend"], inputs=[f32] * 5 + [i64, f32], outputs=[f32] * 3,
            attrs=rope_attrs)(lambda *inputs, **attrs: rope_append(*inputs, **attrs))
