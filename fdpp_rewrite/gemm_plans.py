"""The GEMM plan of every FlatGemm node of an engine, resolved once at build time (the plan owner of `build`).

Where a plan comes from, in order (the rewriter stamped one on every node: fdpp_rewrite.passes.flat_gemm):
    build --profile P      P's entry for the node's [N, K, dtype] (P read by fdpp_rewrite.profiles, validated;
                           on cuda P must be this GPU's); --profile means the same in rewrite and build
    cuda, no --profile     the node's own attributes when their `profile` names this GPU ('h200.json (NVIDIA H200)'
                           on an H200); else the committed (packaged) profile of this GPU,
                           engines/profiles/<gpu slug>.json, through the same reader; else the shape is profiled
                           here and now (quick search, the profiler imported only then): an engine never runs an
                           unprofiled GEMM
    cpu, no --profile      the node's attributes (the cpu backend runs no kernel; it records the plans)
A silu_mul node gets its entry's stored silu_mul plan (the profiler computed it when it wrote the entry).

resolve_cuda_plans takes the device name as an argument, so the cuda resolution is checked on any machine:
    resolve_cuda_plans(gemm_nodes(plan, shapes), "NVIDIA H200", measure=refuse)  # plans from the packaged h200.json
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from fdpp_rewrite.contracts import load_contract
from fdpp_rewrite.errors import FdppError
from fdpp_rewrite.profiles import (GemmChoice, Profile, committed_profile, entry_choice, label_gpu, load_profile,
                                   profile_label)
from fdpp_rewrite.resources import display_path

PLAN_ATTRIBUTES = ("m1", "m2", "implb_n_tile", "implb_k_tile", "implb_stages", "implb_split_k", "implc",
                   "implb_loader", "profile", "m3", "implb_wgmma_stages", "implb_wgmma_split_k")
MEASURED = "profiled at build"  # the file part of the label of a shape measured by the build


@dataclass(frozen=True)
class GemmNode:
    """What a plan is resolved from: the node's weight shape, its epilogue and its (rewriter-stamped) attributes."""

    shape: tuple  # (n, k, dtype)
    epilogue: str
    attrs: dict
    # whether attrs' plan was chosen for this shape: False for a tensor-parallel shard's node, whose [N, K] is a
    # slice of the one the rewriter stamped a plan for
    stamped: bool = True


@dataclass
class GemmPlans:
    """node -> plan ({"m1", "m2", "implb": {...}, "implc"[, "m3", "wgmma": {...}]}: plan.json's gemm_plans), and
    where they came from."""

    plans: dict = field(default_factory=dict)
    sources: set = field(default_factory=set)  # labels: a profile file, '<file> (<gpu>)' of node attributes
    profile_file: Path | None = None  # the profile file read, whose sha256 the manifest records
    measured: list = field(default_factory=list)  # the entries profiled now (n, k, dtype, m1, m2, implb, implc)

    @property
    def source(self) -> str | None:
        return "; ".join(sorted(self.sources)) or None


def gemm_nodes(plan: dict, shapes: dict, prefix: str = "", rewritten_shapes: dict | None = None) -> dict:
    """prefix + node name -> GemmNode of every FlatGemm of a lowered plan; shapes: node name -> (n, k, dtype);
    rewritten_shapes: the shapes the rewriter saw (the unsharded graph's), where they may differ."""
    nodes = {}
    for node in plan["nodes"]:
        if node["domain"] == "fdpp" and node["op"] == "FlatGemm":
            shape = tuple(shapes[node["name"]])
            stamped = rewritten_shapes is None or tuple(rewritten_shapes.get(node["name"], ())) == shape
            nodes[prefix + node["name"]] = GemmNode(shape, node["attrs"].get("epilogue", "none"), dict(node["attrs"]),
                                                    stamped)
    return nodes


def attributes_choice(name: str, attrs: dict) -> GemmChoice:
    """The plan a node's attributes carry, checked against the FlatGemm contract (defaults filled in). Attributes
    the engine adds to a lowered node (a tensor-parallel shard's all_reduce) are not the contract's and not read."""
    contract = load_contract("FlatGemm")
    full = contract.validate_attributes({key: value for key, value in attrs.items() if key in contract.attributes},
                                        where=f"node {name}")
    return GemmChoice(**{key: full[key] for key in PLAN_ATTRIBUTES})


def _profile_choice(profile: Profile, node: GemmNode) -> GemmChoice | None:
    choice = profile.lookup(*node.shape)
    return None if choice is None else choice.for_epilogue(node.epilogue)


def _check_gpu(profile: Profile, device_name: str, why: str) -> None:
    if profile.gpu != device_name:
        raise FdppError(f"profile {profile.path} is for {profile.gpu}, this GPU is {device_name}; {why}")


def _shape_text(shape) -> str:
    return f"[{shape[0]}, {shape[1]}] {shape[2]}"


def resolve_cuda_plans(nodes: dict, device_name: str, profile=None, measure: Callable | None = None,
                       stream=sys.stdout) -> GemmPlans:
    """Plans for a cuda engine on the GPU named device_name (see the module docstring). nodes: name -> GemmNode.
    measure((n, k, dtype)) -> profile entry, called once per shape that no profile has (profiler(device) on a
    GPU); without one such a shape is an error."""
    out = GemmPlans()
    explicit = load_profile(profile) if profile is not None else None
    if explicit is not None:
        _check_gpu(explicit, device_name, "pass --profile for this GPU or omit it")
    committed = None
    chosen, missing = {}, set()
    for name, node in sorted(nodes.items()):
        if explicit is not None:
            choice, read = _profile_choice(explicit, node), explicit
        elif node.stamped and label_gpu(str(node.attrs.get("profile", ""))) == device_name:
            choice, read = attributes_choice(name, node.attrs), None
        else:
            if committed is None:
                path = committed_profile(device_name)
                committed = load_profile(path) if path.is_file() else False
                if committed:
                    _check_gpu(committed, device_name, "the committed profile is misnamed; re-run profile")
            choice, read = (_profile_choice(committed, node) if committed else None), committed
        if choice is None:
            missing.add(node.shape)
            continue
        chosen[name] = choice
        out.sources.add(display_path(read.path) if read else choice.profile)
        if read:
            out.profile_file = read.path
    if missing:
        if measure is None:
            raise FdppError(f"no profile covers {', '.join(_shape_text(s) for s in sorted(missing))} on "
                            f"{device_name}; profile them: python -m fdpp_rewrite profile <preset>")
        label = profile_label(MEASURED, device_name)
        measured = {}
        for index, shape in enumerate(sorted(missing), 1):
            started = time.perf_counter()
            entry = measure(shape)
            _, measured[shape] = entry_choice(entry, label, MEASURED, _shape_text(shape))
            out.measured.append({key: entry[key] for key in ("n", "k", "dtype", "m1", "m2", "implb", "implc", "m3",
                                                              "wgmma") if key in entry})
            print(f"profiled GEMM {index}/{len(missing)} [N={shape[0]}, K={shape[1]}] {shape[2]}: "
                  f"m1={entry['m1']} m2={entry['m2']} ({time.perf_counter() - started:.1f} s)", file=stream,
                  flush=True)
        for name, node in nodes.items():
            if node.shape in measured:
                chosen[name] = measured[node.shape].for_epilogue(node.epilogue)
        out.sources.add(label)
    out.plans = {name: chosen[name].plan() for name in nodes}
    return out


def resolve_cpu_plans(nodes: dict, profile=None) -> GemmPlans:
    """The plans a cpu engine records: the profile's with --profile (every shape must be in it: the cpu backend
    cannot profile), else the nodes' own."""
    out = GemmPlans()
    explicit = load_profile(profile) if profile is not None else None
    for name, node in sorted(nodes.items()):
        if explicit is None:
            choice = attributes_choice(name, node.attrs)
            out.sources.add(choice.profile)
        else:
            choice = _profile_choice(explicit, node)
            if choice is None:
                raise FdppError(f"profile {profile} has no entry for {_shape_text(node.shape)} (a profile for "
                                "another model?); run `python -m fdpp_rewrite profile <preset>` on the GPU")
            out.sources.add(display_path(explicit.path))
            out.profile_file = explicit.path
        out.plans[name] = choice.plan()
    return out


def profiler(device: dict) -> Callable:
    """measure() for resolve_cuda_plans on this GPU: the profiler's quick search, imported (and its timer made) at
    the first shape that needs it, not before. device: gpu.device.gpu_facts()."""
    timers = []

    def measure(shape):
        from fdpp_rewrite.gpu.gemm_timing import Timer
        from fdpp_rewrite.profile_measure import profile_shape

        if not timers:
            timers.append(Timer(reps=10))
        return profile_shape(*shape, timers[0], device, quick=True)

    return measure
