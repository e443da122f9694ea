"""`python -m fdpp_rewrite rewrite model.onnx [-o model.fdpp.onnx] [--profile P] [--calibration C] [--force]`

Swaps every attention chain for fdpp::AsyncSoftmaxAttention, each layer's RoPE and cache writes for fdpp::RopeAppend,
every RMSNorm for fdpp::RMSNorm and every weight matmul for fdpp::FlatGemm:
sanitize -> attention -> rope_append -> norm -> projection fusion -> flat gemm -> sanitize -> report per pattern what
was and was not replaced -> write (external data beside the model when the input had it or the model is big) with the
profile and the calibration used stamped into the model's metadata.

The passes are independent and never abort on one match: a chain a pass cannot prove, or one the kernels cannot serve
(a head size, dtype or soft cap their contract lacks), is left as is while everything else is rewritten; each pass
prints one warning line per reason, and the summary names per pattern how many were left and why.
`--require attention,gemm` makes a pattern that is not fully replaced an error instead.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from fdpp_rewrite import __version__
from fdpp_rewrite.atomic import AtomicOutputs, rename_external_data
from fdpp_rewrite.calibration.settings import load_calibration
from fdpp_rewrite.cli_args import add_force, add_gemm_profile
from fdpp_rewrite.contracts import ALL_OP_NAMES, DOMAIN, load_contract, register_onnx_schemas, validate_node
from fdpp_rewrite.errors import FdppError
from fdpp_rewrite.onnx_files import load_structure
from fdpp_rewrite.progress import QUIET, Progress

if TYPE_CHECKING:  # onnx, onnx-graphsurgeon and the passes are imported when a rewrite runs, not for --help
    import onnx

    from fdpp_rewrite.passes.weights import WeightStore

EXTERNAL_DATA_THRESHOLD = 1 << 30  # weights above 1 GiB go to a .data file even if the input had none
REQUIRABLE = ("attention", "gemm")  # the patterns --require can insist on


def parse_require(text: str | None) -> tuple[str, ...]:
    """'attention,gemm' -> ("attention", "gemm"); a one-line FdppError for a name that is not a pattern."""
    names = tuple(name.strip() for name in (text or "").split(",") if name.strip())
    unknown = [name for name in names if name not in REQUIRABLE]
    if unknown:
        raise FdppError(f"--require {','.join(unknown)}: not a pattern; pass a comma-separated list of "
                        f"{', '.join(REQUIRABLE)}")
    return names


def add_arguments(parser) -> None:
    parser.add_argument("model", help="the exported model (model.onnx, standard ops)")
    parser.add_argument("-o", "--output", help="where to write (default: <name>.fdpp.onnx beside the input)")
    add_gemm_profile(parser)
    parser.add_argument("--calibration", help="per-layer phi and guards from `fdpp_rewrite calibrate` "
                                              "(default: phi=0, guard [-60, 10])")
    parser.add_argument("--require", metavar="PATTERNS",
                        help=f"comma-separated patterns ({', '.join(REQUIRABLE)}) that must be replaced everywhere; "
                             "one left behind is an error (default: a partial rewrite with a warning)")
    add_force(parser, "the output")


@dataclass
class RewriteResult:
    model: onnx.ModelProto
    reports: list = field(default_factory=list)
    profile: str = ""
    calibration: str = ""

    def counts(self) -> dict:
        return {report.name: report.total for report in self.reports}


def rewrite_model(model: onnx.ModelProto, profile=None, calibration=None, stream=None, default_profile=None,
                  store: WeightStore | None = None, weights_dir: str | None = None,
                  progress: Progress = QUIET, require=()) -> RewriteResult:
    """Rewrite a model whose weights are loaded, or whose external data lives in `weights_dir` (read a tensor at
    a time). New weights go through `store` (in memory by default). Prints each pass's report and the per-pattern
    summary to `stream` and a line per stage to `progress`. A pattern in `require` ("attention", "gemm") that is
    left anywhere, or not found at all, is an FdppError."""
    import onnx_graphsurgeon as gs

    from fdpp_rewrite.passes import attention, common, flat_gemm, norm, projection_fusion, rope_append
    from fdpp_rewrite.passes.weights import WeightStore, attach_external_data
    from fdpp_rewrite.quiet import quiet_graphsurgeon

    stream = stream or sys.stdout
    quiet_graphsurgeon()
    register_onnx_schemas()
    if any(node.domain == DOMAIN for node in model.graph.node):
        raise FdppError("this model already has fdpp nodes (it is a rewrite); pass the exported model instead")
    settings = load_calibration(calibration) if calibration else None
    store = store or WeightStore()
    with progress.stage("import graph"):
        graph = gs.import_onnx(model)
        if weights_dir is not None:
            attach_external_data(graph, weights_dir)
        common.numpy_bfloat16(graph)
    with progress.stage("sanitize"):
        common.sanitize(graph)
    with progress.stage("attention"):
        reports = [attention.run(graph, settings)]
    with progress.stage("rope append"):
        reports.append(rope_append.run(graph))
    with progress.stage("norm"):
        reports.append(norm.run(graph))
    with progress.stage("projection fusion"):
        reports.append(projection_fusion.run(graph))
    gemm_args = {} if default_profile is None else {"default_profile": default_profile}
    with progress.stage("flat gemm"):
        reports.append(flat_gemm.run(graph, profile, store=store, **gemm_args))
    with progress.stage("sanitize"):
        common.sanitize(graph)
    for report in reports:
        report.print(stream)

    summary = PatternSummary.of(graph, reports[0], reports[-1])
    for line in summary.lines():
        print(line, file=stream)
    summary.check(require)

    with progress.stage("export graph"):
        rewritten = gs.export_onnx(graph, do_type_check=False)
        _set_opsets(rewritten, model)
        for node in rewritten.graph.node:
            if node.domain == DOMAIN:
                validate_node(node)
    profile_label = str(profile) if profile else _gemm_source(reports[-1])
    calibration_label = str(calibration) if calibration else (
        f"default phi={attention.DEFAULT_PHI} guard [{attention.DEFAULT_GUARD_LO}, {attention.DEFAULT_GUARD_HI}]")
    _stamp(rewritten, model, profile_label, calibration_label, reports)
    return RewriteResult(rewritten, reports, profile_label, calibration_label)


UNEXPLAINED = "not matched by the pass"  # a node the summary finds but the pass's report does not name


@dataclass
class PatternSummary:
    """Per pattern: how many instances were replaced, and for each one left in the graph its name and why."""

    replaced: dict
    left: dict  # pattern -> [(node name, reason)]

    @classmethod
    def of(cls, graph, attention_report, gemm_report) -> PatternSummary:
        """What is left is read from the graph (the passes' reports may not know everything that looks like the
        pattern); why, from the report of the pass that left it."""
        from fdpp_rewrite.passes import attention, flat_gemm

        left = {}
        for name, report, names in (("attention", attention_report, attention.remaining_attention(graph)),
                                    ("gemm", gemm_report, flat_gemm.remaining_weight_matmuls(graph))):
            reasons = report.reasons()
            left[name] = [(node, reasons.get(node, UNEXPLAINED)) for node in names]
        return cls({"attention": attention_report.total, "gemm": gemm_report.total}, left)

    def why(self, name: str) -> str:
        """The reasons the `name` nodes were left, e.g. 'head_dim 32: the kernels are built for 64, 128' or
        '2 x head_dim 32: ...; 1 x logit soft-capping: ...' when they differ."""
        counts = {}
        for _, reason in self.left[name]:
            counts[reason] = counts.get(reason, 0) + 1
        if len(counts) == 1:
            return next(iter(counts))
        return "; ".join(f"{count} x {reason}" for reason, count in counts.items())

    def lines(self) -> list[str]:
        out = []
        for name in REQUIRABLE:
            left = self.left[name]
            line = f"{name}: {self.replaced[name]} replaced, {len(left)} left"
            if left:
                line = f"warning: {line} ({self.why(name)})"
            elif not self.replaced[name]:
                line = f"warning: {name}: none found"
            out.append(line)
        return out

    def check(self, require) -> None:
        from fdpp_rewrite.passes import attention, flat_gemm

        supported = {"attention": f"attention chains {attention.SUPPORTED}", "gemm": flat_gemm.SUPPORTED}
        for name in require:
            left = self.left[name]
            if left or not self.replaced[name]:
                shown = ", ".join(node for node, _ in left[:3]) + (" ..." if len(left) > 3 else "")
                why = f" ({self.why(name)}: {shown})" if left else ""
                raise FdppError(f"--require {name}: {self.replaced[name]} replaced, {len(left)} left{why}; the "
                                f"rewriter replaces {supported[name]}")
        if not any(self.replaced.values()):
            if any(self.left.values()):
                why = "; ".join(f"{name}: {self.why(name)}" for name in REQUIRABLE if self.left[name])
                raise FdppError(f"nothing rewritten: every attention chain and weight matmul was left as is ({why})")
            raise FdppError(f"nothing to rewrite: no attention chain and no weight matmul found; the rewriter "
                            f"replaces {supported['attention']} and {supported['gemm']}")


def _gemm_source(report) -> str:
    note = next((n for n in report.notes if n.startswith("thresholds from ")), "")
    return note[len("thresholds from "):]


def _set_opsets(rewritten: onnx.ModelProto, original: onnx.ModelProto) -> None:
    import onnx

    imports = {op.domain: op.version for op in original.opset_import}
    imports[DOMAIN] = max(load_contract(op).version for op in ALL_OP_NAMES)
    del rewritten.opset_import[:]
    rewritten.opset_import.extend(onnx.helper.make_opsetid(domain, version) for domain, version in imports.items())
    rewritten.ir_version = max(original.ir_version, 8)


def _stamp(rewritten, original, profile_label, calibration_label, reports) -> None:
    rewritten.producer_name = "fdpp_rewrite"
    rewritten.producer_version = __version__
    props = {p.key: p.value for p in original.metadata_props}
    props.update({
        "fdpp.rewrite.source_producer": f"{original.producer_name} {original.producer_version}".strip(),
        "fdpp.rewrite.profile": profile_label,
        "fdpp.rewrite.calibration": calibration_label,
        "fdpp.rewrite.replaced": json.dumps({r.name: dict(r.replaced) for r in reports}, sort_keys=True),
    })
    del rewritten.metadata_props[:]
    for key, value in props.items():
        entry = rewritten.metadata_props.add()
        entry.key, entry.value = key, value


def default_output(path: Path) -> Path:
    name = path.name[:-len(".onnx")] if path.name.endswith(".onnx") else path.name
    return path.with_name(f"{name}.fdpp.onnx")


def _uses_external_data(model: onnx.ModelProto) -> bool:
    import onnx

    return any(init.data_location == onnx.TensorProto.EXTERNAL for init in model.graph.initializer)


def _tensor_bytes(tensor: onnx.TensorProto) -> int:
    for entry in tensor.external_data:
        if entry.key == "length":
            return int(entry.value)
    return len(tensor.raw_data) or tensor.ByteSize()


def rewrite_file(model_path, output=None, profile=None, calibration=None, force=False, stream=None,
                 progress: Progress = QUIET, require=()) -> Path:
    """The command as a function: read, rewrite, write; returns the output path.

    Writes external data (<output>.data, tensors 4096-byte aligned) when the input has external data or more
    than 1 GiB of weights; the passes then stream the weights they make straight into that file. Both files are
    written under temporary names and renamed when complete (fdpp_rewrite.atomic): a failed or interrupted
    rewrite leaves neither, and an old output replaced with --force stays whole until the new one is done."""
    import onnx

    from fdpp_rewrite.passes.weights import WeightStore
    from fdpp_rewrite.profiles import load_profile

    stream = stream or sys.stdout
    model_path = Path(model_path)
    output = Path(output) if output else default_output(model_path)
    data = output.with_name(output.name + ".data")
    if output.resolve() == model_path.resolve():
        raise FdppError(f"the output {output} is the input; pass -o with another path")
    outputs = AtomicOutputs([data, output], force=force)
    outputs.check()
    # the structure only: quick, and every check below needs no stage line (load_structure refuses a missing or
    # truncated .data file)
    model = load_structure(model_path)
    if calibration:
        load_calibration(calibration)
    if profile:
        load_profile(profile)
    weight_bytes = sum(_tensor_bytes(init) for init in model.graph.initializer)
    external = _uses_external_data(model) or weight_bytes > EXTERNAL_DATA_THRESHOLD
    with outputs:
        data_temp = outputs.temp(data) if external else None
        store = WeightStore(data_temp)
        try:
            result = rewrite_model(model, profile=profile, calibration=calibration, stream=stream, store=store,
                                   weights_dir=str(model_path.parent), progress=progress, require=require)
            with progress.stage("write model"):
                if external:
                    store.adopt(result.model, str(model_path.parent))
                    rename_external_data(result.model, data_temp.name, data.name)
                store.close()
                onnx.save_model(result.model, str(outputs.temp(output)))
        finally:
            store.close()
    where = f" + {data.name}" if external else ""
    print(f"wrote {output}{where} (profile: {result.profile}; calibration: {result.calibration})", file=stream)
    return output


def run(args) -> int:
    require = parse_require(args.require)
    rewrite_file(args.model, args.output, args.profile, args.calibration, args.force, progress=Progress(),
                 require=require)
    return 0
