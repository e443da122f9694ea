"""`python -m fdpp_rewrite rewrite`: all passes on whole models, the output file, and bad input."""

import io
import json

import numpy as np
import onnx
import pytest
from cli_output import error_line
from rewrite_graphs import TinyConfig, build_tiny_model

from fdpp_rewrite import cli
from fdpp_rewrite.compare import compare_models
from fdpp_rewrite.contracts import node_attributes, register_onnx_schemas, validate_node
from fdpp_rewrite.errors import FdppError
from fdpp_rewrite.rewrite import rewrite_model


ALL_COMMANDS = dict(cli.COMMANDS)


def run_command(monkeypatch, *argv):
    """cli.main in process (quick), with only this command in the table so other commands' imports do not
    matter here."""
    monkeypatch.setattr(cli, "COMMANDS", {argv[0]: ALL_COMMANDS[argv[0]]})
    return cli.main(list(argv))


@pytest.fixture
def tiny_path(tmp_path):
    path = tmp_path / "tiny.onnx"
    onnx.save(build_tiny_model(TinyConfig()), str(path))
    return path


def op_types(model):
    return [n.op_type for n in model.graph.node]


def test_rewrite_writes_the_model(monkeypatch, tiny_path, capsys):
    assert run_command(monkeypatch, "rewrite", str(tiny_path)) == 0
    out = capsys.readouterr().out
    assert "attention: replaced 2 (grouped-5d/past_len x2)" in out
    assert "projection fusion: replaced 4 (gate_up x2, qkv x2)" in out
    assert "flat gemm: replaced 9 (none x3, residual x4, silu_mul x2)" in out
    assert "warning: using the unprofiled default" in out  # no h200 profile covers these toy shapes
    written = tiny_path.with_name("tiny.fdpp.onnx")
    model = onnx.load(str(written))
    assert op_types(model).count("AsyncSoftmaxAttention") == 2 and op_types(model).count("FlatGemm") == 9
    assert "Softmax" not in op_types(model) and "MatMul" not in op_types(model)
    for node in model.graph.node:
        if node.domain == "fdpp":
            validate_node(node)
    register_onnx_schemas()
    onnx.checker.check_model(model, full_check=True)
    props = {p.key: p.value for p in model.metadata_props}
    assert model.producer_name == "fdpp_rewrite"
    assert props["fdpp.rewrite.profile"] == "unprofiled-default"
    assert props["fdpp.rewrite.calibration"].startswith("default phi=0.0")
    assert json.loads(props["fdpp.rewrite.replaced"])["attention"] == {"grouped-5d/past_len": 2}
    assert {op.domain: op.version for op in model.opset_import} == {"": 17, "fdpp": 5}  # FlatGemm version 5


def test_refuses_to_overwrite_without_force(monkeypatch, tiny_path, capsys):
    output = tiny_path.with_name("out.fdpp.onnx")
    output.write_text("keep me")
    assert run_command(monkeypatch, "rewrite", str(tiny_path), "-o", str(output)) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "already exists; pass --force" in err[0]
    assert output.read_text() == "keep me"
    assert run_command(monkeypatch, "rewrite", str(tiny_path), "-o", str(output), "--force") == 0
    assert "FlatGemm" in op_types(onnx.load(str(output)))


def test_external_data_in_and_out(monkeypatch, tmp_path):
    path = tmp_path / "big.onnx"
    onnx.save(build_tiny_model(TinyConfig()), str(path), save_as_external_data=True, location="big.onnx.data")
    output = tmp_path / "big.fdpp.onnx"
    assert run_command(monkeypatch, "rewrite", str(path)) == 0
    assert output.with_name("big.fdpp.onnx.data").stat().st_size > 0
    assert compare_models(path, output).passed
    # a second rewrite with --force replaces the data file rather than appending to it
    size = output.with_name("big.fdpp.onnx.data").stat().st_size
    assert run_command(monkeypatch, "rewrite", str(path), "--force") == 0
    assert output.with_name("big.fdpp.onnx.data").stat().st_size == size


def test_no_attention_is_one_line_error(monkeypatch, tmp_path, capsys):
    x = onnx.helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [2, 4])
    y = onnx.helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [2, 4])
    graph = onnx.helper.make_graph([onnx.helper.make_node("Relu", ["x"], ["y"])], "relu", [x], [y])
    path = tmp_path / "relu.onnx"
    onnx.save(onnx.helper.make_model(graph), str(path))
    assert run_command(monkeypatch, "rewrite", str(path)) == 2
    line = error_line(capsys.readouterr().err)  # after the stage lines
    assert line.startswith("error: nothing to rewrite: no attention chain and no weight matmul found")
    assert "the rewriter replaces attention chains MatMul(q, k^T)" in line and "weight matmuls" in line
    assert not (tmp_path / "relu.fdpp.onnx").exists()


def _softmax_over_axis_2(tmp_path):
    """Our tiny model whose one attention softmax runs over axis 2: the attention pass cannot take it."""
    model = build_tiny_model(TinyConfig(layers=1))
    softmax = next(n for n in model.graph.node if n.op_type == "Softmax")
    del softmax.attribute[:]
    softmax.attribute.append(onnx.helper.make_attribute("axis", 2))
    path = tmp_path / "odd.onnx"
    onnx.save(model, str(path))
    return path


def test_partial_rewrite_warns_and_require_refuses(monkeypatch, tmp_path, capsys):
    path = _softmax_over_axis_2(tmp_path)
    assert run_command(monkeypatch, "rewrite", str(path)) == 0  # the GEMMs are still replaced
    out = capsys.readouterr().out
    assert "warning: attention: 0 replaced, 1 left" in out and "gemm: 5 replaced, 0 left" in out
    assert "not the last axis" in out  # the pass says why
    assert run_command(monkeypatch, "rewrite", str(path), "--require", "gemm", "--force") == 0
    capsys.readouterr()
    assert run_command(monkeypatch, "rewrite", str(path), "--require", "attention,gemm", "--force") == 2
    line = error_line(capsys.readouterr().err)
    assert line.startswith("error: --require attention: 0 replaced, 1 left") and "the rewriter replaces" in line


def test_require_names_the_patterns(monkeypatch, tiny_path, capsys):
    assert run_command(monkeypatch, "rewrite", str(tiny_path), "--require", "attention,rope") == 2
    assert error_line(capsys.readouterr().err) == ("error: --require rope: not a pattern; pass a comma-separated "
                                                   "list of attention, gemm")
    assert not tiny_path.with_name("tiny.fdpp.onnx").exists()


def test_profile_for_another_model(monkeypatch, tiny_path, tmp_path, capsys):
    profile = tmp_path / "llama2-7b-h200.json"
    profile.write_text(json.dumps({"schema": "fdpp-profile/2", "gpu": "NVIDIA H200", "shapes": [
        {"n": 12288, "k": 4096, "dtype": "float16", "m1": 2, "m2": 32,
         "implb": {"n_tile": 64, "k_tile": 64, "stages": 2, "split_k": 1}, "silu_mul": None}]}))
    assert run_command(monkeypatch, "rewrite", str(tiny_path), "--profile", str(profile)) == 2
    err = capsys.readouterr().err
    cfg = TinyConfig()  # the smallest shape first: the lm_head's [vocab, hidden]
    assert f"has no entry for [{cfg.vocab}, {cfg.hidden}] float32" in err and "a profile for another model?" in err
    assert "python -m fdpp_rewrite profile" in err


def test_calibration_from_the_command_line(monkeypatch, tiny_path, tmp_path):
    calib = tmp_path / "calib.json"
    calib.write_text(json.dumps({"schema": "fdpp-calibration/1", "layers": [
        {"layer": i, "phi": 1.5 * i, "guard_lo": -25.0, "guard_hi": 20.0} for i in range(2)]}))
    assert run_command(monkeypatch, "rewrite", str(tiny_path), "--calibration", str(calib)) == 0
    model = onnx.load(str(tiny_path.with_name("tiny.fdpp.onnx")))
    phis = [node_attributes(n)["phi"] for n in model.graph.node if n.op_type == "AsyncSoftmaxAttention"]
    assert phis == [0.0, 1.5]
    assert {p.key: p.value for p in model.metadata_props}["fdpp.rewrite.calibration"] == str(calib)


@pytest.mark.parametrize("argv, message", [
    (["missing.onnx"], "no ONNX file"),
    (["--calibration", "missing.json"], "no calibration file"),
    (["--profile", "missing.json"], "no profile at"),
])
def test_bad_paths(monkeypatch, tiny_path, capsys, argv, message):
    args = [str(tiny_path.with_name(argv[0]))] if argv[0].endswith(".onnx") else [str(tiny_path), *argv]
    assert run_command(monkeypatch, "rewrite", *args) == 2
    assert message in capsys.readouterr().err


def test_rewriting_a_rewrite_is_refused():
    rewritten = rewrite_model(build_tiny_model(TinyConfig(layers=1)), stream=open("/dev/null", "w")).model
    with pytest.raises(Exception, match="already has fdpp nodes"):
        rewrite_model(rewritten)


def test_unsupported_attention_fails_loudly():
    """A chain the pass recognises but cannot express (a per-head 5-D bias) must stop the rewrite."""
    model = build_tiny_model(TinyConfig(layers=1, mask="sliding"))
    graph = model.graph
    # make the mask per KV head: Expand it to [B, Hkv, 1, S, L] before the Add
    add = next(n for n in graph.node if n.op_type == "Add" and any(i.startswith("t") and "unsqueeze" in i
                                                                   for i in n.input)
               and any("mul" in i for i in n.input))
    mask_name = next(i for i in add.input if "unsqueeze" in i)
    graph.initializer.append(onnx.numpy_helper.from_array(np.array([1, 2, 1, 1, 1], np.int64), "per_head"))
    graph.node.insert(list(graph.node).index(add), onnx.helper.make_node("Expand", [mask_name, "per_head"],
                                                                           ["mask_per_head"]))
    add.input[list(add.input).index(mask_name)] = "mask_per_head"
    with pytest.raises(FdppError, match=r"--require attention: 0 replaced, 1 left"):
        rewrite_model(model, stream=io.StringIO(), require=("attention",))
    log = io.StringIO()  # without --require: a partial rewrite that says what it left
    result = rewrite_model(model, stream=log)
    assert "warning: attention: 0 replaced, 1 left" in log.getvalue() and "gemm: 5 replaced, 0 left" in log.getvalue()
    assert sum(n.op_type == "FlatGemm" for n in result.model.graph.node) == 5


@pytest.mark.parametrize("preset", ["tiny-llama", "tiny-smollm2", "tiny-opt", "tiny-chatglm"])
def test_real_exports_rewrite_and_compare(monkeypatch, tmp_path, capsys, preset):
    """Our exporter's graphs for every tiny preset: all attention and weight matmuls replaced, and the
    rewrite matches the original through polygraphy."""
    from fdpp_rewrite.export import export_model

    path = tmp_path / f"{preset}.onnx"
    export_model(preset, path, dtype="float32", max_cache=64, progress=False)
    assert run_command(monkeypatch, "rewrite", str(path)) == 0
    out = capsys.readouterr().out
    assert "attention: replaced" in out and "qkv x" in out
    assert run_command(monkeypatch, "compare", str(path), str(tmp_path / f"{preset}.fdpp.onnx")) == 0
    assert "PASS: tolerance float32" in capsys.readouterr().out


def test_attention_the_pass_cannot_read_fails_loudly(monkeypatch):
    """A second attention chain whose softmax runs over the wrong axis: the rewrite must not leave it behind
    as a mere warning."""
    from rewrite_graphs import build_attention_graph

    good = build_tiny_model(TinyConfig(layers=1))
    odd = build_attention_graph(softmax_axis=2)
    graph = good.graph
    for info in odd.graph.input:
        if info.name in ("query", "key", "value"):
            graph.input.append(info)
    prefix = {name: f"odd_{name}" for name in [i.name for i in odd.graph.initializer]}
    for init in odd.graph.initializer:
        init.name = prefix[init.name]
        graph.initializer.append(init)
    for node in odd.graph.node:
        renamed = onnx.helper.make_node(node.op_type, [prefix.get(i, i if i in ("query", "key", "value", "past_len")
                                                                   else f"odd_{i}") for i in node.input],
                                        [f"odd_{o}" for o in node.output], name=f"odd_{node.name}")
        renamed.attribute.extend(node.attribute)
        graph.node.append(renamed)
    graph.output.append(onnx.helper.make_tensor_value_info("odd_attention_out", onnx.TensorProto.FLOAT, None))
    with pytest.raises(FdppError, match=r"--require attention: 1 replaced, 1 left"):
        rewrite_model(good, stream=io.StringIO(), require=("attention", "gemm"))


@pytest.mark.parametrize("bad", ["missing", "not json"])
def test_failed_force_rewrite_keeps_the_old_pair(monkeypatch, tmp_path, capsys, bad):
    path = tmp_path / "big.onnx"
    onnx.save(build_tiny_model(TinyConfig()), str(path), save_as_external_data=True, location="big.onnx.data")
    output, data = tmp_path / "big.fdpp.onnx", tmp_path / "big.fdpp.onnx.data"
    assert run_command(monkeypatch, "rewrite", str(path)) == 0
    before = (output.read_bytes(), data.read_bytes())
    calib = tmp_path / "calib.json"
    if bad != "missing":
        calib.write_text(bad)
    assert run_command(monkeypatch, "rewrite", str(path), "--force", "--calibration", str(calib)) == 2
    error_line(capsys.readouterr().err)  # the first run's stage lines, then the one error line
    assert (output.read_bytes(), data.read_bytes()) == before
    assert compare_models(path, output).passed


def test_missing_external_data_is_one_line(monkeypatch, tmp_path, capsys):
    path = tmp_path / "big.onnx"
    onnx.save(build_tiny_model(TinyConfig()), str(path), save_as_external_data=True, location="big.onnx.data")
    (tmp_path / "big.onnx.data").unlink()
    assert run_command(monkeypatch, "rewrite", str(path)) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "big.onnx.data, which is missing" in err[0]
    assert not (tmp_path / "big.fdpp.onnx").exists()


def test_output_that_is_the_input_is_named_as_such(monkeypatch, tiny_path, capsys):
    assert run_command(monkeypatch, "rewrite", str(tiny_path), "-o", str(tiny_path)) == 2
    assert "is the input; pass -o with another path" in capsys.readouterr().err
