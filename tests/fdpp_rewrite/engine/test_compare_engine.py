"""`compare model.onnx ENGINE`: the original graph in onnxruntime against a built engine through polygraphy, on
the cpu backend here and (marked gpu) on the GPU kernels for a tiny preset of each family."""

import io

import pytest

from fdpp_rewrite.engine.build import build_engine
from fdpp_rewrite.engine.compare_engine import compare_engine
from fdpp_rewrite.errors import FdppError

FAMILIES = ["tiny-llama", "tiny-opt", "tiny-smollm2", "tiny-chatglm"]


def _export_build(folder, preset, dtype, backend):
    from fdpp_rewrite.export import export_model
    from fdpp_rewrite.rewrite import rewrite_file

    onnx_path = folder / "model.onnx"
    export_model(preset, onnx_path, dtype=dtype, max_cache=64, progress=False)
    rewritten = rewrite_file(onnx_path, stream=io.StringIO())
    build_engine(rewritten, folder / "engine", backend=backend, max_batch=4, max_seq=64, stream=io.StringIO())
    return onnx_path, folder / "engine"


@pytest.mark.parametrize("preset", FAMILIES)
def test_cpu_engine_matches_the_original(tmp_path, preset):
    onnx_path, engine = _export_build(tmp_path, preset, "float32", "cpu")
    report = compare_engine(onnx_path, engine, batch=3)
    assert report.passed, [(r.step, r.output, r.max_abs) for r in report.rows if not r.passed]
    assert {r.step for r in report.rows} == {"prefill", "decode", "chunk"}
    assert any(r.output == "logits" for r in report.rows) and report.attention_rows > 0


def test_another_models_graph_is_refused(tmp_path):
    _, engine = _export_build(tmp_path / "a", "tiny-llama", "float32", "cpu")
    other, _ = _export_build(tmp_path / "b", "tiny-chatglm", "float32", "cpu")
    with pytest.raises(FdppError, match="is not the graph"):
        compare_engine(other, engine)


def test_an_engine_too_small_to_compare_says_how_to_build_it(tmp_path):
    onnx_path, engine = _export_build(tmp_path, "tiny-llama", "float32", "cpu")
    build_engine(onnx_path.with_suffix(".fdpp.onnx"), tmp_path / "one", backend="cpu", max_batch=1, max_seq=64,
                 stream=io.StringIO())
    with pytest.raises(FdppError, match="engine takes 1; build the engine with --max-batch 2 or more"):
        compare_engine(onnx_path, tmp_path / "one")  # --batch 1 would be refused: the check needs two sequences
    with pytest.raises(FdppError, match="engine takes 4; pass --batch 4 or less"):
        compare_engine(onnx_path, engine, batch=5)


def test_cli_compares_an_engine_folder(tmp_path, capsys):
    from fdpp_rewrite.cli import main

    onnx_path, engine = _export_build(tmp_path, "tiny-llama", "float32", "cpu")
    assert main(["compare", str(onnx_path), str(engine)]) == 0
    assert "PASS: tolerance float32" in capsys.readouterr().out


@pytest.mark.gpu
@pytest.mark.parametrize("preset", FAMILIES)
def test_gpu_engine_matches_the_original(tmp_path, preset):
    onnx_path, engine = _export_build(tmp_path, preset, "float16", "cuda")
    report = compare_engine(onnx_path, engine, batch=3)
    assert report.passed, [(r.step, r.output, r.max_abs) for r in report.rows if not r.passed]
    assert report.fallback_rows == 0


def _hf_rewrite_build(original, folder, backend):
    """An export of tests/helpers/hf_exports.py rewritten and built in `folder`."""
    from fdpp_rewrite.rewrite import rewrite_file

    rewritten = rewrite_file(original, output=folder / f"{original.stem}.fdpp.onnx", stream=io.StringIO())
    build_engine(rewritten, folder / "engine", backend=backend, max_batch=4, max_seq=48, stream=io.StringIO())
    return folder / "engine"


@pytest.mark.parametrize("exporter", ["dynamo", "torchscript"])
def test_cpu_engine_of_a_hugging_face_graph_matches_the_original(hf_export, tmp_path, exporter, capsys):
    # tiny llama's decode-with-cache export: the session's (tests/conftest.py), skipped where the exporter is missing
    pytest.importorskip("transformers")
    pytest.importorskip("onnxscript")
    original = hf_export("llama", exporter == "dynamo", True)
    engine = _hf_rewrite_build(original, tmp_path, "cpu")
    report = compare_engine(original, engine, batch=3)
    assert report.passed, [(r.step, r.output, r.max_abs) for r in report.rows if not r.passed]
    steps = {r.step for r in report.rows}
    assert "prefill" in steps and "decode1" in steps and not any(s.startswith("padded-") for s in steps)
    assert {r.output for r in report.rows} >= {"logits", "present.0.key", "present.0.value"}
    assert "left-padded steps skipped" in capsys.readouterr().err


@pytest.mark.gpu
@pytest.mark.parametrize("exporter", ["dynamo", "torchscript"])
def test_gpu_engine_of_a_hugging_face_graph_matches_the_original(tmp_path, exporter):
    pytest.importorskip("transformers")
    pytest.importorskip("onnxscript")
    hf_exports = pytest.importorskip("hf_exports")
    try:
        original = hf_exports.export_hf("llama", exporter == "dynamo", True, tmp_path, dtype="float16")
    except hf_exports.ExportUnsupported as exc:
        pytest.skip(str(exc))
    engine = _hf_rewrite_build(original, tmp_path, "cuda")
    report = compare_engine(original, engine, batch=3)
    assert report.passed, [(r.step, r.output, r.max_abs) for r in report.rows if not r.passed]
    assert report.fallback_rows == 0
