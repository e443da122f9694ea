"""The rewrite passes, one module each, run in this order by `fdpp_rewrite rewrite`:

1. attention          softmax attention chains -> fdpp::AsyncSoftmaxAttention
2. rope_append        RoPE of q and k + the two KV-cache ScatterNDs of a layer -> fdpp::RopeAppend (rope_dim 0: OPT);
                     a cache-free prefill's RoPE (transformers' exports) -> RopeAppend at past_len 0
                     (rope_match.py reads the rotary chains; rope_hf_cache.py, which no rewrite runs, fuses a
                     transformers decode graph's RoPE and cache Concats for an engine that writes at each length)
3. norm               RMSNorm subgraphs -> fdpp::RMSNorm (LayerNormalization is one ONNX op already: left as is)
4. projection_fusion  q/k/v MatMuls on one input -> one MatMul + Split; gate/up of a SiLU MLP -> one MatMul + Split
5. flat_gemm          MatMul against a constant 2-D weight (+ bias, + silu_mul or residual epilogue) -> fdpp::FlatGemm

Each pass takes an onnx-graphsurgeon graph, edits it in place and returns a PassReport. No pass aborts on one match:
what the kernels serve comes from the op contracts (support.py), and a match they cannot serve, like one the pass
cannot prove, is left as is with its reason in the report (common.PassReport.left).
"""
