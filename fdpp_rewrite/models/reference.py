"""A small, readable torch model for every family: the ground truth the exported ONNX graph is checked against.

It computes exactly what the exported graph computes, in the same order: the KV cache is a preallocated
[batch, kv_heads, max_cache, head_dim] tensor per layer, written in place at positions past_len[b] + i, and
every query attends to the keys at positions <= its own. Norms, RoPE angles and softmax run in float32."""

import math
from collections.abc import Callable, Mapping

import torch
import torch.nn.functional as F

from fdpp_rewrite.errors import FdppError
from fdpp_rewrite.models.config import ModelConfig
from fdpp_rewrite.models.names import weight_shapes

# score_hook(layer, scores, mask): scores [B, Hq, S, L] scaled q.k before the mask, mask [B, 1, S, L] additive
ScoreHook = Callable[[int, torch.Tensor, torch.Tensor], None]


def rope_inv_freq(config: ModelConfig, theta: float | None = None) -> torch.Tensor:
    """theta^(-2i/R) for i < R/2, R = the rotated channels per head, with the config's rope scaling applied
    (the one place it is computed: the exporter bakes this table into the graph). A `theta` other than the
    config's rope_theta is a local layer's base (gemma3): plain RoPE, unscaled."""
    c = config
    r = c.rope_dim
    theta = c.rope_theta if theta is None else theta
    inv_freq = 1.0 / theta ** (torch.arange(0, r, 2, dtype=torch.float32) / r)
    if theta != c.rope_theta:
        return inv_freq
    if c.rope_type == "linear":  # positions divided by the factor
        return inv_freq / c.rope_factor
    if c.rope_type == "llama3":
        # Llama 3.1: long wavelengths (low frequencies) are slowed down by the factor, short ones kept, and the
        # band between moves smoothly from one to the other.
        wavelength = 2 * math.pi / inv_freq
        original = c.rope_original_max_position
        low, high = c.rope_low_freq_factor, c.rope_high_freq_factor
        smooth = (original / wavelength - low) / (high - low)  # 0 at wavelength original / low, 1 at original / high
        blended = (1 - smooth) * inv_freq / c.rope_factor + smooth * inv_freq
        scaled = torch.where(wavelength > original / low, inv_freq / c.rope_factor, blended)
        return torch.where(wavelength < original / high, inv_freq, scaled)
    return inv_freq  # default, and dynamic below its max_position (see config.ROPE_TYPES)


class ReferenceModel:
    def __init__(self, config: ModelConfig, weights: Mapping):
        self.config = config
        missing = [name for name in weight_shapes(config) if name not in weights]
        if missing:
            raise FdppError(f"weights lack {', '.join(missing[:4])}{' ...' if len(missing) > 4 else ''}")
        self.w = {name: weights[name] for name in weight_shapes(config)}
        self.dtype = self.w["embed.weight"].dtype
        thetas = {config.layer_rope_theta(i) for i in range(config.num_layers)} if config.rope_dim else ()
        self.inv_freq = {theta: rope_inv_freq(config, theta) for theta in thetas}

    def new_caches(self, batch: int, max_cache: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
        c = self.config
        shape = (batch, c.num_kv_heads, max_cache, c.head_dim)
        return [(torch.zeros(shape, dtype=self.dtype), torch.zeros(shape, dtype=self.dtype))
                for _ in range(c.num_layers)]

    @torch.no_grad()
    def forward(self, input_ids: torch.Tensor, past_len: torch.Tensor, caches, score_hook: ScoreHook | None = None):
        """logits [B, S, vocab] for input_ids [B, S] at positions past_len[b] + (0..S-1); caches updated in place."""
        c = self.config
        batch, seq = input_ids.shape
        max_cache = caches[0][0].shape[2]
        positions = past_len.long()[:, None] + torch.arange(seq)[None, :]  # [B, S]
        if int(positions.max()) >= max_cache:
            raise FdppError(f"positions up to {int(positions.max())} do not fit a cache of {max_cache}")

        x = self.w["embed.weight"][input_ids]
        if c.scale_embeddings:
            x = x * torch.tensor(math.sqrt(c.hidden_size), dtype=x.dtype)
        if c.learned_positions:
            x = x + self.w["pos_embed.weight"][positions + c.position_offset]

        keys = torch.arange(max_cache)[None, None, :]
        causal = keys <= positions[:, :, None]  # [B, S, L]

        def mask_of(window):
            visible = causal & (keys > positions[:, :, None] - window) if window else causal
            return torch.zeros(visible.shape, dtype=torch.float32).masked_fill(~visible, -math.inf)[:, None]

        # an unmasked window (mistral) is the model's own rule; exports stay inside it, where it masks nothing
        masks = {window: mask_of(window) for window in {c.layer_window(i) for i in range(c.num_layers)}}
        unmasked = mask_of(c.sliding_window) if c.window_unmasked else None
        angles = {theta: positions.float()[..., None] * inv_freq for theta, inv_freq in self.inv_freq.items()}

        for i in range(c.num_layers):
            p = f"layers.{i}."
            attn = self._attention(i, self._norm(x, p + "attn_norm"), positions,
                                   angles.get(c.layer_rope_theta(i)), masks[c.layer_window(i)] if unmasked is None
                                   else unmasked, caches[i], score_hook)
            if c.post_norms:
                attn = self._norm(attn, p + "attn_post_norm")
            if c.parallel_residual:
                x = x + (self._mlp(p, self._norm(x, p + "mlp_norm")) + attn)
                continue
            x = x + attn
            mlp = self._mlp(p, self._norm(x, p + "mlp_norm"))
            x = x + (self._norm(mlp, p + "mlp_post_norm") if c.post_norms else mlp)
        x = self._norm(x, "final_norm")
        head = self.w["embed.weight" if c.tie_embeddings else "lm_head.weight"]
        logits = x @ head.T
        return soft_cap(logits, c.final_softcap) if c.final_softcap else logits

    __call__ = forward

    # -- pieces ---------------------------------------------------------------------------------------------

    def _linear(self, x, name):
        y = x @ self.w[name + ".weight"].T
        bias = self.w.get(name + ".bias")
        return y if bias is None else y + bias

    def _norm(self, x, name):
        weight = self.w[name + ".weight"]
        x32 = x.float()
        if self.config.norm == "layernorm":
            y = F.layer_norm(x32, (x.shape[-1],), weight.float(), self.w[name + ".bias"].float(),
                             self.config.norm_eps)
            return y.to(x.dtype)
        y = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.config.norm_eps)
        return y.to(x.dtype) * weight

    def _rotate(self, x, angles):
        """RoPE on the first rope_dim channels of x [B, H, S, D]; angles [B, S, R/2]."""
        r = self.config.rope_dim
        x_rot, x_pass = x[..., :r].float(), x[..., r:]
        cos, sin = angles.cos()[:, None], angles.sin()[:, None]  # [B, 1, S, R/2]
        if self.config.rope_interleaved:  # pairs (2j, 2j + 1)
            x0, x1 = x_rot[..., 0::2], x_rot[..., 1::2]
            rotated = torch.stack((x0 * cos - x1 * sin, x1 * cos + x0 * sin), dim=-1).flatten(-2)
        else:  # pairs (j, j + R/2)
            x0, x1 = x_rot[..., : r // 2], x_rot[..., r // 2:]
            rotated = torch.cat((x0 * cos - x1 * sin, x1 * cos + x0 * sin), dim=-1)
        return torch.cat((rotated.to(x.dtype), x_pass), dim=-1)

    def _attention(self, i, h, positions, angles, mask, cache, score_hook):
        c = self.config
        p = f"layers.{i}.attn."
        batch, seq, _ = h.shape
        q = self._linear(h, p + "q").view(batch, seq, c.num_heads, c.head_dim).transpose(1, 2)
        k = self._linear(h, p + "k").view(batch, seq, c.num_kv_heads, c.head_dim).transpose(1, 2)
        v = self._linear(h, p + "v").view(batch, seq, c.num_kv_heads, c.head_dim).transpose(1, 2)
        if c.qk_norm:
            q, k = self._norm(q, p + "q_norm"), self._norm(k, p + "k_norm")
        if angles is not None:
            q, k = self._rotate(q, angles), self._rotate(k, angles)

        k_cache, v_cache = cache
        for b in range(batch):  # write the new tokens in place; nothing else in the cache moves
            k_cache[b][:, positions[b]] = k[b]
            v_cache[b][:, positions[b]] = v[b]

        max_cache = k_cache.shape[2]
        groups = c.group_size
        q5 = q.reshape(batch, c.num_kv_heads, groups, seq, c.head_dim)
        scores = q5 @ k_cache[:, :, None].transpose(-1, -2) * c.scores_scale  # [B, Hkv, G, S, L]
        scores = scores.reshape(batch, c.num_heads, seq, max_cache)
        if c.attn_softcap:
            scores = soft_cap(scores, c.attn_softcap)
        if score_hook is not None:
            score_hook(i, scores, mask)
        probs = torch.softmax(scores.float() + mask, dim=-1).to(q.dtype)
        out = probs.reshape(batch, c.num_kv_heads, groups, seq, max_cache) @ v_cache[:, :, None]
        out = out.reshape(batch, c.num_heads, seq, c.head_dim).transpose(1, 2).reshape(batch, seq, c.q_dim)
        return self._linear(out, p + "o")

    def _mlp(self, p, h):
        activation = self.config.activation
        if self.config.gated_mlp:
            gate = self._linear(h, p + "mlp.gate")
            gate = F.silu(gate) if activation == "swiglu" else F.gelu(gate, approximate="tanh")
            hidden = gate * self._linear(h, p + "mlp.up")
        elif activation in ("gelu_tanh", "gelu"):
            hidden = F.gelu(self._linear(h, p + "mlp.up"), approximate="tanh" if activation == "gelu_tanh" else "none")
        else:
            hidden = torch.relu(self._linear(h, p + "mlp.up"))
        return self._linear(hidden, p + "mlp.down")


def soft_cap(x: torch.Tensor, cap: float) -> torch.Tensor:
    """cap * tanh(x / cap): Gemma 2's soft-capping of attention scores and logits."""
    return torch.tanh(x / cap) * cap
