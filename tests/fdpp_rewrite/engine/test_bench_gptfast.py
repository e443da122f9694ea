"""The gpt-fast peer (engine/gptfast_peer.py, and scripts/bench_gptfast.py over it) on the CPU: the presets the
recipe takes, and its model (eager, float32): a decode step through the static KV cache gives the logits a full pass
over the longer prompt gives, with multi-head and grouped KV heads."""

import pytest
from script_module import load_script

from fdpp_rewrite.engine import gptfast_peer
from fdpp_rewrite.errors import FdppError

torch = pytest.importorskip("torch")


script = load_script("bench_gptfast")


def test_model_config_takes_llama_layouts_and_refuses_others_in_one_line():
    assert script.model_config("llama2-7b", None).num_layers == 32
    assert script.model_config("llama2-7b", 2).num_layers == 2
    assert script.model_config("tiny-smollm2", None).num_kv_heads == 1
    with pytest.raises(FdppError, match="not a plain Llama layout .family opt"):
        script.model_config("opt-6.7b", None)
    with pytest.raises(FdppError, match="not a plain Llama layout"):  # chatglm: partial, interleaved RoPE
        script.model_config("tiny-chatglm", None)
    with pytest.raises(FdppError, match="outside 1 .. 32"):
        script.model_config("llama2-7b", 33)


@pytest.mark.parametrize("preset", ["tiny-llama", "tiny-smollm2"])  # 3 heads over 3 and over 1 KV head
def test_decode_through_the_cache_equals_a_full_pass(preset):
    config = script.model_config(preset, None)
    torch.manual_seed(0)
    model = gptfast_peer.build_model(config, torch.float32)(32).eval()
    for param in model.parameters():
        param.data.normal_(0, 0.02)
    ids = torch.randint(0, config.vocab_size, (2, 7))
    with torch.no_grad():
        model.setup(2, 12)
        model(ids[:, :6], torch.arange(6))
        step = model(ids[:, 6:], torch.tensor([6]))[:, -1]
        model.setup(2, 12)
        full = model(ids, torch.arange(7))[:, -1]
    assert model.length == 16  # the cache rounded up to 8, as gpt-fast sizes it
    torch.testing.assert_close(step, full, rtol=1e-5, atol=1e-5)
    assert not torch.allclose(step[0], step[1])  # two different sequences: the check can fail
