"""hf_graph: the names of transformers' exported graph interface, shared by compare and the engine."""

import subprocess
import sys

from fdpp_rewrite.hf_graph import is_hf_interface, past_names, present_name


def test_past_names_in_layer_order_key_first():
    names = ["past_key_values.10.value", "input_ids", "past_key_values.2.value", "past_key_values.10.key",
             "past_key_values.2.key", "present.2.key", "past_key_values.x.key"]
    assert past_names(names) == ["past_key_values.2.key", "past_key_values.2.value", "past_key_values.10.key",
                                 "past_key_values.10.value"]


def test_present_name():
    assert present_name("past_key_values.3.value") == "present.3.value"


def test_is_hf_interface():
    assert is_hf_interface({"input_ids", "attention_mask", "past_key_values.0.key"})
    assert not is_hf_interface({"input_ids", "attention_mask", "past_len"})  # our exporter's graph
    assert not is_hf_interface({"input_ids"})


def test_cpu_compare_imports_no_torch():
    code = "import sys, fdpp_rewrite.compare; print('torch' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          check=True).stdout.strip() == "False"
