"""GEMM profiles: the one reader of engines/profiles/<gpu>.json (schema in engines/profiles/README.md), written on
the GPU by `fdpp_rewrite profile`. Every consumer of a GEMM plan reads it here: the rewriter (M1/M2/M3 and the ImplB
tiles on every FlatGemm node) and the build (fdpp_rewrite.gemm_plans). It imports nothing of the profiler: an
entry's plans are stored complete, the silu_mul one included, and only validated here.

    profile = load_profile(profile_path("h200.json"))
    choice = profile.lookup(n=2048, k=576, dtype="float16")      # GemmChoice or None
    choice.for_epilogue("silu_mul").plan()                        # {"m1", "m2", "implb": {...}, "implc"}
    choices, label, warnings = resolve_choices(shapes, explicit_path=None)
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

from fdpp_rewrite.contracts import contract_path, load_contract
from fdpp_rewrite.dispatch import WGMMA, describe_plan, plan_problem
from fdpp_rewrite.errors import FdppError
from fdpp_rewrite.resources import display_path, profile_path
from fdpp_rewrite.schemas import PROFILE_SCHEMA

DEFAULT_PROFILE = profile_path("h200.json")  # the committed profile the rewriter uses without --profile
UNPROFILED = "unprofiled-default"
DTYPES = ("float16", "bfloat16", "float32")
IMPLB_FIELDS = ("n_tile", "k_tile", "stages", "split_k")  # integers; "loader" is a word
# The wgmma range's config: its tiling and loader are the loader's own (gemm_heuristics.h kWgmmaRows, kWgmmaKStep),
# its stages and split_k are the FlatGemm attributes implb_wgmma_*.
WGMMA_TILES = {"n_tile": 64, "k_tile": 64, "loader": WGMMA}
PROFILE_COMMAND = "python -m fdpp_rewrite profile <preset>"


def gpu_slug(name: str) -> str:
    """A GPU's profile file stem: 'NVIDIA H200' -> 'h200'; 'NVIDIA GeForce RTX 4090' -> 'geforce-rtx-4090'."""
    slug = name.lower().replace("nvidia", "").strip()
    return "-".join(part for part in slug.replace("_", " ").split() if part) or "gpu"


def committed_profile(gpu_name: str) -> Path:
    """The profile committed (and packaged) for a GPU: engines/profiles/<slug>.json, in a checkout or a wheel."""
    return profile_path(f"{gpu_slug(gpu_name)}.json")


def profile_label(name: str, gpu: str) -> str:
    """What a FlatGemm's `profile` attribute says of its plan's origin: '<profile file> (<gpu>)'."""
    return f"{name} ({gpu})"


def label_gpu(label: str) -> str | None:
    """The GPU a `profile` attribute names (profile_label's inverse), None for 'unprofiled-default' or another text:
        'h200.json (NVIDIA H200)' -> 'NVIDIA H200'"""
    if not label.endswith(")") or " (" not in label:
        return None
    return label[label.rindex(" (") + 2:-1] or None
@dataclass(frozen=True)
class GemmChoice:
    """What one [N, K, dtype] gets: the FlatGemm attributes other than the epilogue."""

    m1: int
    m2: int
    implb_n_tile: int
    implb_k_tile: int
    implb_stages: int
    implb_split_k: int
    implc: str
    profile: str
    implb_loader: str = "tma"
    # the wgmma range m2 < M <= m3 (0: none, m3 = m2) and its config's stages and split_k (the FlatGemm contract's
    # defaults where there is no range: such a node carries none of the three, as before the range existed)
    m3: int = 0
    implb_wgmma_stages: int = 8
    implb_wgmma_split_k: int = 1
    # what a node of this shape with the silu_mul epilogue gets instead, where it differs: its decode batches in
    # one launch (stored in the entry by the profiler: fdpp_rewrite.profile_plan.fused_decode_plan); not an attribute
    silu_mul: GemmChoice | None = field(default=None, compare=False, repr=False)

    @property
    def has_wgmma_range(self) -> bool:
        return self.m3 > self.m2

    def attributes(self) -> dict:
        out = asdict(self)
        del out["silu_mul"]
        if not self.has_wgmma_range:
            for key in ("m3", "implb_wgmma_stages", "implb_wgmma_split_k"):
                del out[key]
        return out

    def for_epilogue(self, epilogue: str) -> GemmChoice:
        return self.silu_mul if epilogue == "silu_mul" and self.silu_mul is not None else self

    def plan(self) -> dict:
        """The plan as an engine's plan.json and the C ABI take it (gpu/gemm.py's Plan)."""
        plan = {"m1": self.m1, "m2": self.m2, "implc": self.implc,
                "implb": {"n_tile": self.implb_n_tile, "k_tile": self.implb_k_tile, "stages": self.implb_stages,
                          "split_k": self.implb_split_k, "loader": self.implb_loader}}
        if self.has_wgmma_range:
            plan.update(m3=self.m3, wgmma=dict(WGMMA_TILES, stages=self.implb_wgmma_stages,
                                               split_k=self.implb_wgmma_split_k))
        return plan


def _unprofiled_default() -> GemmChoice:
    """The plan of a shape no profile covers: m1/m2/implc from the FlatGemm contract's "unprofiled_default" (the
    one place both the rewriter and gemm_heuristics.h default_plan read), labelled profile="unprofiled-default".
    Its ImplB tiles are "device": the library picks them for the GPU that runs the node; the node carries the
    contract's attribute defaults in their place (64 x 64 tiles, double buffered, valid on every shape).
        {"m1": 0, "m2": 8, "implc": "cublaslt"} -> M = 1..8 ImplB, M >= 9 cuBLASLt"""
    contract = load_contract("FlatGemm")
    plan = contract.raw["unprofiled_default"]
    if plan.get("implb") != UNPROFILED_IMPLB:
        raise FdppError(f"{contract_path('FlatGemm')}: unprofiled_default.implb must be '{UNPROFILED_IMPLB}'")
    defaults = contract.defaults()
    choice = GemmChoice(m1=int(plan["m1"]), m2=int(plan["m2"]), implc=str(plan["implc"]), profile=UNPROFILED,
                        **{name: defaults[name] for name in ("implb_n_tile", "implb_k_tile", "implb_stages",
                                                              "implb_split_k", "implb_loader")})
    contract.validate_attributes(choice.attributes(), where="unprofiled_default")
    return choice


UNPROFILED_IMPLB = "device"  # the contract's word for "the library's ImplB default for the device"
UNPROFILED_DEFAULT = _unprofiled_default()


@dataclass(frozen=True)
class Profile:
    path: Path
    gpu: str
    compute_capability: str
    presets: tuple
    shapes: dict  # (n, k, dtype) -> GemmChoice

    @property
    def label(self) -> str:
        return profile_label(self.path.name, self.gpu)

    def lookup(self, n: int, k: int, dtype: str) -> GemmChoice | None:
        return self.shapes.get((int(n), int(k), dtype))


def _malformed(path, what: str) -> FdppError:
    return FdppError(f"profile {path} is malformed: {what}; re-run `{PROFILE_COMMAND}` on the GPU")


def _require(condition: bool, path, what: str) -> None:
    if not condition:
        raise _malformed(path, what)


def _integer(value, path, where: str) -> int:
    """A JSON integer (not 1.5, not 1e309, not true): a plan's thresholds and tiles are counts."""
    _require(isinstance(value, int) and not isinstance(value, bool), path,
             f"{where} must be an integer, got {json.dumps(value)}")
    return value


def _word(value, path, where: str) -> str:
    _require(isinstance(value, str), path, f"{where} must be a string, got {json.dumps(value)}")
    return value


def _wgmma_range(plan, path, where: str) -> dict:
    """The stored plan's optional wgmma range as GemmChoice fields: {"m3": int, "wgmma": {"n_tile": 64,
    "k_tile": 64, "stages", "split_k", "loader": "wgmma"}}, both or neither; none: {} (m3 = m2). Its rule
    (m3 > m2, m3 <= 256, m2 <= 64) is dispatch.plan_problem's, checked by the caller."""
    if "m3" not in plan and "wgmma" not in plan:
        return {}
    _require("m3" in plan and "wgmma" in plan, path, f"{where} has one of 'm3' and 'wgmma' without the other "
             "(a wgmma range needs both)")
    m3, config = _integer(plan["m3"], path, f"{where}.m3"), plan["wgmma"]
    _require(isinstance(config, dict) and all(key in config for key in IMPLB_FIELDS), path,
             f"{where}.wgmma must be an object with {', '.join(IMPLB_FIELDS)} and loader 'wgmma'")
    for key, value in WGMMA_TILES.items():
        _require(config.get(key) == value, path, f"{where}.wgmma.{key} must be {json.dumps(value)} (the wgmma "
                 f"loader's), got {json.dumps(config.get(key))}")
    return {"m3": m3, "implb_wgmma_stages": _integer(config["stages"], path, f"{where}.wgmma.stages"),
            "implb_wgmma_split_k": _integer(config["split_k"], path, f"{where}.wgmma.split_k")}


def _choice(plan, label: str, path, where: str, silu_mul: GemmChoice | None = None) -> GemmChoice:
    """A stored plan (m1, m2, implb, implc[, m3, wgmma]) as node attributes, every value type-checked here and
    range-checked against the FlatGemm contract by the caller."""
    _require(isinstance(plan, dict), path, f"{where} must be an object")
    for key in ("m1", "m2", "implb"):
        _require(key in plan, path, f"{where} lacks '{key}'")
    implb = plan["implb"]
    _require(isinstance(implb, dict) and all(key in implb for key in IMPLB_FIELDS), path,
             f"{where}.implb must be an object with {', '.join(IMPLB_FIELDS)}")
    tiles = {key: _integer(implb[key], path, f"{where}.implb.{key}") for key in IMPLB_FIELDS}
    implc = _word(plan.get("implc", "cublaslt"), path, f"{where}.implc")
    return GemmChoice(m1=_integer(plan["m1"], path, f"{where}.m1"), m2=_integer(plan["m2"], path, f"{where}.m2"),
                      implb_n_tile=tiles["n_tile"], implb_k_tile=tiles["k_tile"], implb_stages=tiles["stages"],
                      implb_split_k=tiles["split_k"], implc=implc,
                      profile=label, implb_loader=_word(implb.get("loader", "tma"), path, f"{where}.implb.loader"),
                      silu_mul=silu_mul, **_wgmma_range(plan, path, where))


def entry_choice(entry, label: str, path="the profile", where: str = "entry") -> tuple:
    """((n, k, dtype), GemmChoice) of one profile entry, its stored silu_mul plan attached, every value checked
    (types here, ranges against the FlatGemm contract). The build uses it for the entries it measures itself."""
    _require(isinstance(entry, dict), path, f"{where} must be an object")
    for key in ("n", "k", "dtype"):
        _require(key in entry, path, f"{where} lacks '{key}'")
    n, k = _integer(entry["n"], path, f"{where}.n"), _integer(entry["k"], path, f"{where}.k")
    dtype = entry["dtype"]
    _require(n > 0 and k > 0 and dtype in DTYPES, path, f"{where} has n={n}, k={k}, dtype={dtype!r}")
    _require("silu_mul" in entry, path, f"{where} lacks 'silu_mul' (the plan of its silu_mul nodes, or null)")
    silu = entry["silu_mul"]
    silu_mul = None if silu is None else _choice(silu, label, path, f"{where}.silu_mul")
    choice = _choice(entry, label, path, where, silu_mul=silu_mul)
    contract = load_contract("FlatGemm")
    try:
        for checked in filter(None, (choice, silu_mul)):
            contract.validate_attributes(checked.attributes(), where=f"profile {Path(str(path)).name} {where}")
    except FdppError as exc:
        raise FdppError(f"profile {path} is malformed: {exc}") from exc
    for checked, at in ((choice, where), (silu_mul, f"{where}.silu_mul")):
        problem = checked is not None and checked.m3 != 0 and plan_problem(dict(checked.plan(), m3=checked.m3))
        _require(not problem, path, f"{at}: {problem}")
    return (n, k, dtype), choice


def load_profile(path) -> Profile:
    """Read and validate a profile file (every value typed and checked against the FlatGemm contract); a file of
    another schema, an old one included, is a one-line error saying to re-run the profiler."""
    path = Path(path)
    if not path.is_file():
        raise FdppError(f"no profile at {path}; run `{PROFILE_COMMAND}` on the GPU, or omit --profile")
    try:
        data = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise FdppError(f"profile {path} is not valid JSON ({exc}); re-run `{PROFILE_COMMAND}`") from exc
    schema = data.get("schema") if isinstance(data, dict) else None
    _require(schema == PROFILE_SCHEMA, path, f"expected \"schema\": \"{PROFILE_SCHEMA}\", got {json.dumps(schema)}"
             + (" (an older profile: its entries lack the stored silu_mul plan)" if schema == "fdpp-profile/1" else ""))
    for key in ("gpu", "shapes"):
        _require(key in data, path, f"missing '{key}'")
    _require(isinstance(data["gpu"], str) and data["gpu"], path, "'gpu' must name the GPU")
    _require(isinstance(data["shapes"], list), path, "'shapes' must be a list")
    label = profile_label(path.name, data["gpu"])
    shapes = {}
    for index, entry in enumerate(data["shapes"]):
        key, choice = entry_choice(entry, label, path, f"shapes[{index}]")
        _require(key not in shapes, path, f"shapes[{index}] repeats [{key[0]}, {key[1]}] {key[2]}")
        shapes[key] = choice
    return Profile(path=path, gpu=data["gpu"], compute_capability=str(data.get("compute_capability", "")),
                   presets=tuple(data.get("presets", ())), shapes=shapes)


def _shape_list(shapes) -> str:
    return ", ".join(f"[{n}, {k}] {dtype}" for n, k, dtype in sorted(shapes))


def resolve_choices(shapes, explicit_path=None, default_path=DEFAULT_PROFILE):
    """GemmChoice per (n, k, dtype) for the shapes a model uses.

    With an explicit profile every shape must be in it (a missing one is an error: the profile is for another
    model). Without one, the default profile is used if it covers every shape, else the unprofiled default
    for all of them, with a warning naming the missing shapes. Returns (choices, source label, warnings).
    """
    shapes = sorted(set(shapes))
    if explicit_path is not None:
        profile = load_profile(explicit_path)
        missing = [s for s in shapes if profile.lookup(*s) is None]
        if missing:
            n, k, dtype = missing[0]
            more = f" (and {len(missing) - 1} more: {_shape_list(missing[1:])})" if len(missing) > 1 else ""
            raise FdppError(f"profile {explicit_path} has no entry for [{n}, {k}] {dtype}{more} (a profile for "
                            f"another model?); run `python -m fdpp_rewrite profile <preset>` on the GPU")
        return {s: profile.lookup(*s) for s in shapes}, str(explicit_path), []
    if Path(default_path).is_file():
        profile = load_profile(default_path)
        missing = [s for s in shapes if profile.lookup(*s) is None]
        if not missing:
            return {s: profile.lookup(*s) for s in shapes}, display_path(default_path), []
        reason = f"{Path(default_path).name} has no entry for {_shape_list(missing)}"
    else:
        reason = f"no profile at {default_path}"
    warning = (f"using the unprofiled default GEMM plan ({describe_plan(UNPROFILED_DEFAULT.attributes())}) for "
               f"{_shape_list(shapes)}: {reason}; run `python -m fdpp_rewrite profile <preset>` on the GPU and pass "
               "--profile")
    return {s: UNPROFILED_DEFAULT for s in shapes}, UNPROFILED, [warning]
