"""Names of the graph interface `torch.onnx.export` writes for transformers' models, the one home of that rule.

    input_ids, attention_mask [batch, past + seq], position_ids, cache_position,
    past_key_values.N.key / .value [batch, kv_heads, past, head_dim]  in
    logits, present.N.key / .value = Concat(past, new)                out

Both readers import it: the CPU `compare` (compare_inputs, which feeds such graphs in onnxruntime) and the engine
(engine/hf_interface.py, which runs them on its own caches). It lives outside engine/ and imports nothing but `re`
because the CPU comparison must not need torch (engine/hf_interface.py imports torch at its top).
"""

from __future__ import annotations

import re

PAST_INPUT = re.compile(r"^past_key_values\.(\d+)\.(key|value)$")  # transformers' names, as the exporters keep them


def is_hf_interface(input_names) -> bool:
    """A transformers export (not our exporter's graph, whose interface has past_len)."""
    return "input_ids" in input_names and "attention_mask" in input_names and "past_len" not in input_names


def present_name(past_name: str) -> str:
    """past_key_values.3.key -> present.3.key (the output a decode graph returns for that input)."""
    layer, kind = PAST_INPUT.match(past_name).groups()
    return f"present.{layer}.{kind}"


def past_names(names) -> list[str]:
    """The past_key_values.N.key/value among `names`, in layer order, key before value."""
    past = [name for name in names if PAST_INPUT.match(name)]
    return sorted(past, key=lambda name: (int(PAST_INPUT.match(name).group(1)), PAST_INPUT.match(name).group(2)))
