"""scripts/kernel_table.py, scripts/bench_gptfast.py and `bench --kernels gptfast` on the GPU, small: the table of a
2-layer engine of smollm2-135m's shapes (every GEMM shape is in the committed H200 profile), the gpt-fast peer on
tiny-llama, and bench with that peer on the same engine."""

import io
import json

import pytest
from script_module import load_script

pytestmark = pytest.mark.gpu

LAYER_OPS = ["RMSNorm", "FlatGemm", "RopeAppend", "AsyncSoftmaxAttention", "FlatGemm", "RMSNorm", "FlatGemm",
             "FlatGemm"]


@pytest.fixture(scope="module")
def small_engine(tmp_path_factory):
    from fdpp_rewrite.engine.build import build_engine
    from fdpp_rewrite.export import export_model
    from fdpp_rewrite.rewrite import rewrite_file

    folder = tmp_path_factory.mktemp("kernel_table")
    export_model("smollm2-135m", folder / "m.onnx", dtype="float16", max_cache=256, num_layers=2, random_init=True,
                 progress=False)
    build_engine(rewrite_file(folder / "m.onnx", stream=io.StringIO()), folder / "engine", backend="cuda",
                 max_batch=4, max_seq=256, stream=io.StringIO())
    return folder / "engine"


def test_kernel_table_of_a_two_layer_engine(small_engine, tmp_path, capsys):
    out = tmp_path / "table.json"
    assert load_script("kernel_table").main([str(small_engine), "--batch", "1", "3", "--context", "40",
                                             "--layer", "1", "--out", str(out)]) == 0
    report = json.loads(out.read_text())
    assert [p["batch"] for p in report["points"]] == [1, 3]
    for point in report["points"]:
        rows = point["layer_rows"]
        assert [r["op"] for r in rows] == LAYER_OPS
        assert all(r["us"] > 0 and r["bytes"] > 0 for r in rows)
        qkv = rows[1]  # at least its weight: [576 + 2 * 192, 576] fp16
        assert qkv["bytes"] >= (576 + 2 * 192) * 576 * 2
        assert point["layer_summary"]["kernels"] == len(rows)
        assert point["kernels_per_step"] >= 2 * len(rows) + 2  # the layers, the final norm and lm_head at least
        assert point["step_us"] > 0 and 40 < point["kv_len_mean"] < 256
    text = out.with_suffix(".md").read_text()
    assert "## batch 3" in text and "| RopeAppend |" in text
    assert "wrote" in capsys.readouterr().out


def test_gptfast_peer_on_a_tiny_model(tmp_path):
    out = tmp_path / "peer.json"
    assert load_script("bench_gptfast").main(["--preset", "tiny-llama", "--batch", "1", "2", "--context", "16",
                                              "--new-tokens", "6", "--out", str(out)]) == 0
    report = json.loads(out.read_text())
    assert [(p["batch"], p["context"]) for p in report["points"]] == [(1, 16), (2, 16)]
    for point in report["points"]:
        assert point["kernels"] == "gptfast" and point["decode_steps"] == 5
        assert point["tokens_per_s"] == pytest.approx(point["batch"] * 1e3 / point["ms_per_step"])
        assert point["ms_per_step_events"] > 0 and point["first_token_ms"] > 0
    assert "bench_gptfast" in report["command"]


def test_bench_runs_the_gptfast_peer_on_the_engines_model(small_engine, tmp_path, capsys):
    from fdpp_rewrite.cli import main

    out = tmp_path / "bench.json"
    assert main(["bench", str(small_engine), "--batch", "1", "2", "--context", "16", "--new-tokens", "6",
                 "--kernels", "fdpp", "gptfast", "--out", str(out)]) == 0
    points = json.loads(out.read_text())["points"]
    assert [(p["kernels"], p["batch"]) for p in points] == [("fdpp", 1), ("fdpp", 2), ("gptfast", 1), ("gptfast", 2)]
    assert all(p["tokens_per_s"] > 0 and p["decode_steps"] == 5 for p in points if p["kernels"] == "gptfast")
    assert "the gpt-fast recipe's decode tokens/s" in capsys.readouterr().out
