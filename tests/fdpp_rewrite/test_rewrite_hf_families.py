"""Bring your own model: transformers graphs of the families issue 41 names, at every head size the kernels have,
and graphs the kernels cannot fully serve or that the passes once misread, exported by torch.onnx.export
(tests/helpers/hf_exports.py, shared with the session through tests/conftest.py's hf_export) and rewritten as a
user would:
  * gemma (256), qwen3 (128), phi3 (80, 96), llama at head_dim 80, 96, gemma2, gemma3, stablelm and gpt_neox: each
    head size through both exporters and both graph kinds (the table in the README), every attention and weight
    matmul replaced, the prefill's RoPE fused into RopeAppend;
  * llama with head_dim 32 and 48 (no kernel has them): the attention left as is with one warning per kind,
    everything else replaced, exit 0;
  * gemma2's soft-capped attention: replaced with its cap (softcap 50) and Gemma's RMSNorm folded;
  * gpt_neox and falcon (parallel residual): every weight matmul replaced, and counted once;
and `compare` PASSes on every one of them."""

import io

import onnx
import pytest

from fdpp_rewrite.compare_onnx import compare_models
from fdpp_rewrite.contracts import load_contract, node_attributes
from fdpp_rewrite.errors import FdppError
from fdpp_rewrite.passes import rope_append
from fdpp_rewrite.rewrite import rewrite_file

pytest.importorskip("torch")
pytest.importorskip("transformers")
hf_exports = pytest.importorskip("hf_exports")

LAYERS = hf_exports.LAYERS
GRAPHS = {"llama-hd32": ("llama", {"head_dim": 32}), "gemma2": ("gemma2", {}), "gpt_neox": ("gpt_neox", {}),
          "falcon": ("falcon", {})}


# (family, config overrides, head_dim, exporter, kind): every head size but 64 through both exporters and both
# kinds, each family at least once (llama, mistral, qwen2, opt and gpt2 at 64 in all four: test_rewrite_hf_exporters)
SERVED = [
    ("gemma", {}, 256, "dynamo", "decode"),
    ("gemma", {}, 256, "torchscript", "prefill"),
    ("qwen3", {}, 128, "dynamo", "decode"),
    ("qwen3", {}, 128, "torchscript", "prefill"),
    ("phi3", {"hidden_size": 192}, 96, "dynamo", "prefill"),
    ("llama", {"head_dim": 96}, 96, "torchscript", "decode"),
    ("llama", {"head_dim": 80}, 80, "dynamo", "decode"),
    ("phi3", {}, 80, "torchscript", "prefill"),
    ("gemma3", {}, 64, "torchscript", "prefill"),  # 64 through dynamo: test_rewrite_hf_exporters
    ("gemma3", {}, 64, "torchscript", "decode"),
    ("gemma2", {}, 64, "torchscript", "decode"),
    ("stablelm", {}, 64, "torchscript", "prefill"),
    ("stablelm", {}, 64, "torchscript", "decode"),
    ("gpt_neox", {}, 64, "torchscript", "decode"),
    ("glm", {}, 64, "dynamo", "prefill"),  # chatglm's successor in transformers (chatglm itself is remote code)
]
# GLM rotates interleaved pairs by strided Slices and a Stack (x[..., 0::2], x[..., 1::2]): not a form rope_match
# reads, so its RoPE stays as ops
ROPE_LEFT_AS_OPS = ("glm",)
EXPORTERS = {"dynamo": True, "torchscript": False}


def served_id(case) -> str:
    family, _, head_dim, exporter, kind = case
    return f"{family}-hd{head_dim}-{exporter}-{kind}"


@pytest.fixture(scope="module")
def exported(hf_export):
    return lambda name: hf_export(GRAPHS[name][0], False, False, GRAPHS[name][1])


@pytest.fixture(scope="module")
def rewritten(exported, tmp_path_factory):
    """name -> (output path, the rewrite's log), rewritten once (beside the session's exports, which are read-only)."""
    cache = {}
    folder = tmp_path_factory.mktemp("hf-families-rewritten")

    def get(name):
        if name not in cache:
            path = exported(name)
            log = io.StringIO()
            output = rewrite_file(path, output=folder / f"{path.stem}.fdpp.onnx", stream=log)
            cache[name] = output, log.getvalue()
        return cache[name]

    return get


def ops(path):
    return [n.op_type for n in onnx.load(str(path)).graph.node]


def assert_compare_passes(original, output):
    report = compare_models(original, output)
    assert report.passed, [(r.step, r.output, r.max_abs) for r in report.rows if not r.passed]


def test_a_head_size_no_kernel_has_is_left_with_one_warning(exported, rewritten):
    output, log = rewritten("llama-hd32")
    sizes = ", ".join(map(str, load_contract("AsyncSoftmaxAttention").attributes["head_dim"]["choices"]))
    reason = f"head_dim 32: the kernels are built for {sizes}"
    lines = [line for line in log.splitlines() if "head_dim 32" in line]
    assert lines == [f"  warning: {LAYERS} left as is ({reason}): Softmax '/model/model/layers.0/self_attn/Softmax', "
                     f"Softmax '/model/model/layers.1/self_attn/Softmax'",
                     f"warning: attention: 0 replaced, {LAYERS} left ({reason})"]
    assert "gemm: 9 replaced, 0 left" in log  # qkv, o, gate_up, down per layer and the lm_head
    found = ops(output)
    assert found.count("Softmax") == LAYERS and found.count("RMSNorm") == 2 * LAYERS + 1
    assert found.count("FlatGemm") == 9 and "AsyncSoftmaxAttention" not in found
    assert_compare_passes(exported("llama-hd32"), output)


def test_an_unserved_head_size_in_a_decode_graph_still_exits_0(hf_export, tmp_path, capsys):
    """head_dim 48 in a decode-with-cache graph, from the command line: exit 0, one warning line per kind, every
    GEMM replaced, compare PASS."""
    from fdpp_rewrite import cli

    path = hf_export("llama", False, True, {"head_dim": 48})
    output = tmp_path / "hd48.fdpp.onnx"
    assert cli.main(["rewrite", str(path), "-o", str(output)]) == 0
    captured = capsys.readouterr()
    lines = [line for line in (captured.out + captured.err).splitlines() if "head_dim 48" in line]
    assert len(lines) == 2 and lines[0].startswith(f"  warning: {LAYERS} left as is (head_dim 48: ") \
        and lines[1].startswith(f"warning: attention: 0 replaced, {LAYERS} left (head_dim 48: "), lines
    found = ops(output)
    assert found.count("FlatGemm") == 4 * LAYERS + 1 and found.count("Softmax") == LAYERS
    assert found.count("MatMul") == 2 * LAYERS  # q k^T and p v of the attention left as is, no weight's
    assert_compare_passes(path, output)


@pytest.mark.parametrize("case", SERVED, ids=served_id)
def test_every_family_and_head_size_is_served(hf_export, case, tmp_path):
    family, overrides, head_dim, exporter, kind = case
    path = hf_export(family, EXPORTERS[exporter], kind == "decode", overrides or None)
    log = io.StringIO()
    output = rewrite_file(path, output=tmp_path / f"{path.stem}.fdpp.onnx", stream=log, require=("attention", "gemm"))
    log = log.getvalue()
    model = onnx.load(str(output))
    found = [n.op_type for n in model.graph.node]
    attention = [node_attributes(n) for n in model.graph.node if n.op_type == "AsyncSoftmaxAttention"]
    assert [a["head_dim"] for a in attention] == [head_dim] * LAYERS
    assert not {"Softmax", "MatMul", "Gemm"} & set(found)
    if kind == "prefill" and family not in ROPE_LEFT_AS_OPS:  # fused from the graph's own positions
        assert f"rope_append: replaced {LAYERS} (rope_prefill x{LAYERS})" in log
        assert found.count("RopeAppend") == LAYERS and not {"Sin", "Cos", "Neg"} & set(found)
    elif kind == "decode":
        assert rope_append.HF_CACHE_CONCAT in log
    assert_compare_passes(path, output)


def test_require_attention_names_what_was_left_and_why(exported, tmp_path):
    path = exported("llama-hd32")
    with pytest.raises(FdppError, match=r"--require attention: 0 replaced, 2 left \(head_dim 32: the kernels are "
                                        r"built for .*: /model/model/layers.0/self_attn/Softmax, "):
        rewrite_file(path, output=tmp_path / "required.onnx", stream=io.StringIO(),
                     require=("attention", "gemm"))


def test_soft_capped_attention_is_replaced_with_its_cap(exported, rewritten):
    """passes/test_passes_attention_gemma2.py checks the attributes; this checks what stays of the graph."""
    output, log = rewritten("gemma2")
    # nothing of the attention is left (the projection fusion's note on the GeGLU gate/up pair is another pass's)
    assert f"attention: {LAYERS} replaced, 0 left" in log and "Softmax '" not in log
    assert f"rope_append: replaced {LAYERS} (rope_prefill x{LAYERS})" in log
    found = ops(output)
    # the attention's soft caps are gone; each layer's tanh GELU and the final logit cap stay
    assert found.count("AsyncSoftmaxAttention") == LAYERS and "Softmax" not in found
    assert found.count("Tanh") == LAYERS + 1
    assert found.count("RMSNorm") == 4 * LAYERS + 1  # Gemma's RMSNorm, weight 1 + w folded (four per layer)
    assert "ReduceMean" not in found and "MatMul" not in found
    assert_compare_passes(exported("gemma2"), output)


@pytest.mark.parametrize("name", ["gpt_neox", "falcon"])
def test_parallel_residual_claims_each_add_once(exported, rewritten, name):
    output, log = rewritten(name)
    found = ops(output)
    # qkv, dense, mlp in, mlp out per layer and the lm_head: every one a FlatGemm, and the report counts those;
    # Add(mlp out, attention out) is one residual epilogue, the other GEMM of the pair writes its plain output
    assert found.count("FlatGemm") == 4 * LAYERS + 1 and "MatMul" not in found and "Gemm" not in found
    assert f"flat gemm: replaced {4 * LAYERS + 1} (none x{3 * LAYERS + 1}, residual x{LAYERS})" in log
    assert f"gemm: {4 * LAYERS + 1} replaced, 0 left" in log
    assert f"attention: {LAYERS} replaced, 0 left" in log
    assert f"rope_append: replaced {LAYERS} (rope_prefill x{LAYERS})" in log  # partial rotary (gpt_neox) too
    assert_compare_passes(exported(name), output)
