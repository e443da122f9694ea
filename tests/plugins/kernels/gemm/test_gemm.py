"""The flat GEMM (ImplA GEMV, ImplB flat GEMM, ImplC cuBLASLt / CUTLASS, and the dispatch) against a float32
reference, with a tolerance relative to cuBLAS's own fp16/bf16 error: |ours - ref| <= 2 |torch - ref| (max over
the output) plus a hair. Odd M, N and K that are not multiples of any tile, every epilogue, both dtypes; the
output is poisoned with NaN first so an unwritten element fails.

The grids are pairwise (tests/helpers/pairwise.py) over valid combinations only: every pair of axis values a kernel
can run appears in some case, and no case skips by construction on the H200; each refusal has one case in
test_refusals_are_one_line_errors."""

import pytest

from pairwise import pairwise_params
from pdl_chain import assert_pdl_chain_exact

pytestmark = pytest.mark.gpu

DTYPES = ["float16", "bfloat16"]
MS = [1, 3, 5, 7, 9, 13, 64, 100]
# (n, k): N not a multiple of 16 and K not a multiple of any k_tile; a Llama-sized square; a tiny one.
SHAPES = [(1000, 1032), (4096, 4096), (40, 200)]
EPILOGUES = ["none", "bias", "residual", "bias+residual", "silu_mul", "silu_mul+bias+residual"]
# The implementations a plan can pick per M (ImplC's CUTLASS has its own smoke test: no profiled shape picks it).
IMPLS = ["impla", "implb", "cublaslt"]
MAX_M = {"impla": 8, "implb": 64, "cublaslt": max(MS)}  # the FlatGemm contract's limits (test_gemm_heuristics)


def _torch():
    import torch

    return torch


def _tdtype(name):
    torch = _torch()
    return {"float16": torch.float16, "bfloat16": torch.bfloat16}[name]


def _inputs(m, n, k, dtype, epilogue, seed=0):
    torch = _torch()
    gen = torch.Generator(device="cuda").manual_seed(seed)
    t = _tdtype(dtype)
    x = torch.randn(m, k, device="cuda", dtype=t, generator=gen)
    w = (torch.randn(n, k, device="cuda", dtype=t, generator=gen) / k**0.5).to(t)
    bias = torch.randn(n, device="cuda", dtype=t, generator=gen) if "bias" in epilogue else None
    n_out = n // 2 if epilogue.startswith("silu_mul") else n
    residual = torch.randn(m, n_out, device="cuda", dtype=t, generator=gen) if "residual" in epilogue else None
    return x, w, bias, residual


def _reference(x, w, bias, residual, silu, dtype_path):
    """(float32 reference, torch's own result in the input dtype through cuBLAS)."""
    torch = _torch()
    F = torch.nn.functional

    def compute(xx, ww, bb, rr):
        y = F.linear(xx, ww, bb)
        if silu:
            g, u = y.chunk(2, dim=-1)
            y = F.silu(g) * u
        if rr is not None:
            y = y + rr
        return y

    ref = compute(x.float(), w.float(), None if bias is None else bias.float(),
                  None if residual is None else residual.float())
    ours_peer = compute(x, w, bias, residual)
    return ref, ours_peer


def _check(out, ref, peer):
    torch = _torch()
    assert not torch.isnan(out).any(), "some output element was not written (NaN poison survived) or is NaN"
    err = (out.float() - ref).abs().max().item()
    peer_err = (peer.float() - ref).abs().max().item()
    floor = 1e-5 * ref.abs().max().item() + 1e-6
    assert err <= 2 * peer_err + floor, f"max error {err:.3g} > 2 x cuBLAS's {peer_err:.3g}"


def _run(impl, x, w, bias, residual, epilogue, config=None, plan=None, pad_m=8):
    torch = _torch()
    from fdpp_rewrite.gpu import gemm

    n = w.shape[0]
    silu = epilogue.startswith("silu_mul")
    n_out = n // 2 if silu else n
    out = torch.full((x.shape[0], n_out), float("nan"), device="cuda", dtype=x.dtype)
    ep = "silu_mul" if silu else "none"
    if impl == "auto":
        gemm.linear(x, w, bias, residual, epilogue=ep, plan=plan, out=out)
    elif impl == "implb" and pad_m != 8:
        args = gemm.make_args(x, w, bias, residual, out, ep)
        gemm.run_impl(args, "implb", config, pad_m=pad_m)
    else:
        gemm.linear(x, w, bias, residual, epilogue=ep, impl=impl, implb_config=config, out=out)
    torch.cuda.synchronize()
    return out


def _skip_unavailable(impl):
    from fdpp_rewrite.gpu import gemm

    if impl == "cublaslt" and not gemm.cublaslt_available():
        pytest.skip("libcublasLt not found (set FDPP_CUBLASLT_LIBRARY)")
    if impl == "cutlass" and not gemm.cutlass_available():
        pytest.skip("library built without the CUTLASS headers")


@pytest.mark.parametrize("impl,m,shape,epilogue,dtype", pairwise_params(
    {"impl": IMPLS, "m": MS, "shape": SHAPES, "epilogue": EPILOGUES, "dtype": DTYPES},
    valid=lambda c: c["m"] <= MAX_M[c["impl"]], ids={"shape": lambda s: f"{s[0]}x{s[1]}"}))
def test_matches_fp32_reference(impl, m, shape, epilogue, dtype):
    _skip_unavailable(impl)
    n, k = shape
    x, w, bias, residual = _inputs(m, n, k, dtype, epilogue)
    silu = epilogue.startswith("silu_mul")
    out = _run(impl, x, w, bias, residual, epilogue)
    ref, peer = _reference(x, w, bias, residual, silu, dtype)
    _check(out, ref, peer)


def test_cutlass_smoke():
    """ImplC's CUTLASS path (a plan may name it; no profiled shape does): odd M, N and K, the full epilogue, both
    dtypes."""
    _skip_unavailable("cutlass")
    for dtype in DTYPES:
        x, w, bias, residual = _inputs(13, 1000, 1032, dtype, "silu_mul+bias+residual")
        out = _run("cutlass", x, w, bias, residual, "silu_mul+bias+residual")
        ref, peer = _reference(x, w, bias, residual, True, dtype)
        _check(out, ref, peer)


# ImplB configs: every n_tile, k_tile per warp 32..256, no overlap (stages 1) to deep, split-K over clusters; then
# the warp-tiled configs the H200 profile and default_implb_config pick (engines/profiles/h200.json).
IMPLB_CONFIGS = [
    {"n_tile": 16, "k_tile": 128, "stages": 1, "split_k": 1},
    {"n_tile": 16, "k_tile": 256, "stages": 2, "split_k": 2},
    {"n_tile": 16, "k_tile": 512, "stages": 4, "split_k": 4},
    {"n_tile": 32, "k_tile": 64, "stages": 3, "split_k": 8},
    {"n_tile": 32, "k_tile": 256, "stages": 2, "split_k": 1},
    {"n_tile": 64, "k_tile": 32, "stages": 4, "split_k": 2},
    {"n_tile": 64, "k_tile": 128, "stages": 8, "split_k": 1},
    {"n_tile": 16, "k_tile": 512, "stages": 3, "split_k": 1},
    {"n_tile": 16, "k_tile": 512, "stages": 3, "split_k": 2},
    {"n_tile": 32, "k_tile": 256, "stages": 3, "split_k": 1},
    {"n_tile": 64, "k_tile": 128, "stages": 3, "split_k": 1},
    {"n_tile": 64, "k_tile": 128, "stages": 3, "split_k": 4},
]


# One M per instantiated batch-block count (implb_batch_blocks: 1, 2, 3, 4, 6, 8), and 7 (a zero-padded block).
IMPLB_MS = [1, 7, 13, 20, 29, 33, 64]


def _config_id(c):
    return "n{n_tile}k{k_tile}s{stages}x{split_k}".format(**c)


@pytest.mark.parametrize("config,m,epilogue,dtype", pairwise_params(
    {"config": IMPLB_CONFIGS, "m": IMPLB_MS, "epilogue": ["none", "silu_mul+bias+residual"],
     "dtype": DTYPES}, ids={"config": _config_id}))
def test_implb_configs(config, m, epilogue, dtype):
    from fdpp_rewrite.gpu import gemm

    if config["split_k"] > 1 and gemm.device_info()["cc_major"] != 9:
        pytest.skip("split_k > 1 needs thread-block clusters (sm_90)")
    n, k = (1000, 2056) if not epilogue.startswith("silu") else (688, 2056)
    x, w, bias, residual = _inputs(m, n, k, dtype, epilogue, seed=m)
    out = _run("implb", x, w, bias, residual, epilogue, config=config)
    ref, peer = _reference(x, w, bias, residual, epilogue.startswith("silu"), dtype)
    _check(out, ref, peer)


# The 16-row x 1024-column pipelines: the TMA one (sm_90), the row-streaming cp.async one, and the cluster-pair
# one (sm_90, M <= 16).
BULK_CONFIGS = ([{"n_tile": 16, "k_tile": 1024, "stages": s, "split_k": 1} for s in (2, 3, 4)]
                + [{"n_tile": 16, "k_tile": 1024, "stages": s, "split_k": 1, "loader": "rows"} for s in (2, 3, 4)]
                + [{"n_tile": 16, "k_tile": 1024, "stages": s, "split_k": 1, "loader": "rows1"} for s in (2, 3)]
                + [{"n_tile": 16, "k_tile": 1024, "stages": s, "split_k": 1, "loader": "pair"} for s in (2, 3)])
SM90_LOADERS = ("tma", "pair", "wgmma")  # the library's sm_90a code; rows and rows1 run anywhere


def _loader(config):
    return config.get("loader", "tma")


def _bulk_id(c):
    return f"{_loader(c)}-s{c['stages']}"


def _bulk_shape(shape, silu):
    """(N, K) of a 1024-column pipeline case."""
    if shape == "short-last-unit":  # a 64-column last unit; silu: N / 2 a multiple of 8
        return (4112, 3136) if silu else (4104, 2112)
    if shape == "many-blocks":  # ~10 blocks per CTA (the reduction buffers reused, the ring wrapped many times),
        return (20008, 1600) if silu else (20000, 1600)  # a 576-column last unit; silu: N / 2 = 10004
    return (1048, 2072) if silu else (1000, 2072)  # k-not-64: 2072 = 2 x 1024 + 24, a last group of 24 columns


def _skip_off_hopper(loader):
    from fdpp_rewrite.gpu import gemm

    if loader in SM90_LOADERS and gemm.device_info()["cc_major"] != 9:
        pytest.skip("the TMA, cluster-pair and wgmma pipelines run on compute capability 9.x (the sm_90a code)")


@pytest.mark.parametrize("config,m,epilogue,dtype,shape", pairwise_params(
    {"config": BULK_CONFIGS, "m": [1, 2, 3, 7, 8, 9, 13, 16],
     "epilogue": ["none", "bias+residual", "silu_mul", "silu_mul+bias+residual"], "dtype": DTYPES,
     "shape": ["short-last-unit", "many-blocks", "k-not-64"]},
    valid=lambda c: c["shape"] != "k-not-64" or _loader(c["config"]) != "tma", ids={"config": _bulk_id}))
def test_implb_1024_column_pipelines(config, m, epilogue, dtype, shape):
    """The 1024-column ImplB pipelines (k_tile 1024, M <= 16; TMA on sm_90, rows anywhere): N not a multiple of 16
    (zero-filled rows past N), K a multiple of 64 but not of k_tile (a short last unit), more 16-row blocks than
    SMs (up to ~10 per CTA); for the cp.async loaders also a K that is a multiple of 8 only (a partial 32-column
    group; the TMA pipeline refuses it: test_refusals_are_one_line_errors), M = 2, where rows at 3 stages has one
    reduction buffer (and a barrier after each block's sums), and M = 7, where rows copies a zero eighth
    activation row. Above M = 16 a 1024-column config is refused (test_refusals_are_one_line_errors)."""
    _skip_off_hopper(_loader(config))
    silu = epilogue.startswith("silu")
    n, k = _bulk_shape(shape, silu)
    x, w, bias, residual = _inputs(m, n, k, dtype, epilogue, seed=m + 7)
    out = _run("implb", x, w, bias, residual, epilogue, config=config)
    ref, peer = _reference(x, w, bias, residual, silu, dtype)
    _check(out, ref, peer)


# The pair pipeline where K is whole 512-column units (the other tests' K are not): an odd number of cluster pairs,
# one unit per K half, none for the second half (K = 512: that rank only sends zeros), 8 units per half (K = 8192),
# and M up to the kernel's 16 (one or two 8-row batch tiles).
@pytest.mark.parametrize("nk,stages,m,epilogue,dtype", pairwise_params(
    {"nk": [(80, 512), (80, 1024), (4104, 4096), (1040, 8192)], "stages": [2, 3], "m": [1, 2, 3, 7, 8, 9, 12, 16],
     "epilogue": ["none", "bias+residual", "silu_mul"], "dtype": DTYPES}, ids={"nk": lambda s: f"{s[0]}x{s[1]}"}))
def test_implb_pair_whole_units(nk, stages, m, epilogue, dtype):
    _skip_off_hopper("pair")
    n, k = nk
    config = {"n_tile": 16, "k_tile": 1024, "stages": stages, "split_k": 1, "loader": "pair"}
    x, w, bias, residual = _inputs(m, n, k, dtype, epilogue, seed=m + 11)
    out = _run("implb", x, w, bias, residual, epilogue, config=config)
    ref, peer = _reference(x, w, bias, residual, epilogue.startswith("silu"), dtype)
    _check(out, ref, peer)


# The wgmma loader (sm_90a, M <= 256): every batch width (32, 64, 128, 256: M = 17 and 24 pad to 32, 100 to 128),
# 2 stages (the ring wraps every other step) and 8 (fewer where they do not fit, at M > 64), split_k 1 and 3, 4
# (clusters along K reduced in distributed shared memory; 3 splits 17 steps unevenly). Shapes: N not a multiple of
# the 128-row tile and K not of 64 (the copy engine zero-fills rows past N and columns past K; silu_mul's N / 2 = 500
# is not a multiple of 64, so the last gate box runs into the up rows, whose outputs are never stored), and
# llama2-7b's o_proj.
WGMMA_MS = [17, 24, 32, 64, 100, 128, 256]
WGMMA_CONFIGS = [{"n_tile": 64, "k_tile": 64, "stages": s, "split_k": x, "loader": "wgmma"}
                 for s, x in ((2, 1), (8, 1), (4, 3), (8, 4))]


@pytest.mark.parametrize("config,m,epilogue,dtype,nk", pairwise_params(
    {"config": WGMMA_CONFIGS, "m": WGMMA_MS, "epilogue": EPILOGUES, "dtype": DTYPES,
     "nk": [(1000, 1096), (4096, 4096)]}, ids={"config": _config_id, "nk": lambda s: f"{s[0]}x{s[1]}"}))
def test_implb_wgmma(config, m, epilogue, dtype, nk):
    _skip_off_hopper("wgmma")
    n, k = nk
    x, w, bias, residual = _inputs(m, n, k, dtype, epilogue, seed=m + 13)
    out = _run("implb", x, w, bias, residual, epilogue, config=config)
    ref, peer = _reference(x, w, bias, residual, epilogue.startswith("silu"), dtype)
    _check(out, ref, peer)


@pytest.mark.parametrize("m", [40, 200, 256])
def test_dispatch_through_a_wgmma_plan(m):
    """A plan whose ImplB config is the wgmma loader serves M up to its m2 (here 256, past mma.sync's 64) with
    ImplB and no workspace, its split-K and the fused silu_mul epilogue included."""
    from fdpp_rewrite.gpu import gemm

    _skip_off_hopper("wgmma")
    plan = {"m1": 0, "m2": 256, "implb": {"n_tile": 64, "k_tile": 64, "stages": 8, "split_k": 2, "loader": "wgmma"},
            "implc": "cublaslt"}
    assert gemm.select(m, plan) == "implb"
    assert gemm.workspace_bytes(m, 688, "float16", "silu_mul", plan) == 0
    x, w, bias, residual = _inputs(m, 688, 1032, "float16", "silu_mul+bias+residual")
    out = _run("auto", x, w, bias, residual, "silu_mul+bias+residual", plan=plan)
    ref, peer = _reference(x, w, bias, residual, True, "float16")
    _check(out, ref, peer)


@pytest.mark.parametrize("m", [8, 16, 17, 64, 200, 256])
def test_dispatch_through_a_plan_with_a_wgmma_range(m):
    """A three-range plan (m1 0, m2 16 on an mma.sync config, m3 256 on a wgmma config): M <= 16 runs the first
    config, 17..256 the wgmma one (fdpp_gemm_select_implb_config says which), every M against the fp32 reference,
    with no ImplC workspace up to 256."""
    from fdpp_rewrite.gpu import gemm

    _skip_off_hopper("wgmma")
    plan = {"m1": 0, "m2": 16, "implb": {"n_tile": 16, "k_tile": 256, "stages": 3, "split_k": 1}, "implc": "cublaslt",
            "m3": 256, "wgmma": {"n_tile": 64, "k_tile": 64, "stages": 8, "split_k": 2, "loader": "wgmma"}}
    assert gemm.select_range(m, plan) == ("implb" if m <= 16 else "wgmma")
    assert gemm.workspace_bytes(m, 1000, "float16", "none", plan) == 0
    x, w, bias, residual = _inputs(m, 1000, 1032, "float16", "bias+residual")
    out = _run("auto", x, w, bias, residual, "bias+residual", plan=plan)
    ref, peer = _reference(x, w, bias, residual, False, "float16")
    _check(out, ref, peer)


# Each pad_m with M below, at and above a multiple of 8 (the padding ablation's cases).
@pytest.mark.parametrize("pad_m,m", [(16, 1), (64, 9), (16, 17), (64, 1)])
def test_implb_padding_ablation_is_exact_math_or_names_its_build_option(pad_m, m):
    """pad_m 16 and 64 exist in a library built with FDPP_BENCH_ABLATIONS=ON, where they are the same math; any
    other build refuses them naming the option (the default build, so this never skips)."""
    from fdpp_rewrite.errors import FdppError

    x, w, _, _ = _inputs(m, 1000, 1032, "float16", "none")
    config = {"n_tile": 16, "k_tile": 256, "stages": 3, "split_k": 1}
    try:
        out = _run("implb", x, w, None, None, "none", config=config, pad_m=pad_m)
    except FdppError as exc:
        assert "FDPP_BENCH_ABLATIONS=ON" in str(exc) and "\n" not in str(exc), str(exc)
        return
    ref, peer = _reference(x, w, None, None, False, "float16")
    _check(out, ref, peer)


# Every cluster size impla_split_k can pick, each at a different M.
@pytest.mark.parametrize("split_k,m", [(1, 8), (2, 1), (4, 4), (8, 8)])
def test_impla_split_k(split_k, m):
    from fdpp_rewrite.gpu import gemm

    if split_k > 1 and gemm.device_info()["cc_major"] != 9:
        pytest.skip("split_k > 1 needs thread-block clusters (sm_90)")
    torch = _torch()
    x, w, bias, residual = _inputs(m, 1003, 4104, "bfloat16", "bias+residual")
    out = torch.full((m, 1003), float("nan"), device="cuda", dtype=x.dtype)
    gemm.run_impl(gemm.make_args(x, w, bias, residual, out), "impla", impla_split_k=split_k)
    torch.cuda.synchronize()
    ref, peer = _reference(x, w, bias, residual, False, "bfloat16")
    _check(out, ref, peer)


@pytest.mark.parametrize("config", [{"n_tile": 16, "k_tile": 128, "stages": 3, "split_k": 1},
                                    {"n_tile": 32, "k_tile": 128, "stages": 4, "split_k": 2}],
                         ids=["n16x1", "n32x2"])
@pytest.mark.parametrize("m", [1, 7, 16])
def test_persistent_grid_walks_many_tiles(config, m):
    """More tiles (and ImplA row pairs) than CTAs resident at once: each CTA streams several tiles through one
    pipeline, reusing its reduction buffer between them."""
    from fdpp_rewrite.gpu import gemm

    if config["split_k"] > 1 and gemm.device_info()["cc_major"] != 9:
        config = dict(config, split_k=1)
    x, w, bias, residual = _inputs(m, 20000, 520, "float16", "silu_mul+bias+residual", seed=3)
    out = _run("implb", x, w, bias, residual, "silu_mul+bias+residual", config=config)
    ref, peer = _reference(x, w, bias, residual, True, "float16")
    _check(out, ref, peer)
    if m <= 8:
        x, w, bias, residual = _inputs(m, 20001, 264, "bfloat16", "bias+residual", seed=4)
        out = _run("impla", x, w, bias, residual, "bias+residual")
        ref, peer = _reference(x, w, bias, residual, False, "bfloat16")
        _check(out, ref, peer)


@pytest.mark.parametrize("m", [1, 2, 5, 12, 40, 100])
def test_dispatch_through_plan(m):
    """The plan's thresholds route M to ImplA / ImplB / ImplC; each route is right."""
    from fdpp_rewrite.gpu import gemm

    plan = {"m1": 2, "m2": 40, "implb": {"n_tile": 32, "k_tile": 128, "stages": 3, "split_k": 2},
            "implc": "cutlass" if gemm.cutlass_available() else "cublaslt"}
    if gemm.device_info()["cc_major"] != 9:
        plan["implb"]["split_k"] = 1
    x, w, bias, residual = _inputs(m, 688, 1032, "float16", "silu_mul+bias+residual")
    out = _run("auto", x, w, bias, residual, "silu_mul+bias+residual", plan=plan)
    ref, peer = _reference(x, w, bias, residual, True, "float16")
    _check(out, ref, peer)


@pytest.mark.parametrize("m", [1, 8, 9])
def test_unprofiled_default_plan(m):
    """A shape no profile holds runs the contract's unprofiled default (no plan given): ImplB with
    default_implb_config up to M = 8, cuBLASLt above."""
    from fdpp_rewrite.gpu import gemm

    _skip_unavailable("cublaslt")
    assert gemm.select(m, gemm.default_plan(688, 1032, "silu_mul")) == ("implb" if m <= 8 else "cublaslt")
    x, w, bias, residual = _inputs(m, 688, 1032, "bfloat16", "silu_mul+bias+residual")
    out = _run("auto", x, w, bias, residual, "silu_mul+bias+residual")
    ref, peer = _reference(x, w, bias, residual, True, "bfloat16")
    _check(out, ref, peer)


def test_cuda_graph_capture_and_replay():
    """One graph holding an ImplA, an ImplB and an ImplC launch; replayed on new inputs it matches eager runs."""
    torch = _torch()
    from fdpp_rewrite.gpu import gemm

    n, k = 1000, 1032
    plan = {"m1": 1, "m2": 16, "implb": {"n_tile": 16, "k_tile": 256, "stages": 4, "split_k": 1}, "implc": "cublaslt"}
    if not gemm.cublaslt_available():
        plan["implc"] = "cutlass"
    w = torch.randn(n, k, device="cuda", dtype=torch.float16) / k**0.5
    xs = {m: torch.randn(m, k, device="cuda", dtype=torch.float16) for m in (1, 7, 40)}
    outs = {m: torch.empty(m, n, device="cuda", dtype=torch.float16) for m in xs}
    ws = torch.empty(gemm.workspace_bytes(40, n, "float16", plan=plan), dtype=torch.uint8, device="cuda")
    args = {m: gemm.make_args(xs[m], w, out=outs[m]) for m in xs}
    for m in xs:
        gemm.prepare(args[m], plan)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for m in xs:  # warm-up outside the capture
            gemm.run(args[m], plan, ws)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=stream):
        for m in xs:
            gemm.run(args[m], plan, ws)
    for trial in range(2):
        for m in xs:
            xs[m].copy_(torch.randn(m, k, device="cuda", dtype=torch.float16))
            outs[m].fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        for m in xs:
            expected = torch.empty_like(outs[m])
            gemm.run(gemm.make_args(xs[m], w, out=expected), plan, ws)
            torch.cuda.synchronize()
            assert torch.equal(outs[m], expected), f"graph replay {trial} differs from eager at M={m}"


@pytest.mark.parametrize("first, second, m", [("implb", "implb", 4), ("impla", "implb", 4), ("implb", "impla", 4),
                                              ("cublaslt", "implb", 4), ("implb", "implb", 24),
                                              ("cublaslt", "implb", 24), ("bulk", "bulk", 4), ("bulk", "bulk", 16),
                                              ("implb", "bulk", 8), ("bulk", "impla", 1), ("rows", "rows", 4),
                                              ("rows", "rows", 16), ("bulk", "rows", 8), ("rows", "bulk", 8),
                                              ("rows", "impla", 1), ("cublaslt", "rows", 8), ("rows1", "rows1", 4),
                                              ("rows", "rows1", 8), ("rows1", "impla", 1), ("cublaslt", "rows1", 8),
                                              ("pair", "pair", 1), ("pair", "pair", 8), ("rows1", "pair", 4),
                                              ("pair", "rows", 8), ("cublaslt", "pair", 8), ("pair", "impla", 1),
                                              ("wgmma", "wgmma", 24), ("wgmma", "wgmma", 200), ("implb", "wgmma", 24),
                                              ("cublaslt", "wgmma", 128), ("wgmma", "impla", 1)])
def test_programmatic_dependent_launch_chain(first, second, m):
    """GEMM 2 reads GEMM 1's output. With programmatic dependent launch GEMM 2 starts streaming its weight
    early but must not read X before GEMM 1 is done: X is poisoned with NaN before every chain, and the result
    must equal the one without PDL bit for bit -- eagerly and replayed from a CUDA graph, many times."""
    torch = _torch()
    from fdpp_rewrite.gpu import gemm

    if first == "cublaslt" and not gemm.cublaslt_available():
        pytest.skip("libcublasLt not found")
    k, n1, n2 = 2056, 2056, 3000  # M = 24: ImplB with two 16-row blocks per warp
    x = torch.randn(m, k, device="cuda", dtype=torch.float16)
    w1 = torch.randn(n1, k, device="cuda", dtype=torch.float16) / k**0.5
    w2 = torch.randn(n2, n1, device="cuda", dtype=torch.float16) / n1**0.5
    mid = torch.empty(m, n1, device="cuda", dtype=torch.float16)
    out = torch.empty(m, n2, device="cuda", dtype=torch.float16)
    ws = torch.empty(gemm.workspace_bytes(m, max(n1, n2), "float16"), dtype=torch.uint8, device="cuda")
    a1, a2 = gemm.make_args(x, w1, out=mid), gemm.make_args(mid, w2, out=out)

    bulk = {"n_tile": 16, "k_tile": 1024, "stages": 3, "split_k": 1}  # "bulk": ImplB's TMA pipeline
    rows = dict(bulk, loader="rows")  # the row-streaming cp.async pipeline
    lean = {"rows": rows, "rows1": dict(bulk, loader="rows1"), "bulk": bulk,  # rows1: one unit before the PDL wait
            "pair": dict(bulk, loader="pair"),  # clusters of two CTAs, one K half each
            # warpgroup MMAs, split-K over clusters of two
            "wgmma": {"n_tile": 64, "k_tile": 64, "stages": 4, "split_k": 2, "loader": "wgmma"}}
    if {"bulk", "pair", "wgmma"} & {first, second} and gemm.device_info()["cc_major"] != 9:
        pytest.skip("the TMA, cluster-pair and wgmma pipelines run on compute capability 9.x (the sm_90a code)")
    if {"bulk", "rows", "rows1", "pair"} & {first, second}:
        k, n1 = 2048, 2048  # K a multiple of 64 for the TMA pipeline
        x = torch.randn(m, k, device="cuda", dtype=torch.float16)
        w1 = torch.randn(n1, k, device="cuda", dtype=torch.float16) / k**0.5
        w2 = torch.randn(n2, n1, device="cuda", dtype=torch.float16) / n1**0.5
        mid = torch.empty(m, n1, device="cuda", dtype=torch.float16)
        a1, a2 = gemm.make_args(x, w1, out=mid), gemm.make_args(mid, w2, out=out)

    def launch(args, impl, pdl):
        if impl in lean:
            gemm.run_impl(args, "implb", implb_config=lean[impl], workspace=ws, pdl=pdl)
        else:
            gemm.run_impl(args, impl, workspace=ws, pdl=pdl)

    def chain(pdl):
        mid.fill_(float("nan"))
        launch(a1, first, pdl)
        launch(a2, second, pdl)

    assert_pdl_chain_exact(chain, out, graph_chains=5)


@pytest.mark.parametrize("m", [4, 24])
def test_pdl_chain_through_the_implc_epilogue_pass(m):
    """ImplB -> cuBLASLt with silu_mul (its product, then the epilogue pass, launched with PDL) -> ImplB: the pass
    waits for cuBLASLt's product and the last GEMM for the pass. Intermediates are NaN before every chain; PDL on
    must equal PDL off bit for bit, eagerly and replayed from a CUDA graph."""
    torch = _torch()
    from fdpp_rewrite.gpu import gemm

    if not gemm.cublaslt_available():
        pytest.skip("libcublasLt not found")
    k, n_gate_up, n_out = 2048, 2 * 2056, 3000
    x = torch.randn(m, k, device="cuda", dtype=torch.float16)
    w1 = torch.randn(k, k, device="cuda", dtype=torch.float16) / k**0.5
    w2 = torch.randn(n_gate_up, k, device="cuda", dtype=torch.float16) / k**0.5
    w3 = torch.randn(n_out, n_gate_up // 2, device="cuda", dtype=torch.float16) / (n_gate_up // 2) ** 0.5
    h = torch.empty(m, k, device="cuda", dtype=torch.float16)
    act = torch.empty(m, n_gate_up // 2, device="cuda", dtype=torch.float16)
    out = torch.empty(m, n_out, device="cuda", dtype=torch.float16)
    ws = torch.empty(gemm.workspace_bytes(m, n_gate_up, "float16", "silu_mul"), dtype=torch.uint8, device="cuda")
    a1, a2 = gemm.make_args(x, w1, out=h), gemm.make_args(h, w2, out=act, epilogue="silu_mul")
    a3 = gemm.make_args(act, w3, out=out)

    def chain(pdl):
        h.fill_(float("nan"))
        act.fill_(float("nan"))
        gemm.run_impl(a1, "implb", workspace=ws, pdl=pdl)
        gemm.run_impl(a2, "cublaslt", workspace=ws, pdl=pdl)
        gemm.run_impl(a3, "implb", workspace=ws, pdl=pdl)

    assert_pdl_chain_exact(chain, out)


@pytest.mark.parametrize("m", [9, 24])
def test_one_row_block_per_warp_computes_the_same(m):
    """row_blocks = 1 (one 16-row weight block per warp, what the rule's second block is measured against) is the
    same math as the rule's choice."""
    x, w, bias, residual = _inputs(m, 1000, 1032, "float16", "none")
    config = {"n_tile": 16, "k_tile": 256, "stages": 3, "split_k": 1}
    rule = _run("implb", x, w, None, None, "none", config=config)
    one = _run("implb", x, w, None, None, "none", config=dict(config, row_blocks=1))
    ref, peer = _reference(x, w, None, None, False, "float16")
    _check(rule, ref, peer)
    _check(one, ref, peer)


def _refusal_case(reason):
    """(call, the message's expected words) for one reason the GEMM refuses its input."""
    torch = _torch()
    from fdpp_rewrite.gpu import gemm

    half = dict(device="cuda", dtype=torch.float16)
    w = torch.randn(32, 64, **half)
    bulk = {"n_tile": 16, "k_tile": 1024, "stages": 3, "split_k": 1}
    if reason == "k-not-multiple-of-8":
        return lambda: gemm.linear(torch.randn(2, 100, **half), torch.randn(64, 100, **half), impl="implb"), \
            "multiple of 8"
    if reason == "misaligned-x":
        x = torch.randn(2 * 64 + 1, **half)[1:].view(2, 64)
        return lambda: gemm.linear(x, w, impl="implb"), "16-byte aligned"
    if reason == "float32":
        return lambda: gemm.linear(torch.randn(2, 64, device="cuda"), w.float()), "float16"
    if reason == "impla-m-9":
        return lambda: gemm.linear(torch.randn(9, 64, **half), w, impl="impla"), "M <= 8"
    if reason == "implb-m-65":
        return lambda: gemm.linear(torch.randn(65, 64, **half), w, impl="implb"), "M <= 64"
    if reason == "wgmma-m-257":
        config = {"n_tile": 64, "k_tile": 64, "stages": 4, "split_k": 1, "loader": "wgmma"}
        return lambda: gemm.linear(torch.randn(257, 64, **half), w, impl="implb", implb_config=config), "M <= 256"
    if reason == "n_tile-48":
        config = {"n_tile": 48, "k_tile": 64, "stages": 2, "split_k": 1}
        return lambda: gemm.linear(torch.randn(2, 64, **half), w, impl="implb", implb_config=config), "n_tile"
    if reason == "tma-k-not-64":
        x, w2, _, _ = _inputs(4, 1000, 2072, "float16", "none")
        return lambda: _run("implb", x, w2, None, None, "none", config=bulk), "K to be a multiple of 64"
    # A 1024-column config past 16 rows: the launcher says so and never runs another config instead.
    loader = reason.split("-")[0]
    x, w2, _, _ = _inputs(17, 256, 2048, "float16", "none")
    config = bulk if loader == "tma" else dict(bulk, loader=loader)
    return lambda: _run("implb", x, w2, None, None, "none", config=config), "ImplB config handles M <= 16"


# One case per distinct reason (a launcher that cannot run what it was given says so in one line).
REFUSALS = ["k-not-multiple-of-8", "misaligned-x", "float32", "impla-m-9", "implb-m-65", "n_tile-48",
            "tma-k-not-64", "tma-m-17", "rows-m-17", "pair-m-17", "wgmma-m-257"]


@pytest.mark.parametrize("reason", REFUSALS)
def test_refusals_are_one_line_errors(reason):
    from fdpp_rewrite.errors import FdppError

    if reason.startswith(SM90_LOADERS):
        _skip_off_hopper(reason.split("-")[0])
    call, words = _refusal_case(reason)
    with pytest.raises(FdppError, match=words) as caught:
        call()
    assert "\n" not in str(caught.value)


def test_a_plan_for_cublaslt_without_cublaslt_is_an_error():
    """No silent switch to CUTLASS: where libcublasLt cannot be loaded, a cuBLASLt plan fails naming what to do
    (a fresh process: the first library loaded stays)."""
    import subprocess
    import sys

    code = (
        "import torch\n"
        "from fdpp_rewrite.errors import FdppError\n"
        "from fdpp_rewrite.gpu import gemm\n"
        "assert gemm.library().fdpp_gemm_load_cublaslt(b'/nonexistent/libcublasLt.so') == 2\n"
        "gemm._locate_cublaslt = lambda: None  # keep the binding from loading pip's copy next\n"
        "x = torch.randn(100, 256, device='cuda', dtype=torch.float16)\n"
        "w = torch.randn(512, 256, device='cuda', dtype=torch.float16)\n"
        "plan = {'m1': 0, 'm2': 8, 'implb': {'n_tile': 16, 'k_tile': 256, 'stages': 3, 'split_k': 1},\n"
        "        'implc': 'cublaslt'}\n"
        "try:\n"
        "    gemm.linear(x, w, plan=plan)\n"
        "except FdppError as exc:\n"
        "    print(exc)\n"
    )
    env = {key: value for key, value in __import__("os").environ.items() if key != "FDPP_CUBLASLT_LIBRARY"}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "unsupported" in proc.stdout and "libcublasLt could not be loaded" in proc.stdout, proc.stdout
