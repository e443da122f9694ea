"""A transformers Gemma 2 graph (tiny, TorchScript prefill, tests/helpers/hf_exports.py) through the rewrite with
contract version 4: its soft-capped attention (cap * tanh(s / cap), cap 50, between the scale and the mask) becomes
fdpp::AsyncSoftmaxAttention with `softcap` 50 and, uncalibrated, the guard a cap allows (phi 0, guard_hi 50); the
attention's Tanh ops are gone, and `compare` PASSes (the reference op applies the cap)."""

import io

import onnx
import pytest

from fdpp_rewrite.compare_onnx import compare_models
from fdpp_rewrite.contracts import node_attributes
from fdpp_rewrite.rewrite import rewrite_file

pytest.importorskip("torch")
pytest.importorskip("transformers")
hf_exports = pytest.importorskip("hf_exports")


def test_gemma2_soft_capped_attention_is_replaced_with_its_cap(tmp_path):
    source = hf_exports.cached_exporter(tmp_path)("gemma2", False, False, {})
    log = io.StringIO()
    output = rewrite_file(source, output=source.with_name("gemma2.fdpp.onnx"), force=True, stream=log,
                          require=("attention", "gemm"))
    layers = hf_exports.LAYERS
    nodes = onnx.load(str(output)).graph.node
    attention = [node_attributes(n) for n in nodes if n.op_type == "AsyncSoftmaxAttention"]
    assert len(attention) == layers, log.getvalue()
    for attrs in attention:
        assert attrs["softcap"] == pytest.approx(50.0) and attrs["head_dim"] == 64
        assert (attrs["phi"], attrs["guard_lo"], attrs["guard_hi"]) == (0.0, -60.0, 50.0)
    found = [n.op_type for n in nodes]
    # what stays: each layer's tanh GELU and the final logit cap; no Softmax, no soft cap of the scores
    assert "Softmax" not in found and found.count("Tanh") == layers + 1
    report = compare_models(source, output)
    assert report.passed, [(r.step, r.output, r.max_abs) for r in report.rows if not r.passed]
