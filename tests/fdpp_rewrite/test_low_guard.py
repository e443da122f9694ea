"""The low side of the unified max's guard (ref_ops.guard_flags, the contract's low_guard_tail): a row falls back
only when a term lost to underflow could matter, and every row it keeps on the fast path is still exact."""

import numpy as np
import pytest

from fdpp_rewrite import ref_ops
from fdpp_rewrite.contracts import load_contract

ATOL32, RTOL32 = load_contract("AsyncSoftmaxAttention").tolerance("float32")
PHI, LO, HI = 0.0, -60.0, 10.0
TAIL = ref_ops.low_guard_tail()


def adversarial_rows(rng, length=4096):
    """Score rows (s - phi in nats) built to break a careless low-side rule, each with what it tests."""
    ordinary = lambda centre: rng.normal(centre, 2.0, length)  # noqa: E731
    rows = {}
    rows["ordinary"] = ordinary(-5.0)
    rows["one score of -3000"] = ordinary(-5.0)
    rows["one score of -3000"][17] = -3000.0
    many_lost = ordinary(LO + TAIL + 4.0)  # the row max just clears guard_lo + tail ...
    many_lost[: length // 2] = -110.0  # ... while half its terms underflow float32's e^x (lost)
    rows["half the terms underflow, max above guard_lo + tail"] = many_lost
    near = np.full(length, LO - 30.0)  # terms far below the window, max just under guard_lo + tail
    near[5] = LO + TAIL - 0.5
    rows["max just under guard_lo + tail, terms below guard_lo"] = near
    rows["every score far below phi"] = ordinary(-140.0)
    rows["every score near guard_lo"] = ordinary(LO - 5.0)
    rows["one score above guard_hi"] = ordinary(-5.0)
    rows["one score above guard_hi"][3] = HI + 1.0
    rows["half the scores -1e4"] = np.concatenate([ordinary(-1.0)[: length // 2], np.full(length // 2, -1e4)])
    return rows


def exact_softmax_v(scores, v):
    s = scores.astype(np.float64)
    p = np.exp(s - s.max())
    return (p @ v.astype(np.float64)) / p.sum()


def run_rows(scores, v):
    """ref_ops on rows whose scores are exactly `scores` (q = e0, k[:, 0] = s, scale 1)."""
    rows, length = scores.shape
    dim = v.shape[-1]
    q = np.zeros((1, rows, 1, dim), np.float32)
    q[..., 0] = 1.0
    k = np.zeros((1, rows, length, dim), np.float32)
    k[0, :, :, 0] = scores
    counters = ref_ops.OpCounters()
    out = ref_ops.async_softmax_attention(q, k, np.broadcast_to(v, (1, rows, length, dim)).copy(), scale=1.0,
                                          phi=PHI, guard_lo=LO, guard_hi=HI, mask_mode="none", counters=counters)
    return out[0, :, 0], counters


def old_rule(row_max, row_min):
    """The rule before low_guard_tail: any visible score below phi + guard_lo flagged the row."""
    return (row_max - PHI > HI) | (row_min - PHI < LO)


def test_guard_flags_follows_the_contract_rule():
    row_max = np.array([-5.0, -5.0, LO + TAIL - 1, LO + TAIL + 1, HI + 1, -np.inf, LO - 1])
    row_min = np.array([-9.0, -3000.0, LO - 1, LO - 1, -1.0, np.inf, LO - 2])
    flags = ref_ops.guard_flags(row_max, row_min, PHI, LO, HI)
    assert flags.tolist() == [False, False, True, False, True, False, True]
    # the same rule on torch tensors (calibrate counts rows with it)
    torch = pytest.importorskip("torch")
    assert ref_ops.guard_flags(torch.tensor(row_max), torch.tensor(row_min), PHI, LO, HI).tolist() == flags.tolist()


def test_every_adversarial_row_is_exact_and_only_risky_rows_fall_back():
    rng = np.random.default_rng(29)
    rows = adversarial_rows(rng)
    scores = np.stack(list(rows.values())).astype(np.float32)
    v = rng.standard_normal((scores.shape[1], 8)).astype(np.float32)
    out, counters = run_rows(scores, v)
    for (name, row), got in zip(rows.items(), out):
        np.testing.assert_allclose(got, exact_softmax_v(row.astype(np.float32), v), atol=ATOL32, rtol=RTOL32,
                                   err_msg=name)
    flagged = ref_ops.guard_flags(scores.max(1), scores.min(1), PHI, LO, HI)
    expected = {"max just under guard_lo + tail, terms below guard_lo", "every score far below phi",
                "every score near guard_lo", "one score above guard_hi"}
    assert {name for name, f in zip(rows, flagged) if f} == expected
    assert counters.fallback_rows == len(expected)
    before = int(old_rule(scores.max(1), scores.min(1)).sum())
    assert before == len(expected) + 3  # the -3000 row, the underflowing half row and the -1e4 row, now kept


def test_the_fast_path_breaks_where_the_guard_flags():
    """Without the fallback, the rows the low side flags lose their value: the guard is not decorative."""
    row = np.full((1, 64), -140.0, np.float32)  # every e^(s - phi) is 0 in float32
    v = np.ones((1, 64, 4), np.float32)
    num, den = ref_ops._unified_max(row, np.ones_like(row, bool), v, PHI, 64)
    assert den[0] == 0.0 and ref_ops.guard_flags(row.max(1), row.min(1), PHI, LO, HI)[0]


def test_one_very_negative_score_in_a_16k_row_no_longer_falls_back():
    """The issue's measurement: one -3000 score in a 16K row flagged it; now it stays on the fast path, exact."""
    rng = np.random.default_rng(3)
    row = rng.normal(-4.0, 2.0, 16384).astype(np.float32)
    row[9000] = -3000.0
    v = rng.standard_normal((16384, 8)).astype(np.float32)
    out, counters = run_rows(row[None], v)
    assert counters.fallback_rows == 0 and old_rule(row.max(), row.min())
    np.testing.assert_allclose(out[0], exact_softmax_v(row, v), atol=ATOL32, rtol=RTOL32)


def test_synchronized_softmax_sends_every_row_to_the_online_max():
    rng = np.random.default_rng(5)
    q, k, v = (rng.standard_normal((1, 2, 3, 8)).astype(np.float32) for _ in range(3))
    counters = ref_ops.OpCounters()
    out = ref_ops.async_softmax_attention(q, k, v, scale=0.3, phi=0.0, guard_lo=-60.0, guard_hi=10.0,
                                          mask_mode="none", softmax="synchronized", counters=counters)
    unified = ref_ops.async_softmax_attention(q, k, v, scale=0.3, phi=0.0, guard_lo=-60.0, guard_hi=10.0,
                                              mask_mode="none")
    assert counters.fallback_rows == counters.attention_rows == 6
    np.testing.assert_allclose(out, unified, atol=ATOL32, rtol=RTOL32)
    with pytest.raises(ref_ops.FdppError, match="unknown softmax"):
        ref_ops.async_softmax_attention(q, k, v, scale=0.3, phi=0.0, guard_lo=-60.0, guard_hi=10.0,
                                        mask_mode="none", softmax="fast")
