"""`python -m fdpp_rewrite compare model.onnx model.fdpp.onnx`: run the original graph in onnxruntime and the
rewritten one with the CPU reference of the fdpp ops, on the same realistic inputs, through polygraphy's
Comparator; print each output's max absolute / relative error and PASS/FAIL against the op contracts'
tolerances; exit 1 on any mismatch.

Inputs (our exporter's interface): a prefill from empty caches (past_len 0), then a decode step and a chunked
step on the caches that prefill wrote, with a different past_len per sequence, and random values in every
cache slot past the written ones (they must stay invisible). Token ids are drawn from the vocabulary.
Hugging Face decode-with-cache graphs (past_key_values.N.key/value [batch, kv_heads, past, head_dim] in,
present.N.key/value out): the roles come from the declared names and shapes (attention_mask covers past + new
tokens, position_ids and cache_position the new ones); a prefill from empty caches, several decode steps on the
presents it returned, then the same on a left-padded batch. Hugging Face prefill graphs: one step and a left-padded
one. Outputs at padded positions are not compared (what a model computes for a pad token is a convention: the
original averages over nothing, the fdpp op gives 0). Other graphs: input_ids in the vocabulary, random floats
elsewhere.

The command only dispatches: compare_onnx.compare_models for a rewritten graph, engine/compare_engine.py for an
engine folder; the steps come from compare_inputs, the graph checks from compare_graphs, the table from
compare_report.
"""

from __future__ import annotations

from fdpp_rewrite.compare_onnx import compare_models
from fdpp_rewrite.compare_report import print_report
from fdpp_rewrite.engine.compare_engine import compare_engine, is_engine_folder
from fdpp_rewrite.progress import Progress


def add_arguments(parser) -> None:
    parser.add_argument("original", help="the exported model (standard ops)")
    parser.add_argument("rewritten", help="its rewrite (fdpp ops), e.g. model.fdpp.onnx, or an engine folder built "
                        "from it (`build`): then the engine's kernels are compared")
    parser.add_argument("--batch", type=int, default=2, help="sequences per step (default 2; at least 2)")
    parser.add_argument("--prefill", type=int, default=6, help="prompt length of the first step (default 6)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the random inputs")


def run(args) -> int:
    if is_engine_folder(args.rewritten):  # an engine folder from `build`: its kernels against the original graph
        report = compare_engine(args.original, args.rewritten, batch=args.batch, prefill=args.prefill,
                                seed=args.seed, progress=Progress())
    else:
        report = compare_models(args.original, args.rewritten, batch=args.batch, prefill=args.prefill,
                                seed=args.seed, progress=Progress())
    print_report(report)
    return 0 if report.passed else 1
