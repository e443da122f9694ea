"""The synchronized verdict end to end on tiny-opt-wide (layer 1's scores span several hundred): calibrate marks
exactly that layer, --apply and rewrite --calibration stamp it, the engine runs it synchronized, compare passes."""

import io
import json

import pytest

torch = pytest.importorskip("torch")
onnx = pytest.importorskip("onnx")

from fdpp_rewrite.cli import main  # noqa: E402
from fdpp_rewrite.engine.backends import node_softmax  # noqa: E402
from fdpp_rewrite.engine.build import build_engine  # noqa: E402
from fdpp_rewrite.engine.runtime import Engine  # noqa: E402
from fdpp_rewrite.models import load_model  # noqa: E402
from fdpp_rewrite.models.presets import PRESET_WEIGHT_SCALES  # noqa: E402

PRESET = "tiny-opt-wide"
PROMPT_TOKENS = 64


def _softmax_attributes(path) -> list:
    nodes = [n for n in onnx.load(str(path)).graph.node if n.op_type == "AsyncSoftmaxAttention"]
    return [{a.name: onnx.helper.get_attribute_value(a) for a in n.attribute}.get("softmax", b"unified").decode()
            for n in nodes]


class SoftmaxRecorder:
    """Wraps an engine backend and records each attention node's softmax attribute as it is lowered."""

    def __init__(self, inner):
        self.inner, self.seen = inner, []

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def lower(self, op_type, attrs, name):
        if op_type == "AsyncSoftmaxAttention":
            self.seen.append(node_softmax(attrs))
        return self.inner.lower(op_type, attrs, name)


@pytest.fixture(scope="module")
def calibrated(tmp_path_factory):
    from fdpp_rewrite.export import export_model
    from fdpp_rewrite.rewrite import rewrite_file

    folder = tmp_path_factory.mktemp("wide")
    onnx_path = folder / "wide.onnx"
    export_model(PRESET, onnx_path, dtype="float32", max_cache=PROMPT_TOKENS, progress=False)
    rewritten = rewrite_file(onnx_path, stream=io.StringIO())
    applied, cal = folder / "applied.fdpp.onnx", folder / "cal.json"
    code = main(["calibrate", PRESET, "--device", "cpu", "--calibration-tokens", "512", "--heldout-tokens", "128",
                 "--chunk", str(PROMPT_TOKENS), "-o", str(cal), "--apply", str(rewritten),
                 "--apply-output", str(applied)])
    assert code == 0
    return folder, onnx_path, rewritten, applied, json.loads(cal.read_text()), cal


def test_wide_preset_scales_only_layer_one_q_and_k():
    wide, plain = load_model(PRESET).weights, load_model("tiny-opt").weights
    for name in plain:
        factor = PRESET_WEIGHT_SCALES[PRESET].get(name, 1.0)
        torch.testing.assert_close(wide[name], plain[name] * factor)
    assert {n.split(".")[1] for n in PRESET_WEIGHT_SCALES[PRESET]} == {"1"}


def test_calibrate_marks_exactly_the_widened_layer_synchronized(calibrated):
    *_, calibration, _ = calibrated
    layers = calibration["layers"]
    assert [e["softmax"] for e in layers] == ["unified", "synchronized"]
    # the verdict's reason: layer 1's rows span more than the guard window, layer 0's fit with room to spare
    assert layers[1]["row_max_quantiles"]["99%"] - layers[1]["row_min_quantiles"]["1%"] > 140
    assert layers[1]["calibration_fallback_rate_decode"] > calibration["fallback_budget"]
    assert layers[0]["calibration_fallback_rows_decode"] == 0


def test_apply_and_rewrite_calibration_stamp_the_verdict(calibrated, tmp_path):
    from fdpp_rewrite.rewrite import rewrite_file

    _, onnx_path, rewritten, applied, _, cal = calibrated
    assert _softmax_attributes(rewritten) == ["unified", "unified"]
    assert _softmax_attributes(applied) == ["unified", "synchronized"]
    from_rewrite = rewrite_file(onnx_path, tmp_path / "r.fdpp.onnx", calibration=str(cal), stream=io.StringIO())
    assert _softmax_attributes(from_rewrite) == ["unified", "synchronized"]


def test_cpu_engine_runs_the_layer_synchronized_and_exactly(calibrated):
    from fdpp_rewrite.models.reference import ReferenceModel
    from fdpp_rewrite.ref_ops import COUNTERS

    folder, _, _, applied, _, _ = calibrated
    build_engine(applied, folder / "engine", backend="cpu", max_batch=1, max_seq=PROMPT_TOKENS, force=True,
                 stream=io.StringIO())
    engine = Engine(folder / "engine", backend="cpu")
    engine.backend = recorder = SoftmaxRecorder(engine.backend)
    ids = torch.randint(0, 313, (PROMPT_TOKENS,), generator=torch.Generator().manual_seed(3)).tolist()
    COUNTERS.reset()
    logits = engine.prefill(0, ids)
    assert recorder.seen == ["unified", "synchronized"]
    rows_per_layer = 2 * PROMPT_TOKENS  # 2 heads
    assert COUNTERS.attention_rows == 2 * rows_per_layer
    # every row of layer 1 on the online-max path (unified there would flag only part of them), none of layer 0
    assert COUNTERS.fallback_rows == rows_per_layer
    loaded = load_model(PRESET)
    model = ReferenceModel(loaded.config, loaded.weights)
    with torch.no_grad():
        expected = model.forward(torch.tensor([ids]), torch.zeros(1, dtype=torch.int64),
                                 model.new_caches(1, PROMPT_TOKENS))
    torch.testing.assert_close(logits, expected[0, -1], atol=1e-3, rtol=1e-3)


def test_compare_passes_on_the_stamped_graph(calibrated):
    from fdpp_rewrite.compare import compare_models

    _, onnx_path, _, applied, _, _ = calibrated
    report = compare_models(onnx_path, applied, batch=2, prefill=6)
    assert report.passed


@pytest.mark.gpu
def test_cuda_engine_runs_the_stamped_layer_synchronized(calibrated, tmp_path, monkeypatch):
    from fdpp_rewrite.export import export_model
    from fdpp_rewrite.gpu import attention as gpu_attention
    from fdpp_rewrite.models.reference import ReferenceModel
    from fdpp_rewrite.rewrite import rewrite_file

    *_, cal = calibrated
    onnx_path = tmp_path / "wide16.onnx"
    export_model(PRESET, onnx_path, dtype="float16", max_cache=PROMPT_TOKENS, progress=False)
    stamped = rewrite_file(onnx_path, calibration=str(cal), stream=io.StringIO())
    build_engine(stamped, tmp_path / "engine", backend="cuda", max_batch=1, max_seq=PROMPT_TOKENS,
                 stream=io.StringIO())
    kernel, choices = gpu_attention.attention, []

    def spy(*args, softmax="unified", **kwargs):
        choices.append(softmax)
        return kernel(*args, softmax=softmax, **kwargs)
    monkeypatch.setattr(gpu_attention, "attention", spy)
    engine = Engine(tmp_path / "engine", backend="cuda", use_graphs=False)
    ids = torch.randint(0, 313, (PROMPT_TOKENS,), generator=torch.Generator().manual_seed(3)).tolist()
    logits = engine.prefill(0, ids).float().cpu()
    assert choices == ["unified", "synchronized"]
    loaded = load_model(PRESET)
    model = ReferenceModel(loaded.config, loaded.weights)
    with torch.no_grad():
        expected = model.forward(torch.tensor([ids]), torch.zeros(1, dtype=torch.int64),
                                 model.new_caches(1, PROMPT_TOKENS))
    torch.testing.assert_close(logits, expected[0, -1], atol=5e-2, rtol=5e-2)
