"""Which graphs run mixed steps (fdpp_rewrite/engine/mixed.py): past_len must reach only RopeAppend and the
attention, and the attention must read the caches RopeAppend wrote."""

from fdpp_rewrite.engine.mixed import unsupported_reason


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
