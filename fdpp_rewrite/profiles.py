"""GEMM profiles: engines/profiles/<gpu>.json (schema in engines/profiles/README.md), written on the GPU by
`fdpp_rewrite profile`, read by the rewriter to put M1/M2 and the ImplB tiles on every FlatGemm node.

    profile = load_profile("engines/profiles/h200.json")
    choice = profile.lookup(n=2048, k=576, dtype="float16")      # GemmChoice or None
    choices, label, warnings = resolve_choices(shapes, explicit_path=None)
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

from fdpp_rewrite.contracts import contract_path, load_contract
from fdpp_rewrite.dispatch import describe_plan
from fdpp_rewrite.errors import FdppError
from fdpp_rewrite.profile import fused_decode_plan
from fdpp_rewrite.resources import display_path, profile_path
from fdpp_rewrite.schemas import PROFILE_SCHEMA

DEFAULT_PROFILE = profile_path("h200.json")  # the committed profile the rewriter uses without --profile
UNPROFILED = "unprofiled-default"
DTYPES = ("float16", "bfloat16", "float32")


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
    # what a node of this shape with the silu_mul epilogue gets instead, where it differs: its decode batches in
    # one launch (fdpp_rewrite.profile.fused_decode_plan); not an attribute
    silu_mul: GemmChoice | None = field(default=None, compare=False, repr=False)

    def attributes(self) -> dict:
        out = asdict(self)
        del out["silu_mul"]
        return out

    def for_epilogue(self, epilogue: str) -> GemmChoice:
        return self.silu_mul if epilogue == "silu_mul" and self.silu_mul is not None else self


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
        return f"{self.path.name} ({self.gpu})"

    def lookup(self, n: int, k: int, dtype: str) -> GemmChoice | None:
        return self.shapes.get((int(n), int(k), dtype))


def _require(condition: bool, path: Path, what: str) -> None:
    if not condition:
        raise FdppError(f"profile {path} is malformed: {what}; re-run `python -m fdpp_rewrite profile` on the GPU")


def _choice(plan: dict, label: str, silu_mul: GemmChoice | None = None) -> GemmChoice:
    """A profile entry's plan (m1, m2, implb, implc) as node attributes."""
    implb = plan["implb"]
    return GemmChoice(m1=int(plan["m1"]), m2=int(plan["m2"]), implb_n_tile=int(implb["n_tile"]),
                      implb_k_tile=int(implb["k_tile"]), implb_stages=int(implb["stages"]),
                      implb_split_k=int(implb["split_k"]), implc=str(plan.get("implc", "cublaslt")), profile=label,
                      implb_loader=str(implb.get("loader", "tma")), silu_mul=silu_mul)


def load_profile(path) -> Profile:
    """Read and validate a profile file (every value checked against the FlatGemm contract)."""
    path = Path(path)
    if not path.is_file():
        raise FdppError(f"no profile at {path}; run `python -m fdpp_rewrite profile <preset>` on the GPU, "
                        "or omit --profile for the unprofiled default")
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise FdppError(f"profile {path} is not valid JSON ({exc}); re-run `python -m fdpp_rewrite profile`") from exc
    _require(isinstance(data, dict) and data.get("schema") == PROFILE_SCHEMA, path,
             f"expected \"schema\": \"{PROFILE_SCHEMA}\"")
    for key in ("gpu", "shapes"):
        _require(key in data, path, f"missing '{key}'")
    _require(isinstance(data["shapes"], list), path, "'shapes' must be a list")
    contract = load_contract("FlatGemm")
    label = f"{path.name} ({data['gpu']})"
    shapes = {}
    for index, entry in enumerate(data["shapes"]):
        where = f"shapes[{index}]"
        try:
            n, k, dtype = int(entry["n"]), int(entry["k"]), str(entry["dtype"])
            fused = fused_decode_plan(entry)
            choice = _choice(entry, label, silu_mul=_choice(fused, label) if fused else None)
        except (KeyError, TypeError, ValueError) as exc:
            raise FdppError(f"profile {path} is malformed: {where} lacks or mistypes {exc}; re-run "
                            "`python -m fdpp_rewrite profile` on the GPU") from exc
        _require(n > 0 and k > 0 and dtype in DTYPES, path, f"{where} has n={n}, k={k}, dtype={dtype!r}")
        _require((n, k, dtype) not in shapes, path, f"{where} repeats [{n}, {k}] {dtype}")
        try:
            for checked in filter(None, (choice, choice.silu_mul)):
                contract.validate_attributes(checked.attributes(), where=f"profile {path.name} {where}")
        except FdppError as exc:
            raise FdppError(f"profile {path} is malformed: {exc}") from exc
        shapes[(n, k, dtype)] = choice
    return Profile(path=path, gpu=str(data["gpu"]), compute_capability=str(data.get("compute_capability", "")),
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
