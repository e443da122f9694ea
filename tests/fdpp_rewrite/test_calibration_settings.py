"""The calibration file's one phi writer and one layer numbering (fdpp_rewrite/calibration/settings.py): `rewrite
--calibration` and `calibrate --apply` give the same attention node attributes, unified and synchronized layers."""

import json

import onnx
import onnx_graphsurgeon as gs
import pytest
from rewrite_graphs import TinyConfig, build_tiny_model

from fdpp_rewrite.calibration.graph import apply_to_graph
from fdpp_rewrite.calibration.settings import (DEFAULT_SETTINGS, SoftmaxSettings, attention_nodes, load_calibration,
                                               node_attributes_with, softmax_attributes)
from fdpp_rewrite.contracts import node_attributes
from fdpp_rewrite.errors import FdppError
from fdpp_rewrite.passes import attention, common

LAYERS = [{"layer": 0, "phi": 2.5, "guard_lo": -80.0, "guard_hi": 60.0, "softmax": "synchronized"},
          {"layer": 1, "phi": -1.25, "guard_lo": -40.0, "guard_hi": 20.0, "softmax": "unified"}]


def _rewrite(model, calibration=None):
    graph = gs.import_onnx(model)
    common.sanitize(graph)
    attention.run(graph, calibration)
    return gs.export_onnx(graph, do_type_check=False)


def test_rewrite_calibration_and_apply_write_the_same_attributes(tmp_path):
    path = tmp_path / "calibration.json"
    path.write_text(json.dumps({"schema": "fdpp-calibration/1", "layers": LAYERS}))
    model = build_tiny_model(TinyConfig(layers=2))

    rewritten = _rewrite(model, load_calibration(path))
    plain = tmp_path / "plain.fdpp.onnx"
    onnx.save(_rewrite(model), str(plain))
    assert apply_to_graph({"layers": LAYERS}, plain, tmp_path / "applied.fdpp.onnx") == 2
    applied = onnx.load(str(tmp_path / "applied.fdpp.onnx"))

    by_rewrite = [node_attributes(n) for n in attention_nodes(rewritten.graph.node)]
    by_apply = [node_attributes(n) for n in attention_nodes(applied.graph.node)]
    assert by_rewrite == by_apply
    assert [(a["phi"], a["guard_lo"], a["guard_hi"]) for a in by_apply] == [(2.5, -80.0, 60.0), (-1.25, -40.0, 20.0)]
    assert [a.get("softmax") for a in by_apply] == ["synchronized", None]  # unified: the default, no attribute
    assert "scale" in by_apply[1] and by_apply[1]["num_heads"] == TinyConfig().heads  # the matcher's, kept


def test_the_writer_omits_only_the_default_softmax():
    assert softmax_attributes(DEFAULT_SETTINGS) == {"phi": DEFAULT_SETTINGS.phi, "guard_lo": DEFAULT_SETTINGS.guard_lo,
                                                    "guard_hi": DEFAULT_SETTINGS.guard_hi}
    assert softmax_attributes(SoftmaxSettings(1, -2, 3, "synchronized"))["softmax"] == "synchronized"
    node = {"scale": 0.125, "mask_mode": "none", "num_heads": 2, "num_kv_heads": 2, "head_dim": 64,
            "softmax": "synchronized", "phi": 9.0}
    assert "softmax" not in node_attributes_with(node, SoftmaxSettings(0.0, -60.0, 10.0))  # a verdict is replaced
    with pytest.raises(FdppError, match=r"guard_hi.*\(layer 3\)|\(layer 3\).*guard_hi"):
        node_attributes_with(node, SoftmaxSettings(0.0, -60.0, 99.0), where="layer 3")


def test_one_numbering_for_every_node_representation():
    proto = [onnx.helper.make_node("AsyncSoftmaxAttention", [], [], name=f"a{i}", domain="fdpp") for i in range(2)]
    proto.insert(1, onnx.helper.make_node("Softmax", [], [], name="s"))
    plan = [{"name": n.name, "op": n.op_type, "domain": n.domain} for n in proto]
    nodes = [gs.Node(n.op_type, name=n.name, domain=n.domain or None) for n in proto]
    assert [n.name for n in attention_nodes(proto)] == [n.name for n in attention_nodes(nodes)] \
        == [n["name"] for n in attention_nodes(plan)] == ["a0", "a1"]
