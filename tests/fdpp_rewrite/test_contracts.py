"""The op contracts (plugins/<Op>Plugin/contract.json) and their loader/validator."""

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from fdpp_rewrite.contracts import OP_NAMES, load_contract, register_onnx_schemas, validate_node
from fdpp_rewrite.errors import FdppError

ATTENTION_ATTRS = {"scale": 0.125, "phi": 0.0, "guard_lo": -60.0, "guard_hi": 10.0, "mask_mode": "past_len",
                   "num_heads": 9, "num_kv_heads": 3, "head_dim": 64}
GEMM_ATTRS = {"m1": 1, "m2": 16}


@pytest.mark.parametrize("op", OP_NAMES)
def test_contract_files_are_complete(op):
    contract = load_contract(op)
    assert contract.op == op and contract.domain == "fdpp" and contract.version >= 1
    for dtype in ("float32", "float16", "bfloat16"):
        atol, rtol = contract.tolerance(dtype)
        assert 0 < atol < 1 and 0 < rtol < 1
    for dtype in ("float32", "float16"):
        assert contract.tolerance(dtype, scope="model") >= contract.tolerance(dtype)
    for name, spec in contract.attributes.items():
        assert spec["doc"], name
        assert "range" in spec or "choices" in spec or spec["type"] == "string", name
        if "default" in spec:  # every default passes its own checks
            contract.validate_attributes({**(ATTENTION_ATTRS if op == "AsyncSoftmaxAttention" else GEMM_ATTRS),
                                          name: spec["default"]})


@pytest.mark.parametrize("op", OP_NAMES)
def test_plugin_version_matches_the_contract_and_reaches_the_onnx_parser(op):
    """TensorRT's ONNX parser finds a plugin creator by (op type, the node's plugin_version attribute, default
    "1"): the adapter must register the contract's version, and a node of an op past version 1 must carry it."""
    import re
    from pathlib import Path

    contract = load_contract(op)
    folder = Path(__file__).parents[2] / "plugins" / f"{op}Plugin"
    source = (folder / f"{op}Plugin.h").read_text() + (folder / f"{op}Plugin.cpp").read_text()
    # The adapter registers the contract's own version (fdpp_contract_constants.h, generated from contract.json).
    assert re.search(r"kVersion = contract::k\w+VersionString;", source)
    registered = str(contract.version)
    attrs = contract.validate_attributes(ATTENTION_ATTRS if op == "AsyncSoftmaxAttention" else GEMM_ATTRS)
    assert attrs.get("plugin_version", "1") == registered


def test_flat_gemm_adapter_reads_every_loader_the_contract_allows():
    """The TensorRT adapter parses implb_loader by string compare: every contract choice must be spelled there."""
    from pathlib import Path

    source = (Path(__file__).parents[2] / "plugins" / "FlatGemmPlugin" / "FlatGemmPlugin.cpp").read_text()
    for loader in load_contract("FlatGemm").attributes["implb_loader"]["choices"]:
        assert f'"{loader}"' in source, loader


def test_the_tensorrt_adapter_parses_every_flat_gemm_attribute():
    """FlatGemmPlugin.cpp's attribute table has a row for every contract attribute (plugin_version: the plugin base's),
    so that a new one (m3 and implb_wgmma_* in version 5) reaches the plan (no TensorRT to compile it here)."""
    from pathlib import Path

    source = (Path(__file__).parents[2] / "plugins" / "FlatGemmPlugin" / "FlatGemmPlugin.cpp").read_text()
    for name in load_contract("FlatGemm").attributes:
        if name != "plugin_version":
            assert f'{{"{name}", PluginFieldType::' in source, name


def test_defaults_are_filled_and_inputs_follow_attributes():
    gemm = load_contract("FlatGemm")
    full = gemm.validate_attributes(GEMM_ATTRS)
    assert full["epilogue"] == "none" and full["has_bias"] == 0 and full["profile"] == "unprofiled-default"
    assert gemm.present_inputs(full) == ["x", "weight"]
    assert gemm.present_inputs({**full, "has_bias": 1, "epilogue": "residual"}) == ["x", "weight", "bias", "residual"]
    attention = load_contract("AsyncSoftmaxAttention")
    assert attention.present_inputs(ATTENTION_ATTRS) == ["query", "key", "value", "past_len"]
    assert attention.present_inputs({**ATTENTION_ATTRS, "mask_mode": "bias"}) == ["query", "key", "value", "bias"]
    assert attention.present_inputs({**ATTENTION_ATTRS, "mask_mode": "none"}) == ["query", "key", "value"]


@pytest.mark.parametrize("change, message", [
    ({"guard_hi": 61.0}, "outside"),                # e^61 x 2^20 keys x 65504 would overflow float32
    ({"guard_lo": 5.0, "guard_hi": 4.0}, "outside"),
    ({"guard_lo": -5.0, "guard_hi": -5.0}, "outside"),
    ({"mask_mode": "causal"}, "not one of"),
    ({"num_heads": 8}, "num_heads % num_kv_heads"),  # 8 query heads over 3 KV heads
    ({"scale": "0.1"}, "must be a float"),
    ({"phi": float("nan")}, "finite"),
    ({"sliding_window": 4}, "unknown attribute"),
    ({"window": -1}, "outside"),
    ({"window": 4.0}, "must be an int"),
    ({"softcap": -1.0}, "outside"),
    ({"head_dim": 48}, "not one of"),
])
def test_attention_attribute_errors(change, message):
    with pytest.raises(FdppError, match=message):
        load_contract("AsyncSoftmaxAttention").validate_attributes({**ATTENTION_ATTRS, **change})


def test_attention_softcap_window_and_head_sizes():
    """Version 4: soft-capping and a sliding window default to none, and the kernels take the head sizes real models
    use (Phi-2 80, Phi-3-mini 96, Gemma 256)."""
    contract = load_contract("AsyncSoftmaxAttention")
    assert contract.version == 4
    full = contract.validate_attributes(ATTENTION_ATTRS)
    assert full["softcap"] == 0.0 and full["window"] == 0 and full["plugin_version"] == "4"
    assert contract.attributes["head_dim"]["choices"] == [64, 80, 96, 128, 256]
    gemma2 = contract.validate_attributes({**ATTENTION_ATTRS, "softcap": 50.0, "window": 4096, "head_dim": 256})
    assert gemma2["softcap"] == 50.0 and gemma2["window"] == 4096


def test_guard_order_rule():
    contract = load_contract("AsyncSoftmaxAttention")
    with pytest.raises(FdppError, match="guard_lo < guard_hi"):
        contract.validate_attributes({**ATTENTION_ATTRS, "guard_lo": 0.0, "guard_hi": 0.0})


@pytest.mark.parametrize("change, message", [
    ({"m1": 20, "m2": 16}, "m1 <= m2"),
    ({"implb_n_tile": 48}, "not one of"),
    ({"epilogue": "gelu"}, "not one of"),
    ({"has_bias": True}, "must be an int"),
    ({"implb_stages": 0}, "outside"),
])
def test_gemm_attribute_errors(change, message):
    with pytest.raises(FdppError, match=message):
        load_contract("FlatGemm").validate_attributes({**GEMM_ATTRS, **change})


def test_required_attribute_missing():
    with pytest.raises(FdppError, match="required attribute 'm2'"):
        load_contract("FlatGemm").validate_attributes({"m1": 1})


def _gemm_model(epilogue="silu_mul", inputs=("x", "w"), dtype=TensorProto.FLOAT16):
    node = helper.make_node("FlatGemm", list(inputs), ["y"], domain="fdpp", name="g", epilogue=epilogue, m1=1, m2=16)
    w = numpy_helper.from_array(np.zeros((6, 4), dtype=helper.tensor_dtype_to_np_dtype(dtype)), "w")
    graph = helper.make_graph([node, helper.make_node("Relu", ["y"], ["z"])], "g",
                              [helper.make_tensor_value_info("x", dtype, ["batch", 3, 4])],
                              [helper.make_tensor_value_info("z", dtype, None)], initializer=[w])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("fdpp", 1)])


def test_onnx_schemas_type_fdpp_outputs():
    register_onnx_schemas()
    register_onnx_schemas()  # idempotent
    model = onnx.shape_inference.infer_shapes(_gemm_model(), strict_mode=True)
    out = next(v for v in model.graph.output if v.name == "z")
    dims = [d.dim_param or d.dim_value for d in out.type.tensor_type.shape.dim]
    assert out.type.tensor_type.elem_type == TensorProto.FLOAT16 and dims == ["batch", 3, 3]  # silu_mul: N / 2
    none_model = onnx.shape_inference.infer_shapes(_gemm_model(epilogue="none"), strict_mode=True)
    assert [d.dim_value for d in none_model.graph.output[0].type.tensor_type.shape.dim][-1] == 6


def test_validate_node_checks_input_count():
    model = _gemm_model(epilogue="residual")  # residual epilogue but only x and w
    with pytest.raises(FdppError, match="ask for"):
        validate_node(model.graph.node[0])
    assert validate_node(_gemm_model().graph.node[0])["epilogue"] == "silu_mul"


def test_unknown_op():
    with pytest.raises(FdppError, match="no contract"):
        load_contract("FusedNorm")


def test_attention_guard_is_read_from_the_contract():
    from fdpp_rewrite.contracts import attention_guard

    attributes = load_contract("AsyncSoftmaxAttention").attributes
    guard = attention_guard()
    assert (guard.phi, guard.lo, guard.hi) == tuple(attributes[n]["default"] for n in ("phi", "guard_lo", "guard_hi"))
    assert guard.lo_range == tuple(attributes["guard_lo"]["range"])
    assert guard.hi_range == tuple(attributes["guard_hi"]["range"])
    assert guard.lo_range[0] <= guard.lo < guard.hi <= guard.hi_range[1]


def test_each_schema_string_is_written_once_in_the_package():
    """A file format's schema string is one constant (fdpp_rewrite.schemas or its single owner), never a copy."""
    import ast
    import re
    from pathlib import Path

    package = Path(__file__).parents[2] / "fdpp_rewrite"
    where = {}
    for path in package.rglob("*.py"):
        strings = {node.value for node in ast.walk(ast.parse(path.read_text())) if isinstance(node, ast.Constant)
                   and isinstance(node.value, str) and re.fullmatch(r"fdpp-[a-z-]+/\d+", node.value)}
        for schema in strings:  # string literals that are a schema, not prose that mentions one
            where.setdefault(schema, []).append(str(path.relative_to(package)))
    assert where, "no schema strings found"
    repeated = {schema: files for schema, files in where.items() if len(files) > 1}
    assert not repeated, repeated
