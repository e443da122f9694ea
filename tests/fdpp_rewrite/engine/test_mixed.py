"""Which graphs run mixed steps (fdpp_rewrite/engine/mixed.py): past_len must reach only RopeAppend and the
attention, and the attention must read the caches RopeAppend wrote; and how a mixed step splits those two ops
without copying."""

import torch

from fdpp_rewrite.engine.mixed import MixedLayout, tokens_major, unsupported_reason, wrap


def node(op, inputs, outputs, domain="fdpp", **attrs):
    return {"op": op, "domain": domain, "name": f"{op}_{outputs[0]}", "inputs": inputs, "outputs": outputs,
            "attrs": attrs}


def llama_like(extra=()):
    return {"nodes": [
        node("RopeAppend", ["q", "k", "v", "key_cache.0", "value_cache.0", "past_len", "inv_freq"],
             ["q_rot", "kc", "vc"]),
        node("AsyncSoftmaxAttention", ["q_rot", "kc", "vc", "past_len"], ["attn"], mask_mode="past_len"),
        *extra]}


def test_a_rope_graph_runs_mixed_steps():
    assert unsupported_reason(llama_like()) is None


def test_positions_computed_in_the_graph_refuse_mixed_steps():
    plan = llama_like([node("Unsqueeze", ["past_len", "axes"], ["positions"], domain="")])
    assert "computes positions" in unsupported_reason(plan)


def test_attention_on_other_keys_or_a_bias_refuses_mixed_steps():
    plan = llama_like()
    plan["nodes"][1]["inputs"][1] = "key_cache.0"
    assert "RopeAppend did not write" in unsupported_reason(plan)
    plan = llama_like()
    plan["nodes"][1]["attrs"]["mask_mode"] = "bias"
    assert "bias" in unsupported_reason(plan)
    assert "without fdpp::RopeAppend" in unsupported_reason({"nodes": llama_like()["nodes"][1:]})


def test_a_cache_read_by_another_op_refuses_mixed_steps():
    plan = llama_like([node("Shape", ["key_cache.0"], ["cache_shape"], domain="")])
    plan["cache_inputs"] = ["key_cache.0", "value_cache.0"]
    assert "key_cache.0 feeds Shape" in unsupported_reason(plan)


LAYOUT = MixedLayout(batch=3, slot=1, chunk=4)  # 3 decode rows, then a 4-token chunk of slot 1


def test_a_rope_that_rotates_in_place_returns_the_query_itself():
    def rotate_in_place(query, k_new, v_new, key_cache, value_cache, past_len, inv_freq):
        query.add_(past_len.reshape(-1, 1, 1, 1).to(query.dtype))  # row b of this call moved by past_len[b]
        return query, key_cache, value_cache

    query = torch.zeros(1, 2, 7, 4)
    k_new, cache = torch.zeros(1, 2, 7, 4), torch.zeros(3, 2, 16, 4)
    past_len = torch.tensor([5, 6, 7, 9])
    out, _, _ = wrap("RopeAppend", rotate_in_place, LAYOUT)(query, k_new, k_new, cache, cache, past_len, None)
    assert out is query  # no join, no copy
    assert query[0, 0, :, 0].tolist() == [5, 6, 7, 9, 9, 9, 9]  # decode rows at their lengths, the chunk at its start


def test_the_split_attention_writes_one_tokens_major_output():
    def attention(query, key, value, past_len, out=None):
        return out.copy_(query * 2 + past_len.reshape(-1, 1, 1, 1))

    query = torch.arange(2 * 7 * 4, dtype=torch.float32).reshape(1, 2, 7, 4)
    cache = torch.zeros(3, 2, 16, 4)
    out = wrap("AsyncSoftmaxAttention", attention, LAYOUT)(query, cache, cache, torch.tensor([5, 6, 7, 9]))
    expected = query * 2 + torch.tensor([5, 6, 7, 9, 9, 9, 9.0]).reshape(1, 1, 7, 1)
    assert torch.equal(out, expected)
    assert out.transpose(1, 2).is_contiguous()  # the graph's Transpose back to tokens-major costs no copy
    assert tokens_major(2, 3, 5, 4, query).transpose(1, 2).is_contiguous()
