"""Profile files (engines/profiles/<gpu>.json): loading, validation and the rewriter's choice rule."""

import json

import pytest

from fdpp_rewrite.contracts import load_contract
from fdpp_rewrite.dispatch import select_impl
from fdpp_rewrite.errors import FdppError
from fdpp_rewrite.profiles import UNPROFILED, UNPROFILED_DEFAULT, load_profile, resolve_choices
from fdpp_rewrite.resources import plugin_library_path
from fdpp_rewrite.schemas import PROFILE_SCHEMA

QKV, O_PROJ = (960, 576, "float16"), (576, 576, "float16")


def shape_entry(n, k, dtype="float16", m1=2, m2=24, **implb):
    tiles = {"n_tile": 64, "k_tile": 128, "stages": 2, "split_k": 1, **implb}
    return {"n": n, "k": k, "dtype": dtype, "m1": m1, "m2": m2, "implb": tiles, "implc": "cutlass",
            "curves": {"m": [1, 2], "impla_us": [3.0, 5.0], "cublas_us": [4.0, 4.1]}, "silu_mul": None}


def write_profile(path, entries, **extra):
    data = {"schema": PROFILE_SCHEMA, "gpu": "NVIDIA H200", "compute_capability": "9.0", "num_sms": 132,
            "created": "2026-11-29T00:00:00Z", "command": "python -m fdpp_rewrite profile smollm2-135m",
            "presets": ["smollm2-135m"], "shapes": entries, **extra}
    path.write_text(json.dumps(data))
    return path


def test_load_and_lookup(tmp_path):
    path = write_profile(tmp_path / "h200.json", [shape_entry(960, 576, m1=3, m2=40, n_tile=32),
                                                  shape_entry(576, 576)])
    profile = load_profile(path)
    choice = profile.lookup(*QKV)
    assert (choice.m1, choice.m2, choice.implb_n_tile, choice.implb_k_tile) == (3, 40, 32, 128)
    assert choice.profile == "h200.json (NVIDIA H200)" and profile.label == choice.profile
    assert profile.lookup(960, 576, "bfloat16") is None  # keyed by dtype too
    assert profile.presets == ("smollm2-135m",)


@pytest.mark.parametrize("change, message", [
    ({"schema": "fdpp-profile/0"}, "expected \"schema\""),
    ({"shapes": {}}, "must be a list"),
    ({"shapes": [{"n": 960, "k": 576, "dtype": "float16", "m1": 1, "silu_mul": None}]}, "shapes\\[0\\] lacks .m2."),
    ({"shapes": [shape_entry(960, 576, m1=30, m2=24)]}, "m1 <= m2"),
    ({"shapes": [shape_entry(960, 576, n_tile=48)]}, "implb_n_tile"),
    ({"shapes": [shape_entry(960, 576, dtype="int8")]}, "dtype='int8'"),
    ({"shapes": [shape_entry(960, 576), shape_entry(960, 576)]}, "repeats"),
    ({"schema": "fdpp-profile/1"}, "an older profile.*re-run `python -m fdpp_rewrite profile"),
    ({"shapes": [shape_entry(960, 576, m1=1e309)]}, r"shapes\[0\].m1 must be an integer, got Infinity"),
    ({"shapes": [shape_entry(960, 576, m1=1.5)]}, r"shapes\[0\].m1 must be an integer, got 1.5"),
    ({"shapes": [shape_entry(960, 576, m1=True)]}, r"shapes\[0\].m1 must be an integer, got true"),
    ({"shapes": [shape_entry(960, 576, stages=2.0)]}, r"implb.stages must be an integer, got 2.0"),
    ({"shapes": [dict(shape_entry(960, 576), n="960")]}, r"shapes\[0\].n must be an integer"),
    ({"shapes": [{k: v for k, v in shape_entry(960, 576).items() if k != "silu_mul"}]}, "lacks 'silu_mul'"),
    ({"shapes": [dict(shape_entry(960, 576), silu_mul={"m1": 0, "m2": 1.5, "implb": shape_entry(1, 1)["implb"]})]},
     r"shapes\[0\].silu_mul.m2 must be an integer"),
    ({"shapes": [dict(shape_entry(960, 576), silu_mul=dict(shape_entry(1, 1), m1=9, m2=3))]}, "m1 <= m2"),
])
def test_malformed_profiles(tmp_path, change, message):
    path = write_profile(tmp_path / "bad.json", [shape_entry(960, 576)], **change)
    with pytest.raises(FdppError, match=message) as info:
        load_profile(path)
    assert "\n" not in str(info.value)  # one line


def test_not_json_and_missing(tmp_path):
    (tmp_path / "broken.json").write_text("{")
    with pytest.raises(FdppError, match="not valid JSON"):
        load_profile(tmp_path / "broken.json")
    with pytest.raises(FdppError, match="no profile at"):
        load_profile(tmp_path / "absent.json")


def test_explicit_profile_must_cover_every_shape(tmp_path):
    path = write_profile(tmp_path / "other-model.json", [shape_entry(4096, 4096)])
    with pytest.raises(FdppError) as info:
        resolve_choices([QKV, O_PROJ], explicit_path=path)
    message = str(info.value)
    assert "has no entry for [576, 576] float16" in message and "(and 1 more: [960, 576] float16)" in message
    assert "a profile for another model?" in message and "fdpp_rewrite profile" in message


def test_explicit_profile_used(tmp_path):
    path = write_profile(tmp_path / "p.json", [shape_entry(960, 576, m1=5, m2=9), shape_entry(576, 576)])
    choices, label, warnings = resolve_choices([QKV, O_PROJ, QKV], explicit_path=path)
    assert choices[QKV].m1 == 5 and label == str(path) and warnings == []


def test_default_profile_used_when_it_covers_the_model(tmp_path):
    default = write_profile(tmp_path / "h200.json", [shape_entry(960, 576), shape_entry(576, 576)])
    choices, label, warnings = resolve_choices([QKV, O_PROJ], default_path=default)
    assert label == str(default) and not warnings and choices[O_PROJ].profile.startswith("h200.json")


def test_unprofiled_default_when_the_default_misses_a_shape(tmp_path):
    default = write_profile(tmp_path / "h200.json", [shape_entry(960, 576)])
    choices, label, warnings = resolve_choices([QKV, O_PROJ], default_path=default)
    assert label == UNPROFILED and set(choices.values()) == {UNPROFILED_DEFAULT}  # all shapes, not a mix
    assert len(warnings) == 1 and "[576, 576] float16" in warnings[0] and "h200.json has no entry" in warnings[0]


def test_unprofiled_default_without_any_profile(tmp_path):
    choices, label, warnings = resolve_choices([QKV], default_path=tmp_path / "h200.json")
    assert label == UNPROFILED and choices[QKV].profile == "unprofiled-default" and "no profile at" in warnings[0]


def test_unprofiled_default_is_the_contracts():
    """One unprofiled plan: m1/m2/implc from the FlatGemm contract's "unprofiled_default", tiles "device" (the
    node carries the attribute defaults in their place)."""
    contract = load_contract("FlatGemm")
    plan = contract.raw["unprofiled_default"]
    assert (UNPROFILED_DEFAULT.m1, UNPROFILED_DEFAULT.m2, UNPROFILED_DEFAULT.implc) == (plan["m1"], plan["m2"],
                                                                                         plan["implc"])
    assert plan["implb"] == "device" and "'device'" in contract.raw["unprofiled_default_doc"]
    attrs = UNPROFILED_DEFAULT.attributes()
    assert attrs["profile"] == UNPROFILED == contract.attributes["profile"]["default"]
    assert all(attrs[name] == contract.attributes[name]["default"] for name in attrs if name.startswith("implb_"))
    assert [select_impl(m, attrs) for m in (1, 8, 9, 64)] == ["implb", "implb", "cublaslt", "cublaslt"]


needs_library = pytest.mark.skipif(not plugin_library_path().exists(),
                                   reason=f"plugin library {plugin_library_path()} not built (make lib)")


@needs_library
@pytest.mark.parametrize("n, k, epilogue", [(4096, 4096, "none"), (22016, 4096, "silu_mul"), (576, 576, "none"),
                                            (49152, 576, "none")])
@pytest.mark.parametrize("device", [{"num_sms": 132, "cc_major": 9}, {"num_sms": 108, "cc_major": 8}])
def test_library_default_plan_has_the_contracts_thresholds(n, k, epilogue, device):
    from fdpp_rewrite.gpu import gemm

    plan = gemm.default_plan(n, k, epilogue, **device)
    assert (plan["m1"], plan["m2"], plan["implc"]) == (UNPROFILED_DEFAULT.m1, UNPROFILED_DEFAULT.m2,
                                                       UNPROFILED_DEFAULT.implc)


@needs_library
@pytest.mark.parametrize("k", [64, 576, 4096, 11008, 13696])
@pytest.mark.parametrize("device", [{"cc_major": 9, "max_smem": 232448}, {"cc_major": 8, "max_smem": 166912},
                                    {"cc_major": 8, "max_smem": 101376}])
def test_unprofiled_node_tiles_run_on_every_shape_and_gpu(k, device):
    """The implb_* attributes an unprofiled node carries are a config the library accepts at every M ImplB serves."""
    from fdpp_rewrite.gpu import gemm

    c = UNPROFILED_DEFAULT
    config = {"n_tile": c.implb_n_tile, "k_tile": c.implb_k_tile, "stages": c.implb_stages,
              "split_k": c.implb_split_k, "loader": c.implb_loader}
    for m in range(1, UNPROFILED_DEFAULT.m2 + 1):
        gemm.check_implb_config(config, m, k, **device)


def test_the_committed_h200_profile_covers_every_real_size_preset():
    """No engine of a real-size preset runs unprofiled on the H200: every fused GEMM shape is in the profile."""
    from fdpp_rewrite.models import PRESETS, get_config
    from fdpp_rewrite.profile_plan import model_shapes
    from fdpp_rewrite.profiles import DEFAULT_PROFILE

    profile = load_profile(DEFAULT_PROFILE)
    missing = {name: [(n, k) for _, n, k in model_shapes(get_config(name)) if profile.lookup(n, k, "float16") is None]
               for name in PRESETS if not name.startswith("tiny-")}
    # The families added without a GPU at hand: their shapes are profiled (`fdpp profile <preset>`) at their first
    # build on the H200 until the committed profile has them; this set must shrink to empty, never grow.
    assert {name for name, shapes in missing.items() if shapes} == AWAITING_H200_PROFILE


AWAITING_H200_PROFILE = {"gemma3-270m", "gemma-2b", "gemma2-2b", "phi3-mini", "qwen3-0.6b", "stablelm-2-1.6b",
                         "pythia-1.4b"}


def test_a_silu_mul_node_gets_the_one_launch_decode_plan_of_its_shape(tmp_path):
    """The committed H200 profile: llama2-7b's gate_up [22016, 4096] hands M 9-16 to cuBLASLt (+ the SiLU-mul
    pass); with the silu_mul epilogue its node keeps them on the pair ImplB kernel. Other epilogues keep the plan."""
    from fdpp_rewrite.profiles import DEFAULT_PROFILE

    choice = load_profile(DEFAULT_PROFILE).lookup(22016, 4096, "float16")
    assert choice.m2 == 8 and choice.for_epilogue("none") is choice and choice.for_epilogue("residual") is choice
    fused = choice.for_epilogue("silu_mul")
    assert (fused.m1, fused.m2, fused.implb_loader, fused.implc) == (choice.m1, 16, "pair", choice.implc)
    load_contract("FlatGemm").validate_attributes(fused.attributes(), where="the fused plan")
    assert "silu_mul" not in fused.attributes()


def test_the_committed_h200_profile_stores_each_silu_mul_plan_as_the_profiler_computes_it():
    """The stored silu_mul plans are the profiler's fused_decode_plan of each entry's own search data: converting
    the file (schema 2) changed no number."""
    from fdpp_rewrite.profile_plan import complete_entry
    from fdpp_rewrite.profiles import DEFAULT_PROFILE

    data = json.loads(DEFAULT_PROFILE.read_text())
    assert data["schema"] == PROFILE_SCHEMA
    assert [complete_entry(entry) for entry in data["shapes"]] == data["shapes"]
    assert sum(entry["silu_mul"] is not None for entry in data["shapes"]) > 0


def test_gpu_slug_and_labels():
    from fdpp_rewrite.profiles import gpu_slug, label_gpu, profile_label

    assert gpu_slug("NVIDIA H200") == "h200" and gpu_slug("NVIDIA GeForce RTX 4090") == "geforce-rtx-4090"
    assert label_gpu(profile_label("h200.json", "NVIDIA H200")) == "NVIDIA H200"
    assert label_gpu(UNPROFILED) is None and label_gpu("x (") is None
