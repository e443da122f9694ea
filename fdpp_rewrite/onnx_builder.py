"""The exported graph, built node by node from a ModelConfig (no tracing: torch.onnx.export would need the whole
model in memory). Its shape is the contract the rewriter relies on
(tests/rewrite_graphs.py builds the same shape by hand):

    inputs   input_ids int64 [batch, seq], past_len int64 [batch], key_cache.i / value_cache.i
             [batch, kv_heads, max_cache, head_dim]
    outputs  logits [batch, seq, vocab], key_cache_out.i / value_cache_out.i (the caches after ScatterND)
    linears  MatMul(x, W_t) with W_t a [K, N] initializer (+ Add(bias))
    attention
        q [B, Hq, S, D] -Reshape-> [B, Hkv, G, S, D]
        k_all, v_all (updated caches) -Unsqueeze(2)-> [B, Hkv, 1, L, D]
        MatMul(q5, Transpose(k5, [0,1,2,4,3])) -> Mul(scale) -> [Div(cap) -> Tanh -> Mul(cap)]
        -> Add(mask [B,1,1,S,L]) -> Softmax(-1) -> MatMul(probs, v5) -> Reshape [B, Hq, S, D]
        (the soft cap with attn_softcap only; a sliding layer's mask also hides keys older than its window)

Weights are fetched, converted and streamed to the external data file one layer at a time."""

import math

import numpy as np
import onnx
from onnx import TensorProto, helper

from fdpp_rewrite.dtypes import numpy_type, onnx_type_of, torch_to_numpy
from fdpp_rewrite.models.config import ModelConfig
from fdpp_rewrite.models.reference import rope_inv_freq
from fdpp_rewrite.onnx_graph import ExternalDataWriter, GraphBuilder

OPSET = 17
IR_VERSION = 8  # the IR version that introduced opset 17; older readers (TensorRT's parser) accept it

I64 = np.int64
F32 = np.float32


class DecoderGraph:
    def __init__(self, config: ModelConfig, weights, dtype: str, max_cache: int | None,
                 external: ExternalDataWriter):
        self.c = config
        self.max_cache_dim = max_cache if max_cache else "max_cache"  # None: a symbolic cache length
        self.weights = weights
        self.np_dtype = numpy_type(dtype)
        self.onnx_dtype = onnx_type_of(dtype)
        self.g = GraphBuilder(external)
        self.num_params = 0

    # -- small helpers -----------------------------------------------------------------------------------

    def _tensor(self, name: str) -> np.ndarray:
        tensor = self.weights[name]
        self.num_params += tensor.numel()
        return self._array(tensor)

    def _array(self, tensor) -> np.ndarray:
        """A weight (a torch tensor, already rounded to the model dtype by Weights) as numpy, bits unchanged."""
        return torch_to_numpy(tensor).astype(self.np_dtype, copy=False)

    def _transposed(self, name: str, *, counted: bool = True) -> np.ndarray:
        """weight `name` transposed into a contiguous [K, N] array (torch's copy: a few times numpy's on big tables)."""
        tensor = self.weights[name]
        self.num_params += tensor.numel() if counted else 0
        return self._array(tensor.t().contiguous())

    def param(self, name: str) -> str:
        """An initializer holding weight `name` as is (norm scales, biases, embedding tables)."""
        return self.g.weight(name, self._tensor(name))

    def linear(self, x: str, name: str, bias: bool) -> str:
        """MatMul(x, W_t) (+ Add(bias)), with W_t = weight.T stored as a [K, N] initializer."""
        w_t = self.g.weight(name + ".weight_t", self._transposed(name + ".weight"))
        y = self.g.op("MatMul", [x, w_t])
        return self.g.op("Add", [y, self.param(name + ".bias")]) if bias else y

    def scalar(self, value) -> str:
        return self.g.const(value, self.np_dtype)

    def ints(self, values) -> str:
        return self.g.const(values, I64)

    def to_model_dtype(self, x: str) -> str:
        return x if self.np_dtype == F32 else self.g.op("Cast", [x], to=self.onnx_dtype)

    def to_float32(self, x: str) -> str:
        return x if self.np_dtype == F32 else self.g.op("Cast", [x], to=TensorProto.FLOAT)

    # -- shared per-step tensors: positions, mask, scatter indices, rotary tables ------------------------

    def prologue(self):
        g, c = self.g, self.c
        g.scope = "prologue"
        ids_shape = g.op("Shape", ["input_ids"])
        batch = g.op("Gather", [ids_shape, self.g.const(0, I64)])
        seq = g.op("Gather", [ids_shape, self.g.const(1, I64)])
        max_cache = g.op("Gather", [g.op("Shape", ["key_cache.0"]), self.g.const(2, I64)])
        zero, one = self.g.const(0, I64), self.g.const(1, I64)

        # positions[b, i] = past_len[b] + i
        steps = g.op("Range", [zero, seq, one])
        self.positions = g.op("Add", [g.op("Unsqueeze", ["past_len", self.ints([1])]),
                                      g.op("Unsqueeze", [steps, self.ints([0])])])

        # additive masks [B, 1, 1, S, L]: 0 where key j <= position of query i (and, on a sliding layer,
        # j > position - window), -inf elsewhere; one per window size the layers use
        keys = g.op("Range", [zero, max_cache, one])
        query_positions = g.op("Unsqueeze", [self.positions, self.ints([2])])
        causal = g.op("LessOrEqual", [keys, query_positions])
        self.masks = {}
        for window in sorted({c.layer_window(i) for i in range(c.num_layers)}):
            visible = causal
            if window:
                oldest = g.op("Sub", [query_positions, self.g.const(window, I64)])
                visible = g.op("And", [causal, g.op("Greater", [keys, oldest])])
            mask = g.op("Where", [visible, self.scalar(0.0), self.scalar(-np.inf)])
            self.masks[window] = g.op("Unsqueeze", [mask, self.ints([1, 2])])

        # ScatterND indices [B, Hkv, S, 3] = (b, h, positions[b, s]): where the new K/V rows go
        target = g.op("Concat", [g.op("Unsqueeze", [batch, self.ints([0])]), self.ints([c.num_kv_heads]),
                                 g.op("Unsqueeze", [seq, self.ints([0])])], axis=0)
        b_index = g.op("Reshape", [g.op("Range", [zero, batch, one]), self.ints([-1, 1, 1])])
        h_index = self.ints(np.arange(c.num_kv_heads).reshape(1, -1, 1))
        s_index = g.op("Unsqueeze", [self.positions, self.ints([1])])
        parts = [g.op("Unsqueeze", [g.op("Expand", [index, target]), self.ints([-1])])
                 for index in (b_index, h_index, s_index)]
        self.scatter_indices = g.op("Concat", parts, axis=-1)

        # rotary (cos, sin) tables, one per RoPE base the layers use (gemma3's local layers have their own)
        self.rotary = {}
        if c.rope_dim:
            for theta in sorted({c.layer_rope_theta(i) for i in range(c.num_layers)}):
                self.rotary[theta] = self._rotary_tables(rope_inv_freq(c, theta))

    def _rotary_tables(self, inv_freq) -> tuple[str, str]:
        g, c = self.g, self.c
        # angles in float32: fp16 cannot even represent positions above 2048 exactly
        positions = g.op("Cast", [g.op("Unsqueeze", [self.positions, self.ints([2])])], to=TensorProto.FLOAT)
        angles = g.op("Mul", [positions, g.const(inv_freq.numpy(), F32)])  # [B, S, R/2]
        if c.rope_interleaved:
            axes = self.ints([1, 4])  # [B, 1, S, R/2, 1]: one angle per adjacent pair
        else:
            angles = g.op("Concat", [angles, angles], axis=-1)  # [B, S, R]: channel j and j + R/2 share
            axes = self.ints([1])
        return (g.op("Unsqueeze", [self.to_model_dtype(g.op("Cos", [angles])), axes]),
                g.op("Unsqueeze", [self.to_model_dtype(g.op("Sin", [angles])), axes]))

    # -- layer pieces --------------------------------------------------------------------------------------

    def norm(self, x: str, name: str) -> str:
        g = self.g
        if self.c.norm == "layernorm":
            return g.op("LayerNormalization", [x, self.param(name + ".weight"), self.param(name + ".bias")],
                        axis=-1, epsilon=self.c.norm_eps, stash_type=1)
        # RMSNorm in float32 (squares of fp16 activations overflow), scaled in the model dtype
        x32 = self.to_float32(x)
        mean_square = g.op("ReduceMean", [g.op("Mul", [x32, x32])], axes=[-1], keepdims=1)
        rms = g.op("Sqrt", [g.op("Add", [mean_square, g.const(self.c.norm_eps, F32)])])
        normed = self.to_model_dtype(g.op("Div", [x32, rms]))
        return g.op("Mul", [normed, self.param(name + ".weight")])

    def rotate(self, x: str, tables: tuple[str, str]) -> str:
        """RoPE on the first rope_dim channels of x [B, H, S, D] with the (cos, sin) tables of its layer."""
        g, c = self.g, self.c
        cos, sin = tables
        r, d = c.rope_dim, c.head_dim
        x_rot = x
        if r < d:
            x_rot = g.op("Slice", [x, self.ints([0]), self.ints([r]), self.ints([-1])])
            x_pass = g.op("Slice", [x, self.ints([r]), self.ints([d]), self.ints([-1])])
        if c.rope_interleaved:  # pairs (2j, 2j + 1)
            pairs = g.op("Reshape", [x_rot, self.ints([0, 0, 0, r // 2, 2])])
            x0, x1 = g.op("Split", [pairs, self.ints([1, 1])], outputs=2, axis=-1)
            out0 = g.op("Sub", [g.op("Mul", [x0, cos]), g.op("Mul", [x1, sin])])
            out1 = g.op("Add", [g.op("Mul", [x1, cos]), g.op("Mul", [x0, sin])])
            rotated = g.op("Reshape", [g.op("Concat", [out0, out1], axis=-1), self.ints([0, 0, 0, r])])
        else:  # pairs (j, j + R/2): x * cos + rotate_half(x) * sin
            x0, x1 = g.op("Split", [x_rot, self.ints([r // 2, r // 2])], outputs=2, axis=-1)
            half_turn = g.op("Concat", [g.op("Neg", [x1]), x0], axis=-1)
            rotated = g.op("Add", [g.op("Mul", [x_rot, cos]), g.op("Mul", [half_turn, sin])])
        return g.op("Concat", [rotated, x_pass], axis=-1) if r < d else rotated

    def heads(self, x: str, num_heads: int) -> str:
        """[B, S, H*D] -> [B, H, S, D]"""
        g = self.g
        split = g.op("Reshape", [x, self.ints([0, 0, num_heads, self.c.head_dim])])
        return g.op("Transpose", [split], perm=[0, 2, 1, 3])

    def attention(self, i: int, h: str) -> str:
        g, c = self.g, self.c
        p = f"layers.{i}.attn."
        q = self.heads(self.linear(h, p + "q", c.qkv_bias), c.num_heads)
        k = self.heads(self.linear(h, p + "k", c.qkv_bias), c.num_kv_heads)
        v = self.heads(self.linear(h, p + "v", c.qkv_bias), c.num_kv_heads)
        if c.qk_norm:  # over each head's channels, before RoPE
            q, k = self.norm(q, p + "q_norm"), self.norm(k, p + "k_norm")
        if c.rope_dim:
            tables = self.rotary[c.layer_rope_theta(i)]
            q, k = self.rotate(q, tables), self.rotate(k, tables)

        # write the new K (after RoPE) and V into the caches; the outputs are the updated caches
        k_all = g.op("ScatterND", [f"key_cache.{i}", self.scatter_indices, k], outputs=[f"key_cache_out.{i}"])
        v_all = g.op("ScatterND", [f"value_cache.{i}", self.scatter_indices, v], outputs=[f"value_cache_out.{i}"])

        d = c.head_dim
        q5 = g.op("Reshape", [q, self.ints([0, c.num_kv_heads, c.group_size, -1, d])])
        k5 = g.op("Unsqueeze", [k_all, self.ints([2])])
        v5 = g.op("Unsqueeze", [v_all, self.ints([2])])
        scores = g.op("MatMul", [q5, g.op("Transpose", [k5], perm=[0, 1, 2, 4, 3])])
        scores = g.op("Mul", [scores, self.scalar(c.scores_scale)])
        if c.attn_softcap:
            scores = self.soft_cap(scores, c.attn_softcap)
        scores = g.op("Add", [scores, self.masks[c.layer_window(i)]])
        probs = g.op("Softmax", [scores], axis=-1)
        out = g.op("Reshape", [g.op("MatMul", [probs, v5]), self.ints([0, c.num_heads, -1, d])])
        merged = g.op("Reshape", [g.op("Transpose", [out], perm=[0, 2, 1, 3]), self.ints([0, 0, c.q_dim])])
        return self.linear(merged, p + "o", c.linear_bias)

    def mlp(self, i: int, h: str) -> str:
        g, c = self.g, self.c
        p = f"layers.{i}.mlp."
        if c.activation == "swiglu":
            gate = self.linear(h, p + "gate", c.linear_bias)
            up = self.linear(h, p + "up", c.linear_bias)
            hidden = g.op("Mul", [g.op("Mul", [gate, g.op("Sigmoid", [gate])]), up])  # silu(gate) * up
        elif c.activation == "geglu":
            gate = self.gelu_tanh(self.linear(h, p + "gate", c.linear_bias))
            hidden = g.op("Mul", [gate, self.linear(h, p + "up", c.linear_bias)])
        elif c.activation == "gelu_tanh":
            hidden = self.gelu_tanh(self.linear(h, p + "up", c.linear_bias))
        elif c.activation == "gelu":
            hidden = self.gelu_erf(self.linear(h, p + "up", c.linear_bias))
        else:
            hidden = g.op("Relu", [self.linear(h, p + "up", c.linear_bias)])
        return self.linear(hidden, p + "down", c.linear_bias)

    def gelu_tanh(self, x: str) -> str:
        """GELU, tanh form: 0.5 x (1 + tanh(z)) = x sigmoid(2z), z = sqrt(2/pi) (x + 0.044715 x^3).
        In float32: x^3 of an fp16 activation overflows above 40."""
        g = self.g
        x32 = self.to_float32(x)
        cubic = g.op("Add", [g.const(1.0, F32), g.op("Mul", [g.const(0.044715, F32), g.op("Mul", [x32, x32])])])
        z2 = g.op("Mul", [g.op("Mul", [x32, cubic]), g.const(2 * math.sqrt(2 / math.pi), F32)])
        return self.to_model_dtype(g.op("Mul", [x32, g.op("Sigmoid", [z2])]))

    def gelu_erf(self, x: str) -> str:
        """GELU, exact: 0.5 x (1 + erf(x / sqrt(2))), in float32 like gelu_tanh."""
        g = self.g
        x32 = self.to_float32(x)
        erf = g.op("Erf", [g.op("Mul", [x32, g.const(1 / math.sqrt(2), F32)])])
        half_x = g.op("Mul", [x32, g.const(0.5, F32)])
        return self.to_model_dtype(g.op("Mul", [half_x, g.op("Add", [erf, g.const(1.0, F32)])]))

    def soft_cap(self, x: str, cap: float, outputs=None) -> str:
        """cap * tanh(x / cap), written as Gemma 2 writes it (the attention pass reads this chain)."""
        g = self.g
        return g.op("Mul", [g.op("Tanh", [g.op("Div", [x, self.scalar(cap)])]), self.scalar(cap)],
                    outputs=outputs or 1)

    # -- the whole model -----------------------------------------------------------------------------------

    def build(self, on_layer=None) -> onnx.ModelProto:
        """The model; `on_layer()` is called after each layer (a progress stage's update)."""
        g, c = self.g, self.c
        self.prologue()
        g.scope = "embed"
        x = g.op("Gather", [self.param("embed.weight"), "input_ids"])
        if c.scale_embeddings:  # by sqrt(hidden) rounded to the model dtype, as Gemma does
            x = g.op("Mul", [x, self.scalar(math.sqrt(c.hidden_size))])
        if c.learned_positions:
            rows = g.op("Add", [self.positions, self.ints(c.position_offset)])
            x = g.op("Add", [x, g.op("Gather", [self.param("pos_embed.weight"), rows])])

        for i in range(c.num_layers):
            p = f"layers.{i}."
            g.scope = f"layers.{i}/attn"
            attn = self.attention(i, self.norm(x, p + "attn_norm"))
            if c.post_norms:
                attn = self.norm(attn, p + "attn_post_norm")
            if c.parallel_residual:  # both branches read the layer's input: x + (mlp + attn), as GPT-NeoX adds
                g.scope = f"layers.{i}/mlp"
                x = g.op("Add", [x, g.op("Add", [self.mlp(i, self.norm(x, p + "mlp_norm")), attn])])
            else:
                x = g.op("Add", [x, attn])
                g.scope = f"layers.{i}/mlp"
                mlp = self.mlp(i, self.norm(x, p + "mlp_norm"))
                x = g.op("Add", [x, self.norm(mlp, p + "mlp_post_norm") if c.post_norms else mlp])
            if on_layer is not None:
                on_layer()

        g.scope = "head"
        x = self.norm(x, "final_norm")
        if c.tie_embeddings:
            # the lm_head is a MatMul like every linear: a transposed copy of the embedding table
            head = g.weight("lm_head.weight_t", self._transposed("embed.weight", counted=False))
        else:
            head = g.weight("lm_head.weight_t", self._transposed("lm_head.weight"))
        if c.final_softcap:
            self.soft_cap(g.op("MatMul", [x, head]), c.final_softcap, outputs=["logits"])
        else:
            g.op("MatMul", [x, head], outputs=["logits"])
        return self._model()

    def _model(self) -> onnx.ModelProto:
        c, dt = self.c, self.onnx_dtype
        cache_dims = ["batch", c.num_kv_heads, self.max_cache_dim, c.head_dim]
        inputs = [helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["batch", "seq"]),
                  helper.make_tensor_value_info("past_len", TensorProto.INT64, ["batch"])]
        outputs = [helper.make_tensor_value_info("logits", dt, ["batch", "seq", c.vocab_size])]
        for i in range(c.num_layers):
            for kind in ("key", "value"):
                inputs.append(helper.make_tensor_value_info(f"{kind}_cache.{i}", dt, cache_dims))
                outputs.append(helper.make_tensor_value_info(f"{kind}_cache_out.{i}", dt, cache_dims))
        graph = helper.make_graph(self.g.nodes, "fdpp_decoder", inputs, outputs, self.g.initializers)
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)],
                                  producer_name="fdpp_rewrite", ir_version=IR_VERSION)
        return model


def build_decoder(config: ModelConfig, weights, dtype: str, max_cache: int | None, external: ExternalDataWriter,
                  on_layer=None) -> tuple[onnx.ModelProto, int]:
    """(model proto with external initializers, parameter count). max_cache None: a symbolic cache length.
    `on_layer()` is called as each layer is done."""
    graph = DecoderGraph(config, weights, dtype, max_cache, external)
    model = graph.build(on_layer)
    return model, graph.num_params
