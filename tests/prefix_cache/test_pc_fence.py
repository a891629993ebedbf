"""Rule 2 at the MLA level, under full-attention (no checkpoint fence to mask it): a request admitted in the
step that writes its prefix must not read those pages before they land; with the fence off it does, and the
cache counts the stale read."""

from __future__ import annotations

import pytest
from helpers_pc import tiny_config

from k3sim.prefix_cache.cache import HybridPrefixCache, ReqState

KEYS = [11, 12, 13, 14, 15, 16]  # six hash blocks of 2 tokens: 12 tokens, three 4-token pages


def _second_admission_in_writing_step(fence: bool):
    cache = HybridPrefixCache(tiny_config("full-attention", hash_block=2, physical_block=4,
                                          fence_unlanded=fence))
    a = cache.admit(KEYS, 12, 1)
    assert isinstance(a, ReqState)
    cache.schedule_prefill(a, 1 << 30)  # A's pages are written in this step; they land at end_step
    b = cache.admit(KEYS, 12, 1)       # same prompt, same step
    assert isinstance(b, ReqState)
    return cache, b


def test_mla_fence_holds_back_unlanded_pages():
    cache, b = _second_admission_in_writing_step(fence=True)
    # hand-worked: every one of A's pages is still in flight, so B may reuse none of them
    assert b.hit_hb == 0
    assert cache.stats.stale_reads == 0 and cache.stats.fenced_lookups == 1


def test_without_fence_the_unlanded_pages_are_read_and_counted():
    cache, b = _second_admission_in_writing_step(fence=False)
    # the lookup stops one token short of the prompt: (12 - 1) // 2 = 5 hash blocks, of which the
    # first 2 whole pages (4 hash blocks) are shared and the fifth block comes from a partial copy
    assert b.hit_hb == 5
    assert cache.stats.stale_reads == 1


@pytest.mark.parametrize("fence", [True, False])
def test_after_landing_the_prefix_is_shared(fence):
    cache = HybridPrefixCache(tiny_config("full-attention", hash_block=2, physical_block=4, fence_unlanded=fence))
    a = cache.admit(KEYS, 12, 1)
    cache.schedule_prefill(a, 1 << 30)
    cache.end_step()
    b = cache.admit(KEYS, 12, 1)
    assert b.hit_hb == 5 and cache.stats.stale_reads == 0
