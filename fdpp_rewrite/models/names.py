"""Our canonical weight names and their shapes. Every loader produces exactly these names, the reference model
and the exporter consume exactly these. Linear weights keep the torch layout [out_features, in_features].

    embed.weight                     [vocab, hidden]
    pos_embed.weight                 [max_position + offset, hidden]        (learned positions only)
    layers.{i}.attn_norm.weight      [hidden]         (+ .bias for LayerNorm)
    layers.{i}.attn.q.weight         [heads * head_dim, hidden]             (+ .bias with qkv_bias)
    layers.{i}.attn.k.weight         [kv_heads * head_dim, hidden]          (+ .bias with qkv_bias)
    layers.{i}.attn.v.weight         [kv_heads * head_dim, hidden]          (+ .bias with qkv_bias)
    layers.{i}.attn.q_norm.weight    [head_dim]                             (qk_norm only)
    layers.{i}.attn.k_norm.weight    [head_dim]                             (qk_norm only)
    layers.{i}.attn.o.weight         [hidden, heads * head_dim]             (+ .bias with linear_bias)
    layers.{i}.attn_post_norm.weight [hidden]                               (post_norms only)
    layers.{i}.mlp_norm.weight       [hidden]         (+ .bias for LayerNorm)
    layers.{i}.mlp.gate.weight       [intermediate, hidden]                 (SwiGLU, GeGLU only)
    layers.{i}.mlp.up.weight         [intermediate, hidden]                 (+ .bias with linear_bias)
    layers.{i}.mlp.down.weight       [hidden, intermediate]                 (+ .bias with linear_bias)
    layers.{i}.mlp_post_norm.weight  [hidden]                               (post_norms only)
    final_norm.weight                [hidden]         (+ .bias for LayerNorm)
    lm_head.weight                   [vocab, hidden]                        (absent when tied)

Q and K rows are in the order our rotary code expects: rotate-half pairs (i, i + R/2) for llama, qwen2 and mistral,
adjacent pairs (2i, 2i + 1) for chatglm. Loaders that read other layouts (GGUF, GPT-NeoX's per-head fused qkv)
convert on the way in. Norm weights are the scale itself (Gemma's 1 + weight, see config.py).
"""

from fdpp_rewrite.models.config import ModelConfig


def layer_shapes(config: ModelConfig, i: int) -> dict[str, tuple[int, ...]]:
    """Name -> shape of every weight of layer i, in a fixed order (the order they are exported in)."""
    c = config
    p = f"layers.{i}."
    shapes: dict[str, tuple[int, ...]] = {}

    def norm(name, size=c.hidden_size):
        shapes[p + name + ".weight"] = (size,)
        if c.norm == "layernorm":
            shapes[p + name + ".bias"] = (size,)

    def linear(name, out_features, in_features, bias):
        shapes[p + name + ".weight"] = (out_features, in_features)
        if bias:
            shapes[p + name + ".bias"] = (out_features,)

    norm("attn_norm")
    linear("attn.q", c.q_dim, c.hidden_size, c.qkv_bias)
    linear("attn.k", c.kv_dim, c.hidden_size, c.qkv_bias)
    linear("attn.v", c.kv_dim, c.hidden_size, c.qkv_bias)
    if c.qk_norm:
        norm("attn.q_norm", c.head_dim)
        norm("attn.k_norm", c.head_dim)
    linear("attn.o", c.hidden_size, c.q_dim, c.linear_bias)
    if c.post_norms:
        norm("attn_post_norm")
    norm("mlp_norm")
    if c.gated_mlp:
        linear("mlp.gate", c.intermediate_size, c.hidden_size, c.linear_bias)
    linear("mlp.up", c.intermediate_size, c.hidden_size, c.linear_bias)
    linear("mlp.down", c.hidden_size, c.intermediate_size, c.linear_bias)
    if c.post_norms:
        norm("mlp_post_norm")
    return shapes


def head_shapes(config: ModelConfig) -> dict[str, tuple[int, ...]]:
    """The weights before the first layer: token (and position) embeddings."""
    shapes = {"embed.weight": (config.vocab_size, config.hidden_size)}
    if config.learned_positions:
        shapes["pos_embed.weight"] = (config.max_position + config.position_offset, config.hidden_size)
    return shapes


def tail_shapes(config: ModelConfig) -> dict[str, tuple[int, ...]]:
    """The weights after the last layer: final norm and (untied) lm_head."""
    shapes = {"final_norm.weight": (config.hidden_size,)}
    if config.norm == "layernorm":
        shapes["final_norm.bias"] = (config.hidden_size,)
    if not config.tie_embeddings:
        shapes["lm_head.weight"] = (config.vocab_size, config.hidden_size)
    return shapes


def weight_shapes(config: ModelConfig) -> dict[str, tuple[int, ...]]:
    """Every canonical weight of the model, in export order."""
    shapes = head_shapes(config)
    for i in range(config.num_layers):
        shapes.update(layer_shapes(config, i))
    shapes.update(tail_shapes(config))
    return shapes


def parameter_count(config: ModelConfig) -> int:
    total = 0
    for shape in weight_shapes(config).values():
        n = 1
        for d in shape:
            n *= d
        total += n
    return total
