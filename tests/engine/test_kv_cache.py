import pytest

from gpu_worker.kv_cache import KVCacheManager


def test_allocates_on_demand_and_frees_everything():
    kv = KVCacheManager(num_blocks=8, block_size=4)
    assert kv.allocate_slots("a", 5) is not None     # 2 blocks
    assert kv.num_free_blocks == 6
    kv.allocate_slots("a", 9)                          # grows to 3
    assert kv.num_blocks_of("a") == 3 and kv.num_free_blocks == 5
    kv.free("a")
    assert kv.num_free_blocks == 8


def test_refuses_without_side_effects_when_full():
    kv = KVCacheManager(num_blocks=4, block_size=4)
    assert kv.allocate_slots("a", 12) is not None
    assert kv.allocate_slots("b", 8) is None
    assert kv.num_free_blocks == 1 and kv.num_blocks_of("b") == 0


def test_full_blocks_are_shared_by_prefix_with_ref_counts():
    kv = KVCacheManager(num_blocks=10, block_size=4)
    prompt = list(range(10))                # 2 full blocks + 2 tokens
    kv.allocate_slots("a", 10)
    kv.cache_computed("a", prompt, 10)
    hits, n = kv.get_computed_blocks(prompt + [99])
    assert n == 8 and len(hits) == 2
    table_b = kv.allocate_slots("b", 11, hits)
    assert table_b[:2] == kv.block_ids("a")[:2]
    assert [b.ref_count for b in hits] == [2, 2]
    kv.free("a")
    assert [b.ref_count for b in hits] == [1, 1]
    kv.free("b")
    assert kv.num_free_blocks == 10


def test_hit_needs_equal_tokens_and_leaves_one_token_to_compute():
    kv = KVCacheManager(num_blocks=10, block_size=4)
    prompt = list(range(8))
    kv.allocate_slots("a", 8)
    kv.cache_computed("a", prompt, 8)
    # The whole prompt is cached, but its last token must still run to give logits.
    assert kv.get_computed_blocks(prompt)[1] == 4
    assert kv.get_computed_blocks([0, 1, 2, 5, 4, 5, 6, 7, 8])[1] == 0


def test_freed_cached_blocks_are_reused_then_evicted_lru():
    kv = KVCacheManager(num_blocks=4, block_size=2)
    kv.allocate_slots("a", 4)
    kv.cache_computed("a", [1, 2, 3, 4], 4)
    kv.free("a")
    assert kv.get_computed_blocks([1, 2, 3, 4, 5])[1] == 4   # still cached after free
    kv.allocate_slots("b", 8)                                  # needs every block: evicts
    kv.free("b")
    assert kv.get_computed_blocks([1, 2, 3, 4, 5])[1] == 0


def test_prefix_cache_off_never_hits():
    kv = KVCacheManager(num_blocks=4, block_size=2, enable_prefix_caching=False)
    kv.allocate_slots("a", 4)
    kv.cache_computed("a", [1, 2, 3, 4], 4)
    assert kv.get_computed_blocks([1, 2, 3, 4, 5]) == ([], 0)


def test_trim_returns_draft_blocks_but_keeps_cached_ones():
    kv = KVCacheManager(num_blocks=8, block_size=4)
    kv.allocate_slots("a", 13)            # 4 blocks, e.g. 9 tokens + 4 drafts
    kv.cache_computed("a", list(range(9)), 9)
    kv.trim("a", 10)
    assert kv.num_blocks_of("a") == 3 and kv.num_free_blocks == 5


def test_rejects_empty_pool():
    with pytest.raises(ValueError):
        KVCacheManager(num_blocks=0, block_size=16)
