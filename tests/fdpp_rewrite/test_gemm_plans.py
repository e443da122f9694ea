"""Build-time GEMM plan resolution (fdpp_rewrite.gemm_plans) on any machine: the cuda rule takes the device name
as an argument, so it is checked here without a GPU."""

import io
import json

import pytest

from fdpp_rewrite.errors import FdppError
from fdpp_rewrite.gemm_plans import GemmNode, gemm_nodes, resolve_cpu_plans, resolve_cuda_plans
from fdpp_rewrite.profiles import UNPROFILED_DEFAULT, load_profile
from fdpp_rewrite.resources import profile_path
from fdpp_rewrite.schemas import PROFILE_SCHEMA

GATE_UP = (22016, 4096, "float16")  # llama2-7b's gate_up: its silu_mul plan differs from the entry's
ODD = (1000, 123, "float16")        # no profile has it


def stamped(m1=3, m2=40, label="h200.json (NVIDIA H200)", epilogue="none"):
    """A FlatGemm's attributes as the rewriter writes them."""
    return {"m1": m1, "m2": m2, "implb_n_tile": 32, "implb_k_tile": 256, "implb_stages": 3, "implb_split_k": 2,
            "implc": "cublaslt", "profile": label, "epilogue": epilogue, "has_bias": 0}


def refuse(shape):
    raise AssertionError(f"profiled {shape}: a profile covers it")


def test_cuda_plans_come_from_the_committed_profile_of_this_gpu():
    """Nodes stamped without this GPU's profile (unprofiled default): the packaged h200.json, read by the one
    validated reader; a silu_mul node gets its entry's stored silu_mul plan."""
    unprofiled = dict(UNPROFILED_DEFAULT.attributes(), epilogue="silu_mul")
    nodes = {"gate_up": GemmNode(GATE_UP, "silu_mul", unprofiled),
             "plain": GemmNode(GATE_UP, "none", dict(unprofiled, epilogue="none"))}
    resolved = resolve_cuda_plans(nodes, "NVIDIA H200", measure=refuse, stream=io.StringIO())
    entry = load_profile(profile_path("h200.json")).lookup(*GATE_UP)
    assert resolved.plans["plain"] == entry.plan()
    assert resolved.plans["gate_up"] == entry.silu_mul.plan() != entry.plan()
    assert (resolved.plans["gate_up"]["m2"], resolved.plans["gate_up"]["implb"]["loader"]) == (16, "pair")
    assert (resolved.plans["plain"]["m2"], resolved.plans["plain"]["implb"]["loader"]) == (8, "rows")
    assert resolved.profile_file == profile_path("h200.json") and resolved.measured == []
    assert resolved.source == "engines/profiles/h200.json"


def test_cuda_plans_take_the_nodes_attributes_when_stamped_for_this_gpu():
    nodes = {"o": GemmNode(GATE_UP, "none", stamped())}
    resolved = resolve_cuda_plans(nodes, "NVIDIA H200", measure=refuse)
    assert resolved.plans["o"] == {"m1": 3, "m2": 40, "implc": "cublaslt", "implb": {
        "n_tile": 32, "k_tile": 256, "stages": 3, "split_k": 2, "loader": "tma"}}
    assert resolved.source == "h200.json (NVIDIA H200)" and resolved.profile_file is None


def test_a_shards_node_is_not_served_by_the_plan_stamped_for_the_whole_shape():
    """A tensor-parallel shard's [N / 2, K]: its stamped attributes were chosen for [N, K], so the shard's shape is
    resolved through the profile (here the committed H200 one, which has it), not taken from the node."""
    shard = (6144, 4096, "float16")  # llama2-7b's qkv [12288, 4096] on 2 ranks
    nodes = gemm_nodes({"nodes": [{"name": "g", "domain": "fdpp", "op": "FlatGemm", "attrs": stamped()}]},
                       {"g": shard}, prefix="1/", rewritten_shapes={"g": (12288, 4096, "float16")})
    assert nodes["1/g"].stamped is False
    resolved = resolve_cuda_plans(nodes, "NVIDIA H200", measure=refuse)
    assert resolved.plans["1/g"] == load_profile(profile_path("h200.json")).lookup(*shard).plan() != \
        resolve_cuda_plans({"g": GemmNode(shard, "none", stamped())}, "NVIDIA H200").plans["g"]


def test_cuda_plans_profile_only_the_shapes_no_profile_has():
    """Stamped for another GPU and absent from every profile of this one: measured once per shape, here."""
    from fdpp_rewrite.profile_plan import complete_entry

    measured = []

    def measure(shape):
        measured.append(shape)
        n, k, dtype = shape
        return complete_entry({"n": n, "k": k, "dtype": dtype, "m1": 1, "m2": 16, "implc": "cublaslt",
                               "implb": {"n_tile": 16, "k_tile": 128, "stages": 2, "split_k": 1}})

    nodes = {"a": GemmNode(ODD, "none", stamped(label="a100.json (NVIDIA A100)")),
             "b": GemmNode(ODD, "residual", stamped(label="a100.json (NVIDIA A100)")),
             "c": GemmNode(GATE_UP, "none", stamped(label="unprofiled-default"))}
    stream = io.StringIO()
    resolved = resolve_cuda_plans(nodes, "NVIDIA H200", measure=measure, stream=stream)
    assert measured == [ODD] and resolved.plans["a"]["m2"] == resolved.plans["b"]["m2"] == 16
    assert resolved.plans["c"] == load_profile(profile_path("h200.json")).lookup(*GATE_UP).plan()
    assert [e["n"] for e in resolved.measured] == [1000] and "profiled GEMM 1/1 [N=1000, K=123]" in stream.getvalue()
    assert "profiled at build (NVIDIA H200)" in resolved.source


def test_cuda_without_a_profile_or_a_profiler_is_an_error():
    nodes = {"a": GemmNode(ODD, "none", stamped(label="unprofiled-default"))}
    with pytest.raises(FdppError, match=r"no profile covers \[1000, 123\] float16 on NVIDIA H100"):
        resolve_cuda_plans(nodes, "NVIDIA H100")  # no committed h100.json


def write_profile(path, gpu="NVIDIA H200", m1=2, **entry):
    path.write_text(json.dumps({"schema": PROFILE_SCHEMA, "gpu": gpu, "shapes": [dict(
        {"n": ODD[0], "k": ODD[1], "dtype": ODD[2], "m1": m1, "m2": 24, "silu_mul": None,
         "implb": {"n_tile": 64, "k_tile": 128, "stages": 2, "split_k": 1}}, **entry)]}))
    return path


def test_build_profile_overrides_the_stamps_on_cuda_and_cpu(tmp_path):
    path = write_profile(tmp_path / "mine.json", m1=5)
    nodes = {"a": GemmNode(ODD, "none", stamped())}
    assert resolve_cuda_plans(nodes, "NVIDIA H200", path, measure=refuse).plans["a"]["m1"] == 5
    cpu = resolve_cpu_plans(nodes, path)
    assert cpu.plans["a"]["m1"] == 5 and cpu.profile_file == path
    assert resolve_cpu_plans(nodes).plans["a"]["m1"] == 3  # without --profile: the node's own


@pytest.mark.parametrize("call, message", [
    (lambda p: resolve_cuda_plans({"a": GemmNode(ODD, "none", stamped())}, "NVIDIA H100", p),
     "is for NVIDIA H200, this GPU is NVIDIA H100"),
    (lambda p: resolve_cpu_plans({"a": GemmNode(GATE_UP, "none", stamped())}, p),
     r"has no entry for \[22016, 4096\] float16"),
    (lambda p: resolve_cpu_plans({"a": GemmNode(ODD, "none", stamped())}, p.with_name("missing.json")),
     "no profile at .*missing.json"),
])
def test_bad_build_profiles_are_one_line_errors(tmp_path, call, message):
    with pytest.raises(FdppError, match=message) as info:
        call(write_profile(tmp_path / "mine.json"))
    assert "\n" not in str(info.value)


def test_a_profile_with_a_non_integer_threshold_is_refused_by_the_build(tmp_path):
    for bad in (1e309, 1.5):
        path = write_profile(tmp_path / "bad.json", m1=bad)
        with pytest.raises(FdppError, match="m1 must be an integer"):
            resolve_cpu_plans({"a": GemmNode(ODD, "none", stamped())}, path)


def test_cpu_build_applies_its_profile_and_refuses_a_missing_one(tmp_path):
    """`build --backend cpu --profile P`: P's plans in plan.json; a missing P is a one-line error, nothing written."""
    from fdpp_rewrite.engine.build import build_engine
    from fdpp_rewrite.export import export_model
    from fdpp_rewrite.profile_plan import model_shapes
    from fdpp_rewrite.models import get_config
    from fdpp_rewrite.rewrite import rewrite_file

    exported = tmp_path / "model.onnx"
    export_model("tiny-llama", exported, dtype="float16", max_cache=32, progress=False)
    rewritten = rewrite_file(exported, stream=io.StringIO())
    with pytest.raises(FdppError, match="no profile at .*missing.json") as info:
        build_engine(rewritten, tmp_path / "engine", backend="cpu", profile=tmp_path / "missing.json")
    assert "\n" not in str(info.value) and not (tmp_path / "engine").exists()

    entries = [{"n": n, "k": k, "dtype": "float16", "m1": 1, "m2": 7, "silu_mul": None,
                "implb": {"n_tile": 16, "k_tile": 64, "stages": 2, "split_k": 1}}
               for n, k in sorted({(n, k) for _, n, k in model_shapes(get_config("tiny-llama"))})]
    path = tmp_path / "tiny.json"
    path.write_text(json.dumps({"schema": PROFILE_SCHEMA, "gpu": "NVIDIA H200", "shapes": entries}))
    manifest = build_engine(rewritten, tmp_path / "engine", backend="cpu", profile=path, stream=io.StringIO())
    plans = json.loads((tmp_path / "engine" / "plan.json").read_text())["gemm_plans"]
    assert plans and {(p["m1"], p["m2"], p["implb"]["n_tile"]) for p in plans.values()} == {(1, 7, 16)}
    assert manifest["profile"] == str(path) and manifest["profile_sha256"]
