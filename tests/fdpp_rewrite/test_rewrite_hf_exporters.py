"""The rewriter on what today's exporters write from transformers' own models (tests/helpers/hf_exports.py): five
families x {dynamo=True (sdpa), dynamo=False (TorchScript, eager)} x {prefill, decode-with-cache}. Every attention and
every weight matmul must be replaced (rewrite --require attention,gemm), and `compare` must PASS over a prefill,
decode steps on the presents and a left-padded batch. Each graph is exported once per test session."""

import io

import onnx
import pytest

from fdpp_rewrite.compare_onnx import compare_models
from fdpp_rewrite.contracts import node_attributes
from fdpp_rewrite.errors import FdppError
from fdpp_rewrite.passes import rope_append
from fdpp_rewrite.rewrite import rewrite_file

pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("onnxscript")  # the dynamo exporter needs it
hf_exports = pytest.importorskip("hf_exports")

EXPORTERS = {"dynamo": True, "torchscript": False}
COMBINATIONS = [(family, exporter, kind) for family in hf_exports.FAMILIES for exporter in EXPORTERS
                for kind in ("prefill", "decode")]
WEIGHT_MATMULS_PER_LAYER = {"llama": 4, "mistral": 4, "qwen2": 4, "opt": 4, "gpt2": 4}  # qkv, o, up(+gate), down
# OPT multiplies q by 1/sqrt(D) right after its projection, before the head reshape: that Mul stays a standard op
# and the scores are not scaled again (scale 1); the others scale the scores (eager) or q and k^T (sdpa)
SCALE = {"opt": 1.0}
RMS_NORM_FAMILIES = ("llama", "mistral", "qwen2")  # opt and gpt2 use LayerNormalization
ROPE_FAMILIES = RMS_NORM_FAMILIES  # opt and gpt2 learn their positions
ROPE_OPS = ("Sin", "Cos", "Neg")  # what a rotary chain left as ops keeps (its Slices and Concat are checked apart)


@pytest.fixture(scope="session")
def exported(hf_export):
    """(family, exporter, kind) -> path of the exported graph: the session's (tests/conftest.py hf_export, shared
    with the engine tests), exported on first use."""
    return lambda family, exporter, kind: hf_export(family, EXPORTERS[exporter], kind == "decode")


def rewritten(path, folder, **options):
    log = io.StringIO()
    output = rewrite_file(path, output=folder / f"{path.stem}.fdpp.onnx", stream=log, **options)
    return output, log.getvalue()


@pytest.mark.parametrize("family, exporter, kind", COMBINATIONS)
def test_every_attention_and_gemm_replaced_and_compare_passes(exported, family, exporter, kind, tmp_path):
    path = exported(family, exporter, kind)
    output, log = rewritten(path, tmp_path, require=("attention", "gemm"))
    layers = hf_exports.LAYERS
    assert f"attention: {layers} replaced, 0 left" in log and "gemm: " in log and "warning: attention" not in log

    model = onnx.load(str(output))
    ops = [n.op_type for n in model.graph.node]
    assert "Softmax" not in ops and "MatMul" not in ops and "Gemm" not in ops  # every matmul here is a weight's
    attention = [node_attributes(n) for n in model.graph.node if n.op_type == "AsyncSoftmaxAttention"]
    config = hf_exports.tiny_config(family)
    heads = config.num_attention_heads
    kv_heads = getattr(config, "num_key_value_heads", None) or heads
    assert [(a["num_heads"], a["num_kv_heads"], a["head_dim"], a["mask_mode"]) for a in attention] == \
        [(heads, kv_heads, 64, "bias")] * layers
    assert [a["scale"] for a in attention] == pytest.approx([SCALE.get(family, 64 ** -0.5)] * layers, rel=1e-5)
    assert ops.count("FlatGemm") >= WEIGHT_MATMULS_PER_LAYER[family] * layers + 1  # + the lm_head
    if family in RMS_NORM_FAMILIES:  # Hugging Face's Pow(x, 2) RMSNorm: two per layer and the final one
        assert ops.count("RMSNorm") == 2 * layers + 1 and "ReduceMean" not in ops and "Pow" not in ops
    if family in ROPE_FAMILIES and kind == "prefill":  # RoPE fused from the graph's own positions and inv_freq
        assert f"rope_append: replaced {layers} (rope_prefill x{layers})" in log
        assert ops.count("RopeAppend") == layers and not set(ROPE_OPS) & set(ops)
    elif family in ROPE_FAMILIES:  # Concat(past, rotated k): the op cannot write row past + s at position_ids
        assert rope_append.HF_CACHE_CONCAT in log and "RopeAppend" not in ops

    report = compare_models(path, output)
    assert report.passed, [(r.step, r.output, r.max_abs) for r in report.rows if not r.passed]
    steps = sorted({row.step for row in report.rows})
    if kind == "decode":
        assert steps == sorted(["prefill", "decode1", "decode2", "decode3", "padded-prefill", "padded-decode1",
                                "padded-decode2"])
        assert {row.output for row in report.rows} >= {"logits", "present.0.key", f"present.{layers - 1}.value"}
    else:
        assert steps == ["padded", "prefill"]
    assert report.attention_rows > 0 and report.fallback_rows == 0


def test_the_padded_positions_are_the_only_ones_left_out(exported, tmp_path):
    """Without blanking the padded positions the left-padded batch differs exactly there: the original averages a
    fully masked row, the op gives 0 (its contract). Everything else must agree."""
    import numpy as np
    import onnxruntime as ort

    from fdpp_rewrite.compare_inputs import make_steps
    from fdpp_rewrite.ref_session import make_reference_session

    path = exported("llama", "dynamo", "prefill")
    output, _ = rewritten(path, tmp_path)
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    names, steps = make_steps(session, onnx.load(str(path), load_external_data=False), batch=3, prefill=6, seed=0)
    feed = steps[names.index("padded")]
    expected = session.run(["logits"], feed)[0]
    got = make_reference_session(onnx.load(str(output))).run(["logits"], feed)[0]
    pads = feed["attention_mask"] == 0
    assert pads.any() and not pads[0].any()  # sequence 0 unpadded, the others start with pads
    np.testing.assert_allclose(got[~pads], expected[~pads], atol=1e-3, rtol=1e-3)
    assert np.abs(got[pads] - expected[pads]).max() > 1e-3  # so compare must leave them out, and says so


def test_compare_refuses_a_decode_graph_against_a_prefill_rewrite(exported, tmp_path):
    """A decode-with-cache graph against the rewrite of its prefill graph: one line before anything runs."""
    decode = exported("qwen2", "torchscript", "decode")
    prefill_rewrite, _ = rewritten(exported("qwen2", "torchscript", "prefill"), tmp_path)
    with pytest.raises(FdppError, match=r"does not belong to .*their inputs differ \(position_ids, "
                                        r"past_key_values.0.key, past_key_values.0.value ... only in"):
        compare_models(decode, prefill_rewrite)


def fdpp_kernels(path) -> list:
    """The fdpp ops of a rewritten graph in graph (topological) order."""
    return [n.op_type for n in onnx.load(str(path)).graph.node if n.domain == "fdpp"]


@pytest.mark.parametrize("exporter", sorted(EXPORTERS))
def test_a_transformers_llama_runs_our_kernels_per_layer(exported, exporter, tmp_path):
    """Issue 41's bar on the CPU: transformers' Llama exported by torch.onnx.export (prefill), rewritten, runs the
    kernels our own export's rewrite runs, layer by layer, and no op of its rotary chain is left."""
    from fdpp_rewrite import cli

    layers = hf_exports.LAYERS
    ours = tmp_path / "ours.onnx"
    assert cli.main(["export", "tiny-llama", "--layers", str(layers), "--max-cache", "16", "--dtype", "float32",
                     "-o", str(ours)]) == 0
    ours_rewritten, _ = rewritten(ours, tmp_path)
    theirs, log = rewritten(exported("llama", exporter, "prefill"), tmp_path)
    expected = hf_exports.model_kernels(layers)
    assert fdpp_kernels(ours_rewritten) == expected
    assert fdpp_kernels(theirs) == expected
    model = onnx.load(str(theirs))
    # no Sin/Cos (so no table Concat(freqs, freqs) either) and no Neg or Slice (so no rotate_half Concat of them)
    assert not [n for n in model.graph.node if n.op_type in ROPE_OPS + ("Slice",)]
    produced_by = {out: n.op_type for n in model.graph.node for out in n.output}
    concats = [n for n in model.graph.node if n.op_type == "Concat"]
    assert not [n for n in concats if {produced_by.get(i) for i in n.input} & {"Neg", "Mul", "Add"}]
    rope = [node_attributes(n) for n in model.graph.node if n.op_type == "RopeAppend"]
    assert [(a["rope_dim"], a["interleaved"]) for a in rope] == [(64, 0)] * layers
