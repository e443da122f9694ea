"""A profile with a wgmma range (m3) through the whole path on the CPU: `rewrite` stamps m3 and the wgmma config on
every FlatGemm of tiny-llama, `build` (cpu) records them in the engine's GEMM plans, and such a plan becomes the C
ABI's struct (what the cuda backend hands fdpp_gemm_run through gpu/gemm.linear)."""

import io
import json

import onnx

from fdpp_rewrite.contracts import node_attributes
from fdpp_rewrite.models import get_config
from fdpp_rewrite.profile_plan import model_shapes
from fdpp_rewrite.resources import plugin_library_path
from fdpp_rewrite.schemas import PROFILE_SCHEMA

PRESET, DTYPE = "tiny-llama", "float32"
MMA = {"n_tile": 16, "k_tile": 256, "stages": 3, "split_k": 1}
WGMMA = {"n_tile": 64, "k_tile": 64, "stages": 4, "split_k": 2, "loader": "wgmma"}


def profile_with_m3(path):
    shapes = sorted({(n, k) for _, n, k in model_shapes(get_config(PRESET))})
    entries = [{"n": n, "k": k, "dtype": DTYPE, "m1": 0, "m2": 16, "implb": MMA, "implc": "cublaslt",
                "m3": 96 + i, "wgmma": WGMMA, "silu_mul": None} for i, (n, k) in enumerate(shapes)]
    path.write_text(json.dumps({"schema": PROFILE_SCHEMA, "gpu": "Test GPU", "shapes": entries}))
    return path, {(n, k): 96 + i for i, (n, k) in enumerate(shapes)}


def test_rewrite_stamps_m3_and_the_build_plans_carry_it_to_the_c_struct(tmp_path):
    from fdpp_rewrite.engine.build import build_engine
    from fdpp_rewrite.export import export_model
    from fdpp_rewrite.gpu.gemm import LOADERS, Plan
    from fdpp_rewrite.rewrite import rewrite_file

    profile, m3_by_shape = profile_with_m3(tmp_path / "gpu.json")
    onnx_path = tmp_path / "model.onnx"
    export_model(PRESET, onnx_path, dtype=DTYPE, max_cache=64, progress=False)
    rewritten = rewrite_file(onnx_path, profile=profile, stream=io.StringIO())

    model = onnx.load(str(rewritten), load_external_data=False)
    weights = {init.name: tuple(init.dims) for init in model.graph.initializer}
    gemms = [node for node in model.graph.node if node.domain == "fdpp" and node.op_type == "FlatGemm"]
    assert gemms
    for node in gemms:
        attrs = node_attributes(node)
        n, k = weights[node.input[1]]
        assert (attrs["m2"], attrs["m3"]) == (16, m3_by_shape[(n, k)]), node.name
        assert (attrs["implb_wgmma_stages"], attrs["implb_wgmma_split_k"]) == (4, 2)
        assert attrs["plugin_version"] == "5"

    engine = tmp_path / "engine"
    build_engine(rewritten, engine, backend="cpu", max_batch=2, max_seq=64, stream=io.StringIO())
    plans = json.loads((engine / "plan.json").read_text())["gemm_plans"]
    assert len(plans) == len(gemms)
    for plan in plans.values():
        assert plan["m3"] in m3_by_shape.values() and plan["wgmma"] == WGMMA
        struct = Plan.from_dict(plan)  # what gpu/gemm.linear passes to fdpp_gemm_run
        assert (struct.m2, struct.m3) == (16, plan["m3"])
        assert (struct.wgmma.n_tile, struct.wgmma.k_tile, struct.wgmma.stages, struct.wgmma.split_k,
                struct.wgmma.loader) == (64, 64, 4, 2, LOADERS["wgmma"])
        if plugin_library_path().exists():  # the library's dispatch of that struct
            from fdpp_rewrite.gpu.gemm import select_range

            assert [select_range(m, plan) for m in (16, 17, plan["m3"], plan["m3"] + 1)] == [
                "implb", "wgmma", "wgmma", "cublaslt"]


def test_a_profile_without_m3_stamps_no_wgmma_range(tmp_path):
    from fdpp_rewrite.export import export_model
    from fdpp_rewrite.rewrite import rewrite_file

    profile, _ = profile_with_m3(tmp_path / "gpu.json")
    data = json.loads(profile.read_text())
    for entry in data["shapes"]:
        del entry["m3"], entry["wgmma"]
    profile.write_text(json.dumps(data))
    onnx_path = tmp_path / "model.onnx"
    export_model(PRESET, onnx_path, dtype=DTYPE, max_cache=64, progress=False)
    model = onnx.load(str(rewrite_file(onnx_path, profile=profile, stream=io.StringIO())), load_external_data=False)
    for node in model.graph.node:
        if node.op_type == "FlatGemm":
            attrs = node_attributes(node)
            # the contract's defaults: m3 0 (= m2, no range); the node's plan is the one it had before m3 existed
            assert attrs.get("m3", 0) == 0 and attrs["m2"] == 16
