"""`calibrate --apply`: a calibration's settings written onto an existing rewritten graph's AsyncSoftmaxAttention
nodes, layer k on the k-th node (calibration.settings: the numbering and the one phi writer `rewrite --calibration`
uses too). Only the structure is loaded; external weights stay where they are.
"""

from __future__ import annotations

from pathlib import Path

from fdpp_rewrite.calibration.settings import (SETTINGS_ATTRIBUTES, attention_nodes, layer_settings,
                                               node_attributes_with)
from fdpp_rewrite.errors import FdppError


def load_apply_target(model_path: Path, output: Path):
    """The rewritten graph --apply will update (structure only) and its attention nodes; checked before the long
    calibration run so that a wrong --apply fails at once."""
    import onnx

    if not model_path.is_file():
        raise FdppError(f"--apply: {model_path} does not exist; rewrite the model first")
    try:
        model = onnx.load(str(model_path), load_external_data=False)
    except Exception as exc:  # noqa: BLE001 - protobuf/IO errors of many kinds: all mean "not a usable model"
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise FdppError(f"--apply: cannot load {model_path}: {first}; re-run rewrite") from exc
    nodes = attention_nodes(model.graph.node)
    if not nodes:
        raise FdppError(f"--apply: {model_path} has no fdpp::AsyncSoftmaxAttention nodes; pass a rewritten model "
                        "(python -m fdpp_rewrite rewrite)")
    external = any(t.data_location == onnx.TensorProto.EXTERNAL for t in model.graph.initializer)
    if external and output.resolve().parent != model_path.resolve().parent:
        raise FdppError("--apply-output must be in the same folder as a model with external data (it refers to it)")
    return model, nodes


def apply_to_graph(calibration: dict, model_path: Path, output: Path) -> int:
    """Sets each layer's phi, guard and softmax verdict on the fdpp::AsyncSoftmaxAttention nodes of a rewritten
    graph (layer k on the k-th node) and saves it to `output`. Returns the number of nodes set."""
    import onnx
    from onnx import helper

    from fdpp_rewrite.contracts import node_attributes

    model, nodes = load_apply_target(model_path, output)
    settings = layer_settings(calibration.get("layers"), calibration.get("source", "(--apply)"))
    if len(nodes) != len(settings):
        raise FdppError(f"--apply: {model_path} has {len(nodes)} AsyncSoftmaxAttention nodes but the calibration has "
                        f"{len(settings)} layers; calibrate the same model (or its --num-layers)")
    for layer, (node, values) in enumerate(zip(nodes, settings)):
        attrs = node_attributes_with(node_attributes(node), values, where=f"--apply: layer {layer}")
        kept = [a for a in node.attribute if a.name in attrs and a.name not in SETTINGS_ATTRIBUTES]
        del node.attribute[:]
        node.attribute.extend(kept + [helper.make_attribute(name, attrs[name]) for name in SETTINGS_ATTRIBUTES
                                      if name in attrs])
    meta = {p.key: p for p in model.metadata_props}
    if "fdpp.rewrite.calibration" in meta:
        meta["fdpp.rewrite.calibration"].value = calibration.get("source", "fdpp_rewrite calibrate")
    onnx.save(model, str(output))
    return len(nodes)
