"""The rewriter on a graph it did not write: transformers' own LlamaForCausalLM (tiny config, GQA, eager
attention) exported by torch.onnx.export, rewritten, and compared with polygraphy."""

import io
import warnings

import onnx
import pytest

from fdpp_rewrite.compare_onnx import compare_models
from fdpp_rewrite.contracts import node_attributes
from fdpp_rewrite.rewrite import rewrite_file

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")


class LogitsOnly(torch.nn.Module):
    """input_ids, attention_mask -> logits (an explicit attention_mask keeps transformers off its
    packed-sequence detection, which uses torch.diff, an op the ONNX exporter lacks)."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, input_ids, attention_mask):
        return self.model(input_ids=input_ids, attention_mask=attention_mask, use_cache=False).logits


def export_tiny_llama(path, num_kv_heads):
    # hidden 256 over 4 heads: head_dim 64, the smallest the attention contract takes
    config = transformers.LlamaConfig(vocab_size=97, hidden_size=256, intermediate_size=96, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=num_kv_heads,
                                      max_position_embeddings=64, attn_implementation="eager", use_cache=False)
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(config).eval()
    ids = torch.randint(0, 97, (2, 7))
    dynamic = {0: "batch", 1: "seq"}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the TorchScript exporter's deprecation and tracer warnings
        torch.onnx.export(LogitsOnly(model), (ids, torch.ones_like(ids)), str(path), opset_version=17, dynamo=False,
                          input_names=["input_ids", "attention_mask"], output_names=["logits"],
                          dynamic_axes={"input_ids": dynamic, "attention_mask": dynamic, "logits": dynamic})


@pytest.mark.parametrize("num_kv_heads", [2, 1])
def test_hugging_face_llama(tmp_path, num_kv_heads):
    path = tmp_path / "hf-llama.onnx"
    export_tiny_llama(path, num_kv_heads)
    log = io.StringIO()
    output = rewrite_file(path, stream=log)
    text = log.getvalue()
    assert "attention: replaced 2 (4d/bias x2)" in text  # the mask comes from attention_mask: a bias
    assert "projection fusion: replaced 4 (gate_up x2, qkv x2)" in text

    rewritten = onnx.load(str(output))
    attention = [node_attributes(n) for n in rewritten.graph.node if n.op_type == "AsyncSoftmaxAttention"]
    assert [(a["num_heads"], a["num_kv_heads"], a["head_dim"]) for a in attention] == [(4, num_kv_heads, 64)] * 2
    gemms = [n for n in rewritten.graph.node if n.op_type == "FlatGemm"]
    assert len(gemms) == 2 * 4 + 1  # qkv, o, gate_up, down per layer, and the lm_head
    assert not any(n.op_type in ("Softmax", "MatMul", "ReduceMean") for n in rewritten.graph.node)
    assert sum(n.op_type == "RMSNorm" for n in rewritten.graph.node) == 2 * 2 + 1  # Hugging Face's Pow(x, 2) form
    assert "rope_append: replaced 2 (rope_prefill x2)" in text  # its rotary chain, fused from the graph's positions
    assert sum(n.op_type == "RopeAppend" for n in rewritten.graph.node) == 2
    assert not any(n.op_type in ("Sin", "Cos", "Neg") for n in rewritten.graph.node)

    report = compare_models(path, output)
    assert report.passed, [(r.output, r.max_abs) for r in report.rows]
    assert report.attention_rows == 2 * 2 * 2 * 4 * 6  # steps (prefill, left-padded) x layers x batch x heads x seq
