"""export --max-position: a RoPE model's position limit raised for long-context speed runs (random weights), and
refused where positions are a learned table."""

import json

import pytest

from fdpp_rewrite.errors import FdppError
from fdpp_rewrite.export import export_model


def test_raised_limit_reaches_the_metadata_and_the_build(tmp_path):
    from fdpp_rewrite.engine.build import build_engine

    out = tmp_path / "m.onnx"
    export_model("tiny-llama", out, dtype="float32", max_cache=1000, max_position=1024, progress=False)
    meta = json.loads((tmp_path / "m.fdpp.json").read_text())
    assert meta["config"]["max_position"] == 1024 and meta["max_cache"] == 1000
    with pytest.raises(FdppError, match="exceeds the 512 positions"):
        export_model("tiny-llama", tmp_path / "n.onnx", dtype="float32", max_cache=1000, progress=False)
    from fdpp_rewrite.rewrite import rewrite_file

    import io
    rewritten = rewrite_file(out, stream=io.StringIO())
    manifest = build_engine(rewritten, tmp_path / "engine", backend="cpu", max_batch=1, max_seq=1000,
                            stream=io.StringIO())
    assert manifest["max_seq"] == 1000


@pytest.mark.parametrize("preset, position, message", [("tiny-opt", 1024, "learned position table"),
                                                       ("tiny-llama", 256, "below the model's 512")])
def test_refusals(tmp_path, preset, position, message):
    with pytest.raises(FdppError, match=message):
        export_model(preset, tmp_path / "m.onnx", dtype="float32", max_position=position, progress=False)
