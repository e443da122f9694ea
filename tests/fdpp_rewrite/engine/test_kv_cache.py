"""The contiguous slot cache (kv_cache.py) and the bucket rules (buckets.py) on the CPU: views share the one
allocation, host and device lengths move together, a step past max_seq is a one-line error."""

import numpy as np
import pytest
import torch

from fdpp_rewrite.engine.buckets import pick
from fdpp_rewrite.engine.kv_cache import SlotCache, upload
from fdpp_rewrite.errors import FdppError


def _cache():
    return SlotCache(["key_cache.0", "value_cache.0"], max_batch=3, max_seq=40, kv_heads=2, head_dim=4,
                     dtype=torch.float32, device=torch.device("cpu"))


def test_views_are_the_slots_rows_of_the_one_allocation():
    cache = _cache()
    views = cache.views(slice(1, 3), 17)
    assert list(views) == cache.names and views["key_cache.0"].shape == (2, 2, 17, 4)
    views["value_cache.0"][0, :, 5] = 1.0  # a step writes in place
    assert float(cache.tensors[1][1, :, 5].sum()) == 8.0 and float(cache.tensors[1].sum()) == 8.0
    assert cache.views(slice(None), 9)["key_cache.0"].shape == (3, 2, 9, 4)


def test_lengths_move_together_on_the_host_and_the_device():
    cache = _cache()
    cache.set_length(2, 7)
    assert cache.lengths == [0, 0, 7] and cache.past_len.tolist() == [0, 0, 7]
    cache.advance_first(2)
    assert cache.lengths == [1, 1, 7] and cache.past_len.tolist() == [1, 1, 7]
    cache.advance([0, 2], bucket_batch=3)
    assert cache.lengths == [2, 1, 8] and cache.past_len.tolist() == [2, 1, 8]
    cache.lengths[1] = 5
    cache.sync(2)  # only the first two follow
    assert cache.past_len.tolist() == [2, 5, 8]
    cache.reset()
    assert cache.lengths == [0, 0, 0] and cache.past_len.tolist() == [0, 0, 0]


def test_a_step_past_max_seq_is_one_line():
    cache = _cache()
    cache.check_fits(40)
    with pytest.raises(FdppError, match="max sequence 40; rebuild with a larger --max-seq") as error:
        cache.check_fits(41)
    assert "\n" not in str(error.value)


def test_upload_keeps_values_and_pick_takes_the_smallest_bucket_that_fits():
    assert upload([3, 1, 4], torch.device("cpu")).tolist() == [3, 1, 4]
    assert upload([5], torch.device("cpu")).dtype == torch.int64
    table = upload(np.array([[2, 0], [7, 1]], dtype=np.int32), torch.device("cpu"))  # a block table keeps int32
    assert table.dtype == torch.int32 and table.tolist() == [[2, 0], [7, 1]]
    assert [pick(v, [16, 32, 40]) for v in (1, 16, 17, 40)] == [16, 16, 32, 40]
