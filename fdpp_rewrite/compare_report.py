"""What a comparison found: one row per (step, output), the op contracts' tolerance it was judged by, and the
printed table. Shared by the CPU comparison (compare_onnx) and the engine's (engine/compare_engine.py)."""

from __future__ import annotations

import sys
from dataclasses import dataclass, field

from fdpp_rewrite.contracts import OP_NAMES, load_contract
from fdpp_rewrite.dtypes import numpy_dtype_name
from fdpp_rewrite.generate import ORT_DTYPES


@dataclass
class CompareRow:
    step: str
    output: str
    max_abs: float
    max_rel: float
    passed: bool


@dataclass
class CompareReport:
    rows: list = field(default_factory=list)
    atol: float = 0.0
    rtol: float = 0.0
    dtype: str = ""
    fallback_rows: int = 0
    attention_rows: int = 0
    gemm_impls: dict = field(default_factory=dict)
    note: str = ""  # one line on what the comparison did not check (printed above the verdict)

    @property
    def passed(self) -> bool:
        return bool(self.rows) and all(row.passed for row in self.rows)


def contract_tolerance(dtype: str) -> tuple[float, float]:
    """The loosest whole-model (atol, rtol) of the op contracts for `dtype`: a model mixes both ops."""
    pairs = [load_contract(op).tolerance(dtype, scope="model") for op in OP_NAMES]
    return max(a for a, _ in pairs), max(r for _, r in pairs)


def session_tolerance(session) -> tuple[str, float, float]:
    """(dtype name, atol, rtol) for the outputs of the onnxruntime session of the original graph."""
    dtype = numpy_dtype_name(ORT_DTYPES.get(session.get_outputs()[0].type), "float32")
    return (dtype, *contract_tolerance(dtype))


def accuracy_rows(runners: list, step_names: list, steps: list, atol: float, rtol: float) -> list[CompareRow]:
    """Run the polygraphy runners on the steps and judge every output elementwise against (atol, rtol)."""
    from polygraphy.comparator import Comparator, SimpleCompareFunc

    results = Comparator.run(runners, data_loader=steps)
    accuracy = Comparator.compare_accuracy(
        results, compare_func=SimpleCompareFunc(atol=atol, rtol=rtol, check_error_stat="elemwise"))
    return [CompareRow(step, name, result.max_absdiff, result.max_reldiff, bool(result))
            for per_iteration in accuracy[0].values()
            for step, outputs in zip(step_names, per_iteration)
            for name, result in outputs.items()]


def print_report(report: CompareReport, stream=None) -> None:
    stream = stream or sys.stdout
    width = max([len(row.output) for row in report.rows] + [6])
    step_width = max([len(row.step) for row in report.rows] + [8])
    print(f"{'step':{step_width}} {'output':{width}} {'max abs err':>12} {'max rel err':>12}  result", file=stream)
    for row in report.rows:
        print(f"{row.step:{step_width}} {row.output:{width}} {row.max_abs:12.3e} {row.max_rel:12.3e}  "
              f"{'PASS' if row.passed else 'FAIL'}", file=stream)
    failed = sum(not row.passed for row in report.rows)
    impls = ", ".join(f"{impl} x{count}" for impl, count in sorted(report.gemm_impls.items())) or "none"
    print(f"attention rows: {report.attention_rows}, exact fallback taken by {report.fallback_rows}; "
          f"FlatGemm calls by Impl: {impls}", file=stream)
    if report.note:
        print(f"note: {report.note}", file=stream)
    verdict = "PASS" if report.passed else f"FAIL ({failed} of {len(report.rows)} outputs)"
    print(f"{verdict}: tolerance {report.dtype} atol {report.atol:g} rtol {report.rtol:g} "
          "(elementwise |a - b| <= atol or <= rtol * |b|; model_tolerances of the op contracts)", file=stream)
