"""The scheduler on the cuda backend (fp16, CUDA graphs): requests joining and leaving mid-way get the greedy
tokens they get alone, decode steps replay captured graphs, and the softmax fallback counter is read from the
plugin library between steps. The model: smollm2-135m's shapes, 2 layers, random weights (as test_engine_gpu)."""

import io

import pytest

pytestmark = pytest.mark.gpu

PROMPTS = [[(11 * i + k) % 4000 + 5 for i in range(n)] for k, n in ((1, 3), (2, 70), (3, 200), (4, 9), (5, 33))]
MAX_TOKENS = [20, 6, 15, 4, 12]


@pytest.fixture(scope="module")
def cuda_engine(tmp_path_factory):
    from fdpp_rewrite.engine.build import build_engine
    from fdpp_rewrite.engine.runtime import Engine
    from fdpp_rewrite.export import export_model
    from fdpp_rewrite.rewrite import rewrite_file

    folder = tmp_path_factory.mktemp("serve_gpu_engine")
    onnx_path = folder / "model.onnx"
    export_model("smollm2-135m", onnx_path, dtype="float16", max_cache=384, num_layers=2, random_init=True,
                 progress=False)
    rewritten = rewrite_file(onnx_path, stream=io.StringIO())
    build_engine(rewritten, folder / "engine", backend="cuda", max_batch=4, max_seq=384, stream=io.StringIO())
    return Engine(folder / "engine")


def test_continuous_batching_on_the_gpu(cuda_engine):
    from fdpp_rewrite.engine.runtime import Sampler
    from fdpp_rewrite.serve.requests import Finish, Request
    from fdpp_rewrite.serve.scheduler import Scheduler

    alone = [cuda_engine.generate([p], n).tokens[0] for p, n in zip(PROMPTS, MAX_TOKENS)]
    scheduler = Scheduler(cuda_engine, None, max_queue=8, prefill_chunk=64)
    requests = [(Request(prompt=p, max_tokens=n, sampler=Sampler(), emit=events.append), events)
                for p, n, events in zip(PROMPTS, MAX_TOKENS, [[] for _ in PROMPTS])]
    arrivals = {0: [0, 1], 3: [2, 3, 4]}
    for iteration in range(300):
        for index in arrivals.get(iteration, []):
            scheduler.submit(requests[index][0])
        if iteration == 299 or (iteration > 3 and not scheduler.waiting and all(r is None for r in scheduler.slots)):
            break
        scheduler.counters_read_at = 0.0  # read the library counter after every iteration here
        scheduler.run_once()
    for index, (request, events) in enumerate(requests):
        assert request.tokens == alone[index], f"request {index}"
        assert isinstance(events[-1], Finish)
    assert cuda_engine.graphs  # the decode steps replayed captured CUDA graphs
    _, fallback_rows, labels = scheduler.gauges()["softmax_fallback_rows_total"]
    assert labels == {"path": "kernel"} and isinstance(fallback_rows, int) and fallback_rows >= 0
    assert cuda_engine.lengths == [0] * cuda_engine.max_batch


def test_warm_up_captures_every_decode_bucket_on_the_gpu(cuda_engine):
    """After the decode warm-up every (batch, KV) bucket has its CUDA graph, the slots are free, and a request
    then replays graphs only (no new capture) and gets its tokens alone."""
    from fdpp_rewrite.engine.runtime import Engine, Sampler
    from fdpp_rewrite.serve.requests import Request
    from fdpp_rewrite.serve.scheduler import Scheduler

    engine = Engine(cuda_engine.folder)  # a fresh engine: nothing traced or captured yet
    scheduler = Scheduler(engine, None, prefill_chunk=64, warmup="decode")
    scheduler.warm_up(io.StringIO())
    buckets = {(b, kv) for b in engine.batch_buckets for kv in engine.kv_buckets}
    assert set(engine.graphs) == buckets and scheduler.last_error is None
    assert engine.lengths == [0] * engine.max_batch and engine.past_len.tolist() == [0] * engine.max_batch
    request = Request(prompt=PROMPTS[2], max_tokens=MAX_TOKENS[2], sampler=Sampler(), emit=lambda event: None)
    scheduler.submit(request)
    for _ in range(100):
        if all(r is None for r in scheduler.slots) and not scheduler.waiting:
            break
        scheduler.run_once()
    assert request.tokens == cuda_engine.generate([PROMPTS[2]], MAX_TOKENS[2]).tokens[0]
    assert set(engine.graphs) == buckets


def test_all_warm_up_captures_the_prompt_graphs_of_every_slot(cuda_engine):
    """With --warmup all, each slot's prompt-pass graphs are captured before the server is healthy: requests in
    any slot then capture nothing new and get their tokens alone."""
    from fdpp_rewrite.engine.runtime import Engine, Sampler
    from fdpp_rewrite.serve.requests import Request
    from fdpp_rewrite.serve.scheduler import Scheduler

    engine = Engine(cuda_engine.folder)
    scheduler = Scheduler(engine, None, prefill_chunk=64, warmup="all")
    scheduler.warm_up(io.StringIO())
    assert {key[0] for key in engine.prefill_graphs} == set(range(engine.max_batch))
    captured = set(engine.prefill_graphs)
    requests = [Request(prompt=p, max_tokens=n, sampler=Sampler(), emit=lambda event: None)
                for p, n in zip(PROMPTS[:4], MAX_TOKENS[:4])]
    for request in requests:
        scheduler.submit(request)
    for _ in range(300):
        if all(r is None for r in scheduler.slots) and not scheduler.waiting:
            break
        scheduler.run_once()
    assert set(engine.prefill_graphs) == captured
    for request, prompt, count in zip(requests, PROMPTS, MAX_TOKENS):
        assert request.tokens == cuda_engine.generate([prompt], count).tokens[0]


def test_mixed_steps_replay_graphs_and_equal_the_passes_apart(cuda_engine):
    """A mixed step (a decode step and a prompt chunk in one pass) is captured on its first run and replayed after,
    bit for bit the eager engine's; against the decode step and the chunk run apart (other GEMM shapes, so other
    roundings) the logits agree within fp16 tolerance and the greedy tokens are the same."""
    import torch

    from fdpp_rewrite.engine.runtime import Engine

    def mid_flight(engine):
        engine.reset()
        first = [int(engine.prefill_chunk(0, PROMPTS[0]).argmax()), int(engine.prefill_chunk(2, PROMPTS[4]).argmax())]
        engine.prefill_chunk(1, PROMPTS[2][:64])
        return torch.tensor(first, device="cuda")

    graphs, eager = Engine(cuda_engine.folder), Engine(cuda_engine.folder, use_graphs=False)
    assert graphs.supports_mixed, graphs.mixed_reason
    runs = []
    for engine in (graphs, graphs, eager):  # traced and captured, replayed, eager
        tokens = mid_flight(engine)
        logits, last = engine.mixed_step([0, 2], tokens, 1, PROMPTS[2][64:128], 64)
        runs.append((logits.float().cpu(), last.float().cpu(), [c[:3, :, :128].float().cpu() for c in engine.caches]))
    assert list(graphs.mixed_steps) == [(4, 64, 1, 128)] and isinstance(graphs.mixed_steps[(4, 64, 1, 128)][0],
                                                                         torch.cuda.CUDAGraph)
    for replayed, reference in ((runs[1], runs[0]), (runs[1], runs[2])):
        assert torch.equal(replayed[0], reference[0]) and torch.equal(replayed[1], reference[1])
        assert all(torch.equal(a, b) for a, b in zip(replayed[2], reference[2]))
    tokens = mid_flight(eager)
    apart = eager.decode_slots([0, 2], tokens).float().cpu(), eager.prefill_chunk(1, PROMPTS[2][64:128]).float().cpu()
    torch.testing.assert_close(runs[2][0], apart[0], atol=2e-2, rtol=2e-2)
    torch.testing.assert_close(runs[2][1], apart[1], atol=2e-2, rtol=2e-2)
    assert runs[2][0].argmax(-1).tolist() == apart[0].argmax(-1).tolist()
    assert int(runs[2][1].argmax()) == int(apart[1].argmax())


def test_launching_a_step_never_waits_for_the_gpu(cuda_engine):
    """Once its shapes are captured, a decode step, a mixed step, freeing a slot and a prompt chunk into it are
    queued with no host synchronization (torch's sync debug mode raises on a blocking copy or readback), so the
    server prepares step n + 1 while the GPU runs step n."""
    import torch

    from fdpp_rewrite.engine.runtime import Engine

    engine = Engine(cuda_engine.folder)
    for checked in (False, True):  # the first round traces and captures (which may synchronize)
        engine.reset()
        first = [int(engine.prefill_chunk(0, PROMPTS[0]).argmax()), int(engine.prefill_chunk(2, PROMPTS[4]).argmax())]
        engine.prefill_chunk(1, PROMPTS[2][:64])
        tokens = torch.tensor(first, device="cuda")
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("error" if checked else "default")
        try:
            logits = engine.decode_slots([0, 2], tokens)
            logits, last = engine.mixed_step([0, 2], logits.argmax(-1), 1, PROMPTS[2][64:128], 64)
            tokens = logits.argmax(-1)
            engine.release(0)  # a sequence ends: its slot takes the next prompt at once
            engine.prefill_chunk(0, PROMPTS[0])
        finally:
            torch.cuda.set_sync_debug_mode("default")
        assert engine.lengths[:3] == [len(PROMPTS[0]), 128, len(PROMPTS[4]) + 2]
        assert engine.past_len[:3].tolist() == engine.lengths[:3]
