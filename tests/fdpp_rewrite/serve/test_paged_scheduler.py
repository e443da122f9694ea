"""The paged scheduler (fdpp_rewrite/serve/paged_scheduler.py) on a CPU double of the paged engine
(fake_paged_engine.py, real block accounting): admission by free blocks, one step per iteration carrying the decode
rows and chunks of several prompts within the prefill budget, preemption of the youngest sequence with recompute,
prefix hits, and a seeded soak with cancellations and timeouts that leaks and double-owns no block."""

import random

import pytest
from fake_paged_engine import FakePagedEngine, greedy

from fdpp_rewrite.engine.sampling import Sampler
from fdpp_rewrite.serve.paged_scheduler import PagedScheduler
from fdpp_rewrite.serve.requests import Delta, Failure, Finish, Request

VOCAB = 50


def make_request(prompt, max_tokens, **options):
    events = []
    request = Request(prompt=list(prompt), max_tokens=max_tokens, sampler=Sampler(), emit=events.append, **options)
    return request, events


def idle(scheduler) -> bool:
    return not scheduler.waiting and scheduler.in_flight is None and all(r is None for r in scheduler.slots)


def run_until_idle(scheduler, limit=5000, each=None):
    for _ in range(limit):
        if idle(scheduler):
            return
        scheduler.run_once()
        if each is not None:
            each()
    raise AssertionError("the scheduler did not drain")


def prompts(seed, count, low, high):
    rng = random.Random(seed)
    return [[rng.randrange(VOCAB) for _ in range(rng.randint(low, high))] for _ in range(count)]


def steps(engine):
    return [call for call in engine.calls if call[0] == "step"]


def test_outputs_under_preemption_equal_each_request_alone():
    """A pool too small for all of them at once: sequences are preempted and recomputed, and every greedy output is
    what the request generates alone; the streamed text is each token's once, in order."""
    engine = FakePagedEngine(num_blocks=24, block_size=8, max_batch=8)
    scheduler = PagedScheduler(engine, None, prefill_chunk=16, prefill_budget=64, max_queue=32)
    cases = [(p, 30 + 7 * i) for i, p in enumerate(prompts(1, 8, 10, 40))]
    requests = [make_request(p, n) for p, n in cases]
    for request, _ in requests:
        scheduler.submit(request)
    run_until_idle(scheduler, each=engine.check)
    assert scheduler.preemptions > 0
    for (prompt, count), (request, events) in zip(cases, requests):
        expected = greedy(prompt, count, VOCAB)
        assert request.tokens == expected
        assert "".join(e.text for e in events if isinstance(e, Delta)) == ",".join(map(str, expected))
        assert events[-1] == Finish("length", len(prompt), count)
    assert engine.kv.used_blocks == 0 and scheduler.metrics.requests == {
        "answered": 8, "refused": 0, "cancelled": 0, "timed_out": 0, "failed": 0}
    assert scheduler.metrics.prompt_tokens == sum(len(p) for p, _ in cases)  # a recompute is not a new prompt


def test_the_youngest_running_sequence_is_preempted_first():
    engine = FakePagedEngine(num_blocks=13, block_size=4, max_batch=4)  # 12 usable blocks: 48 tokens
    scheduler = PagedScheduler(engine, None, prefill_chunk=16, prefill_budget=64)
    preempted = []
    original = scheduler._preempt
    scheduler._preempt = lambda request: (preempted.append((request.arrival, running(scheduler))),
                                          original(request))
    requests = [make_request(p, 24)[0] for p in prompts(2, 3, 6, 8)]
    for request in requests:
        scheduler.submit(request)
    run_until_idle(scheduler, each=engine.check)
    assert preempted
    for arrival, running_arrivals in preempted:
        assert arrival == max(running_arrivals)  # the youngest of those running then
    assert [r.tokens for r in requests] == [greedy(r.prompt, 24, VOCAB) for r in requests]


def running(scheduler):
    return [r.arrival for r in scheduler.slots if r is not None]


def test_admission_waits_for_free_blocks_and_keeps_a_reserve():
    """Blocks, not rows, bound admission: of four 30-token prompts (4 blocks each, + 1 to decode into) on a pool of
    12 blocks, two start; the others wait, oldest first, until blocks come back."""
    engine = FakePagedEngine(num_blocks=13, block_size=8, max_batch=8)
    scheduler = PagedScheduler(engine, None, prefill_chunk=8, prefill_budget=64)
    requests = [make_request(p, 4)[0] for p in prompts(3, 4, 30, 30)]
    for request in requests:
        scheduler.submit(request)
    scheduler.run_once()
    assert [r.slot is not None for r in requests] == [True, True, False, False]
    assert list(scheduler.waiting) == requests[2:]
    attaches = lambda: sum(call[0] == "attach" for call in engine.calls)  # noqa: E731
    scheduler._admit(0.0)
    tried = attaches()
    scheduler._admit(0.0)  # nothing changed: the head is not looked up again (nor counted in the hit rate)
    assert attaches() == tried and list(scheduler.waiting) == requests[2:]
    run_until_idle(scheduler, each=engine.check)
    assert scheduler.preemptions == 0 and all(len(r.tokens) == 4 for r in requests)


def test_one_step_carries_the_decode_rows_and_chunks_of_several_prompts_within_the_budget():
    engine = FakePagedEngine(num_blocks=200, block_size=16, max_batch=16)
    scheduler = PagedScheduler(engine, None, prefill_chunk=32, prefill_budget=100)
    assert (scheduler.padded, scheduler.max_chunks) == (32, 3)  # 100 tokens hold three chunks padded to 32
    first = make_request(prompts(4, 1, 5, 5)[0], 40)[0]
    scheduler.submit(first)
    for _ in range(3):
        scheduler.run_once()
    late = [make_request(p, 6)[0] for p in prompts(5, 6, 50, 90)]
    for request in late:
        scheduler.submit(request)
    run_until_idle(scheduler)
    calls = steps(engine)
    assert all(len(chunks) <= 3 and padded == 32 and all(n <= 32 for _, n in chunks) for _, _, chunks, padded in calls)
    assert len(calls) == scheduler.steps  # one engine call per step
    mixed = [c for c in calls if c[1] and len(c[2]) == 3]
    assert mixed  # decode rows and three prompts' chunks in one pass
    assert all(len(r.tokens) == 6 for r in late) and first.tokens == greedy(first.prompt, 40, VOCAB)
    observed = scheduler.metrics.prefill
    assert observed.total == sum(len(r.prompt) for r in late + [first]) and sum(observed.counts) == len(calls)


@pytest.mark.parametrize("prefix_caching", [True, False])
def test_shared_prefixes_hit_the_cache_and_change_no_output(prefix_caching):
    engine = FakePagedEngine(num_blocks=80, block_size=8, prefix_caching=prefix_caching)
    scheduler = PagedScheduler(engine, None, prefill_chunk=16, prefill_budget=64)
    system = prompts(6, 1, 40, 40)[0]
    cases = [system + tail for tail in prompts(7, 6, 3, 9)]
    first = make_request(cases[0], 5)[0]
    scheduler.submit(first)
    run_until_idle(scheduler)
    rest = [make_request(p, 5)[0] for p in cases[1:]]
    for request in rest:
        scheduler.submit(request)
    run_until_idle(scheduler, each=engine.check)
    assert [r.tokens for r in [first] + rest] == [greedy(p, 5, VOCAB) for p in cases]
    prefilled = scheduler.metrics.prefill.total
    gauges = scheduler.gauges()
    if prefix_caching:
        assert gauges["prefix_cache_hit_rate"][1] == engine.kv.hit_tokens / engine.kv.query_tokens > 0.5
        assert engine.kv.hit_tokens == 5 * 40 and prefilled == sum(map(len, cases)) - 5 * 40
    else:
        assert gauges["prefix_cache_hit_rate"][1] == 0 and prefilled == sum(map(len, cases))
        assert not [c for c in engine.calls if c[0] == "attach"]


def test_seeded_soak_with_cancellations_and_timeouts_leaks_no_block():
    rng = random.Random(11)
    engine = FakePagedEngine(num_blocks=40, block_size=8, max_batch=12)
    scheduler = PagedScheduler(engine, None, prefill_chunk=16, prefill_budget=48, max_queue=400)
    requests, offsets, cancel_at = [], {}, {}
    for index in range(150):
        prompt = [rng.randrange(VOCAB) for _ in range(rng.randint(1, 70))]
        request, _ = make_request(prompt, rng.randint(1, 40), timeout_s=0.0 if rng.random() < 0.05 else 600.0)
        requests.append(request)
        if rng.random() < 0.25:
            offsets[index] = rng.randint(0, 60)  # iterations after its submission
    pending, iteration = list(enumerate(requests)), 0
    while pending or not idle(scheduler):
        for _ in range(rng.randint(0, 3)):
            if pending:
                index, request = pending.pop(0)
                scheduler.submit(request)
                if index in offsets:
                    cancel_at[index] = iteration + offsets[index]
        for index, at in cancel_at.items():
            if at == iteration:
                scheduler.cancel(requests[index])
        scheduler.run_once()
        engine.check()
        owners = [id(r) for r in scheduler.slots if r is not None]
        assert len(owners) == len(set(owners)) and all(scheduler.slots[r.slot] is r for r in scheduler.slots if r)
        iteration += 1
        assert iteration < 20000
    assert engine.kv.used_blocks == 0 and engine.lengths == [0] * engine.max_batch
    outcomes = scheduler.metrics.requests
    assert outcomes["failed"] == 0 and outcomes["timed_out"] > 0 and outcomes["cancelled"] > 0
    assert outcomes["answered"] + outcomes["cancelled"] + outcomes["timed_out"] == len(requests)
    assert scheduler.preemptions > 0
    for request in requests:  # an answered one got what it gets alone, however often it was preempted
        if len(request.tokens) == request.max_tokens and not request.cancelled:
            assert request.tokens == greedy(request.prompt, request.max_tokens, VOCAB)


def test_a_request_cancelled_after_preemption_leaves_the_queue():
    engine = FakePagedEngine(num_blocks=13, block_size=4, max_batch=4)
    scheduler = PagedScheduler(engine, None, prefill_chunk=16, prefill_budget=64)
    requests = [make_request(p, 24) for p in prompts(2, 3, 6, 8)]
    for request, _ in requests:
        scheduler.submit(request)
    while not scheduler.preemptions:
        scheduler.run_once()
    victim, events = next((r, e) for r, e in requests if r in scheduler.waiting)
    sent = len(events)
    assert victim.tokens and victim.slot is None
    scheduler.cancel(victim)
    run_until_idle(scheduler, each=engine.check)
    assert len(events) == sent and scheduler.metrics.requests["cancelled"] == 1 and engine.kv.used_blocks == 0


def test_timeout_while_waiting_fails_with_a_timeout():
    engine = FakePagedEngine()
    scheduler = PagedScheduler(engine, None)
    request, events = make_request([1, 2, 3], 5, timeout_s=0.0)
    scheduler.submit(request)
    run_until_idle(scheduler)
    assert isinstance(events[-1], Failure) and events[-1].kind == "timeout" and engine.kv.used_blocks == 0


def test_sequence_limit_and_gauges():
    engine = FakePagedEngine(num_blocks=11, block_size=16, max_seq=1024)
    scheduler = PagedScheduler(engine, None, max_batch=3)
    limit, what = scheduler.sequence_limit()
    assert limit == 160 and "10 blocks of 16 tokens" in what and "--kv-memory" in what
    assert PagedScheduler(FakePagedEngine(num_blocks=200), None).sequence_limit()[0] == 1024  # max_seq binds
    capped = PagedScheduler(FakePagedEngine(step_tokens=64), None, prefill_chunk=128, prefill_budget=2048)
    assert (capped.prefill_budget, capped.prefill_chunk, capped.max_chunks) == (64, 64, 1)  # the engine's step budget
    gauges = scheduler.gauges()
    assert (gauges["kv_slots_total"][1], gauges["kv_blocks_total"][1], gauges["kv_blocks_free"][1]) == (3, 10, 10)
    assert gauges["kv_blocks_used"][1] == gauges["preemptions_total"][1] == 0
    assert scheduler.kv_blocks() == {"used": 0, "free": 10, "total": 10}
    text = scheduler.metrics.render(gauges)
    for name in ("kv_blocks_used", "kv_blocks_free", "kv_blocks_total", "prefix_cache_hit_rate", "preemptions_total",
                 "prefill_tokens_per_step_count", "prefill_tokens_last_step", "queue_depth", "running_sequences"):
        assert f"fdpp_{name} " in text
