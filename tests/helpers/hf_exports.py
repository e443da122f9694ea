"""ONNX graphs of transformers' own models, as today's exporters write them: tiny configs of five families (and of
three more the rewriter must take apart, MORE_FAMILIES), exported by torch.onnx.export with dynamo=True (sdpa
attention, the exporter's default) or dynamo=False (TorchScript, eager attention), as a prefill graph
(input_ids, attention_mask -> logits) or a decode-with-cache graph
(input_ids, attention_mask, position_ids, past_key_values.N.key/value -> logits, present.N.key/value).

export_hf(family, dynamo, cache, folder) writes one graph and returns its path, or raises ExportUnsupported with the
exact reason when the installed torch/transformers cannot export that combination; `overrides` change the tiny config
(e.g. {"head_dim": 32}, a head size no kernel has).
"""

from __future__ import annotations

import warnings
from pathlib import Path

FAMILIES = ("llama", "mistral", "qwen2", "opt", "gpt2")
# parallel residual (gpt_neox, falcon: attention and MLP outputs added together), logit soft-capping (gemma2), and
# the families issue 41 adds: gemma (head_dim 256), gemma3 (QK-norm, local layers), phi3 (fused qkv, head_dim from
# hidden_size: 160 -> 80, 192 -> 96), qwen3 (head_dim 128, QK-norm), stablelm (partial rotary), glm (GLM-4, the
# chatglm line in transformers: partial interleaved rotary)
MORE_FAMILIES = ("gpt_neox", "falcon", "gemma2", "gemma", "gemma3", "phi3", "qwen3", "stablelm", "glm")
VOCAB = 128
LAYERS = 2
BATCH, SEQ, PAST = 2, 5, 3  # the sizes traced; every one of them is a dynamic dim of the graph
# the fdpp kernels of our own export's rewrite per layer, in order (what a rewritten llama export must run too): norm,
# qkv, rope + cache append, attention, o (+ residual), norm, gate_up (+ silu_mul), down (+ residual)
LAYER_KERNELS = ["RMSNorm", "FlatGemm", "RopeAppend", "AsyncSoftmaxAttention", "FlatGemm", "RMSNorm", "FlatGemm",
                 "FlatGemm"]


def model_kernels(layers: int) -> list:
    """LAYER_KERNELS for each layer, then the final norm and the lm_head."""
    return LAYER_KERNELS * layers + ["RMSNorm", "FlatGemm"]


class ExportUnsupported(Exception):
    """This combination cannot be exported with the installed torch/transformers (the message says why)."""


def tiny_config(family: str, **overrides):
    """hidden 64-128 with head_dim 64 (the smallest the attention contract takes), 2 layers, vocab 128; `overrides`
    set config fields (e.g. head_dim=32)."""
    config = _tiny_config(family)
    for name, value in overrides.items():
        setattr(config, name, value)
    return config


def _tiny_config(family: str):
    import transformers

    common = {"vocab_size": VOCAB, "use_cache": True}
    if family == "llama":  # GQA: 4 query heads over 2 KV heads
        return transformers.LlamaConfig(hidden_size=64, head_dim=64, intermediate_size=96, num_hidden_layers=LAYERS,
                                        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                                        **common)
    if family == "mistral":
        return transformers.MistralConfig(hidden_size=64, head_dim=64, intermediate_size=96, num_hidden_layers=LAYERS,
                                          num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=64,
                                          sliding_window=None, **common)
    if family == "qwen2":  # q/k/v with biases
        return transformers.Qwen2Config(hidden_size=128, intermediate_size=96, num_hidden_layers=LAYERS,
                                        num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=64,
                                        **common)
    if family == "opt":
        return transformers.OPTConfig(hidden_size=128, ffn_dim=96, num_hidden_layers=LAYERS, num_attention_heads=2,
                                      word_embed_proj_dim=128, max_position_embeddings=64, **common)
    if family == "gpt2":
        return transformers.GPT2Config(n_embd=128, n_layer=LAYERS, n_head=2, n_positions=64, **common)
    if family == "gpt_neox":  # parallel residual, partial rotary (a quarter of each head)
        return transformers.GPTNeoXConfig(hidden_size=128, intermediate_size=96, num_hidden_layers=LAYERS,
                                          num_attention_heads=2, max_position_embeddings=64,
                                          use_parallel_residual=True, **common)
    if family == "falcon":  # parallel attention and MLP, no biases
        return transformers.FalconConfig(hidden_size=128, num_hidden_layers=LAYERS, num_attention_heads=2,
                                         parallel_attn=True, **common)
    if family == "gemma2":  # logit soft-capping (50), Gemma's RMSNorm (1 + weight), sliding window off at this length
        return transformers.Gemma2Config(hidden_size=64, head_dim=64, intermediate_size=96, num_hidden_layers=LAYERS,
                                         num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=64,
                                         **common)
    small = dict(intermediate_size=96, num_hidden_layers=LAYERS, num_attention_heads=2, num_key_value_heads=1,
                 max_position_embeddings=64, **common)
    if family == "gemma":
        return transformers.GemmaConfig(hidden_size=64, head_dim=256, **small)
    if family == "gemma3":
        return transformers.Gemma3TextConfig(hidden_size=64, head_dim=64, **small)
    if family == "phi3":  # head_dim = hidden_size / heads
        return transformers.Phi3Config(hidden_size=160, pad_token_id=0, eos_token_id=1, bos_token_id=2, **small)
    if family == "qwen3":
        return transformers.Qwen3Config(hidden_size=64, head_dim=128, **small)
    if family == "stablelm":  # rotary on a quarter of each head, LayerNorm, q/k/v biases
        return transformers.StableLmConfig(hidden_size=128, use_qkv_bias=True, **small)
    if family == "glm":
        return transformers.GlmConfig(hidden_size=128, head_dim=64, pad_token_id=0, **small)
    raise ValueError(f"unknown family {family}; known: {', '.join(FAMILIES + MORE_FAMILIES)}")


def _model(family: str, attention: str, dtype: str = "float32", overrides: dict | None = None):
    import torch
    import transformers

    config = tiny_config(family, **(overrides or {}))
    config._attn_implementation = attention  # noqa: SLF001 - how transformers picks the attention function
    torch.manual_seed(0)
    return transformers.AutoModelForCausalLM.from_config(config).eval().to(getattr(torch, dtype))


def _wrappers():
    import torch

    class Prefill(torch.nn.Module):
        """input_ids, attention_mask -> logits (an explicit attention_mask keeps transformers off its
        packed-sequence detection)."""

        def __init__(self, model):
            super().__init__()
            self.model = model

        def forward(self, input_ids, attention_mask):
            return self.model(input_ids=input_ids, attention_mask=attention_mask, use_cache=False).logits

    class Decode(torch.nn.Module):
        """input_ids, attention_mask [batch, past + seq], position_ids, past keys and values per layer ->
        logits, present keys and values per layer (past + seq long)."""

        def __init__(self, model):
            super().__init__()
            self.model = model

        def forward(self, input_ids, attention_mask, position_ids, *past):
            from transformers import DynamicCache

            pairs = [(past[2 * i], past[2 * i + 1]) for i in range(len(past) // 2)]
            cache = DynamicCache(ddp_cache_data=pairs, config=self.model.config)
            out = self.model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                             past_key_values=cache, use_cache=True)
            present = []
            for layer in out.past_key_values.layers:
                present += [layer.keys, layer.values]
            return (out.logits, *present)

    return Prefill, Decode


def export_hf(family: str, dynamo: bool, cache: bool, folder, dtype: str = "float32",
              overrides: dict | None = None) -> Path:
    """dtype: the model's weights and caches (float16 for the GPU engine; the file name then says so)."""
    import torch

    suffix = ("" if dtype == "float32" else f"-{dtype}") + "".join(f"-{k}{v}" for k, v in (overrides or {}).items())
    path = Path(folder) / (f"{family}-{'dynamo' if dynamo else 'torchscript'}-{'decode' if cache else 'prefill'}"
                           f"{suffix}.onnx")
    model = _model(family, "sdpa" if dynamo else "eager", dtype, overrides)
    config = model.config
    prefill, decode = _wrappers()
    ids = torch.randint(0, VOCAB, (BATCH, SEQ))
    names = ["input_ids", "attention_mask"]
    outputs = ["logits"]
    if cache:
        kv_heads = getattr(config, "num_key_value_heads", None) or config.num_attention_heads
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        layers = config.num_hidden_layers  # LAYERS unless `overrides` set it (real shapes for the GPU engine)
        past = [torch.randn(BATCH, kv_heads, PAST, head_dim, dtype=getattr(torch, dtype)) for _ in range(2 * layers)]
        args = (ids, torch.ones(BATCH, PAST + SEQ, dtype=torch.int64),
                torch.arange(PAST, PAST + SEQ).expand(BATCH, SEQ).contiguous(), *past)
        names += ["position_ids"] + [f"past_key_values.{i}.{kind}" for i in range(layers) for kind in ("key", "value")]
        outputs += [f"present.{i}.{kind}" for i in range(layers) for kind in ("key", "value")]
        module = decode(model)
    else:
        args = (ids, torch.ones_like(ids))
        module = prefill(model)
    axes = {"input_ids": {0: "batch", 1: "seq"}, "attention_mask": {0: "batch", 1: "total" if cache else "seq"},
            "position_ids": {0: "batch", 1: "seq"}, "logits": {0: "batch", 1: "seq"}}
    for name in names[3:]:
        axes[name] = {0: "batch", 2: "past"}
    for name in outputs[1:]:
        axes[name] = {0: "batch", 2: "total"}
    axes = {name: dims for name, dims in axes.items() if name in names + outputs}
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the exporters' deprecation and tracer warnings
            if dynamo:
                dims = {}
                for name, spec in axes.items():
                    if name in names:
                        dims[name] = dict(spec)  # named dynamic dims (torch.onnx.export names them so)
                shapes = [dims[name] for name in names]
                if cache:  # the past tensors are one *past argument
                    shapes = shapes[:3] + [tuple(shapes[3:])]
                torch.onnx.export(module, args, str(path), dynamo=True, input_names=names, output_names=outputs,
                                  dynamic_shapes=tuple(shapes), verbose=False)
            else:
                torch.onnx.export(module, args, str(path), dynamo=False, opset_version=17, input_names=names,
                                  output_names=outputs, dynamic_axes=axes)
    except Exception as exc:  # noqa: BLE001 - the exporter's own error is the reason we report
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ExportUnsupported(f"torch {torch.__version__} cannot export {path.stem}: {type(exc).__name__}: "
                                f"{first[:300]}") from exc
    return path


def cached_exporter(folder):
    """get(family, dynamo, cache, overrides=None) -> the path of that export in `folder`, exported on first use; a
    combination the installed torch/transformers cannot export skips the calling test with the exporter's reason."""
    import pytest

    done = {}

    def get(family: str, dynamo: bool, cache: bool, overrides: dict | None = None) -> Path:
        key = (family, dynamo, cache, tuple(sorted((overrides or {}).items())))
        if key not in done:
            try:
                done[key] = export_hf(family, dynamo, cache, folder, overrides=overrides)
            except ExportUnsupported as exc:
                done[key] = exc
        if isinstance(done[key], Exception):
            pytest.skip(str(done[key]))
        return done[key]

    return get
