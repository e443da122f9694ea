"""The profiler's pure parts on the CPU: which shapes a model has, how M1/M2/ImplC are chosen from curves,
how a profile file is merged, and the CLI's error without a GPU."""

import argparse

import pytest

from fdpp_rewrite import profile, profile_measure, profile_plan, profiles
from fdpp_rewrite.dispatch import select_impl
from fdpp_rewrite.errors import FdppError
from fdpp_rewrite.models import get_config
from fdpp_rewrite.schemas import PROFILE_SCHEMA


def test_model_shapes_llama2_7b():
    assert profile_plan.model_shapes(get_config("llama2-7b")) == [
        ("qkv", 12288, 4096), ("o", 4096, 4096), ("gate_up", 22016, 4096), ("down", 4096, 11008),
        ("lm_head", 32000, 4096)]


def test_model_shapes_gqa_and_relu_families():
    glm = dict((name, (n, k)) for name, n, k in profile_plan.model_shapes(get_config("chatglm2-6b")))
    assert glm["qkv"] == (4096 + 2 * 2 * 128, 4096) and glm["gate_up"] == (2 * 13696, 4096)
    opt = [name for name, _, _ in profile_plan.model_shapes(get_config("opt-6.7b"))]
    assert opt == ["qkv", "o", "fc1", "fc2", "lm_head"]
    smol = dict((name, (n, k)) for name, n, k in profile_plan.model_shapes(get_config("smollm2-135m")))
    assert smol["qkv"] == (576 + 2 * 3 * 64, 576) and smol["lm_head"] == (49152, 576)


def curves(ms, a, b, lt, cutlass):
    return {"m": ms, "impla_us": a, "implb_us": b, "cublaslt_us": lt, "cutlass_us": cutlass}


def test_choose_plan_breaks_a_tie_towards_implb():
    # The worked example in the docstring: tied at M = 8, the larger m2 wins.
    plan = profile_plan.choose_plan([8, 16], curves([8, 16], [None] * 2, [45.4, 60.0], [45.4, 50.0], [None] * 2))
    assert (plan["m1"], plan["m2"], plan["implc"]) == (0, 8, "cublaslt")


def test_choose_plan_finds_the_crossovers():
    ms = [1, 2, 4, 8, 16, 32, 64, 128]
    a = [10, 12, 20, 40, None, None, None, None]          # GEMV best only at M = 1
    b = [11, 11, 11, 12, 13, 20, 40, None]                # flat GEMM best up to 16
    lt = [30, 30, 30, 30, 30, 18, 19, 25]                 # library best from 32
    cut = [35, 35, 35, 35, 35, 22, 24, 30]
    choice = profile_plan.choose_plan(ms, curves(ms, a, b, lt, cut))
    assert (choice["m1"], choice["m2"], choice["implc"]) == (1, 16, "cublaslt")
    assert choice["worst_ratio"] == 1.0


def test_choose_plan_without_impla_and_with_cutlass_faster():
    ms = [1, 2, 4, 8, 16, 32]
    a = [12, 14, 20, 30, None, None]
    b = [10, 10, 10, 11, 13, 30]
    lt = [30, 30, 30, 30, 30, 25]
    cut = [30, 30, 30, 30, 30, 20]
    choice = profile_plan.choose_plan(ms, curves(ms, a, b, lt, cut))
    assert (choice["m1"], choice["m2"], choice["implc"]) == (0, 16, "cutlass")


def test_choose_plan_prefers_the_smallest_worst_ratio_over_noise():
    # ImplA and ImplB trade places within noise at M = 2; the thresholds must not chase it into a big loss.
    ms = [1, 2, 3, 4]
    a = [10.0, 10.0, 15.0, 20.0]
    b = [10.2, 9.9, 10.0, 10.0]
    lt = [40.0] * 4
    choice = profile_plan.choose_plan(ms, curves(ms, a, b, lt, [None] * 4))
    assert choice["m1"] in (0, 1, 2) and choice["m2"] == 4
    assert choice["worst_ratio"] <= 1.02


def test_choose_plan_breaks_ties_towards_implb():
    # At M = 8 ImplB and the library are equal within 0.1%: the flat GEMM keeps it (its time held across machines).
    ms = [1, 2, 4, 8, 16]
    b = [10.0, 10.0, 10.0, 10.003, 14.0]
    lt = [12.0, 12.0, 12.0, 10.0, 10.0]
    choice = profile_plan.choose_plan(ms, curves(ms, [None] * 5, b, lt, [None] * 5))
    assert (choice["m1"], choice["m2"]) == (0, 8)
    # A clear win for the library at M = 8 still moves the threshold.
    lt[3] = 9.0
    assert profile_plan.choose_plan(ms, curves(ms, [None] * 5, b, lt, [None] * 5))["m2"] == 4


def test_choose_plan_respects_where_implb_cannot_run():
    ms = [1, 8, 16, 32, 64]
    b = [10, 10, 10, None, 9]  # a config that does not fit at M = 32
    lt = [20, 20, 20, 20, 20]
    choice = profile_plan.choose_plan(ms, curves(ms, [None] * 5, b, lt, [None] * 5))
    assert choice["m2"] == 16


def test_choose_plan_without_any_implc_is_an_error():
    with pytest.raises(FdppError, match="ImplC"):
        profile_plan.choose_plan([1], curves([1], [1.0], [1.0], [None], [None]))


def entry(n, k, m1=1, dtype="float16"):
    return {"n": n, "k": k, "dtype": dtype, "m1": m1, "m2": 16,
            "implb": {"n_tile": 16, "k_tile": 256, "stages": 4, "split_k": 1}, "implc": "cublaslt", "silu_mul": None}


HEADER = {"schema": PROFILE_SCHEMA, "gpu": "NVIDIA H200", "presets": ["llama2-7b"]}


def test_merge_keeps_other_shapes_and_skips_known_ones_without_force():
    existing = dict(HEADER, presets=["opt-6.7b"], shapes=[entry(4096, 4096, m1=3), entry(50272, 4096)])
    data, replaced = profile_plan.merge_profile(existing, HEADER, [entry(4096, 4096, m1=1), entry(12288, 4096)], False)
    keys = [(e["n"], e["k"]) for e in data["shapes"]]
    assert keys == [(4096, 4096), (12288, 4096), (50272, 4096)]
    assert data["shapes"][0]["m1"] == 3 and replaced == []
    assert data["presets"] == ["llama2-7b", "opt-6.7b"]


def test_merge_with_force_replaces_and_reports():
    existing = dict(HEADER, shapes=[entry(4096, 4096, m1=3)])
    data, replaced = profile_plan.merge_profile(existing, HEADER, [entry(4096, 4096, m1=1)], True)
    assert data["shapes"][0]["m1"] == 1 and replaced == [(4096, 4096, "float16")]


def test_merge_refuses_another_gpus_file():
    existing = dict(HEADER, gpu="NVIDIA A100-SXM4-80GB", shapes=[])
    with pytest.raises(FdppError, match="A100"):
        profile_plan.merge_profile(existing, HEADER, [], False)


@pytest.mark.parametrize("existing, message", [
    (dict(HEADER, gpu="NVIDIA A100-SXM4-80GB"), "measured on NVIDIA A100-SXM4-80GB, this GPU is NVIDIA H200"),
    (dict(HEADER, schema="fdpp-profile/0"), "is not fdpp-profile"),
    ([], "is not fdpp-profile"),
])
def test_existing_profile_check_refuses_another_gpu_or_schema(existing, message):
    with pytest.raises(FdppError, match=message):
        profile_plan.check_existing_profile(existing, "NVIDIA H200")
    profile_plan.check_existing_profile(dict(HEADER, shapes=[]), "NVIDIA H200")  # the same GPU's file is fine


def test_gpu_slug():
    assert profiles.gpu_slug("NVIDIA H200") == "h200"
    assert profiles.gpu_slug("NVIDIA GeForce RTX 4090") == "geforce-rtx-4090"


def test_m_grid_is_the_issues_sweep():
    assert profile_measure.M_GRID[:16] == list(range(1, 17))
    assert profile_measure.M_GRID[16:] == [24, 32, 48, 64, 96, 128, 192, 256]


def test_without_gpu_the_command_fails_with_a_one_line_error():
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    parser = argparse.ArgumentParser()
    profile.add_arguments(parser)
    args = parser.parse_args(["llama2-7b", "smollm2-135m", "--plots", "/tmp/unused"])
    with pytest.raises(FdppError, match="GPU") as info:
        profile.run(args)
    assert "\n" not in str(info.value)


def test_written_profile_loads_in_the_rewriter(tmp_path):
    """What the profiler writes is what fdpp_rewrite.profiles (the rewriter's reader) accepts."""
    from fdpp_rewrite.profiles import load_profile

    header = dict(HEADER, compute_capability="9.0", num_sms=132, created="2026-11-29T00:00:00+00:00",
                  command="python -m fdpp_rewrite profile llama2-7b")
    e = entry(4096, 4096)
    e.update(implb={"n_tile": 32, "k_tile": 512, "stages": 4, "split_k": 8}, implc="cutlass",
             curves={"m": [1], "implb_us": [9.0]}, used_by=["llama2-7b:o"])
    data, _ = profile_plan.merge_profile(None, header, [e, entry(12288, 4096)], False)
    path = tmp_path / "h200.json"
    path.write_text(__import__("json").dumps(data))
    loaded = load_profile(path)
    choice = loaded.lookup(4096, 4096, "float16")
    assert (choice.m1, choice.m2, choice.implb_k_tile, choice.implb_split_k, choice.implc) == (1, 16, 512, 8, "cutlass")


def test_weight_copies_read_every_weight_cold_in_a_graph():
    l2 = 60 << 20
    # Llama2-7B o (33.5 MB): enough copies for > 3x the L2 between two reads of the same one.
    assert profile_measure.weight_copies(4096, 4096, l2) == 6
    # gate_up (180 MB) alone exceeds 3x the L2, but the graph still alternates between two copies.
    assert profile_measure.weight_copies(22016, 4096, l2) == 2
    # A tiny weight: capped at one copy per launch of the graph, each read once per replay.
    assert profile_measure.weight_copies(576, 576, l2) == profile_measure.GRAPH_ITERS


def test_profile_cli_times_in_a_graph_by_default():
    parser = argparse.ArgumentParser()
    profile.add_arguments(parser)
    args = parser.parse_args(["llama2-7b"])
    assert args.timing == "graph" and not args.quick
    assert set(profile_measure.TIMINGS) == {"graph", "flushed"}


def test_lone_peaks_finds_a_point_above_both_neighbours():
    from fdpp_rewrite.profile_plan import lone_peaks

    # The worked example in the docstring.
    assert lone_peaks([5, 6, 7, 8], [44.5, 44.6, 47.1, 44.6]) == [2]
    # A step up that stays is a real change, not noise; neither is a rise within 2%.
    assert lone_peaks([5, 6, 7, 8], [44.5, 44.6, 47.1, 47.2]) == []
    assert lone_peaks([5, 6, 7], [44.5, 45.3, 44.6]) == []
    # Neighbours further than one M apart (16 -> 24 -> 32) or unmeasured ones say nothing.
    assert lone_peaks([16, 24, 32], [40.0, 60.0, 41.0]) == []
    assert lone_peaks([7, 8, 9], [44.6, 47.1, None]) == []


def test_profile_shape_times_a_lone_peak_again_and_keeps_the_lower_time(monkeypatch):
    from types import SimpleNamespace

    calls = []

    def fake_time(bench, timer, timing, name, m, config=None, plan=None, replays=10):
        calls.append((name, m))
        if name == "implb" and m == 7:
            return 50.0 if calls.count(("implb", 7)) == 1 else 44.7  # a noisy first time, then the real one
        if name == "impla":
            return 60.0 + m
        return 44.5 if name == "implb" else 45.0  # ImplC within 2% of ImplB

    monkeypatch.setattr(profile_measure, "ShapeBench", lambda *args, **kwargs: SimpleNamespace())
    monkeypatch.setattr(profile_measure, "search_implb", lambda *args, **kwargs: ({"n_tile": 16}, []))
    monkeypatch.setattr(profile_measure, "time_impl", fake_time)
    entry = profile_measure.profile_shape(4096, 4096, "float16", SimpleNamespace(l2_bytes=1 << 20), {},
                                          ms=[5, 6, 7, 8, 9])
    assert entry["retimed"] == [{"impl": "implb", "m": 7, "us": [50.0, 44.7]}]
    assert entry["silu_mul"] is None  # stored with the entry (no search data here: the entry's own plan serves)
    assert entry["curves"]["implb_us"][2] == 44.7
    assert calls.count(("implb", 7)) == 2 and calls.count(("implb", 6)) == 1
    # Without the second look M = 7 would miss by 11% and m2 would stop at 6 (ImplC within 2% beyond it).
    assert entry["m2"] == 9


def test_pick_implb_curve_takes_the_config_that_serves_every_m():
    # The worked example in the docstring: the winner is slow at M = 6 only.
    ms = [4, 6, 8]
    base = curves(ms, [None] * 3, None, [133.0, 134.0, 133.0], [None] * 3)
    index, plan = profile_plan.pick_implb_curve(ms, base, [[124.0, 138.0, 125.0], [126.0, 127.0, 126.0]])
    assert index == 1 and (plan["m1"], plan["m2"], plan["misses"]) == (0, 8, 0)
    # The best single implementation at M = 4 is the first config's 124: the second's 126 is 1.6% over it.
    assert plan["worst_ratio"] == pytest.approx(126 / 124, abs=1e-3)


def test_pick_implb_curve_keeps_the_winner_unless_a_runner_up_plans_better():
    ms = [1, 2, 4]
    base = curves(ms, [None] * 3, None, [30.0, 30.0, 30.0], [None] * 3)
    # A runner-up slower everywhere, and one equal to the winner: the winner stays (ties keep the earlier).
    index, plan = profile_plan.pick_implb_curve(ms, base, [[10.0, 10.0, 10.0], [11.0, 11.0, 11.0], [10.0, 10.0, 10.0]])
    assert index == 0 and plan["misses"] == 0 and plan["worst_ratio"] == 1.0
    # A runner-up that cannot run at some M still competes where its plan avoids that M.
    index, plan = profile_plan.pick_implb_curve(ms, base, [[10.0, 40.0, 10.0], [10.1, 10.1, None]])
    assert index == 1 and plan["m2"] == 2 and plan["misses"] == 1  # M = 4 goes to ImplC (30 against 10)


def test_choose_plan_measures_against_the_floor_of_other_configs():
    ms = [1, 2]
    c = curves(ms, [None] * 2, [10.0, 10.0], [30.0, 30.0], [None] * 2)
    assert profile_plan.choose_plan(ms, c)["worst_ratio"] == 1.0
    plan = profile_plan.choose_plan(ms, c, best_floor=[9.0, None])
    assert plan["worst_ratio"] == pytest.approx(10 / 9, abs=1e-3) and plan["misses"] == 1


def test_profile_shape_times_the_runners_up_when_the_winner_misses(monkeypatch):
    from types import SimpleNamespace

    slow_at_6, flat = {"loader": "rows1"}, {"loader": "tma"}

    def fake_time(bench, timer, timing, name, m, config=None, plan=None, replays=10):
        if name == "implb":
            return (138.0 if m == 6 else 125.0) if config is slow_at_6 else 127.0
        return None if name == "impla" else 134.0

    times = {m: 1.0 for m in profile_plan.SEARCH_MS}
    search = [(slow_at_6, times, 1.0), (flat, times, 1.01)]
    monkeypatch.setattr(profile_measure, "ShapeBench", lambda *args, **kwargs: SimpleNamespace())
    monkeypatch.setattr(profile_measure, "search_implb", lambda *args, **kwargs: (slow_at_6, search))
    monkeypatch.setattr(profile_measure, "time_impl", fake_time)
    entry = profile_measure.profile_shape(65024, 4096, "float16", SimpleNamespace(l2_bytes=1 << 20), {},
                                          ms=[4, 5, 6, 7, 8])
    assert entry["implb"] is flat and entry["curves"]["implb_us"] == [127.0] * 5
    assert entry["implb_alternatives"] == [{"config": slow_at_6, "implb_us": [125.0, 125.0, 138.0, 125.0, 125.0]}]
    assert (entry["m2"], entry["points_over_2pct_vs_best_impl"]) == (8, 0)
    assert entry["curves"]["dispatched_us"] == [127.0] * 5


def _fused_entry(m2=8, pair_us=(44.0, 45.5, 45.6, 46.0, 49.1), m1=0):
    """[22016, 4096] on the H200 in short: ImplB's rows config slow at M = 16, a pair config close to cuBLASLt."""
    rows, pair = {"n_tile": 16, "k_tile": 1024, "stages": 3, "split_k": 1, "loader": "rows"}, \
        {"n_tile": 16, "k_tile": 1024, "stages": 2, "split_k": 1, "loader": "pair"}
    return {"m1": m1, "m2": m2, "implb": rows, "implc": "cublaslt",
            "implb_search": {"m": [1, 2, 4, 8, 16], "top": [{"config": rows, "us": [44.0, 44.6, 44.9, 45.0, 58.1]},
                                                            {"config": pair, "us": list(pair_us)}]},
            "curves": {"m": [1, 2, 4, 8, 16], "impla_us": [52.2, 55.4, 69.1, 108.7, None],
                       "implb_us": [44.0, 44.5, 44.9, 45.0, 58.3], "cublaslt_us": [44.7, 45.0, 45.0, 45.4, 45.8]}}


def test_fused_decode_plan_keeps_the_decode_batches_in_one_launch():
    from fdpp_rewrite.profile_plan import FUSED_DECODE_MAX_M, fused_decode_plan

    plan = fused_decode_plan(_fused_entry())
    assert plan["m2"] == FUSED_DECODE_MAX_M == 16 and plan["m1"] == 0 and plan["implb"]["loader"] == "pair"
    assert plan["worst_ratio"] == pytest.approx(49.1 / 45.8, abs=1e-3)
    assert select_impl(16, plan) == "implb" and select_impl(17, plan) == "cublaslt"


@pytest.mark.parametrize("entry", [
    _fused_entry(m2=16),  # already one launch at every decode batch
    _fused_entry(pair_us=(44.0, 45.5, 45.6, 46.0, 51.0)),  # 11% over cuBLASLt at M = 16: the pass is cheaper
    _fused_entry(pair_us=(44.0, 45.5, 45.6, 46.0, None)),  # no time at M = 16
    dict(_fused_entry(), implb_search={}),  # an entry without the search (an older profile)
    dict(_fused_entry(), implb_search={"m": [1, 2, 4, 8, 16], "top": [{"config": {}, "us": [44.0]}]}),  # cut short
])
def test_fused_decode_plan_none_where_the_entry_stands(entry):
    from fdpp_rewrite.profile_plan import fused_decode_plan

    assert fused_decode_plan(entry) is None


def test_fused_decode_plan_leaves_impla_its_batches():
    from fdpp_rewrite.profile_plan import fused_decode_plan

    entry = _fused_entry(m1=1, pair_us=(60.0, 45.5, 45.6, 46.0, 49.1))  # slow at M = 1, which ImplA serves
    assert fused_decode_plan(entry)["m1"] == 1


def test_measure_wgmma_keeps_the_fastest_config_beside_cublaslt(monkeypatch):
    """The wgmma loader's record in a profile entry: every candidate timed at WGMMA_MS, the lowest geometric mean
    kept (a config that cannot run at some M never wins), cuBLASLt's curve beside it; nothing off Hopper."""
    from types import SimpleNamespace

    from fdpp_rewrite.gpu import lib as fdpp_lib

    if not fdpp_lib.library_path().exists():
        pytest.skip("plugin library not built (make lib)")
    h200 = {"num_sms": 132, "cc_major": 9, "max_smem": 232448}
    bench = SimpleNamespace(n=4096, k=4096)

    def fake_time(bench, timer, timing, name, m, config=None, plan=None, replays=10):
        if name == "cublaslt":
            return 20.0 + m / 10
        if config["split_k"] == 8:  # fastest where it runs, but refused at one M
            return None if m == 256 else 5.0
        return 10.0 + config["split_k"] + config["stages"] / 10

    monkeypatch.setattr(profile_measure, "time_impl", fake_time)
    record = profile_measure.measure_wgmma(bench, None, h200)
    assert record["m"] == list(profile_measure.WGMMA_MS) == [32, 64, 128, 256]
    assert record["config"] == {"n_tile": 64, "k_tile": 64, "stages": 4, "split_k": 4, "loader": "wgmma"}
    assert record["implb_wgmma_us"] == [14.4] * 4
    assert record["cublaslt_us"] == [23.2, 26.4, 32.8, 45.6]
    assert len(record["candidates"]) == 4 and record["candidates"][-1]["us"][-1] is None
    assert profile_measure.measure_wgmma(bench, None, dict(h200, cc_major=8)) is None
    assert profile_measure.measure_wgmma(bench, None, {}) is None


def test_wgmma_summary_reports_time_and_read_rate_beside_cublaslt():
    entry = {"n": 4096, "k": 4096, "implb_wgmma": {
        "m": [32, 64], "config": {"n_tile": 64, "k_tile": 64, "stages": 4, "split_k": 4, "loader": "wgmma"},
        "implb_wgmma_us": [10.0, None], "cublaslt_us": [12.5, 12.0]}}
    line = profile.wgmma_summary(entry)
    assert line.startswith("[4096, 4096] wgmma n64 k64 s4 x4 wgmma: ")
    assert "M=32 10.0 us 3.36 TB/s (cuBLASLt 12.5 us 2.68 TB/s)" in line
    assert "M=64 n/a (cuBLASLt 12.0 us 2.80 TB/s)" in line
