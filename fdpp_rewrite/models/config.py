"""ModelConfig: everything the reference model and the exporter need to know about an architecture.

The families share one decoder-only layout (embedding, N x [norm, attention, residual, norm, MLP, residual],
final norm, lm_head) and differ only in the switches below:

    family   norm       MLP                 positions            biases
    llama    RMSNorm    SwiGLU (gate, up)   RoPE, rotate-half    none (qkv_bias optional); Llama 3 rope scaling
    qwen2    RMSNorm    SwiGLU (gate, up)   RoPE, rotate-half    q, k, v only
    mistral  RMSNorm    SwiGLU (gate, up)   RoPE, rotate-half    none; sliding-window attention
    opt      LayerNorm  ReLU (up = fc1)     learned, offset 2    every linear and norm
    gpt2     LayerNorm  GELU (tanh approx)  learned, offset 0    every linear and norm
    chatglm  RMSNorm    SwiGLU (gate, up)   RoPE on half of each head, interleaved pairs   qkv only
    gemma    RMSNorm    GeGLU (gate, up)    RoPE, rotate-half    none; embeddings scaled by sqrt(hidden)
    gemma2   gemma's, with norms after attention and MLP too, soft-capped scores and logits, local layers
    gemma3   gemma2's without the caps, with q/k RMSNorm and a rope base of its own on the local layers
    phi3     RMSNorm    SwiGLU (fused gate_up)  RoPE, rotate-half (fused qkv)  none
    qwen3    RMSNorm    SwiGLU (gate, up)   RoPE, rotate-half    none; q/k RMSNorm per head
    stablelm LayerNorm  SwiGLU (gate, up)   RoPE on the first rotary_dim channels    q, k, v optional
    gpt_neox LayerNorm  GELU (erf)          RoPE on the first rotary_dim channels    every linear; parallel residual

Gemma's RMSNorm scales by (1 + weight): loaders store the scale itself (1 + weight), so norms are plain RMSNorm.

Sliding windows come in two kinds. Without layer_types (mistral, qwen2) the window is not masked by the exported
graph: max_position is at most the window, so every sequence fits it and full causal attention is exact. With
layer_types (gemma2, gemma3, phi3) each "sliding_attention" layer masks its window in the graph (a mask of its own),
so sequences may be as long as max_position.
"""

from dataclasses import asdict, dataclass, fields, replace

from fdpp_rewrite.errors import FdppError

FAMILIES = ("llama", "qwen2", "mistral", "opt", "gpt2", "chatglm", "gemma", "gemma2", "gemma3", "phi3", "qwen3",
            "stablelm", "gpt_neox")
# swiglu: silu(gate) * up; geglu: gelu_tanh(gate) * up; relu, gelu_tanh, gelu (erf): act(up)
ACTIVATIONS = ("swiglu", "geglu", "relu", "gelu_tanh", "gelu")
GATED_ACTIVATIONS = ("swiglu", "geglu")
LAYER_TYPES = ("full_attention", "sliding_attention")
# RoPE scalings (Hugging Face's rope_type), each a fixed change of the inverse frequencies (reference.rope_inv_freq).
# "dynamic" (NTK) rescales only past max_position_embeddings, which is where our max_position stops: below it the
# frequencies are plain RoPE's.
ROPE_TYPES = ("default", "linear", "llama3", "dynamic")


@dataclass(frozen=True)
class ModelConfig:
    family: str                 # one of FAMILIES
    hidden_size: int
    intermediate_size: int      # MLP width (per branch for SwiGLU)
    num_layers: int
    num_heads: int              # query heads
    num_kv_heads: int           # key/value heads (== num_heads for MHA, 1 or a divisor for MQA/GQA)
    head_dim: int
    vocab_size: int
    max_position: int           # longest sequence the position encoding supports
    norm_eps: float
    rope_theta: float = 10000.0  # RoPE base (unused with learned positions)
    rotary_dim: int = 0          # channels of each head that RoPE rotates; 0 means head_dim
    rope_interleaved: bool = False  # pairs (x[2i], x[2i+1]) (chatglm) instead of (x[i], x[i+D/2]) (HF llama)
    tie_embeddings: bool = False  # lm_head shares the token embedding matrix
    qkv_bias: bool = False       # bias on the q, k, v projections
    linear_bias: bool = False    # bias on the attention output and MLP projections
    norm: str = "rmsnorm"        # "rmsnorm" | "layernorm" (layernorm has a bias)
    activation: str = "swiglu"   # "swiglu" (silu(gate) * up) | "relu" (relu(up)) | "gelu_tanh" (gelu(up), tanh form)
    learned_positions: bool = False  # OPT, GPT-2: a position embedding table added to the token embedding
    position_offset: int = 0     # OPT stores position p at row p + 2
    rope_type: str = "default"   # one of ROPE_TYPES
    rope_factor: float = 1.0     # linear, llama3: how much longer the context is than the one trained at first
    rope_low_freq_factor: float = 1.0    # llama3: wavelengths above original / low are divided by the factor
    rope_high_freq_factor: float = 4.0   # llama3: wavelengths below original / high are kept
    rope_original_max_position: int = 0  # llama3: the context length before the extension
    sliding_window: int = 0      # each query sees only this many latest keys (mistral); 0: no window
    layer_types: tuple = ()      # per layer, one of LAYER_TYPES: the window is masked in the graph (see above)
    rope_local_theta: float = 0.0  # RoPE base of the sliding layers (gemma3); 0: rope_theta
    scale_embeddings: bool = False  # token embeddings multiplied by sqrt(hidden_size) (gemma)
    post_norms: bool = False     # a norm on the attention and MLP outputs before each residual add (gemma2, gemma3)
    qk_norm: bool = False        # RMSNorm over each head's channels of q and k, before RoPE (qwen3, gemma3)
    attn_scale: float = 0.0      # the scores' scale; 0: 1 / sqrt(head_dim) (gemma2/3: query_pre_attn_scalar^-0.5)
    attn_softcap: float = 0.0    # scores = cap * tanh(scores / cap) before the mask (gemma2); 0: none
    final_softcap: float = 0.0   # logits = cap * tanh(logits / cap) (gemma2); 0: none
    parallel_residual: bool = False  # x + attn(norm1(x)) + mlp(norm2(x)) (gpt_neox)

    def __post_init__(self):
        object.__setattr__(self, "layer_types", tuple(self.layer_types))  # from JSON: a list
        problems = []
        if self.family not in FAMILIES:
            problems.append(f"family {self.family!r} is not one of {', '.join(FAMILIES)}")
        for name in ("hidden_size", "intermediate_size", "num_layers", "num_heads", "num_kv_heads", "head_dim",
                     "vocab_size", "max_position"):
            if getattr(self, name) <= 0:
                problems.append(f"{name} must be positive, got {getattr(self, name)}")
        if self.num_kv_heads > 0 and self.num_heads % self.num_kv_heads:
            problems.append(f"num_heads {self.num_heads} is not a multiple of num_kv_heads {self.num_kv_heads}")
        if self.rotary_dim % 2 or self.rotary_dim > self.head_dim or self.head_dim % 2:
            problems.append(f"rotary_dim {self.rotary_dim} must be even and at most head_dim {self.head_dim}")
        if self.norm not in ("rmsnorm", "layernorm"):
            problems.append(f"norm {self.norm!r} is not rmsnorm or layernorm")
        if self.activation not in ACTIVATIONS:
            problems.append(f"activation {self.activation!r} is not one of {', '.join(ACTIVATIONS)}")
        if self.rope_type not in ROPE_TYPES:
            problems.append(f"rope_type {self.rope_type!r} is not one of {', '.join(ROPE_TYPES)}")
        if self.rope_type == "llama3" and (self.rope_original_max_position <= 0
                                           or self.rope_high_freq_factor <= self.rope_low_freq_factor):
            problems.append("llama3 rope scaling needs rope_original_max_position > 0 and "
                            "rope_high_freq_factor > rope_low_freq_factor")
        if self.rope_factor <= 0:
            problems.append(f"rope_factor must be positive, got {self.rope_factor}")
        if self.layer_types and (len(self.layer_types) != self.num_layers
                                 or not set(self.layer_types) <= set(LAYER_TYPES)):
            problems.append(f"layer_types must give one of {', '.join(LAYER_TYPES)} for each of the "
                            f"{self.num_layers} layers")
        if "sliding_attention" in self.layer_types and self.sliding_window <= 0:
            problems.append("sliding_attention layers need a positive sliding_window")
        if self.window_unmasked and self.max_position > self.sliding_window:
            problems.append(f"max_position {self.max_position} exceeds sliding_window {self.sliding_window} "
                            "(the exported graph does not mask the window)")
        if problems:
            raise FdppError("invalid model config: " + "; ".join(problems))

    @property
    def rope_dim(self) -> int:
        """Channels per head that RoPE rotates (0 when positions are learned)."""
        if self.learned_positions:
            return 0
        return self.rotary_dim or self.head_dim

    def position_limit_reason(self) -> str:
        """Why sequences stop at max_position when that is not simply the model's trained length ("" then),
        for the errors that enforce the limit."""
        if self.window_unmasked and self.max_position == self.sliding_window:
            return (f"{self.family} attends within a sliding window of {self.sliding_window} tokens, which the "
                    "exported graph does not mask: sequences must fit the window")
        if self.rope_type == "dynamic":
            return f"dynamic NTK RoPE is plain RoPE up to {self.max_position} positions and rescales beyond"
        return ""

    @property
    def window_unmasked(self) -> bool:
        """A sliding window that the exported graph does not mask (mistral, qwen2): sequences must fit it."""
        return bool(self.sliding_window) and not self.layer_types

    def layer_window(self, i: int) -> int:
        """The window that layer i masks in the graph (0: none)."""
        return self.sliding_window if self.layer_types and self.layer_types[i] == "sliding_attention" else 0

    def layer_rope_theta(self, i: int) -> float:
        """The RoPE base of layer i: the local one on sliding layers where the model has one (gemma3)."""
        return self.rope_local_theta if self.rope_local_theta and self.layer_window(i) else self.rope_theta

    @property
    def scores_scale(self) -> float:
        return self.attn_scale or self.head_dim ** -0.5

    @property
    def group_size(self) -> int:
        """Query heads per KV head (G in the attention chain)."""
        return self.num_heads // self.num_kv_heads

    @property
    def q_dim(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        return self.num_kv_heads * self.head_dim

    @property
    def gated_mlp(self) -> bool:
        return self.activation in GATED_ACTIVATIONS

    def with_layers(self, num_layers: int | None) -> "ModelConfig":
        """The same architecture with its first `num_layers` layers (1 to its own count); None keeps them all."""
        if num_layers is None:
            return self
        if num_layers <= 0:
            raise FdppError(f"--layers must be positive, got {num_layers}")
        if num_layers > self.num_layers:  # e.g. --layers 32 of smollm2-135m, which has 30
            raise FdppError(f"--layers {num_layers} is more than the model has: it has {self.num_layers} layers; "
                            f"pass --layers {self.num_layers} or fewer")
        return replace(self, num_layers=num_layers, layer_types=self.layer_types[:num_layers])

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> "ModelConfig":
        known = {f.name for f in fields(cls)}
        unknown = set(data) - known
        if unknown:
            raise FdppError(f"unknown model config keys {sorted(unknown)}; was the file written by another version?")
        return cls(**data)
