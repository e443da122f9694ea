"""The TensorRT adapters driven as TensorRT drives them (tests/plugins/trt/trt_harness.cpp), from the nodes of a
real rewritten model: creator lookup by the node's op type and plugin_version, the build-phase calls, the
serialize / recreate round trip, and on a GPU enqueue (eager and in a CUDA graph) against the CPU reference."""

import numpy as np
import onnx
import pytest
from trt_harness_io import CaseSpec, TensorSpec, from_bits, plugin_version, rounded, run_harness, to_bits, write_spec

from fdpp_rewrite import ref_ops
from fdpp_rewrite.contracts import load_contract, node_attributes

DTYPES = ["float16", "bfloat16"]



ROUTED = {"plugin_version"}  # picks the creator (TensorRT's ONNX parser); not a field of the plugin


def plugin_fields(op: str) -> list:
    """The creator's fields: the contract's attributes in order, less the routing ones."""
    return [name for name in load_contract(op).attributes if name not in ROUTED]

def first_node(model, op_type, **attrs):
    for node in model.graph.node:
        values = node_attributes(node)
        if node.op_type == op_type and all(values.get(k) == v for k, v in attrs.items()):
            return node
    raise AssertionError(f"no {op_type} node with {attrs} in the rewritten model")


def initializer_shape(model, name):
    return next(tuple(t.dims) for t in model.graph.initializer if t.name == name)


def cache_capacity(model):
    cache = next(i for i in model.graph.input if i.name == "key_cache.0")
    return cache.type.tensor_type.shape.dim[2].dim_value


# ---- the shapes of each op's decode and prefill cases ---------------------------------------------------------
def gemm_cases(model, node, dtype, folder=None, seed=0):
    """x [2, 1, K] (decode: M = 2, ImplB) and [1, 12, K] (prefill: M = 12, ImplC) against the node's weight
    [N, K]; with `folder`, random inputs in files and the float32 reference output of each case."""
    n, k = initializer_shape(model, node.input[1])
    attrs = node_attributes(node)
    rng = np.random.default_rng(seed)
    weight = rng.standard_normal((n, k)).astype(np.float32) / np.sqrt(k)
    bias = rng.standard_normal(n).astype(np.float32) if attrs["has_bias"] else None
    cases, expected = [], {}
    for label, lead in (("decode", (2, 1)), ("prefill", (1, 12))):
        x = rng.standard_normal((*lead, k)).astype(np.float32)
        residual = rng.standard_normal((*lead, n)).astype(np.float32) if attrs["epilogue"] == "residual" else None
        tensors = [("x", x), ("weight", weight)] + ([("bias", bias)] if bias is not None else []) + (
            [("residual", residual)] if residual is not None else [])
        cases.append(_case(label, tensors, dtype, folder))
        expected[label] = ref_ops.flat_gemm(*[rounded(a, dtype) for _, a in tensors[:2]],
                                            rounded(bias, dtype) if bias is not None else None,
                                            rounded(residual, dtype) if residual is not None else None,
                                            epilogue=attrs["epilogue"], m1=attrs["m1"], m2=attrs["m2"])
    return cases, expected


def attention_cases(model, node, dtype, folder=None, seed=0):
    """Decode: 2 sequences of 1 query after 5 and 9 cached tokens; prefill: one sequence of 7 queries from an
    empty cache. The cache is the graph's (its capacity), filled with random keys and values."""
    attrs = node_attributes(node)
    heads, kv_heads, dim, capacity = attrs["num_heads"], attrs["num_kv_heads"], attrs["head_dim"], cache_capacity(model)
    rng = np.random.default_rng(seed)
    cases, expected = [], {}
    for label, batch, seq, past in (("decode", 2, 1, [5, 9]), ("prefill", 1, 7, [0])):
        q = rng.standard_normal((batch, heads, seq, dim)).astype(np.float32)
        k = rng.standard_normal((batch, kv_heads, capacity, dim)).astype(np.float32)
        v = rng.standard_normal((batch, kv_heads, capacity, dim)).astype(np.float32)
        past_len = np.array(past, dtype=np.int64)
        cases.append(_case(label, [("query", q), ("key", k), ("value", v), ("past_len", past_len)], dtype, folder))
        expected[label] = ref_ops.async_softmax_attention(
            rounded(q, dtype), rounded(k, dtype), rounded(v, dtype), past_len,
            **{name: attrs[name] for name in ("scale", "phi", "guard_lo", "guard_hi", "mask_mode")})
    return cases, expected


def norm_cases(model, node, dtype, folder=None, seed=0):
    """x [2, 1, H] (decode) and [1, 7, H] (prefill) against a random weight of the node's hidden size."""
    (hidden,) = initializer_shape(model, node.input[1])
    epsilon = node_attributes(node)["epsilon"]
    rng = np.random.default_rng(seed)
    weight = rng.standard_normal(hidden).astype(np.float32)
    cases, expected = [], {}
    for label, lead in (("decode", (2, 1)), ("prefill", (1, 7))):
        x = rng.standard_normal((*lead, hidden)).astype(np.float32)
        cases.append(_case(label, [("x", x), ("weight", weight)], dtype, folder))
        expected[label] = ref_ops.rms_norm(rounded(x, dtype), rounded(weight, dtype), epsilon=epsilon)
    return cases, expected


def rope_cases(model, node, dtype, folder=None, seed=0):
    """Decode: 2 sequences of 1 new token after 5 and 9 cached ones; prefill: 7 new tokens into an empty cache.
    The rotary table is the node's own (the rewriter's initializer); the caches are random. Expected: the three
    outputs (query_out, key_cache_out, value_cache_out)."""
    attrs = node_attributes(node)
    heads, kv_heads, dim, capacity = attrs["num_heads"], attrs["num_kv_heads"], attrs["head_dim"], cache_capacity(model)
    inv_freq = next(onnx.numpy_helper.to_array(t) for t in model.graph.initializer if t.name == node.input[6])
    inv_freq = inv_freq.astype(np.float32)
    rng = np.random.default_rng(seed)
    cases, expected = [], {}
    for label, batch, seq, past in (("decode", 2, 1, [5, 9]), ("prefill", 1, 7, [0])):
        tensors = [("query", rng.standard_normal((batch, heads, seq, dim))),
                   ("k_new", rng.standard_normal((batch, kv_heads, seq, dim))),
                   ("v_new", rng.standard_normal((batch, kv_heads, seq, dim))),
                   ("key_cache", rng.standard_normal((batch, kv_heads, capacity, dim))),
                   ("value_cache", rng.standard_normal((batch, kv_heads, capacity, dim)))]
        tensors = [(name, a.astype(np.float32)) for name, a in tensors]
        tensors += [("past_len", np.array(past, dtype=np.int64)), ("inv_freq", inv_freq)]
        cases.append(_case(label, tensors, dtype, folder))
        floats = [rounded(a, dtype) for _, a in tensors[:5]]
        expected[label] = ref_ops.rope_append(*floats, tensors[5][1], inv_freq,
                                              **{k: attrs[k] for k in load_contract("RopeAppend").attributes})
    return cases, expected


FLOAT32_INPUTS = {"inv_freq"}  # float32 in every model dtype (the contract's)


def _case(label, tensors, dtype, folder):
    specs = []
    for name, array in tensors:
        kind = "int64" if array.dtype == np.int64 else "float32" if name in FLOAT32_INPUTS else dtype
        path = None
        if folder is not None:
            path = folder / f"{label}_{name}.bin"
            path.write_bytes(to_bits(array, kind))
        specs.append(TensorSpec(kind, array.shape, path))
    return CaseSpec(label, specs, folder / f"{label}_out.bin" if folder is not None else None)


def expected_gemm_shape(model, node, lead):
    n, _ = initializer_shape(model, node.input[1])
    return (*lead, n // 2 if node_attributes(node)["epilogue"] == "silu_mul" else n)


# ---- CPU: everything before enqueue ---------------------------------------------------------------------------
@pytest.mark.parametrize("epilogue", ["none", "silu_mul", "residual"])
@pytest.mark.parametrize("dtype", DTYPES)
def test_flat_gemm_build_phase_and_round_trip(tmp_path, harness, plugin_library, tiny_rewritten, epilogue, dtype):
    node = first_node(tiny_rewritten, "FlatGemm", epilogue=epilogue)
    cases, _ = gemm_cases(tiny_rewritten, node, dtype)
    result = run_harness(harness, plugin_library, write_spec(tmp_path / "spec", node, cases))
    assert result.returncode == 0, result.lines

    assert f"FlatGemm {plugin_version(node)} ''" in result.values("creator")
    assert result.values("creator_field") == plugin_fields("FlatGemm")
    for label, lead in (("decode", (2, 1)), ("prefill", (1, 12))):
        answers = result.cases[label]
        half = "half" if dtype == "float16" else "bf16"
        shape = ",".join(map(str, expected_gemm_shape(tiny_rewritten, node, lead)))
        assert answers["output"] == [f"0 {half} {shape}"]
        assert all(line.endswith(" 1") for line in answers["format"]), answers["format"]
        assert answers["format_float32"] == ["0"]
        assert answers["configure"] == ["0"]
    _check_serialized(result, node, ROUTED)


@pytest.mark.parametrize("dtype", DTYPES)
def test_attention_build_phase_and_round_trip(tmp_path, harness, plugin_library, tiny_rewritten, dtype):
    node = first_node(tiny_rewritten, "AsyncSoftmaxAttention")
    cases, _ = attention_cases(tiny_rewritten, node, dtype)
    result = run_harness(harness, plugin_library, write_spec(tmp_path / "spec", node, cases))
    assert result.returncode == 0, result.lines

    assert f"AsyncSoftmaxAttention {plugin_version(node)} ''" in result.values("creator")
    assert result.values("creator_field") == plugin_fields("AsyncSoftmaxAttention")
    for case in cases:
        answers = result.cases[case.label]
        half = "half" if dtype == "float16" else "bf16"
        assert answers["output"] == [f"0 {half} " + ",".join(map(str, case.inputs[0].shape))]  # the query's shape
        assert answers["format"] == ["0 1", "1 1", "2 1", "3 1", "4 1"]
        assert answers["format_float32"] == ["0"]
        assert answers["configure"] == ["0"]
    _check_serialized(result, node, ROUTED)


@pytest.mark.parametrize("dtype", DTYPES)
def test_rms_norm_build_phase_and_round_trip(tmp_path, harness, plugin_library, tiny_rewritten, dtype):
    node = first_node(tiny_rewritten, "RMSNorm")
    cases, _ = norm_cases(tiny_rewritten, node, dtype)
    result = run_harness(harness, plugin_library, write_spec(tmp_path / "spec", node, cases))
    assert result.returncode == 0, result.lines

    assert f"RMSNorm {plugin_version(node)} ''" in result.values("creator")
    assert result.values("creator_field") == plugin_fields("RMSNorm")
    for case in cases:
        answers = result.cases[case.label]
        half = "half" if dtype == "float16" else "bf16"
        assert answers["output"] == [f"0 {half} " + ",".join(map(str, case.inputs[0].shape))]  # x's shape
        assert answers["alias"] == ["0 -1"]
        assert answers["format"] == ["0 1", "1 1", "2 1"]
        assert answers["format_float32"] == ["0"]
        assert answers["configure"] == ["0"] and answers["workspace"] == ["0"]
    _check_serialized(result, node, ROUTED)


@pytest.mark.parametrize("dtype", DTYPES)
def test_rope_append_build_phase_aliases_and_round_trip(tmp_path, harness, plugin_library, tiny_rewritten, dtype):
    node = first_node(tiny_rewritten, "RopeAppend")
    cases, _ = rope_cases(tiny_rewritten, node, dtype)
    result = run_harness(harness, plugin_library, write_spec(tmp_path / "spec", node, cases))
    assert result.returncode == 0, result.lines

    assert f"RopeAppend {plugin_version(node)} ''" in result.values("creator")
    assert result.values("creator_field") == plugin_fields("RopeAppend")
    half = "half" if dtype == "float16" else "bf16"
    for case in cases:
        answers = result.cases[case.label]
        shapes = [",".join(map(str, case.inputs[i].shape)) for i in (0, 3, 4)]  # query, key_cache, value_cache
        assert answers["output"] == [f"{o} {half} {shape}" for o, shape in enumerate(shapes)]
        assert answers["alias"] == ["0 0", "1 3", "2 4"]  # in place: no copy of the query or the caches
        assert answers["format"] == [f"{pos} 1" for pos in range(10)]
        assert answers["format_float32"] == ["0"]
        assert answers["configure"] == ["0"] and answers["workspace"] == ["0"]
    _check_serialized(result, node, ROUTED)


@pytest.mark.parametrize(("op_type", "overrides", "message"), [
    ("RMSNorm", {"epsilon": 2.0}, "attribute epsilon = 2 is outside [0, 1]"),
    ("RopeAppend", {"rope_dim": 128}, "rope_dim must be at most head_dim"),
    ("RopeAppend", {"num_kv_heads": 2}, "num_heads must be a multiple of num_kv_heads"),
    ("RopeAppend", {"interleaved": 2}, "attribute interleaved = 2 is outside [0, 1]"),
])
def test_bad_glue_attributes_are_refused_with_the_reason(tmp_path, harness, plugin_library, tiny_rewritten, op_type,
                                                         overrides, message):
    node = first_node(tiny_rewritten, op_type)
    result = run_harness(harness, plugin_library, write_spec(tmp_path / "spec", node, [], overrides))
    assert result.returncode == 2 and "create failed" in result.lines
    assert message in result.logs


def _check_serialized(result, node, routed):
    """Every attribute of the node comes back from getFieldsToSerialize with its value, and a plugin recreated
    from those fields serializes the same."""
    serialized = {}
    for line in result.values("serialized"):
        name, kind, value = (line.split(" ", 2) + [""])[:3]
        serialized[name] = float(value) if kind == "float" else int(value) if kind == "int" else value
    for name, value in node_attributes(node).items():
        if name in routed:
            assert name not in serialized
        elif isinstance(value, float):
            assert serialized[name] == pytest.approx(value, rel=1e-6), name
        else:
            assert serialized[name] == value, name
    assert result.values("roundtrip") == ["1"]


@pytest.mark.parametrize(("overrides", "drop", "message"), [
    ({"head_dim": 96}, (), "attribute head_dim = 96 is not one of 64, 128"),
    ({"mask_mode": "causal"}, (), "attribute mask_mode = 'causal' is not one of past_len, bias, none"),
    ({"guard_hi": -6.0}, (), "attribute guard_hi = -6 is outside [0, 60]"),
    ({"guard_lo": 0.0, "guard_hi": 0.0}, (), "guard_lo must be below guard_hi"),
    ({"phantom": 1}, (), "unknown attribute 'phantom'"),
    ({}, ("scale",), "attribute scale is required"),
])
def test_bad_attention_attributes_are_refused_with_the_reason(tmp_path, harness, plugin_library, tiny_rewritten,
                                                              overrides, drop, message):
    node = first_node(tiny_rewritten, "AsyncSoftmaxAttention")
    result = run_harness(harness, plugin_library, write_spec(tmp_path / "spec", node, [], overrides, drop))
    assert result.returncode == 2 and "create failed" in result.lines
    assert message in result.logs  # through the logger handed over by setLoggerFinder


def test_bad_flat_gemm_attributes_are_refused_with_the_reason(tmp_path, harness, plugin_library, tiny_rewritten):
    node = first_node(tiny_rewritten, "FlatGemm")
    result = run_harness(harness, plugin_library, write_spec(tmp_path / "spec", node, [], {"implb_k_tile": 48}))
    assert result.returncode == 2
    assert "attribute implb_k_tile = 48 is not one of 32, 64, 128, 256, 512, 1024" in result.logs


def test_the_library_exports_only_the_c_abi_and_tensorrt_entry_points(plugin_library):
    import subprocess

    out = subprocess.run(["nm", "-D", "--defined-only", str(plugin_library)], capture_output=True, text=True).stdout
    names = {line.split()[-1] for line in out.splitlines() if line.strip()}
    assert {"getCreators", "setLoggerFinder"} <= names
    assert {name for name in names if not name.startswith("fdpp_")} == {"getCreators", "setLoggerFinder"}


# ---- GPU: enqueue with real buffers ---------------------------------------------------------------------------
def _enqueue_and_compare(tmp_path, harness, plugin_library, model, node, make_cases, dtype):
    cases, expected = make_cases(model, node, dtype, folder=tmp_path)
    result = run_harness(harness, plugin_library, write_spec(tmp_path / "spec", node, cases))
    assert result.returncode == 0, result.lines
    atol, rtol = load_contract(node.op_type).tolerance(dtype)
    for case in cases:
        answers = result.cases[case.label]
        assert answers["shape_change"] == ["0"] and answers["enqueue"] == ["0"], answers
        assert answers["graph_enqueue"] == ["0"] and answers["graph_equal"] == ["1"], answers
        wants = expected[case.label]
        for index, want in enumerate(wants if isinstance(wants, tuple) else (wants,)):
            path = case.output if index == 0 else case.output.with_name(f"{case.output.name}.{index}")
            got = from_bits(path.read_bytes(), dtype, want.shape)
            np.testing.assert_allclose(got, want.astype(np.float32), atol=atol, rtol=rtol,
                                       err_msg=f"{case.label} output {index}")


@pytest.mark.gpu
@pytest.mark.parametrize("epilogue", ["none", "silu_mul", "residual"])
@pytest.mark.parametrize("dtype", DTYPES)
def test_flat_gemm_enqueue_matches_the_reference(tmp_path, harness, plugin_library, tiny_rewritten, epilogue, dtype):
    node = first_node(tiny_rewritten, "FlatGemm", epilogue=epilogue)
    _enqueue_and_compare(tmp_path, harness, plugin_library, tiny_rewritten, node, gemm_cases, dtype)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
def test_attention_enqueue_matches_the_reference(tmp_path, harness, plugin_library, tiny_rewritten, dtype):
    node = first_node(tiny_rewritten, "AsyncSoftmaxAttention")
    _enqueue_and_compare(tmp_path, harness, plugin_library, tiny_rewritten, node, attention_cases, dtype)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
def test_rms_norm_enqueue_matches_the_reference(tmp_path, harness, plugin_library, tiny_rewritten, dtype):
    node = first_node(tiny_rewritten, "RMSNorm")
    _enqueue_and_compare(tmp_path, harness, plugin_library, tiny_rewritten, node, norm_cases, dtype)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
def test_rope_append_enqueue_matches_the_reference_in_place(tmp_path, harness, plugin_library, tiny_rewritten, dtype):
    """The query and caches are written in place (the outputs are bound to the input buffers, as TensorRT binds
    aliased outputs); all three outputs against the reference, eager and replayed from a CUDA graph."""
    node = first_node(tiny_rewritten, "RopeAppend")
    _enqueue_and_compare(tmp_path, harness, plugin_library, tiny_rewritten, node, rope_cases, dtype)


def test_the_rewritten_nodes_name_the_creators_the_library_registers(tiny_rewritten):
    """The ONNX parser finds a creator by (op type, plugin_version or "1", namespace ""): the contract's versions."""
    for op in ("FlatGemm", "AsyncSoftmaxAttention", "RMSNorm", "RopeAppend"):
        node = first_node(tiny_rewritten, op)
        assert plugin_version(node) == str(load_contract(op).version)
        assert node.domain == "fdpp" and isinstance(node, onnx.NodeProto)
