"""The calibration file and what it sets on a graph: one layer's SoftmaxSettings (phi, the guard, the softmax
verdict), read from a `fdpp calibrate` file, numbered by graph order, and written as AsyncSoftmaxAttention node
attributes. Both writers, `rewrite --calibration` (passes/attention.py) and `calibrate --apply`
(calibration/graph.py), go through `node_attributes_with`; both readers through `layer_settings`.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

from fdpp_rewrite.contracts import DOMAIN, attention_guard, load_contract
from fdpp_rewrite.errors import FdppError
from fdpp_rewrite.schemas import CALIBRATION_SCHEMA

OP = "AsyncSoftmaxAttention"
_ATTRIBUTES = load_contract(OP).attributes
SOFTMAX_CHOICES = tuple(_ATTRIBUTES["softmax"]["choices"])
DEFAULT_SOFTMAX = _ATTRIBUTES["softmax"]["default"]  # "unified": a node without the attribute runs it
# The attributes a layer's settings own; every other attribute of the node is the matcher's.
SETTINGS_ATTRIBUTES = ("phi", "guard_lo", "guard_hi", "softmax")


@dataclass(frozen=True)
class SoftmaxSettings:
    phi: float
    guard_lo: float
    guard_hi: float
    softmax: str = DEFAULT_SOFTMAX  # "synchronized": calibrate found no phi that covers this layer's scores


# Without a calibration: the contract's attribute defaults, phi = 0 with the guard [-60, 10]. They are safe for any
# score range: a visible s - phi above 10 falls back, so every exponent the fast path takes is at most e^10 (fits
# float16; a float32 sum over 2^20 keys x |v| <= 65504 stays far under float32's max), and one below -60 falls back
# too, so every kept exponent is a normal float32 (no zero denominator). Calibration narrows the window to where real
# scores live so that the fallback is rare.
_GUARD = attention_guard()
DEFAULT_SETTINGS = SoftmaxSettings(_GUARD.phi, _GUARD.lo, _GUARD.hi)


def softmax_attributes(settings: SoftmaxSettings) -> dict:
    """The node attributes one layer's settings set: phi and the guard always; softmax only where it is not the
    default, so that unified nodes stay as they were (readers without the attribute agree)."""
    attrs = {"phi": float(settings.phi), "guard_lo": float(settings.guard_lo), "guard_hi": float(settings.guard_hi)}
    if settings.softmax != DEFAULT_SOFTMAX:
        attrs["softmax"] = settings.softmax
    return attrs


def node_attributes_with(attrs: dict, settings: SoftmaxSettings, where: str = "") -> dict:
    """An AsyncSoftmaxAttention node's attributes with the layer's settings in place of its own, checked against
    the contract (a one-line FdppError naming `where` otherwise):
        node_attributes_with({"scale": 0.125, "phi": 0.0, "softmax": "unified", ...}, SoftmaxSettings(2.0, -80, 60))
        -> {"scale": 0.125, ..., "phi": 2.0, "guard_lo": -80.0, "guard_hi": 60.0}"""
    merged = {k: v for k, v in attrs.items() if k not in SETTINGS_ATTRIBUTES}
    merged.update(softmax_attributes(settings))
    load_contract(OP).validate_attributes(merged, where=where)
    return merged


def attention_nodes(nodes) -> list:
    """The fdpp::AsyncSoftmaxAttention nodes among a graph's `nodes` (in graph order): the k-th is layer k, the one
    numbering that the calibration file, `rewrite --calibration`, `calibrate --apply` and the engine's score
    collection share. Takes ONNX NodeProtos, onnx-graphsurgeon Nodes or engine plan node dicts."""
    def kind(node):
        if isinstance(node, dict):
            return node.get("domain"), node.get("op")
        return node.domain, getattr(node, "op_type", None) or getattr(node, "op", None)

    return [node for node in nodes if kind(node) == (DOMAIN, OP)]


def layer_settings(layers, source: str) -> list[SoftmaxSettings]:
    """A calibration's "layers" entries as settings in layer order (layer k at index k); `source` names the file in
    the one-line errors."""
    if not isinstance(layers, list):
        raise FdppError(f"calibration {source} has no 'layers' list; re-run `python -m fdpp_rewrite calibrate`")
    ordered = sorted(layers, key=lambda entry: entry.get("layer", -1) if isinstance(entry, dict) else -1)
    settings = []
    for position, entry in enumerate(ordered):
        try:
            if entry["layer"] != position:
                raise ValueError(f"layer numbers must be 0..{len(ordered) - 1}, found {entry['layer']}")
            values = SoftmaxSettings(float(entry["phi"]), float(entry["guard_lo"]), float(entry["guard_hi"]),
                                     entry.get("softmax", DEFAULT_SOFTMAX))
            if values.softmax not in SOFTMAX_CHOICES:
                raise ValueError(f"softmax must be one of {', '.join(SOFTMAX_CHOICES)}, found {values.softmax!r}")
        except (KeyError, TypeError, ValueError) as exc:
            raise FdppError(f"calibration {source}: layer entry {position} is invalid ({exc}); re-run calibrate") \
                from exc
        if not all(math.isfinite(v) for v in (values.phi, values.guard_lo, values.guard_hi)):
            raise FdppError(f"calibration {source}: layer {position} has a non-finite value; re-run calibrate")
        settings.append(values)
    return settings


def load_calibration(path) -> list[SoftmaxSettings]:
    """Per-layer phi and guards from a `fdpp_rewrite calibrate` file, layer k at index k."""
    path = Path(path)
    if not path.is_file():
        raise FdppError(f"no calibration file at {path}; run `python -m fdpp_rewrite calibrate` or omit --calibration")
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise FdppError(f"calibration {path} is not valid JSON ({exc}); re-run calibrate") from exc
    if not isinstance(data, dict) or data.get("schema") != CALIBRATION_SCHEMA or not isinstance(data.get("layers"),
                                                                                                   list):
        raise FdppError(f"calibration {path} is not a '{CALIBRATION_SCHEMA}' file with a 'layers' list; "
                        "re-run `python -m fdpp_rewrite calibrate`")
    return layer_settings(data["layers"], str(path))
