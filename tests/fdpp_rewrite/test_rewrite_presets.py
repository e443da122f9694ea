"""Every preset, at its real dimensions: every attention and every weight matmul is replaced, and the committed
H200 profile covers every [N, K] shape (an explicit --profile is strict: a missing shape is an error).

One layer per model keeps this to seconds of random-weight generation; the layers repeat, so one layer has every
pattern the whole model has."""

import onnx
import pytest

from fdpp_rewrite import cli
from fdpp_rewrite.models import get_config
from fdpp_rewrite.resources import profile_path

H200_PROFILE = profile_path("h200.json")
# Weight matmuls per layer after the projection fusion: qkv, o, gate_up, down (OPT: qkv, o, fc1, fc2).
FLAT_GEMMS_PER_LAYER = 4


# llama2-13b's graph is llama2-7b's, opt-6.7b's rewrite runs at tiny size (test_passes_rewrite.py); every preset's
# shapes are checked by test_profile_covers_every_preset_shape.
@pytest.mark.slow
@pytest.mark.parametrize("preset", ["llama2-7b", "chatglm2-6b", "smollm2-135m"])
def test_real_preset_is_fully_rewritten_with_the_h200_profile(real_preset_export, tmp_path, preset, capsys):
    # the session's export (tests/conftest.py: `export PRESET --dtype float16 --layers 1 --max-cache 16
    # --random-init`, shared with test_export.py)
    exported = real_preset_export(preset)
    rewritten = tmp_path / "model.fdpp.onnx"
    capsys.readouterr()  # the export's output, when this test made it
    assert cli.main(["rewrite", str(exported), "-o", str(rewritten), "--profile", str(H200_PROFILE)]) == 0
    printed = capsys.readouterr().out
    assert "unprofiled" not in printed

    model = onnx.load(str(rewritten), load_external_data=False)
    op_types = [node.op_type for node in model.graph.node]
    assert op_types.count("AsyncSoftmaxAttention") == 1
    assert op_types.count("FlatGemm") == FLAT_GEMMS_PER_LAYER + 1  # + the lm_head
    assert "Softmax" not in op_types and "MatMul" not in op_types and "Gemm" not in op_types
    profiles = {attr.s.decode() for node in model.graph.node if node.op_type == "FlatGemm"
                for attr in node.attribute if attr.name == "profile"}
    assert profiles and all("h200" in p.lower() for p in profiles), profiles


def test_profile_covers_every_preset_shape():
    """Cheap twin of the test above that runs in CI: the fused [N, K] shapes of each preset are in h200.json."""
    import json

    shapes = {(s["n"], s["k"], s["dtype"]) for s in json.loads(H200_PROFILE.read_text())["shapes"]}
    for preset in ["llama2-7b", "llama2-13b", "opt-6.7b", "chatglm2-6b", "smollm2-135m"]:
        c = get_config(preset)
        ffn_out = 2 * c.intermediate_size if c.family != "opt" else c.intermediate_size
        needed = {
            ((c.num_heads + 2 * c.num_kv_heads) * c.head_dim, c.hidden_size),  # qkv
            (c.hidden_size, c.num_heads * c.head_dim),                          # o
            (ffn_out, c.hidden_size),                                           # gate_up (OPT: fc1)
            (c.hidden_size, c.intermediate_size),                               # down (OPT: fc2)
            (c.vocab_size, c.hidden_size),                                      # lm_head
        }
        missing = {shape for shape in needed if (*shape, "float16") not in shapes}
        assert not missing, f"{preset}: h200.json lacks {sorted(missing)}"
