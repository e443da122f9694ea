"""Bring your own model: transformers graphs the kernels cannot fully serve, or that the passes once misread, each
exported once (TorchScript prefill, tests/helpers/hf_exports.py) and rewritten as a user would:
  * llama with head_dim 32 (no kernel has it): its attention left as is with one warning, everything else replaced;
  * gemma2's soft-capped attention: replaced with its cap (softcap 50) and Gemma's RMSNorm folded;
  * gpt_neox and falcon (parallel residual): every weight matmul replaced, and counted once;
and `compare` PASSes on every one of them."""

import io

import onnx
import pytest

from fdpp_rewrite.compare_onnx import compare_models
from fdpp_rewrite.contracts import load_contract
from fdpp_rewrite.errors import FdppError
from fdpp_rewrite.rewrite import rewrite_file

pytest.importorskip("torch")
pytest.importorskip("transformers")
hf_exports = pytest.importorskip("hf_exports")

LAYERS = hf_exports.LAYERS
GRAPHS = {"llama-hd32": ("llama", {"head_dim": 32}), "gemma2": ("gemma2", {}), "gpt_neox": ("gpt_neox", {}),
          "falcon": ("falcon", {})}


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    get = hf_exports.cached_exporter(tmp_path_factory.mktemp("hf-families"))
    return lambda name: get(GRAPHS[name][0], False, False, GRAPHS[name][1])


@pytest.fixture(scope="module")
def rewritten(exported):
    """name -> (output path, the rewrite's log), rewritten once."""
    cache = {}

    def get(name):
        if name not in cache:
            path = exported(name)
            log = io.StringIO()
            output = rewrite_file(path, output=path.with_name(path.stem + ".fdpp.onnx"), force=True, stream=log)
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


def test_require_attention_names_what_was_left_and_why(exported):
    path = exported("llama-hd32")
    with pytest.raises(FdppError, match=r"--require attention: 0 replaced, 2 left \(head_dim 32: the kernels are "
                                        r"built for .*: /model/model/layers.0/self_attn/Softmax, "):
        rewrite_file(path, output=path.with_name("required.onnx"), force=True, stream=io.StringIO(),
                     require=("attention", "gemm"))


def test_soft_capped_attention_is_replaced_with_its_cap(exported, rewritten):
    """passes/test_passes_attention_gemma2.py checks the attributes; this checks what stays of the graph."""
    output, log = rewritten("gemma2")
    assert "soft-capping" not in log and "attention: 0 replaced" not in log
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
    assert_compare_passes(exported(name), output)
