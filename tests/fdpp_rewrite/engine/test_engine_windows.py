"""Sliding-window layers of our own exports (Gemma 2/3 local layers, Phi-3): the rewriter reads the graph's window
mask as mask_mode past_len with the op's `window` (not as a bias, which the engine's cache buckets cannot feed), and
the engine (cpu backend) equals the original graph on prompts longer than the window; the same graph with the
window dropped does not, so the comparison sees the window. The rule itself: attention_mask._window_of."""

import io

import numpy as np
import onnx
import pytest

from fdpp_rewrite.calibration.settings import attention_nodes
from fdpp_rewrite.compare_onnx import compare_models
from fdpp_rewrite.engine.build import build_engine
from fdpp_rewrite.engine.compare_engine import compare_engine
from fdpp_rewrite.models import get_config
from fdpp_rewrite.passes.attention_mask import _window_of

PROMPT = 10  # longer than every window below (4 and 6 keys)


def _attrs(node) -> dict:
    return {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    from fdpp_rewrite.export import export_model
    from fdpp_rewrite.rewrite import rewrite_file

    made = {}

    def get(preset):
        if preset not in made:
            folder = tmp_path_factory.mktemp(preset)
            export_model(preset, folder / "model.onnx", dtype="float32", max_cache=64, progress=False)
            made[preset] = folder / "model.onnx", rewrite_file(folder / "model.onnx", stream=io.StringIO())
        return made[preset]
    return get


@pytest.mark.parametrize("preset", ["tiny-gemma2", "tiny-gemma3", "tiny-phi3"])
def test_window_layers_become_past_len_with_their_window_and_the_engine_equals_the_graph(exported, tmp_path,
                                                                                        preset):
    original, rewritten = exported(preset)
    config = get_config(preset)
    nodes = attention_nodes(onnx.load(str(rewritten), load_external_data=False).graph.node)
    windows = [config.layer_window(i) for i in range(config.num_layers)]
    assert any(windows)
    assert [_attrs(n)["mask_mode"] for n in nodes] == [b"past_len"] * config.num_layers
    assert [_attrs(n).get("window", 0) for n in nodes] == windows
    build_engine(rewritten, tmp_path / "engine", backend="cpu", max_batch=2, max_seq=64, stream=io.StringIO())
    report = compare_engine(original, tmp_path / "engine", prefill=PROMPT)
    assert report.passed, [(r.step, r.output, r.max_abs) for r in report.rows if not r.passed]


def test_the_comparison_sees_a_dropped_window(exported):
    original, rewritten = exported("tiny-gemma3")
    model = onnx.load(str(rewritten))
    for node in attention_nodes(model.graph.node):
        for attribute in node.attribute:
            if attribute.name == "window":
                attribute.i = 0
    assert not compare_models(original, model, prefill=PROMPT).passed


def _probe(past: list, seq: int, kv_len: int, visible) -> tuple:
    """One probe of a mask: each row's position [B, S] and the mask's values [B, S, L] (0 visible, -inf hidden)."""
    position = np.asarray(past)[:, None] + np.arange(seq)[None, :]
    keys = np.arange(kv_len)[None, None, :]
    return position, np.where(visible(position[:, :, None], keys), 0.0, -np.inf)


@pytest.mark.parametrize("visible, expected", [
    (lambda pos, j: j <= pos, 0),                                     # causal
    (lambda pos, j: (j <= pos) & (pos - j < 3), 3),                   # a window of 3 keys
    (lambda pos, j: (j <= pos) & (pos - j < 50), 0),                  # a window no row reaches: causal here
    (lambda pos, j: j < pos, None),                                   # the diagonal hidden: no past_len rule
    (lambda pos, j: (j <= pos) & (pos - j < np.where(pos > 6, 3, 2)), None),  # two windows
])
def test_window_of_a_probed_mask(visible, expected):
    probes = [_probe([8, 0], 3, 12, visible), _probe([0, 8], 3, 12, visible)]
    assert _window_of(probes, -1e4) == expected
