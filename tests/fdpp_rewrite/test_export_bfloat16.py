"""`export --dtype bfloat16`: the initializers are ONNX bfloat16 (type 16) holding the float32 weights rounded to
bfloat16 (torch's round-to-nearest-even), the graph's float inputs, outputs and Casts are bfloat16, and the
metadata and disk-space check know the dtype."""

import ml_dtypes
import numpy as np
import onnx
import pytest
import torch
from onnx import TensorProto, numpy_helper

from fdpp_rewrite import dtypes, export
from fdpp_rewrite.errors import FdppError
from fdpp_rewrite.export import export_model, read_metadata
from fdpp_rewrite.models import load_model


@pytest.fixture(scope="module")
def bf16_export(tmp_path_factory):
    path = tmp_path_factory.mktemp("bf16") / "model.onnx"
    export_model("tiny-gemma3", path, dtype="bfloat16", max_cache=16, progress=False)
    return path


def test_weights_are_float32_rounded_to_bfloat16(bf16_export):
    model = onnx.load(str(bf16_export))  # loads the external data too
    reference = load_model("tiny-gemma3", dtype="float32").weights
    big = [init for init in model.graph.initializer if init.data_location == TensorProto.EXTERNAL
           or init.name.endswith(".weight_t")]
    assert big and all(init.data_type == TensorProto.BFLOAT16 for init in big)
    checked = 0
    for init in model.graph.initializer:
        name = init.name[: -len("_t")] if init.name.endswith(".weight_t") else init.name
        if init.name == "lm_head.weight_t" and "lm_head.weight" not in reference:
            name = "embed.weight"  # tied: the head is the table's transposed copy
        if name not in reference:
            continue
        array = numpy_helper.to_array(init)
        assert array.dtype == np.dtype(ml_dtypes.bfloat16)
        expected = reference[name].to(torch.bfloat16).float().numpy()
        got = array.astype(np.float32)
        np.testing.assert_array_equal(got.T if init.name.endswith(".weight_t") else got, expected, err_msg=name)
        checked += 1
    assert checked >= len(reference)


def test_graph_interface_and_metadata_are_bfloat16(bf16_export):
    model = onnx.load(str(bf16_export), load_external_data=False)
    graph = model.graph
    floats = [v for v in list(graph.input) + list(graph.output) if v.name != "input_ids" and v.name != "past_len"]
    assert floats and all(v.type.tensor_type.elem_type == TensorProto.BFLOAT16 for v in floats)
    casts = {a.i for node in graph.node if node.op_type == "Cast" for a in node.attribute if a.name == "to"}
    assert TensorProto.BFLOAT16 in casts and TensorProto.FLOAT16 not in casts  # float32 islands cast back to bf16
    assert read_metadata(bf16_export)["dtype"] == "bfloat16"
    assert {p.key: p.value for p in model.metadata_props}["fdpp.dtype"] == "bfloat16"


def test_dtype_table():
    assert dtypes.onnx_dtype_name(16) == "bfloat16" and dtypes.numpy_dtype_name(ml_dtypes.bfloat16) == "bfloat16"
    assert [dtypes.itemsize(name) for name in ("float32", "float16", "bfloat16")] == [4, 2, 2]
    tensor = torch.tensor([1.0, -3.140625, 65504.0 * 4], dtype=torch.bfloat16)
    array = dtypes.torch_to_numpy(tensor)
    assert array.dtype == np.dtype(ml_dtypes.bfloat16)
    np.testing.assert_array_equal(array.astype(np.float32), tensor.float().numpy())


def test_disk_space_counts_two_bytes_per_weight(tmp_path, monkeypatch):
    """The check assumes 2 bytes a weight for bfloat16 (as float16): it refuses when free space is below that."""
    config = load_model("tiny-llama").config
    from fdpp_rewrite.models.names import parameter_count

    needed = parameter_count(config) * 2
    monkeypatch.setattr(export.shutil, "disk_usage", lambda _: type("U", (), {"free": needed - 1})())
    with pytest.raises(FdppError, match="free space or choose another -o"):
        export._check_disk_space(tmp_path, config, "bfloat16")
    monkeypatch.setattr(export.shutil, "disk_usage", lambda _: type("U", (), {"free": needed})())
    export._check_disk_space(tmp_path, config, "bfloat16")


def test_cli_offers_bfloat16():
    import argparse

    parser = argparse.ArgumentParser()
    export.add_arguments(parser)
    assert parser.parse_args(["tiny-llama", "--dtype", "bfloat16"]).dtype == "bfloat16"
    with pytest.raises(SystemExit):
        parser.parse_args(["tiny-llama", "--dtype", "float64"])


def test_numpy_torch_round_trip_keeps_bits():
    tensor = torch.randn(5, 7).to(torch.bfloat16)
    array = dtypes.torch_to_numpy(tensor)
    array.flags.writeable = False  # a memory-mapped initializer is read-only
    back = dtypes.numpy_to_torch(array)
    assert back.dtype == torch.bfloat16 and torch.equal(back, tensor)
    assert dtypes.numpy_to_torch(np.ones(3, np.float16)).dtype == torch.float16


def test_widened_graph_runs_in_onnxruntime_like_float32(bf16_export, tmp_path):
    """compare's float32 twin of a bfloat16 graph: no bfloat16 left anywhere, runs in onnxruntime, and gives the
    logits of the float32 export up to the weights' bf16 rounding (relative 2^-9 each)."""
    import onnxruntime as ort

    from fdpp_rewrite.compare_graphs import is_bfloat16
    from fdpp_rewrite.onnx_graph import widen_bfloat16

    model = onnx.load(str(bf16_export))
    assert is_bfloat16(model)
    wide = widen_bfloat16(model)
    assert not is_bfloat16(wide) and is_bfloat16(model)  # a copy: the original keeps its types
    values = list(wide.graph.input) + list(wide.graph.output) + list(wide.graph.value_info)
    assert all(v.type.tensor_type.elem_type != TensorProto.BFLOAT16 for v in values)
    assert all(a.i != TensorProto.BFLOAT16 for node in wide.graph.node for a in node.attribute if a.name == "to")
    assert all(init.data_type != TensorProto.BFLOAT16 for init in wide.graph.initializer)
    fp32 = export_model("tiny-gemma3", tmp_path / "model.onnx", dtype="float32", max_cache=16, progress=False)
    config = load_model("tiny-gemma3").config
    rng = np.random.default_rng(0)
    feeds = {"input_ids": rng.integers(0, config.vocab_size, (1, 5)), "past_len": np.zeros(1, np.int64)}
    for i in range(config.num_layers):
        for kind in ("key", "value"):
            feeds[f"{kind}_cache.{i}"] = np.zeros((1, config.num_kv_heads, 16, config.head_dim), np.float32)
    got = ort.InferenceSession(wide.SerializeToString(), providers=["CPUExecutionProvider"]).run(["logits"], feeds)
    want = ort.InferenceSession(str(fp32.onnx_path), providers=["CPUExecutionProvider"]).run(["logits"], feeds)
    scale = float(np.abs(want[0]).max())
    error = float(np.abs(got[0] - want[0]).max())
    assert 0 < error < 0.05 * scale  # the weights did change (bf16), by their rounding only


def _engine_takes_bfloat16() -> bool:
    from fdpp_rewrite.engine import build

    return 16 in build.ONNX_NP


PROMPT = [1, 5, 9, 20, 33, 7]


@pytest.mark.skipif(not _engine_takes_bfloat16(), reason="build reads no bfloat16 initializers yet (engine/build.py "
                    "ONNX_NP, the rewrite passes' and the cpu backend's bf16 changes in h-bf16's report)")
def test_rewrite_build_cpu_run_matches_float32(tmp_path):
    """export bf16 -> rewrite (the same replacements as float16) -> build --backend cpu -> greedy tokens equal the
    float32 reference's: tiny-llama's random-init logits have a top-1 margin far above bf16's rounding (8 bits of
    mantissa: relative 2^-9 per op), which the assertion on the margins below checks."""
    from fdpp_rewrite.engine.build import build_engine
    from fdpp_rewrite.engine.runtime import Engine
    from fdpp_rewrite.models.reference import ReferenceModel
    from fdpp_rewrite.rewrite import rewrite_file

    kinds = {}
    for dtype in ("float16", "bfloat16"):
        path = tmp_path / dtype / "model.onnx"
        export_model("tiny-llama", path, dtype=dtype, max_cache=32, progress=False)
        rewrite_file(path, None, None, None, False, stream=open("/dev/null", "w"))
        rewritten = onnx.load(str(path.with_name("model.fdpp.onnx")), load_external_data=False)
        kinds[dtype] = sorted(node.op_type for node in rewritten.graph.node if node.domain == "fdpp")
    assert kinds["bfloat16"] == kinds["float16"]
    build_engine(tmp_path / "bfloat16" / "model.fdpp.onnx", tmp_path / "engine", backend="cpu", max_batch=1,
                 max_seq=32, stream=open("/dev/null", "w"))
    from fdpp_rewrite.compare_onnx import BFLOAT16_NOTE, compare_models

    report = compare_models(tmp_path / "bfloat16" / "model.onnx", tmp_path / "bfloat16" / "model.fdpp.onnx")
    assert report.passed and report.note == BFLOAT16_NOTE and report.dtype == "float32"
    engine = Engine(tmp_path / "engine", backend="cpu")
    assert engine.dtype == torch.bfloat16
    new = 2  # the first steps: their top-1 margins (0.27, 0.085) are the wide ones
    tokens = engine.generate([PROMPT], max_new_tokens=new).tokens[0]
    model = load_model("tiny-llama")
    reference = ReferenceModel(model.config, model.weights)
    ids, margins = list(PROMPT), []
    for _ in range(new):  # the whole sequence again each step, from empty caches
        caches = reference.new_caches(1, 32)
        logits = reference.forward(torch.tensor([ids]), torch.tensor([0]), caches)[0, -1]
        top2 = torch.topk(logits, 2).values
        margins.append(float(top2[0] - top2[1]))
        ids.append(int(logits.argmax()))
    assert min(margins) > 0.05, margins  # wide: bf16's error on these logits is a few 1e-3
    assert tokens == ids[len(PROMPT):], margins


def test_widened_dtype():
    from fdpp_rewrite.onnx_graph import widened_dtype

    assert widened_dtype(ml_dtypes.bfloat16) == np.float32 and widened_dtype(TensorProto.BFLOAT16) == np.float32
    assert widened_dtype(np.float16) == np.float16 and widened_dtype(TensorProto.INT64) == np.int64
