"""ctypes bindings of the flat GEMM's C ABI (plugins/capi/gemm_capi.h) and a torch-facing `linear()`.

A *plan* is the per-(N, K, dtype) dispatch table of the heuristic dataflow, as a dict shaped like one entry of
engines/profiles/<gpu>.json: {"m1": int, "m2": int, "implb": {"n_tile", "k_tile", "stages", "split_k"[, "loader"]},
"implc": "cublaslt" | "cutlass"[, "m3": int, "wgmma": {... "loader": "wgmma"}]} (no m3, or 0: m3 = m2, no wgmma
range).

The pure host functions (select, default_plan, implb_candidates, check_implb_config, workspace_bytes) need the
library but no GPU, so the CPU tests use them too."""

import ctypes
import functools
import glob
import os
import sys

from fdpp_rewrite import dispatch
from fdpp_rewrite.errors import FdppError
from fdpp_rewrite.gpu import lib as _lib

# The C ABI's fdpp_gemm_impl codes: 0 = auto (dispatch by the plan), then dispatch.IMPLS in gemm_heuristics.h's order.
IMPL_CODES = {"auto": 0, **{name: code for code, name in enumerate(dispatch.IMPLS, start=1)}}
IMPL_NAMES = {v: k for k, v in IMPL_CODES.items()}
EPILOGUES = {"none": 0, "silu_mul": 1}
PDL = {True: 0, False: 1}  # fdpp_pdl: AUTO (on where the GPU runs the sm_90a code), OFF


# How a k_tile 1024 config streams the weight (the C ABI's loader codes): "tma", the tensor memory accelerator
# (sm_90); "rows", row-streaming cp.async with two CTAs per SM, every stage's weights issued before the PDL wait;
# "rows1", the same kernel issuing only the first unit's before it (two in the second half of its grid); "pair"
# (M <= 16, sm_90), clusters of two CTAs per 32 weight rows, one K half each. Smaller k_tiles have no loader choice,
# except "wgmma" (sm_90a, M <= 256): its own kernel on warpgroup MMAs with the batch on their N side,
# n_tile 64 and k_tile 64 (gemm_heuristics.h, kLoaderWgmma).
LOADERS = {"tma": 0, "rows": 1, "rows1": 2, "pair": 3, "wgmma": 4}
LOADER_NAMES = {v: k for k, v in LOADERS.items()}
BULK_MIN_K_TILE = 1024


class ImplBConfig(ctypes.Structure):
    """Mirror of fdpp_gemm_implb_config. row_blocks (16-row weight blocks per warp below k_tile 1024): 0, the
    rule, unless a measurement asks for 1; it appears in dicts only when set."""

    _fields_ = [("n_tile", ctypes.c_int32), ("k_tile", ctypes.c_int32), ("stages", ctypes.c_int32),
                ("split_k", ctypes.c_int32), ("loader", ctypes.c_int32), ("row_blocks", ctypes.c_int32)]

    def as_dict(self) -> dict:
        d = {"n_tile": self.n_tile, "k_tile": self.k_tile, "stages": self.stages, "split_k": self.split_k}
        if self.k_tile >= BULK_MIN_K_TILE or self.loader == LOADERS["wgmma"]:
            d["loader"] = LOADER_NAMES.get(self.loader, str(self.loader))
        if self.row_blocks:
            d["row_blocks"] = self.row_blocks
        return d

    @classmethod
    def from_dict(cls, d: dict) -> "ImplBConfig":
        loader = d.get("loader", "tma") if isinstance(d, dict) else None
        if loader not in LOADERS:
            raise FdppError(f"ImplB config {d!r}: loader must be one of {', '.join(LOADERS)}")
        try:
            return cls(int(d["n_tile"]), int(d["k_tile"]), int(d["stages"]), int(d["split_k"]), LOADERS[loader],
                       int(d.get("row_blocks", 0)))
        except (KeyError, TypeError, ValueError) as exc:
            raise FdppError(f"ImplB config {d!r} needs integer n_tile, k_tile, stages and split_k") from exc


def config_label(c: dict) -> str:
    """A config in one short word, e.g. 'n16 k1024 s3 x1 rows'."""
    loader = f" {c['loader']}" if c.get("loader") else ""
    return f"n{c['n_tile']} k{c['k_tile']} s{c['stages']} x{c['split_k']}{loader}"


class Plan(ctypes.Structure):
    """Mirror of fdpp_gemm_plan (C ABI 7). In dicts m3 and wgmma appear only where there is a wgmma range."""

    _fields_ = [("m1", ctypes.c_int32), ("m2", ctypes.c_int32), ("implb", ImplBConfig), ("implc", ctypes.c_int32),
                ("m3", ctypes.c_int32), ("wgmma", ImplBConfig)]

    def as_dict(self) -> dict:
        d = {"m1": self.m1, "m2": self.m2, "implb": self.implb.as_dict(), "implc": IMPL_NAMES[self.implc]}
        if self.m3 != self.m2:
            d.update(m3=self.m3, wgmma=self.wgmma.as_dict())
        return d

    @classmethod
    def from_dict(cls, d: dict) -> "Plan":
        implc = d.get("implc", "cublaslt")
        implc = "cublaslt" if implc == "cublas" else implc  # the contract's "cublas": cuBLAS's Lt interface
        if implc not in ("cublaslt", "cutlass"):
            raise FdppError(f"plan implc {implc!r} is not 'cublaslt', 'cublas' or 'cutlass'")
        try:
            m3 = dispatch.plan_m3(d)
            if m3 != int(d["m2"]) and "wgmma" not in d:
                raise FdppError(f"plan {d!r} has m3 {m3} > m2 but no wgmma config; add one (loader 'wgmma') or drop m3")
            wgmma = ImplBConfig.from_dict(d["wgmma"]) if "wgmma" in d else ImplBConfig()
            return cls(int(d["m1"]), int(d["m2"]), ImplBConfig.from_dict(d["implb"]), IMPL_CODES[implc], m3, wgmma)
        except (KeyError, TypeError, ValueError) as exc:
            raise FdppError(f"plan {d!r} needs integer m1, m2 and an implb config") from exc


class Args(ctypes.Structure):
    _fields_ = [("x", ctypes.c_void_p), ("w", ctypes.c_void_p), ("bias", ctypes.c_void_p),
                ("residual", ctypes.c_void_p), ("y", ctypes.c_void_p), ("m", ctypes.c_int64), ("n", ctypes.c_int64),
                ("k", ctypes.c_int64), ("dtype", ctypes.c_int32), ("epilogue", ctypes.c_int32),
                ("pdl", ctypes.c_int32)]


_P = ctypes.POINTER


@functools.lru_cache(maxsize=1)
def library() -> ctypes.CDLL:
    """The loaded plugin library with the GEMM functions' signatures declared."""
    cdll = _lib.load()
    i32, i64, vp, sz = ctypes.c_int32, ctypes.c_int64, ctypes.c_void_p, ctypes.c_size_t
    signatures = {
        "fdpp_gemm_default_plan": [i64, i64, i32, i32, i32, _P(Plan)],
        "fdpp_gemm_select": [i64, _P(Plan), _P(i32)],
        "fdpp_gemm_select_implb_config": [i64, _P(Plan), _P(i32)],
        "fdpp_gemm_check_implb_config": [_P(ImplBConfig), i64, i64, i64, i32],
        "fdpp_gemm_implb_candidates": [i64, i64, i32, i64, i32, i64, i32, _P(ImplBConfig), i32, _P(i32)],
        "fdpp_gemm_workspace_bytes": [i64, i64, i32, i32, _P(Plan), _P(sz)],
        "fdpp_gemm_run": [_P(Args), _P(Plan), vp, sz, vp],
        "fdpp_gemm_run_impl": [_P(Args), i32, _P(ImplBConfig), i32, i32, vp, sz, vp],
        "fdpp_gemm_prepare": [_P(Args), _P(Plan)],
        "fdpp_gemm_device_info": [_P(i32), _P(i32), _P(i32), _P(i64)],
        "fdpp_gemm_load_cublaslt": [ctypes.c_char_p],
    }
    for name, argtypes in signatures.items():
        fn = getattr(cdll, name, None)
        if fn is None:
            raise FdppError(f"{_lib.library_path()} has no {name}; rebuild the library from this checkout")
        fn.argtypes = argtypes
        fn.restype = ctypes.c_int
    cdll.fdpp_gemm_cublaslt_available.restype = ctypes.c_int32
    cdll.fdpp_gemm_cutlass_available.restype = ctypes.c_int32
    return cdll


@functools.lru_cache(maxsize=1)
def _locate_cublaslt() -> None:
    """Load libcublasLt into the library before its first cuBLASLt GEMM: the one $FDPP_CUBLASLT_LIBRARY names,
    else the one pip's nvidia-cublas (torch's dependency) installed, else whatever the dynamic linker finds. A
    library that cannot be loaded is not an error here: cublaslt_available() is then False, and a GEMM that needs
    cuBLASLt says why."""
    path = os.environ.get("FDPP_CUBLASLT_LIBRARY") or _pip_cublaslt()
    library().fdpp_gemm_load_cublaslt(path.encode() if path else None)


def _pip_cublaslt():
    """The libcublasLt a pip package installed (nvidia-cublas, or torch's own), or None."""
    for base in sys.path:
        for pattern in ("nvidia/cublas/lib/libcublasLt.so*", "nvidia/cu*/lib/libcublasLt.so*",
                        "torch/lib/libcublasLt.so*"):
            hits = sorted(glob.glob(os.path.join(base, pattern)))
            if hits:
                return hits[-1]
    return None


def cublaslt_available() -> bool:
    _locate_cublaslt()
    return bool(library().fdpp_gemm_cublaslt_available())


def pdl_supported() -> bool:
    """Whether ImplA/ImplB launch with programmatic dependent launch here by default (pdl=True): on a GPU that
    runs the library's sm_90a code (compute capability 9.x)."""
    return device_info()["cc_major"] == 9


def cutlass_available() -> bool:
    return bool(library().fdpp_gemm_cutlass_available())


def device_info() -> dict:
    """num_sms, cc_major, cc_minor, max_smem (opt-in bytes per block) of the current CUDA device."""
    vals = [ctypes.c_int32(), ctypes.c_int32(), ctypes.c_int32(), ctypes.c_int64()]
    _lib.check(library().fdpp_gemm_device_info(*(ctypes.byref(v) for v in vals)), "fdpp_gemm_device_info")
    return {"num_sms": vals[0].value, "cc_major": vals[1].value, "cc_minor": vals[2].value, "max_smem": vals[3].value}


# ---- pure host logic ----------------------------------------------------------------------------------------
def default_plan(n: int, k: int, epilogue: str = "none", num_sms: int = 0, cc_major: int = 0) -> dict:
    """The plan for a shape with no profile (num_sms/cc_major 0: the current device's)."""
    out = Plan()
    _lib.check(library().fdpp_gemm_default_plan(n, k, EPILOGUES[epilogue], num_sms, cc_major, ctypes.byref(out)),
               "fdpp_gemm_default_plan")
    return out.as_dict()


def select(m: int, plan: dict) -> str:
    """Which implementation the plan runs for m rows: 'impla', 'implb', 'cublaslt' or 'cutlass'."""
    out = ctypes.c_int32()
    p = Plan.from_dict(plan)
    _lib.check(library().fdpp_gemm_select(m, ctypes.byref(p), ctypes.byref(out)), "fdpp_gemm_select")
    return IMPL_NAMES[out.value]


IMPLB_RANGES = {0: None, 1: "implb", 2: dispatch.WGMMA}  # fdpp_gemm_select_implb_config's range codes


def select_range(m: int, plan: dict) -> str:
    """select() with the ImplB range told apart: 'impla', 'implb', 'wgmma' (the plan's wgmma config), 'cublaslt' or
    'cutlass' (dispatch.implb_range's answer, from the C ABI)."""
    p = Plan.from_dict(plan)
    out = ctypes.c_int32()
    _lib.check(library().fdpp_gemm_select_implb_config(m, ctypes.byref(p), ctypes.byref(out)),
               "fdpp_gemm_select_implb_config")
    return IMPLB_RANGES[out.value] or select(m, plan)


def check_implb_config(config: dict, m: int, k: int, max_smem: int, cc_major: int) -> None:
    """Raise FdppError naming the problem unless the ImplB config can run."""
    c = ImplBConfig.from_dict(config)
    _lib.check(library().fdpp_gemm_check_implb_config(ctypes.byref(c), m, k, max_smem, cc_major),
               "fdpp_gemm_check_implb_config")


def implb_candidates(n: int, k: int, m: int, num_sms: int, max_smem: int, cc_major: int,
                     epilogue: str = "none") -> list:
    """The ImplB configs the profiler sweeps for this shape and batch size."""
    count = ctypes.c_int32()
    lib = library()
    _lib.check(lib.fdpp_gemm_implb_candidates(n, k, EPILOGUES[epilogue], m, num_sms, max_smem, cc_major, None, 0,
                                              ctypes.byref(count)), "fdpp_gemm_implb_candidates")
    buf = (ImplBConfig * max(count.value, 1))()
    _lib.check(lib.fdpp_gemm_implb_candidates(n, k, EPILOGUES[epilogue], m, num_sms, max_smem, cc_major, buf,
                                              count.value, ctypes.byref(count)), "fdpp_gemm_implb_candidates")
    return [buf[i].as_dict() for i in range(count.value)]


def workspace_bytes(max_m: int, n: int, dtype: str, epilogue: str = "none", plan: dict = None) -> int:
    """Workspace for any M <= max_m under plan (plan None: for any implementation)."""
    out = ctypes.c_size_t()
    p = ctypes.byref(Plan.from_dict(plan)) if plan is not None else None
    _lib.check(library().fdpp_gemm_workspace_bytes(max_m, n, EPILOGUES[epilogue], _lib.DTYPE_CODES[dtype], p,
                                                   ctypes.byref(out)), "fdpp_gemm_workspace_bytes")
    return out.value


# ---- torch-facing ---------------------------------------------------------------------------------------------
def _dtype_name(t) -> str:
    import torch

    names = {torch.float16: "float16", torch.bfloat16: "bfloat16"}
    if t.dtype not in names:
        raise FdppError(f"fdpp GEMM supports float16 and bfloat16 tensors, got {t.dtype}; cast the inputs first")
    return names[t.dtype]


def make_args(x, w, bias=None, residual=None, out=None, epilogue: str = "none", pdl: bool = True) -> Args:
    """C ABI arguments for Y = epilogue(X W^T + bias) + residual. x [..., K], w [N, K]; out [..., n_out].
    pdl: programmatic dependent launch of ImplA/ImplB where the GPU supports it (speed only, as long as w is not
    written by a kernel still running when the GEMM starts: plugins/kernels/gemm/gemm.h)."""
    if epilogue not in EPILOGUES:
        raise FdppError(f"unknown epilogue {epilogue!r}; use one of {sorted(EPILOGUES)}")
    dtype = _dtype_name(x)
    for name, t in (("w", w), ("bias", bias), ("residual", residual), ("out", out)):
        if t is None:
            continue
        if t.dtype != x.dtype or not t.is_cuda or not t.is_contiguous():
            raise FdppError(f"{name} must be a contiguous CUDA tensor of x's dtype {x.dtype}")
    if not x.is_cuda or not x.is_contiguous():
        raise FdppError("x must be a contiguous CUDA tensor")
    if w.dim() != 2 or x.shape[-1] != w.shape[1]:
        raise FdppError(f"x [..., K] and w [N, K] disagree: x {tuple(x.shape)}, w {tuple(w.shape)}")
    n, k = w.shape
    m = x.numel() // k if k else 0
    n_out = n // 2 if epilogue == "silu_mul" else n
    if out is None or tuple(out.shape[:-1]) != tuple(x.shape[:-1]) or out.shape[-1] != n_out:
        raise FdppError(f"out must have shape {tuple(x.shape[:-1]) + (n_out,)}")
    if residual is not None and tuple(residual.shape) != tuple(out.shape):
        raise FdppError(f"residual must have the output's shape {tuple(out.shape)}")
    if bias is not None and tuple(bias.shape) != (n,):
        raise FdppError(f"bias must have shape ({n},)")
    return Args(x.data_ptr(), w.data_ptr(), bias.data_ptr() if bias is not None else None,
                residual.data_ptr() if residual is not None else None, out.data_ptr(), m, n, k,
                _lib.DTYPE_CODES[dtype], EPILOGUES[epilogue], PDL[bool(pdl)])


def _set_pdl(args: Args, pdl) -> None:
    if pdl is not None:
        args.pdl = PDL[bool(pdl)]


def run(args: Args, plan: dict, workspace=None, stream=None, pdl: bool = None) -> None:
    """Launch through the plan on the current (or given) torch stream. workspace: a uint8 CUDA tensor of at
    least workspace_bytes(...) (None only when the plan never reaches ImplC for this M). pdl: overrides the
    args' setting (make_args)."""
    _locate_cublaslt()
    _set_pdl(args, pdl)
    p = Plan.from_dict(plan)
    ws_ptr, ws_bytes = (workspace.data_ptr(), workspace.numel()) if workspace is not None else (None, 0)
    _lib.check(library().fdpp_gemm_run(ctypes.byref(args), ctypes.byref(p), ws_ptr, ws_bytes,
                                       _lib.stream_handle(stream)), "fdpp_gemm_run")


def run_impl(args: Args, impl: str, implb_config: dict = None, pad_m: int = 8, impla_split_k: int = 0,
             workspace=None, stream=None, pdl: bool = None) -> None:
    """Launch one implementation ('impla', 'implb', 'cublaslt', 'cutlass') regardless of any plan. pad_m 16 and
    64 (the padding ablation) need a library built with FDPP_BENCH_ABLATIONS=ON."""
    if impl not in IMPL_CODES or impl == "auto":
        raise FdppError(f"unknown implementation {impl!r}; use impla, implb, cublaslt or cutlass")
    _locate_cublaslt()
    _set_pdl(args, pdl)
    cfg = ctypes.byref(ImplBConfig.from_dict(implb_config)) if implb_config is not None else None
    ws_ptr, ws_bytes = (workspace.data_ptr(), workspace.numel()) if workspace is not None else (None, 0)
    _lib.check(library().fdpp_gemm_run_impl(ctypes.byref(args), IMPL_CODES[impl], cfg, pad_m, impla_split_k, ws_ptr,
                                            ws_bytes, _lib.stream_handle(stream)), f"GEMM {impl}")


def prepare(args: Args, plan: dict = None) -> None:
    """Do the host-side cuBLASLt planning for args now (before a CUDA-graph capture)."""
    _locate_cublaslt()
    p = ctypes.byref(Plan.from_dict(plan)) if plan is not None else None
    _lib.check(library().fdpp_gemm_prepare(ctypes.byref(args), p), "fdpp_gemm_prepare")


def linear(x, w, bias=None, residual=None, epilogue: str = "none", plan: dict = None, impl: str = "auto",
           implb_config: dict = None, out=None, workspace=None, pdl: bool = True):
    """Y = epilogue(x w^T + bias) + residual with fdpp's GEMM; allocates out/workspace when not given (so not
    for use inside a CUDA-graph capture unless both are passed). pdl: as in make_args."""
    import torch

    n = w.shape[0]
    n_out = n // 2 if epilogue == "silu_mul" else n
    if out is None:
        out = torch.empty(*x.shape[:-1], n_out, dtype=x.dtype, device=x.device)
    args = make_args(x, w, bias, residual, out, epilogue, pdl=pdl)
    if impl == "auto":
        plan = plan or default_plan(n, w.shape[1], epilogue)
        if workspace is None:
            need = workspace_bytes(max(args.m, 1), n, _dtype_name(x), epilogue, plan)
            workspace = torch.empty(need, dtype=torch.uint8, device=x.device) if need else None
        run(args, plan, workspace)
    else:
        if workspace is None and impl in ("cublaslt", "cutlass"):
            need = workspace_bytes(max(args.m, 1), n, _dtype_name(x), epilogue, None)
            workspace = torch.empty(need, dtype=torch.uint8, device=x.device)
        run_impl(args, impl, implb_config, workspace=workspace)
    return out

