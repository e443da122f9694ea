"""The continuous-batching scheduler, driven one iteration at a time (run_once, no thread): requests joining and
leaving mid-way get the tokens they get alone (Engine.generate), long prompts are prefilled in chunks between
decode steps, slots are packed low and reused at once, and cancellation, timeouts, the queue bound, EOS and stop
strings retire a sequence on its own."""

import pytest

from fdpp_rewrite.engine.runtime import Engine, Sampler
from fdpp_rewrite.serve.requests import Delta, Failure, Finish, QueueFull, Request
from fdpp_rewrite.serve.scheduler import Scheduler

PROMPTS = [[(5 * i + k) % 390 for i in range(n)] for k, n in ((1, 3), (2, 40), (3, 100), (4, 7), (5, 60), (6, 12))]
MAX_TOKENS = [9, 5, 12, 3, 8, 6]


@pytest.fixture(scope="module")
def engine(engine_dir):
    return Engine(engine_dir)


def make_request(prompt, max_tokens, sampler=None, **options):
    events = []
    request = Request(prompt=prompt, max_tokens=max_tokens, sampler=sampler or Sampler(), emit=events.append,
                      **options)
    return request, events


def run_until_idle(scheduler, limit=500):
    for _ in range(limit):
        if not scheduler.waiting and all(r is None for r in scheduler.slots):
            return
        scheduler.run_once()
    raise AssertionError("the scheduler did not drain")


def test_joining_and_leaving_requests_get_their_tokens_alone(engine, tokenizer):
    alone = [engine.generate([p], n).tokens[0] for p, n in zip(PROMPTS, MAX_TOKENS)]
    scheduler = Scheduler(engine, tokenizer, max_queue=8, prefill_chunk=16)
    requests = [make_request(p, n) for p, n in zip(PROMPTS, MAX_TOKENS)]
    arrivals = {0: [0, 1], 2: [2, 3, 4], 6: [5]}  # iteration -> requests submitted before it; 4 slots
    slots, prefill_iterations, waited, steps_during_prefill = {}, {}, set(), []
    for iteration in range(200):
        for index in arrivals.get(iteration, []):
            scheduler.submit(requests[index][0])
        free = [slot for slot, r in enumerate(scheduler.slots) if r is None]
        waiting = [id(r) for r in scheduler.waiting]
        scheduler.run_once()
        admitted = [i for i, (r, _) in enumerate(requests) if id(r) in waiting and r.slot is not None]
        assert [requests[i][0].slot for i in admitted] == free[:len(admitted)]  # the lowest free slots, at once
        slots.update({i: requests[i][0].slot for i in admitted})
        waited.update(i for i, (r, _) in enumerate(requests) if r in scheduler.waiting)
        for index, (request, _) in enumerate(requests):
            if request.slot is not None and request.prefilled and not request.tokens:
                prefill_iterations[index] = prefill_iterations.get(index, 0) + 1
                if index == 2:
                    steps_during_prefill.append(scheduler.steps)
        if iteration > 6 and not scheduler.waiting and all(r is None for r in scheduler.slots):
            break
    for index, (request, events) in enumerate(requests):
        assert request.tokens == alone[index], f"request {index}"
        finish = events[-1]
        assert isinstance(finish, Finish) and finish.reason == "length"
        assert (finish.prompt_tokens, finish.completion_tokens) == (len(PROMPTS[index]), MAX_TOKENS[index])
        text = "".join(e.text for e in events if isinstance(e, Delta))
        assert text == tokenizer.decode(alone[index])
    assert [slots[i] for i in range(4)] == [0, 1, 2, 3] and waited  # a request waited for a slot to free
    assert prefill_iterations[2] >= 100 // 16  # the 100-token prompt was spread over several 16-token chunks
    assert steps_during_prefill[-1] - steps_during_prefill[0] >= 4  # ... with the others' decode steps between
    assert engine.lengths == [0] * engine.max_batch and scheduler.metrics.requests["answered"] == len(PROMPTS)
    assert scheduler.mixed_steps >= 100 // 16  # the chunks rode on the others' decode steps (Engine.mixed_step)


def test_separate_passes_where_the_engine_cannot_run_mixed_steps(engine, tokenizer):
    alone = [engine.generate([p], n).tokens[0] for p, n in zip(PROMPTS[:3], MAX_TOKENS[:3])]
    engine.mixed_reason = "switched off for this test"
    try:
        scheduler = Scheduler(engine, tokenizer, prefill_chunk=16)
        requests = [make_request(p, n) for p, n in zip(PROMPTS[:3], MAX_TOKENS[:3])]
        for request, _ in requests:
            scheduler.submit(request)
        run_until_idle(scheduler)
    finally:
        engine.mixed_reason = None
    assert [r.tokens for r, _ in requests] == alone and scheduler.mixed_steps == 0 and scheduler.steps


def test_seeded_sampling_does_not_depend_on_the_batch(engine, tokenizer):
    sampled = dict(temperature=0.8, top_k=50, top_p=0.9, seed=1234)
    alone = Scheduler(engine, tokenizer)
    request, _ = make_request(PROMPTS[1], 10, Sampler(**sampled))
    alone.submit(request)
    run_until_idle(alone)
    batched = Scheduler(engine, tokenizer)
    again, _ = make_request(PROMPTS[1], 10, Sampler(**sampled))
    for prompt in (PROMPTS[0], PROMPTS[3]):
        batched.submit(make_request(prompt, 10, Sampler(temperature=1.0, seed=7))[0])
    batched.submit(again)
    run_until_idle(batched)
    assert again.tokens == request.tokens and len(request.tokens) == 10


def test_cancel_frees_the_slot_within_one_step(engine, tokenizer):
    scheduler = Scheduler(engine, tokenizer)
    request, events = make_request(PROMPTS[0], 100)
    scheduler.submit(request)
    for _ in range(3):
        scheduler.run_once()
    assert scheduler.slots[0] is request and engine.lengths[0] > 0
    steps, delivered = scheduler.steps, len(events)
    scheduler.cancel(request)
    scheduler.run_once()
    assert scheduler.slots == [None] * engine.max_batch and engine.lengths[0] == 0
    assert scheduler.steps == steps and len(events) == delivered  # no step ran for it, nothing more was sent
    assert scheduler.metrics.requests["cancelled"] == 1
    waiting, _ = make_request(PROMPTS[0], 5)  # a request cancelled while it waits leaves the queue
    scheduler.waiting.append(waiting)
    scheduler.cancel(waiting)
    scheduler.run_once()
    assert not scheduler.waiting and scheduler.metrics.requests["cancelled"] == 2


def test_queue_bound_and_timeout(engine, tokenizer):
    """--max-queue 2 on 4 free slots: 6 requests are taken (4 go to the slots at the next iteration), a 7th is
    refused; a request past its deadline is retired with a timeout, even while it waits."""
    scheduler = Scheduler(engine, tokenizer, max_queue=2)
    late, events = make_request(PROMPTS[0], 5, timeout_s=0.0)
    scheduler.submit(late)
    for _ in range(5):
        scheduler.submit(make_request(PROMPTS[0], 5)[0])
    with pytest.raises(QueueFull):
        scheduler.submit(make_request(PROMPTS[0], 5)[0])
    run_until_idle(scheduler)
    assert isinstance(events[-1], Failure) and events[-1].kind == "timeout" and not late.tokens
    assert scheduler.metrics.requests["timed_out"] == 1 and scheduler.metrics.requests["answered"] == 5


def test_eos_and_stop_strings_end_a_sequence(engine, tokenizer):
    alone = engine.generate([PROMPTS[2]], 12).tokens[0]
    eos = alone[4]
    cut = alone.index(eos)
    scheduler = Scheduler(engine, tokenizer, stop_ids={eos})
    request, events = make_request(PROMPTS[2], 12)
    scheduler.submit(request)
    run_until_idle(scheduler)
    assert request.tokens == alone[:cut] and events[-1] == Finish("stop", len(PROMPTS[2]), cut)

    text = tokenizer.decode(alone)
    stop = text[len(text) // 2:len(text) // 2 + 2]
    scheduler = Scheduler(engine, tokenizer)
    request, events = make_request(PROMPTS[2], 12, stop=["never there", stop])
    scheduler.submit(request)
    run_until_idle(scheduler)
    assert "".join(e.text for e in events if isinstance(e, Delta)) == text[:text.index(stop)]
    assert events[-1].reason == "stop" and len(request.tokens) < 12


def test_stop_strings_without_a_tokenizer_match_the_streamed_ids(engine):
    """An engine without a tokenizer streams its ids as comma-separated text; a stop string is found in that text."""
    alone = engine.generate([PROMPTS[2]], 12).tokens[0]
    text = ",".join(str(t) for t in alone)
    stop = f",{alone[5]},"
    cut = text.index(stop)
    scheduler = Scheduler(engine, None)
    request, events = make_request(PROMPTS[2], 12, stop=[stop])
    scheduler.submit(request)
    run_until_idle(scheduler)
    assert "".join(e.text for e in events if isinstance(e, Delta)) == text[:cut]
    stopped_at = text[:cut + 1].count(",")  # the stop's id; its closing comma comes with the next token
    assert events[-1].reason == "stop" and request.tokens == alone[:stopped_at + 2]
    # usage counts the tokens of the text sent, not those that spelled the stop string
    assert events[-1].completion_tokens == text[:cut].count(",") + 1 < len(request.tokens)


def test_a_deliver_hook_gets_each_iterations_events_in_one_call(engine, tokenizer):
    batches = []
    scheduler = Scheduler(engine, tokenizer, max_queue=8, prefill_chunk=16, deliver=batches.append)
    requests = [make_request(p, n) for p, n in zip(PROMPTS[:3], MAX_TOKENS[:3])]
    for request, _ in requests:
        scheduler.submit(request)
    iterations = 0
    while scheduler.waiting or any(r is not None for r in scheduler.slots):
        delivered = len(batches)
        scheduler.run_once()
        iterations += 1
        assert len(batches) - delivered <= 1  # at most one hand-over per iteration
        assert all(not events for _, events in requests)  # nothing reaches a request behind the hook's back
    assert max(len(batch) for batch in batches) > 1  # several sequences' tokens went in one hand-over
    for batch in batches:
        for emit, event in batch:
            emit(event)
    alone = [engine.generate([p], n).tokens[0] for p, n in zip(PROMPTS[:3], MAX_TOKENS[:3])]
    for (request, events), tokens in zip(requests, alone):
        assert request.tokens == tokens
        assert isinstance(events[-1], Finish) and events[-1].completion_tokens == len(tokens)


def test_step_times_are_observed_by_kind_for_back_to_back_steps(engine, tokenizer):
    from fdpp_rewrite.serve import metrics

    scheduler = Scheduler(engine, tokenizer, max_queue=8, prefill_chunk=16)
    requests = [make_request(p, n) for p, n in zip(PROMPTS[:4], MAX_TOKENS[:4])]
    for request, _ in requests:
        scheduler.submit(request)
    run_until_idle(scheduler)
    counts = {kind: sum(h.counts) for kind, h in scheduler.metrics.steps.items()}
    assert counts["mixed"] >= 1 and counts["decode"] >= 1
    assert counts["mixed"] <= scheduler.mixed_steps
    assert sum(counts.values()) < scheduler.steps  # the first step had nothing in flight before it: not a step time
    samples = metrics.parse(scheduler.metrics.render(scheduler.gauges()))
    assert samples['fdpp_step_seconds_count{kind="mixed"}'] == counts["mixed"]
    assert samples['fdpp_step_seconds_bucket{kind="decode",le="+Inf"}'] == counts["decode"]
