"""`build --backend tensorrt`: the one-line errors (in CI: no TensorRT there), the optimization profiles, and, where
TensorRT or TensorRT-RTX is importable and the library has the adapters, a real plan built from fdpp nodes."""

import importlib
import sys

import onnx
import pytest
from trt_harness_io import as_bfloat16, fdpp_nodes_graph

from fdpp_rewrite import cli
from fdpp_rewrite.engine import tensorrt_build
from fdpp_rewrite.engine.tensorrt_build import DECODE, PREFILL, profile_shapes
from fdpp_rewrite.errors import FdppError


def error_lines(capsys):
    return [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]


def hide_tensorrt(monkeypatch):
    for name in tensorrt_build.MODULES:
        monkeypatch.setitem(sys.modules, name, None)  # `import name` now raises ImportError


def test_without_tensorrt_the_build_names_what_to_install(tmp_path, tiny_rewritten_path, monkeypatch, capsys):
    hide_tensorrt(monkeypatch)
    code = cli.main(["build", str(tiny_rewritten_path), "--backend", "tensorrt", "-o", str(tmp_path / "m.plan")])
    assert code == 2
    assert error_lines(capsys) == [f"error: {tensorrt_build.INSTALL_TENSORRT}"]
    assert not (tmp_path / "m.plan").exists()


def test_an_existing_plan_is_kept_without_force(tmp_path, tiny_rewritten_path, monkeypatch, capsys):
    hide_tensorrt(monkeypatch)
    plan = tmp_path / "m.plan"
    plan.write_bytes(b"the user's engine")
    assert cli.main(["build", str(tiny_rewritten_path), "--backend", "tensorrt", "-o", str(plan)]) == 2
    (line,) = error_lines(capsys)
    assert "--force" in line and plan.read_bytes() == b"the user's engine"


def test_the_rtx_wheels_missing_library_link_is_named(tmp_path, monkeypatch):
    """TensorRT-RTX's parser aborts the process without libtensorrt_rtx.so; the build says how to add the link."""
    import types

    libs = tmp_path / "tensorrt_rtx_libs"
    libs.mkdir()
    (libs / "__init__.py").write_text("")
    (libs / "libtensorrt_rtx.so.1").write_bytes(b"")
    monkeypatch.setitem(sys.modules, "tensorrt_rtx_libs", types.SimpleNamespace(__file__=str(libs / "__init__.py")))
    rtx = types.SimpleNamespace(__name__="tensorrt_rtx_bindings")
    with pytest.raises(FdppError, match=f"ln -s libtensorrt_rtx.so.1 {libs}/libtensorrt_rtx.so"):
        tensorrt_build.check_rtx_parser(rtx)
    (libs / "libtensorrt_rtx.so").symlink_to("libtensorrt_rtx.so.1")
    tensorrt_build.check_rtx_parser(rtx)  # with the link: nothing to say
    tensorrt_build.check_rtx_parser(types.SimpleNamespace(__name__="tensorrt"))  # full TensorRT: not concerned


def test_profiles_cover_decode_and_prefill_up_to_the_cache(tiny_rewritten):
    shapes = profile_shapes(tiny_rewritten, max_batch=4, max_seq=None)
    assert shapes[DECODE]["input_ids"] == ((1, 1), (4, 1), (4, 1))
    assert shapes[PREFILL]["input_ids"] == ((1, 1), (1, 64), (4, 64))  # the cache length: 64
    assert shapes[DECODE]["past_len"] == ((1,), (4,), (4,))
    assert shapes[PREFILL]["key_cache.0"] == ((1, 3, 64, 64), (1, 3, 64, 64), (4, 3, 64, 64))
    assert profile_shapes(tiny_rewritten, max_batch=2, max_seq=16)[PREFILL]["input_ids"][2] == (2, 16)


def test_an_unknown_dynamic_dimension_is_refused(tiny_rewritten):
    model = onnx.ModelProto()
    model.CopyFrom(tiny_rewritten)
    model.graph.input[0].type.tensor_type.shape.dim[1].dim_param = "tokens"
    with pytest.raises(FdppError, match="dimension 'tokens' the tensorrt backend has no range for"):
        profile_shapes(model, max_batch=1, max_seq=8)


# ---- with a real TensorRT (TensorRT-RTX builds on a CPU-only machine too) -------------------------------------
@pytest.fixture
def trt(plugin_library, monkeypatch):
    for name in tensorrt_build.MODULES:
        try:
            module = importlib.import_module(name)
        except ImportError:
            continue
        try:
            tensorrt_build.check_rtx_parser(module)
        except Exception as exc:  # the wheel's missing link: say how to fix the environment, don't fail the code
            pytest.skip(str(exc))
        monkeypatch.setenv("FDPP_PLUGIN_LIB", str(plugin_library))
        return module
    pytest.skip("neither tensorrt nor tensorrt_rtx_bindings is importable")


def test_a_node_version_without_a_creator_is_named(trt, plugin_library, tiny_rewritten):
    model = onnx.ModelProto()
    model.CopyFrom(tiny_rewritten)
    norm = next(n for n in model.graph.node if n.op_type == "RMSNorm")
    norm.attribute.append(onnx.helper.make_attribute("plugin_version", "9"))
    with pytest.raises(FdppError, match=r"no TensorRT plugin for the graph's fdpp nodes RMSNorm \(version 9\)"):
        tensorrt_build.load_plugins(trt, plugin_library, model)


WHOLE_PRESETS = ["tiny-llama", "tiny-smollm2", "tiny-chatglm", "tiny-opt"]


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("preset", WHOLE_PRESETS)
def test_tensorrt_builds_a_whole_rewritten_model(tmp_path, trt, preset, dtype, capsys):
    """Every node of the rewritten model (fdpp plugins and the standard ops left between them) parses and builds,
    both profiles; the plan holds each fdpp plugin of the graph."""
    exported, rewritten, plan = tmp_path / "m.onnx", tmp_path / "m.fdpp.onnx", tmp_path / "m.plan"
    assert cli.main(["export", preset, "--dtype", "float16", "--max-cache", "64", "-o", str(exported)]) == 0
    assert cli.main(["rewrite", str(exported), "-o", str(rewritten)]) == 0
    if dtype == "bfloat16":  # the exporter writes float16; the same graph retyped
        onnx.save(as_bfloat16(onnx.load(str(rewritten))), str(rewritten))
    op_types = {n.op_type for n in onnx.load(str(rewritten), load_external_data=False).graph.node
                if n.domain == "fdpp"}
    assert {"FlatGemm", "AsyncSoftmaxAttention", "RopeAppend"} <= op_types
    capsys.readouterr()
    assert cli.main(["build", str(rewritten), "--backend", "tensorrt", "--max-batch", "2", "-o", str(plan)]) == 0, \
        capsys.readouterr().err
    data = plan.read_bytes()
    for op_type in op_types:
        assert op_type.encode() in data, op_type


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_tensorrt_builds_a_plan_of_fdpp_plugins(tmp_path, trt, tiny_rewritten_path, dtype, capsys):
    source = tmp_path / "nodes.onnx"
    onnx.save(fdpp_nodes_graph(onnx.load(str(tiny_rewritten_path)), dtype), str(source))
    plan = tmp_path / "nodes.plan"
    assert cli.main(["build", str(source), "--backend", "tensorrt", "--max-batch", "4", "-o", str(plan)]) == 0
    assert capsys.readouterr().out.startswith(f"wrote {plan} ({trt.__name__}")
    data = plan.read_bytes()
    # The plan carries each plugin's name, version and getFieldsToSerialize() fields, which the runtime hands back
    # to the creators.
    for text in (b"FlatGemm", b"AsyncSoftmaxAttention", b"unprofiled-default", b"past_len", b"cublaslt"):
        assert text in data, text
    assert cli.main(["build", str(source), "--backend", "tensorrt", "-o", str(plan)]) == 2  # exists: needs --force
