"""scripts/bench_hf.py's transformers peer on the CPU (float32): the llama presets through LlamaForCausalLM, the other
families (gemma3_text) through AutoConfig.for_model and AutoModelForCausalLM; each one's logits equal the
ReferenceModel's on the same weights (tiny-gemma3's sliding window of 4 active over 12 tokens)."""

import pytest
from script_module import load_script

from fdpp_rewrite.models import load_model
from fdpp_rewrite.models.reference import ReferenceModel

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

script = load_script("bench_hf")


@pytest.mark.parametrize("preset, model_class", [("tiny-llama", "LlamaForCausalLM"),
                                                 ("tiny-gemma3", "Gemma3ForCausalLM")])
def test_the_peer_gives_the_reference_logits(preset, model_class):
    model, _ = script.hf_model(preset, None, "float32", "cpu")
    assert type(model).__name__ == model_class and model.dtype == torch.float32
    loaded = load_model(preset, dtype="float32")
    reference = ReferenceModel(loaded.config, loaded.weights)
    ids = torch.randint(0, loaded.config.vocab_size, (2, 12), generator=torch.Generator().manual_seed(0))
    with torch.inference_mode():
        theirs = model(input_ids=ids).logits
    ours = reference(ids, torch.zeros(2, dtype=torch.long), reference.new_caches(2, 16))
    assert float((theirs - ours).abs().max()) < 1e-5


def test_the_peer_is_built_in_the_dtype_asked():
    model, _ = script.hf_model("tiny-gemma3", 2, "float16", "cpu")
    assert model.dtype == torch.float16 and model.config.num_hidden_layers == 2
