"""The paged scheduler on the real paged engine (the tiny-llama engine of conftest.py, paged on the cpu backend
with a small block pool): requests joining, leaving and preempted for lack of blocks get the greedy tokens of the
contiguous engine alone, prefix hits change nothing, and every block is free once idle. (The fake paged engine's
tests cover the scheduler's rules; these check it drives the engine's step API as the engine means it.)"""

import pytest
from test_paged_scheduler import idle, make_request

from fdpp_rewrite.engine.runtime import Engine
from fdpp_rewrite.serve.paged_scheduler import PagedScheduler

PROMPTS = [[(5 * i + k) % 390 for i in range(n)] for k, n in ((1, 3), (2, 140), (3, 100), (4, 7), (5, 70), (6, 12))]
MAX_TOKENS = [150, 60, 90, 150, 70, 150]  # the three short prompts grow to 3 blocks each: 7 blocks run short


@pytest.fixture(scope="module")
def alone(engine_dir):
    contiguous = Engine(engine_dir)
    return [contiguous.generate([p], n).tokens[0] for p, n in zip(PROMPTS, MAX_TOKENS)]


def run(scheduler, requests, arrivals):
    for iteration in range(3000):
        for index in arrivals.get(iteration, []):
            scheduler.submit(requests[index])
        if iteration > max(arrivals) and idle(scheduler):
            return
        scheduler.run_once()
    raise AssertionError("the scheduler did not drain")


def test_greedy_tokens_equal_the_contiguous_engine_alone_through_preemptions(engine_dir, alone):
    """7 blocks (448 tokens; the pool's 8th is the null block) do not hold the three short prompts grown: sequences
    are preempted and recomputed."""
    engine = Engine(engine_dir, kv_blocks=8)
    scheduler = PagedScheduler(engine, None, prefill_chunk=32, prefill_budget=64)
    requests = [make_request(p, n)[0] for p, n in zip(PROMPTS, MAX_TOKENS)]
    run(scheduler, requests, {0: [0, 3, 5], 3: [1, 2], 9: [4]})
    assert [r.tokens for r in requests] == alone
    assert scheduler.preemptions > 0
    assert engine.kv.used_blocks == 0 and scheduler.metrics.requests["answered"] == len(PROMPTS)


def test_a_shared_prefix_is_attached_and_changes_no_output(engine_dir):
    system = [(7 * i + 3) % 390 for i in range(130)]  # two whole 64-token blocks, and 2 ids
    prompts = [system + [11 + k, 40 + k, 90 + k] for k in range(3)]
    contiguous = Engine(engine_dir)
    expected = [contiguous.generate([p], 6).tokens[0] for p in prompts]
    engine = Engine(engine_dir, kv_blocks=30)
    scheduler = PagedScheduler(engine, None, prefill_chunk=64, prefill_budget=128)
    requests = [make_request(p, 6)[0] for p in prompts]
    run(scheduler, requests, {0: [0], 12: [1, 2]})
    assert [r.tokens for r in requests] == expected
    assert engine.kv.prefix.hit_tokens == 2 * 128 and scheduler.gauges()["prefix_cache_hit_rate"][1] > 0.5
    assert engine.kv.used_blocks == 0
