"""passes/rope_hf_cache.py on transformers' Llama decode-with-cache graph (TorchScript, tests/helpers/hf_exports.py):
after the rewrite, each layer's RoPE and cache Concats become one RopeAppend on engine-style cache buffers, and a
decode step of two sequences of different lengths, each written at its own length, gives what the original graph
gives for each sequence alone."""

import io

import numpy as np
import onnx
import onnx_graphsurgeon as gs
import onnxruntime as ort
import pytest

from fdpp_rewrite.hf_graph import past_names, present_name
from fdpp_rewrite.passes import rope_hf_cache
from fdpp_rewrite.ref_session import make_reference_session
from fdpp_rewrite.rewrite import rewrite_file

pytest.importorskip("torch")
pytest.importorskip("transformers")
hf_exports = pytest.importorskip("hf_exports")

LENGTHS = [2, 5]  # tokens already in each sequence's cache
WRITE_POS = "engine.write_pos"


def buffer_name(past: str) -> str:
    return "engine.cache." + past


@pytest.fixture(scope="module")
def graphs(hf_export, tmp_path_factory):
    """(original path, the rewrite fused for engine caches, its report)."""
    path = hf_export("llama", False, True)
    rewritten = rewrite_file(path, output=tmp_path_factory.mktemp("rope-hf-cache") / "llama.fdpp.onnx",
                             stream=io.StringIO())
    graph = gs.import_onnx(onnx.load(str(rewritten)))
    report = rope_hf_cache.run(graph, buffer_name, WRITE_POS)
    return path, gs.export_onnx(graph, do_type_check=False), report


def test_each_layer_becomes_one_rope_append_on_the_buffers(graphs):
    _, model, report = graphs
    layers = hf_exports.LAYERS
    assert report.replaced == {"rope_cache": layers} and not report.near_misses
    ops = [n.op_type for n in model.graph.node]
    assert ops.count("RopeAppend") == layers and not {"Sin", "Cos", "Neg", "Slice"} & set(ops)
    inputs = {i.name for i in model.graph.input}
    assert {WRITE_POS, buffer_name("past_key_values.0.key"), buffer_name("past_key_values.1.value")} <= inputs
    # the kernels of our own export's rewrite, layer by layer
    assert [n.op_type for n in model.graph.node if n.domain == "fdpp"] == hf_exports.model_kernels(layers)
    rope = [n for n in model.graph.node if n.op_type == "RopeAppend"]
    assert [list(n.output)[1:] for n in rope] == [[f"present.{i}.key", f"present.{i}.value"] for i in range(layers)]


def test_a_decode_step_at_each_sequences_own_length(graphs):
    path, model, _ = graphs
    original = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    fused = make_reference_session(model)
    past = past_names(i.name for i in original.get_inputs())
    config = hf_exports.tiny_config("llama")
    kv_heads, head_dim = config.num_key_value_heads, config.head_dim
    rng = np.random.default_rng(0)
    total = max(LENGTHS) + 1  # the engine's KV bucket: the past view is total - 1 rows for every sequence
    caches = {name: rng.standard_normal((len(LENGTHS), kv_heads, total, head_dim)).astype(np.float32)
              for name in past}
    ids = rng.integers(0, hf_exports.VOCAB, (len(LENGTHS), 1))
    lengths = np.array(LENGTHS, np.int64)
    feed = {"input_ids": ids, "attention_mask": (np.arange(total)[None, :] <= lengths[:, None]).astype(np.int64),
            "position_ids": lengths[:, None], WRITE_POS: lengths}
    for name in past:
        feed[name] = caches[name][:, :, :total - 1]
        feed[buffer_name(name)] = caches[name]
    names = ["logits"] + [present_name(name) for name in past]
    got = dict(zip(names, fused.run(names, feed)))
    for b, length in enumerate(LENGTHS):  # the original graph on sequence b alone, past = its own rows
        alone = {"input_ids": ids[b:b + 1], "attention_mask": np.ones((1, length + 1), np.int64),
                 "position_ids": lengths[b:b + 1, None]}
        alone.update({name: caches[name][b:b + 1, :, :length] for name in past})
        want = dict(zip(names, original.run(names, alone)))
        np.testing.assert_allclose(got["logits"][b], want["logits"][0], atol=1e-4, rtol=1e-4)
        for name in names[1:]:
            np.testing.assert_allclose(got[name][b, :, :length + 1], want[name][0], atol=1e-5, rtol=1e-5)
