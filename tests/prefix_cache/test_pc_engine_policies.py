"""Each engine policy on hand-built request sequences: where its checkpoints land, which boundary a later request
restores, and the hit tokens, worked out here. Tiny caches: 4-token hash blocks and pages (r = 1), 1 byte of KV
per token, a state of one page in one group, so page counts read directly."""

from __future__ import annotations

from k3sim.prefix_cache.cache import HybridPrefixCache, ReqState
from k3sim.prefix_cache.config import CacheConfig
from helpers_pc import ks, serve_chunks

BIG = 1 << 20


def cache(policy: str, **kw) -> HybridPrefixCache:
    return HybridPrefixCache(CacheConfig(policy, 4, 4, 1, 4, 1, kw.pop("capacity", None), **kw))


def hit(c: HybridPrefixCache, keys: list, L: int) -> int:
    """The hit tokens a request would get (admitted and released at once)."""
    rs = c.admit(keys, L, 1)
    assert isinstance(rs, ReqState)
    h = rs.hit_tokens
    assert rs.computed == h
    c.release(rs)
    c.end_step()
    return h


def test_vllm_all_restores_every_block_boundary():
    """A 16-token prompt in one forward leaves states at 4, 8, 12 and 16 (every boundary crossed, all cached).
    Sharing 2 blocks restores at 8, sharing 1 at 4."""
    c = cache("vllm-all")
    serve_chunks(c, ks(4, 4, 0), 16, [BIG])
    assert c.stats.checkpoints_written == 4 and sorted(ck.tok for ck in c.ckpt_index.values()) == [4, 8, 12, 16]
    assert hit(c, ks(5, 2, 1), 20) == 8
    assert hit(c, ks(5, 1, 2), 20) == 4


def test_vllm_align_cuts_chunks_to_blocks_and_caches_only_step_ends():
    """L = 14, budget 8 a step, blocks of 4: the last block boundary is 12. Step 1 ends at 8 (8 < 12: already
    whole blocks) -> state at 8; step 2 would end at 14, crosses 12 -> cut at 12 -> state at 12; step 3 prefills
    12..14 (not a boundary: no state). A request sharing 3 blocks restores 12, sharing 2 restores 8, and sharing
    only the first block restores nothing (vllm-all would give 4): the all-or-nothing of align mode."""
    c = cache("vllm-align")
    rs = c.admit(ks(3, 3, 0), 14, 1)
    assert c.schedule_prefill(rs, 8) == 8
    c.end_step()
    first = c.ckpt_index[("p", 1)]
    head = c.slot_pages[first.slots[0]][0]
    assert first.tok == 8 and c.pool.refcount[head] == 1  # held by the request: running + latest aligned
    assert c.schedule_prefill(rs, 8) == 4  # cut at the last block boundary, 12
    c.end_step()
    assert c.ckpt_index[("p", 2)].tok == 12 and c.pool.refcount[head] == 0  # superseded: released to the LRU
    assert c.schedule_prefill(rs, 8) == 2 and c.stats.checkpoints_written == 2
    c.end_step()
    c.release(rs)
    c.end_step()
    c.check()
    assert hit(c, ks(5, 3, 1), 20) == 12
    assert hit(c, ks(5, 2, 2), 20) == 8
    assert hit(c, ks(5, 1, 3), 20) == 0


def test_vllm_align_waits_when_no_whole_block_fits():
    """Before the last boundary a chunk is a whole number of blocks: a 3-token budget schedules nothing."""
    c = cache("vllm-align")
    rs = c.admit(ks(3, 3, 0), 14, 1)
    assert c.schedule_prefill(rs, 3) == 0 and rs.computed == 0
    assert c.schedule_prefill(rs, 5) == 4


def test_sglang_no_buffer_snapshots_every_chunk_end():
    """L = 14 in chunks of 6: snapshots at 6 (block 1), 12 (block 2) and 14 (the partial last block: its key
    does not exist, so it holds memory but no lookup finds it); the finished request's state is donated. Sharing
    2 blocks (8 tokens) restores 6: the hit rounds down to the snapshot, 2 tokens are prefilled again, and the
    half-shared page is copied."""
    c = cache("sglang-no-buffer", state_pool_fraction=0.5, donate_final_state=True)
    serve_chunks(c, ks(3, 3, 0), 14, [6, 6, 6])
    assert c.stats.checkpoints_written == 3 and c.stats.checkpoints_donated == 1
    assert sorted(ck.tok for ck in c.ckpt_index.values()) == [6, 12]
    assert c.ckpt_pages == 4  # 3 snapshots + the donated state, one page each
    rs = c.admit(ks(5, 2, 1), 20, 1)
    assert rs.hit_tokens == 6 and len(rs.blocks) == 2  # page 0 shared, page 1 a private copy (6 % 4 = 2)
    c.release(rs)
    c.end_step()
    assert hit(c, ks(5, 3, 2), 20) == 12


def test_sglang_extra_buffer_tracks_one_position_per_forward_and_the_branch_point():
    """Tracking grid 2 tokens (64 in SGLang), chunks of 6. L = 14: forward 0..6 tracks 4 (the deepest grid point
    strictly inside: 0 + (6 - 1) // 2 x 2), forward 6..12 tracks 10, forward 12..14 (2 tokens, not > 2) none.
    A request sharing 2 blocks restores 4 (the only snapshot inside its match) and, because its match reaches
    8, tracks the branch point 8 in its first forward (4..10); the next request sharing those 2 blocks
    restores 8. Each running request holds 1 + 2 ping-pong slots."""
    c = cache("sglang-extra-buffer", state_pool_fraction=0.5, donate_final_state=True, private_state_slots=3,
              track_tokens=2)
    serve_chunks(c, ks(3, 3, 0), 14, [6, 6, 6])
    assert sorted(ck.tok for ck in c.ckpt_index.values()) == [4, 10]
    assert hit(c, ks(5, 3, 1), 20) == 10
    rs = c.admit(ks(4, 2, 2), 16, 1)
    assert rs.hit_tokens == 4 and rs.junction_tok == 8 and len(rs.state_slots) == 3
    c.schedule_prefill(rs, 6)
    c.end_step()
    assert c.ckpt_index[("p", 1)].tok == 8
    c.release(rs)
    c.end_step()
    c.check()
    assert hit(c, ks(5, 2, 3), 20) == 8


def test_trtllm_periodic_every_n_tokens_merged_per_hash_block():
    """N = 3, one 14-token forward: snapshots at 3, 6, 9, 12. Blocks of 4 tokens: 3 in block 0, 6 in block 1,
    9 and 12 in block 2 (one allocation of 2 snapshots; 12 is the one a lookup restores). Sharing 3 blocks
    restores 12, 2 blocks 6, 1 block 3."""
    c = cache("trtllm-periodic", snapshot_interval_tokens=3)
    serve_chunks(c, ks(3, 3, 0), 14, [BIG])
    assert c.stats.checkpoints_written == 4 and c.ckpt_pages == 4
    assert sorted(ck.tok for ck in c.ckpt_index.values()) == [3, 6, 12]
    assert [hit(c, ks(5, n, n), 20) for n in (3, 2, 1)] == [12, 6, 3]


def test_full_attention_restores_every_block_and_none_nothing():
    fa = cache("full-attention")
    serve_chunks(fa, ks(4, 4, 0), 16, [BIG])
    assert hit(fa, ks(5, 3, 1), 20) == 12 and not fa.ckpt_index
    no = cache("none")
    serve_chunks(no, ks(4, 4, 0), 16, [BIG])
    assert hit(no, ks(4, 4, 0), 16) == 0 and not no.mla_index and not no.ckpt_index
    assert no.stats.lookups == 0


def test_split_state_pool_caps_snapshots_apart_from_kv():
    """SGLang's pools: capacity 40 B, a quarter for states -> 10 B: 2 state slots of 4 B; the other 30 B: 7 KV
    pages of 4 B (4 tokens x 1 B). The running request holds one slot, so each new snapshot evicts the one
    before it, from the state pool only."""
    cfg = CacheConfig("sglang-no-buffer", 4, 4, 1, 4, 1, 40.0, state_pool_fraction=0.25, donate_final_state=True)
    assert (cfg.num_state_pages, cfg.num_pages, cfg.state_page_bytes, cfg.checkpoint_bytes) == (2, 7, 4, 4)
    c = HybridPrefixCache(cfg)
    serve_chunks(c, ks(3, 3, 0), 12, [4, 4, 4])  # snapshots at 4, 8, 12 and the donated state: 4 > 2 slots
    assert c.spool.evictions >= 2 and c.pool.evictions == 0 and c.spool.num_pages == 2
