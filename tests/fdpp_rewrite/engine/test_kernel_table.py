"""scripts/kernel_table.py's host logic on the CPU: finding the repeated layer in a step's nodes, the bytes each node
moves, kernels matched to nodes with their gaps, the per-layer medians and the markdown."""

import pytest
from script_module import load_script

from fdpp_rewrite.errors import FdppError

torch = pytest.importorskip("torch")

LLAMA_LAYER = ["RMSNorm", "FlatGemm", "Reshape", "RopeAppend", "AsyncSoftmaxAttention", "FlatGemm", "RMSNorm",
               "FlatGemm", "FlatGemm"]


kt = load_script("kernel_table")


@pytest.mark.parametrize("layers", [2, 3, 32])
def test_layer_span_finds_the_layer_between_the_head_and_the_tail(layers):
    ops = ["Gather", "Add"] + LLAMA_LAYER * layers + ["RMSNorm", "FlatGemm"]
    assert kt.layer_span(ops, layers) == (2, len(LLAMA_LAYER))


def test_layer_span_of_the_docstring_example_and_a_list_that_does_not_repeat():
    assert kt.layer_span(["Gather", "N", "FlatGemm", "FlatGemm", "N", "FlatGemm", "FlatGemm", "N", "FlatGemm"], 2) \
        == (1, 3)
    with pytest.raises(FdppError, match="do not repeat one layer 4 times"):
        kt.layer_span(["Gather"] + LLAMA_LAYER * 3, 4)


def test_node_bytes_counts_what_each_node_reads_and_writes_once():
    f16 = torch.float16
    # attention: batch 2 (lengths 100 and 50) over a 256-row cache bucket of 4 KV heads of 64; 8 query heads
    query, out = torch.empty(2, 8, 1, 64, dtype=f16), torch.empty(2, 8, 1, 64, dtype=f16)
    cache = torch.empty(2, 4, 256, 64, dtype=f16)
    past = torch.tensor([99, 49])
    kv_row = 4 * 64 * 2
    assert kt.node_bytes("AsyncSoftmaxAttention", [query, cache, cache, past], [out], [100, 50, 7]) == \
        query.nbytes + out.nbytes + 2 * kv_row * 150  # rows past the query's batch are not read
    # RopeAppend: q rotated in place, the new K/V rows read and written into the caches, the small inputs once
    k_new = torch.empty(2, 4, 1, 64, dtype=f16)
    inv_freq = torch.empty(32)
    rope_in = [query, k_new, k_new, cache, cache, past, inv_freq]
    assert kt.node_bytes("RopeAppend", rope_in, [query, cache, cache], None) == \
        2 * query.nbytes + 4 * k_new.nbytes + past.nbytes + inv_freq.nbytes
    # Gather: the ids and one table row per id, read and written
    table, ids, rows = torch.empty(1000, 64, dtype=f16), torch.zeros(2, 1, dtype=torch.int64), torch.empty(2, 1, 64)
    assert kt.node_bytes("Gather", [table, ids], [rows], None) == ids.nbytes + 2 * rows.nbytes
    # a GEMM (or anything else): every tensor once, absent inputs none
    x, w, y = torch.empty(2, 1, 64, dtype=f16), torch.empty(96, 64, dtype=f16), torch.empty(2, 1, 96, dtype=f16)
    assert kt.node_bytes("FlatGemm", [x, w, None, y], [y], None) == x.nbytes + w.nbytes + 2 * y.nbytes
    assert kt.node_bytes("ScatterND", [cache, ids, k_new], [cache], None) == ids.nbytes + 2 * k_new.nbytes


def _kernel(name, start, end):
    return {"kernel": name, "start": start, "end": end, "us": end - start}


def test_step_rows_match_kernels_to_nodes_with_gaps_and_refuse_a_different_program():
    steps = [{"op": "Gather", "kernels": 1, "bytes": 400}, {"op": "Reshape", "kernels": 0, "bytes": 0},
             {"op": "AsyncSoftmaxAttention", "kernels": 2, "bytes": 6000},
             {"op": "FlatGemm", "kernels": 1, "bytes": 10_000_000}]
    kernels = [_kernel("gather", 0.0, 2.0), _kernel("split", 3.0, 5.0), _kernel("combine", 5.5, 6.0),
               _kernel("gemm", 5.8, 10.8)]
    rows = kt.step_rows(steps, kernels)
    assert [r["step"] for r in rows] == [0, 2, 3]
    assert rows[1]["kernel"] == "split + combine" and rows[1]["us"] == pytest.approx(2.5)
    assert [r["gap_us"] for r in rows] == pytest.approx([0.0, 1.0, -0.2])  # the GEMM overlapped the combine
    assert rows[2]["tb_s"] == pytest.approx(10_000_000 / 5.0 / 1e6)  # 2 TB/s
    with pytest.raises(FdppError, match="launched 4 kernels and the graph replay 3"):
        kt.step_rows(steps, kernels[:3])


def test_layer_rows_take_medians_over_the_layers_and_the_layer_wall_includes_its_first_gap():
    def row(step, us, gap, start):
        return {"step": step, "op": "FlatGemm", "kernel": "k", "bytes": 1000, "us": us, "gap_us": gap,
                "start": start, "end": start + us, "tb_s": None}

    # three layers of two nodes starting at step 1; the middle layer's second kernel is slow
    rows = [row(0, 1.0, 0.0, 0.0),
            row(1, 2.0, 1.0, 2.0), row(2, 3.0, 0.5, 4.5),
            row(3, 2.0, 1.0, 8.5), row(4, 9.0, 0.5, 11.0),
            row(5, 2.0, 1.0, 21.0), row(6, 3.0, 0.5, 23.5)]
    mine, summary = kt.layer_rows(rows, head=1, period=2, layers=3, layer=1)
    assert [r["us"] for r in mine] == [2.0, 3.0]  # medians over the layers, not layer 1's own 9.0
    assert summary["kernels"] == 2 and summary["bytes"] == 2000 and summary["us_sum"] == 5.0
    assert summary["wall_us"] == pytest.approx(6.5)  # median of 6.5, 12.5, 6.5 (gap before + first start to last end)
    assert summary["tb_s"] == pytest.approx(2000 / 6.5 / 1e6)


def test_markdown_lists_the_layer_and_the_head_and_tail():
    row = {"step": 3, "op": "RMSNorm", "kernel": "rms_norm_kernel<__half>", "bytes": 24576, "us": 2.5,
           "tb_s": 0.0098, "gap_us": -0.4}
    point = {"batch": 16, "kv_len_mean": 136.0, "step_us": 4100.0, "kernels_per_step": 259, "kernel_us_sum": 4300.0,
             "step_bytes": 13.3e9, "step_tb_s": 3.24, "layer": 16, "layers": 32,
             "layer_summary": {"kernels": 8, "bytes": 404e6, "wall_us": 110.0, "tb_s": 3.67, "us_sum": 115.0},
             "layer_rows": [row], "head_rows": [dict(row, step=0, op="Gather", tb_s=None)], "tail_rows": []}
    text = kt.markdown({"model": "llama2-7b", "dtype": "float16", "gpu": "NVIDIA H200", "command": "kernel_table.py e",
                        "points": [point]})
    assert "## batch 16, 136 keys per sequence" in text
    assert "| 3 | RMSNorm | `rms_norm_kernel<__half>` | 24,576 | 2.50 | 0.01 | -0.40 |" in text
    assert "| 0 | Gather | `rms_norm_kernel<__half>` | 24,576 | 2.50 | - | -0.40 |" in text
    assert "8 kernels, 404.00 MB, 110.00 us" in text


def test_op_name_drops_the_domain_of_a_program_step():
    assert [kt.op_name(k) for k in ("fdpp::FlatGemm", "fdpp.engine::CacheAppend", "Gather")] == \
        ["FlatGemm", "CacheAppend", "Gather"]


def test_short_name_drops_arguments_and_anonymous_namespaces():
    name = "void fdpp::gemm::(anonymous namespace)::flat_gemm_pair_kernel<__half, 1>(fdpp::gemm::PairParams)"
    assert kt.short_name(name) == "void fdpp::gemm::flat_gemm_pair_kernel<__half, 1>"
