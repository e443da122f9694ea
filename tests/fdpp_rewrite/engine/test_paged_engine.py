"""The paged engine on the cpu backend (paged_engine.py, paged_step.py, paged_cache.py): its greedy tokens and
logits equal the contiguous engine's for generate, the slot API and steps of several chunks at once; blocks are
allocated as sequences grow and all come back on release; OutOfBlocks comes before anything runs; an attached
prefix changes no output; a paged build runs more sequences than a contiguous build's slots."""

import io
import json

import numpy as np
import pytest
import torch

from fdpp_rewrite.engine.bench import decode_kv_buckets, decode_step
from fdpp_rewrite.engine.build import build_engine
from fdpp_rewrite.engine.paged.blocks import KV_BLOCK_SIZE, OutOfBlocks
from fdpp_rewrite.engine.paged_step import PagedLayout, chunk_rows, decode_rows, join
from fdpp_rewrite.engine.runtime import Engine, Sampler
from fdpp_rewrite.errors import FdppError

PROMPT = [5, 17, 42, 8, 99, 3, 250, 11]
LONG = [(7 * i + 3) % 200 for i in range(70)]  # crosses the first block boundary
SHARED = [(11 * i + 5) % 250 for i in range(150)]  # two full blocks and 22 tokens


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    from fdpp_rewrite.export import export_model
    from fdpp_rewrite.rewrite import rewrite_file

    folder = tmp_path_factory.mktemp("paged")
    onnx_path = folder / "tiny-llama.onnx"
    export_model("tiny-llama", onnx_path, dtype="float32", max_cache=224, progress=False)
    rewritten = rewrite_file(onnx_path, stream=io.StringIO())
    build_engine(rewritten, folder / "slots", backend="cpu", max_batch=4, max_seq=224, stream=io.StringIO())
    build_engine(rewritten, folder / "paged", backend="cpu", max_seq=224, kv_memory="0.5", stream=io.StringIO())
    return rewritten, folder / "slots", folder / "paged"


@pytest.fixture(scope="module")
def contiguous(folders):
    return Engine(folders[1])


@pytest.fixture()
def paged(folders):
    return Engine(folders[1], kv_blocks=24)


def _greedy_logits(engine, prompts, steps):
    captured, sampler = [], Sampler()

    def record(logits):
        captured.append(logits.clone())
        return sampler(logits)

    return engine.generate(prompts, steps, sampler=record).tokens, torch.cat(captured)


def test_generate_equals_the_contiguous_engine(contiguous, paged):
    prompts = [PROMPT, LONG, PROMPT[:3]]
    ours_tokens, ours = _greedy_logits(paged, prompts, 12)
    theirs_tokens, theirs = _greedy_logits(contiguous, prompts, 12)
    assert ours_tokens == theirs_tokens
    np.testing.assert_allclose(ours.numpy(), theirs.numpy(), atol=1e-4, rtol=1e-4)
    assert paged.paged and not contiguous.paged
    assert any(key[1] > 0 for key in paged.paged_steps)  # the prompts ran as batched chunks: P > 0, B = 0
    program, feeds, graph = decode_step(paged, 3)  # what bench counts kernels of: the last decode bucket's step
    assert graph is None and program.run(feeds)["logits"].shape[:2] == (1, 4) and decode_kv_buckets(paged, 3) == [128]


def test_slot_api_equals_the_contiguous_engine(contiguous, paged):
    """prefill_chunk in pieces, decode_slots of some slots and a mixed step, on both engines: the same logits."""
    def walk(engine):
        engine.reset()
        out = [engine.prefill_chunk(0, LONG[:40]), engine.prefill_chunk(0, LONG[40:]), engine.prefill(2, PROMPT)]
        tokens = torch.tensor([3, 9])
        out.append(engine.decode_slots([2, 0], tokens))
        decoded, chunk = engine.mixed_step([0, 2], torch.tensor([4, 4]), 1, PROMPT[:5])
        out += [decoded, chunk, engine.decode_slots([1], torch.tensor([7]))]
        return out, list(engine.lengths[:3])

    ours, our_lengths = walk(paged)
    theirs, their_lengths = walk(contiguous)
    assert our_lengths == their_lengths == [len(LONG) + 2, 6, len(PROMPT) + 2]
    for a, b in zip(ours, theirs):
        np.testing.assert_allclose(a.numpy(), b.numpy(), atol=1e-4, rtol=1e-4)


def test_a_step_of_decode_rows_and_several_chunks(contiguous, paged):
    """One step: slots 0 and 1 decode, slots 2 and 3 take chunks of different lengths; the same logits as the
    contiguous engine running them one call at a time."""
    for engine in (paged, contiguous):
        engine.reset()
        engine.prefill(0, PROMPT)
        engine.prefill(1, LONG)
        engine.prefill_chunk(3, PROMPT[:2])
    decoded, chunks = paged.step([0, 1], torch.tensor([5, 6]), [(2, LONG[:50]), (3, PROMPT)])
    assert decoded.shape[0] == 2 and chunks.shape[0] == 2
    expected_decode = contiguous.decode_slots([0, 1], torch.tensor([5, 6]))
    expected_chunks = [contiguous.prefill_chunk(2, LONG[:50]), contiguous.prefill_chunk(3, PROMPT)]
    np.testing.assert_allclose(decoded.numpy(), expected_decode.numpy(), atol=1e-4, rtol=1e-4)
    np.testing.assert_allclose(chunks.numpy(), torch.stack(expected_chunks).numpy(), atol=1e-4, rtol=1e-4)
    assert paged.lengths[:4] == contiguous.lengths[:4] == [len(PROMPT) + 1, len(LONG) + 1, 50, 2 + len(PROMPT)]
    assert (2, 2, 64, 128) in paged.paged_steps  # (B, P, C, KV bucket): 50 tokens run as the 64 bucket


def test_blocks_follow_the_sequences(paged):
    kv = paged.kv
    total = kv.total_blocks
    assert total == 23 and kv.free_blocks == total and kv.used_blocks == 0
    paged.prefill(1, LONG)  # 70 tokens: two blocks
    assert kv.used_blocks == 2 and kv.table[1, :3].tolist()[2] == 0 and min(kv.table[1, :2]) > 0
    assert paged.blocks_needed([1], []) == 0
    for token in range(128 - len(LONG)):  # up to position 127: still two blocks
        paged.decode_slots([1], torch.tensor([token % 50]))
    assert kv.lengths[1] == 128 and kv.used_blocks == 2 and paged.blocks_needed([1], []) == 1
    paged.decode_slots([1], torch.tensor([1]))
    assert kv.used_blocks == 3 and kv.table[1, 2] > 0
    paged.release(1)
    assert kv.free_blocks == total and kv.table[1].tolist() == [0] * kv.width and kv.lengths[1] == 0
    kv.pool.check()


def test_out_of_blocks_before_anything_runs(folders):
    engine = Engine(folders[1], kv_blocks=3)  # two usable blocks
    engine.prefill(0, PROMPT)
    steps = dict(engine.paged_steps)
    with pytest.raises(OutOfBlocks) as info:
        engine.step([0], torch.tensor([1]), [(1, LONG)])  # one block for slot 0 is free, two more are not
    assert "\n" not in str(info.value)
    assert engine.blocks_needed([0], [(1, LONG)]) == 2
    assert engine.kv.lengths[:2] == [len(PROMPT), 0] and engine.kv.used_blocks == 1
    assert engine.paged_steps == steps  # nothing traced or run
    with pytest.raises(OutOfBlocks, match="need 3 KV blocks"):
        engine.generate([LONG, PROMPT], 4)  # refused before the prefill
    engine.kv.pool.check()


def test_an_attached_prefix_changes_no_output(folders):
    engine = Engine(folders[1], kv_blocks=24)
    plain = engine.prefill(0, SHARED)
    tokens = [int(plain.argmax())]
    for _ in range(5):
        tokens.append(int(engine.decode_slots([0], torch.tensor(tokens[-1:])).argmax()))
    cached = engine.kv.pool.cached_count
    assert cached == 2  # the prompt's two full blocks were published
    assert engine.attach_prefix(1, SHARED) == 2 * KV_BLOCK_SIZE
    assert engine.kv.table[1, :2].tolist() == engine.kv.table[0, :2].tolist()  # shared, not copied
    used = engine.kv.used_blocks
    logits = engine.prefill_chunk(1, SHARED[2 * KV_BLOCK_SIZE:])
    assert engine.kv.used_blocks == used + 1  # only the last 22 tokens took a block
    np.testing.assert_allclose(logits.numpy(), plain.numpy(), atol=1e-4, rtol=1e-4)
    again = [int(logits.argmax())]
    for _ in range(5):
        again.append(int(engine.decode_slots([1], torch.tensor(again[-1:])).argmax()))
    assert again == tokens
    engine.release(0)
    engine.release(1)
    assert engine.kv.free_blocks == engine.kv.total_blocks  # cached blocks stay cached but count as free
    off = Engine(folders[1], kv_blocks=24, prefix_caching=False)
    off.prefill(0, SHARED)
    assert off.attach_prefix(1, SHARED) == 0 and off.kv.prefix is None


def test_a_paged_build_runs_more_sequences_than_slots(folders, contiguous):
    rewritten, _, paged_folder = folders
    manifest = json.loads((paged_folder / "manifest.json").read_text())
    assert manifest["kv_cache"] == {"layout": "paged", "block_size": 64, "kv_memory": "0.5"}
    assert manifest["max_batch"] == 256
    engine = Engine(paged_folder)
    assert engine.paged and engine.kv.total_blocks > 6
    prompts = [PROMPT[: 2 + i] for i in range(6)]  # 6 sequences: more than the contiguous build's 4 slots
    together = engine.generate(prompts, 5).tokens
    assert together == contiguous.generate(prompts[:4], 5).tokens + contiguous.generate(prompts[4:], 5).tokens
    assert engine.kv.free_blocks == engine.kv.total_blocks - 6  # each sequence holds one block until reset


def test_build_and_load_refuse_what_cannot_be_paged(folders, tmp_path):
    from fdpp_rewrite.export import export_model
    from fdpp_rewrite.rewrite import rewrite_file

    with pytest.raises(FdppError, match="--kv-memory 2.5"):
        build_engine(folders[0], tmp_path / "e", backend="cpu", kv_memory="2.5", stream=io.StringIO())
    with pytest.raises(FdppError, match="kv_blocks must be at least 2"):
        Engine(folders[1], kv_blocks=1)
    onnx_path = tmp_path / "tiny-opt.onnx"  # learned absolute positions: computed from past_len in the graph
    export_model("tiny-opt", onnx_path, dtype="float32", max_cache=64, progress=False)
    rewritten = rewrite_file(onnx_path, stream=io.StringIO())
    with pytest.raises(FdppError, match="--kv-memory needs a graph that runs mixed steps .*computes positions") as info:
        build_engine(rewritten, tmp_path / "opt", backend="cpu", kv_memory="0.5", stream=io.StringIO())
    assert "\n" not in str(info.value)
    build_engine(rewritten, tmp_path / "opt", backend="cpu", max_seq=64, stream=io.StringIO())
    with pytest.raises(FdppError, match="a paged KV cache needs mixed steps"):
        Engine(tmp_path / "opt", kv_memory="0.5")
    assert not Engine(tmp_path / "opt").paged


def test_the_cli_refuses_kv_memory_for_other_backends(folders, capsys):
    from fdpp_rewrite.cli import main

    assert main(["build", str(folders[0]), "-o", "x", "--backend", "tensorrt", "--kv-memory", "0.9"]) == 2
    err = capsys.readouterr().err
    assert "drop --kv-memory or --backend tensorrt" in err and len(err.strip().splitlines()) == 1


def test_cli_run_and_bench_on_a_paged_engine(folders, contiguous, capsys, tmp_path):
    """run and bench on the paged build, and on the contiguous build with --kv-memory (paged at load)."""
    from fdpp_rewrite.cli import main

    expected = ",".join(map(str, contiguous.generate([PROMPT], 5).tokens[0]))
    for folder, extra in ((folders[2], []), (folders[1], ["--kv-memory", "0.25"])):
        assert main(["run", str(folder), "--token-ids", ",".join(map(str, PROMPT)), "--max-new-tokens", "5",
                     *extra]) == 0
        assert capsys.readouterr().out.strip() == expected
    out = tmp_path / "b.json"
    assert main(["bench", str(folders[2]), "--context", "16", "--new-tokens", "3", "--batch", "6", "--out",
                 str(out)]) == 0
    report = json.loads(out.read_text())
    assert report["kv_cache"]["layout"] == "paged"
    assert [(p["batch"], p["kv_buckets"]) for p in report["points"]] == [(6, [128])]
    assert main(["bench", str(folders[1]), "--context", "16", "--new-tokens", "3", "--kv-memory", "9"]) == 2
    assert "--kv-memory 9" in capsys.readouterr().err


def test_the_step_views_copy_nothing():
    """Decode rows [B, H, 1, D] and chunks [P, H, C, D] are views of the tokens-major query [1, T, H, D]."""
    batch, chunks, chunk, heads, dim = 3, 2, 4, 2, 8
    tokens = torch.arange(batch + chunks * chunk, dtype=torch.float32)
    query = tokens.reshape(1, -1, 1, 1).expand(1, -1, heads, dim).contiguous().transpose(1, 2)  # [1, H, T, D]
    dec, chk = decode_rows(query, batch), chunk_rows(query, batch, chunks, chunk)
    assert dec.shape == (batch, heads, 1, dim) and chk.shape == (chunks, heads, chunk, dim)
    assert dec.data_ptr() == query.data_ptr() and chk.stride(-1) == 1
    assert chk[1, 0, :, 0].tolist() == [7, 8, 9, 10]  # chunk 1 = tokens B + C .. B + 2C - 1
    assert torch.equal(join(dec, chk), query)


LAYOUT = PagedLayout(batch=2, chunks=2, chunk=3, kv_len=128, table=torch.tensor([[1, 0], [2, 0], [3, 4], [5, 0]]))


def test_a_rope_that_rotates_in_place_gets_each_part_its_table_rows():
    """As the cuda kernel: rotate the views in place (here: add past_len + the row's first block); the wrapped step
    returns the query itself, no join or copy."""
    seen = []

    def rotate_in_place(query, k_new, v_new, key_pool, value_pool, past_len, inv_freq, block_table):
        seen.append((tuple(query.shape), block_table.tolist()))
        query.add_((past_len + 10 * block_table[:, 0]).reshape(-1, 1, 1, 1).to(query.dtype))
        return query, key_pool, value_pool

    query, pool = torch.zeros(1, 2, 8, 4), torch.zeros(6, 2, 64, 4)
    out, _, _ = LAYOUT.wrap("RopeAppend", rotate_in_place)(query, query, query, pool, pool,
                                                           torch.tensor([5, 6, 0, 64]), None)
    assert out is query
    assert seen == [((2, 2, 1, 4), [[1, 0], [2, 0]]), ((2, 2, 3, 4), [[3, 4], [5, 0]])]
    assert query[0, 0, :, 0].tolist() == [15, 26, 30, 30, 30, 114, 114, 114]


def test_the_split_attention_writes_one_tokens_major_output():
    def attention(query, key_pool, value_pool, past_len, out=None, block_table=None, max_kv_len=None):
        assert max_kv_len == 128 and block_table.shape[0] == query.shape[0]
        return out.copy_(query * 2 + past_len.reshape(-1, 1, 1, 1))

    query = torch.arange(2 * 8 * 4, dtype=torch.float32).reshape(1, 2, 8, 4)
    pool = torch.zeros(6, 2, 64, 4)
    out = LAYOUT.wrap("AsyncSoftmaxAttention", attention)(query, pool, pool, torch.tensor([5, 6, 0, 64]))
    expected = query * 2 + torch.tensor([5, 6, 0, 0, 0, 64, 64, 64.0]).reshape(1, 1, 8, 1)
    assert torch.equal(out, expected)
    assert out.transpose(1, 2).is_contiguous()  # the graph's Transpose back to tokens-major costs no copy


def test_a_long_prompt_runs_as_steps_within_the_budget(folders, contiguous, monkeypatch):
    """prefill and prefill_chunk split ids into steps of at most MAX_GRAPH_PREFILL tokens (the largest step the
    pool was sized around): the same logits as the contiguous engine's one pass."""
    from fdpp_rewrite.engine import paged_engine

    monkeypatch.setattr(paged_engine, "MAX_GRAPH_PREFILL", 32)
    engine = Engine(folders[1], kv_blocks=24)
    ours = [engine.prefill(0, LONG), engine.prefill_chunk(0, PROMPT * 5)]
    assert {key[2] for key in engine.paged_steps} == {32, 16}  # chunks of 32 tokens (and the last 6 as 16)
    contiguous.reset()
    theirs = [contiguous.prefill(0, LONG), contiguous.prefill_chunk(0, PROMPT * 5)]
    for a, b in zip(ours, theirs):
        np.testing.assert_allclose(a.numpy(), b.numpy(), atol=1e-4, rtol=1e-4)
    assert engine.lengths[0] == len(LONG) + 5 * len(PROMPT)
    with pytest.raises(FdppError, match="non-empty"):
        engine.prefill_chunk(1, [])


def test_a_step_past_the_largest_prefill_is_refused_before_anything_runs(folders, capsys):
    engine = Engine(folders[1], kv_blocks=24)
    assert "KV pool: 24 blocks of 64 tokens" in capsys.readouterr().err  # the pool's one line at load
    assert engine.max_prefill_tokens >= 2048
    engine.max_prefill_tokens = 32
    with pytest.raises(FdppError, match="at most 32 padded prompt tokens, not 2 chunks run as 2 of 32") as info:
        engine.step([], None, [(0, LONG[:20]), (1, LONG[:30])])
    assert "\n" not in str(info.value) and engine.kv.used_blocks == 0 and not engine.paged_steps
    engine.step([], None, [(0, LONG[:20])])  # one chunk of 32 fits


def test_bench_runs_the_torch_peer_of_a_paged_engine_on_a_contiguous_build(folders, capsys, tmp_path):
    from fdpp_rewrite.cli import main
    from fdpp_rewrite.engine.bench import configurations

    args = ["bench", str(folders[2]), "--context", "16", "--new-tokens", "3", "--batch", "2", "--kernels", "fdpp",
            "torch"]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert "would gather every KV page" in err and "--torch-engine" in err and len(err.strip().splitlines()) == 1
    assert main(args + ["--torch-engine", str(folders[2])]) == 2
    assert "is a paged build" in capsys.readouterr().err
    out = tmp_path / "b.json"
    assert main(args + ["--torch-engine", str(folders[1]), "--out", str(out)]) == 0
    report = json.loads(out.read_text())
    assert [p["kernels"] for p in report["points"]] == ["fdpp", "torch"]
    assert report["torch_engine"] == str(folders[1]) and report["kv_cache"]["layout"] == "paged"
    assert "fdpp kernels" in capsys.readouterr().out
    names = [label for label, _ in configurations(["fdpp"], True, paged=True)]
    assert "-sdpa-attention" not in names and "torch" not in names and "-cublaslt-gemm" in names
    assert [label for label, _ in configurations(["fdpp"], True)][-2:] == ["-sdpa-attention", "torch"]


def test_a_steps_inputs_upload_in_one_copy():
    """StepBuffers: ids, past_len, table rows and logits rows are views of one buffer, filled from one staging
    buffer of the same layout."""
    from fdpp_rewrite.engine.paged_step import StepBuffers

    buffers = StepBuffers(batch=2, chunks=1, chunk=3, width=5, device=torch.device("cpu"))
    assert buffers.ids.shape == (1, 5) and buffers.table.shape == (3, 5) and buffers.table.dtype == torch.int32
    assert buffers.rows.tolist() == [0, 1, 2]
    bases = {t.untyped_storage().data_ptr() for t in (buffers.ids, buffers.past, buffers.rows, buffers.table)}
    assert bases == {buffers.packed.untyped_storage().data_ptr()}
    host, fields = buffers.staging()
    fields["ids"][0] = [1, 2, 3, 4, 5]
    fields["past"][:] = [7, 8, 9]
    fields["rows"][:] = [0, 1, 4]
    fields["table"][2, :2] = [6, 11]
    buffers.upload(host)
    assert buffers.ids.tolist() == [[1, 2, 3, 4, 5]] and buffers.past.tolist() == [7, 8, 9]
    assert buffers.rows.tolist() == [0, 1, 4] and buffers.table[2].tolist() == [6, 11, 0, 0, 0]
    assert buffers.table[:2].sum() == 0
