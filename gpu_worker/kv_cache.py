"""Paged KV-cache bookkeeping in ids and counts (pure Python, no torch).

Blocks hold ``block_size`` tokens. A *full* block whose tokens are all computed gets a
chained content hash ``hash((parent_hash, tokens))`` and stays findable after it is freed,
so a later request with the same prefix reuses it (prefix caching). Free blocks wait in LRU
order; a cached free block is evicted only when a new block is needed and none is left.
"""
from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field


@dataclass(eq=False)
class Block:
    block_id: int
    ref_count: int = 0
    block_hash: int | None = None
    token_ids: tuple[int, ...] = ()   # kept for full blocks to rule out hash collisions


class BlockPool:
    """Owns every block: ref counts, the LRU free queue and the hash -> block map."""

    def __init__(self, num_blocks: int) -> None:
        if num_blocks < 1:
            raise ValueError(f"a KV cache needs at least one block, got {num_blocks}")
        self._free: OrderedDict[int, Block] = OrderedDict((i, Block(i)) for i in range(num_blocks))
        self._cached: dict[int, Block] = {}

    @property
    def num_free_blocks(self) -> int:
        return len(self._free)

    def lookup(self, block_hash: int, token_ids: tuple[int, ...]) -> Block | None:
        block = self._cached.get(block_hash)
        return block if block is not None and block.token_ids == token_ids else None

    def take_new(self, n: int) -> list[Block]:
        """Pop ``n`` least-recently-freed blocks, evicting their cached content."""
        assert n <= len(self._free), "caller must check num_free_blocks"
        blocks = [self._free.popitem(last=False)[1] for _ in range(n)]
        for block in blocks:
            self._evict(block)
            block.ref_count = 1
        return blocks

    def touch(self, blocks: Sequence[Block]) -> None:
        """Add a reference (a prefix hit); a block in the free queue leaves it."""
        for block in blocks:
            if block.ref_count == 0:
                del self._free[block.block_id]
            block.ref_count += 1

    def release(self, blocks: Sequence[Block]) -> None:
        """Drop a reference; blocks reaching zero join the LRU tail (still cached)."""
        for block in blocks:
            assert block.ref_count > 0, f"double free of block {block.block_id}"
            block.ref_count -= 1
            if block.ref_count == 0:
                self._free[block.block_id] = block

    def cache(self, block: Block, block_hash: int, token_ids: tuple[int, ...]) -> None:
        if block.block_hash is not None or block_hash in self._cached:  # content cached already: keep the first
            return
        block.block_hash, block.token_ids = block_hash, token_ids
        self._cached[block_hash] = block

    def _evict(self, block: Block) -> None:
        if block.block_hash is not None:
            if self._cached.get(block.block_hash) is block:
                del self._cached[block.block_hash]
            block.block_hash, block.token_ids = None, ()


@dataclass
class _ReqBlocks:
    blocks: list[Block] = field(default_factory=list)
    hashes: list[int] = field(default_factory=list)  # chained hashes of full, cached blocks


class KVCacheManager:
    """Per-request block tables over a :class:`BlockPool`."""

    def __init__(self, num_blocks: int, block_size: int, enable_prefix_caching: bool = True) -> None:
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        self.pool = BlockPool(num_blocks)
        self.num_total_blocks = num_blocks
        self._reqs: dict[str, _ReqBlocks] = {}
        self.prefix_queries = 0   # tokens looked up
        self.prefix_hits = 0      # tokens found

    @property
    def num_free_blocks(self) -> int:
        return self.pool.num_free_blocks

    @property
    def usage(self) -> float:
        return 1.0 - self.num_free_blocks / self.num_total_blocks

    def blocks_for(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    def get_computed_blocks(self, token_ids: Sequence[int]) -> tuple[list[Block], int]:
        """Longest cached prefix of full blocks; at least one token is always left to
        compute (its logits are needed)."""
        if not self.enable_prefix_caching:
            return [], 0
        bs, parent, hits = self.block_size, None, []
        for i in range((len(token_ids) - 1) // bs):
            chunk = tuple(token_ids[i * bs:(i + 1) * bs])
            parent = hash((parent, chunk))
            block = self.pool.lookup(parent, chunk)
            if block is None:
                break
            hits.append(block)
        self.prefix_queries += len(token_ids)
        self.prefix_hits += len(hits) * bs
        return hits, len(hits) * bs

    def allocate_slots(self, request_id: str, num_tokens_after: int,
                       new_computed_blocks: Sequence[Block] = ()) -> list[int] | None:
        """Make the request's table cover ``num_tokens_after`` tokens (computed + new +
        lookahead). Returns the whole block-id table, or None if the pool cannot (then
        nothing changed and the caller preempts)."""
        entry = self._reqs.get(request_id)
        have = (len(entry.blocks) if entry else 0) + len(new_computed_blocks)
        need = self.blocks_for(num_tokens_after) - have
        # A prefix hit on a free cached block removes it from the free queue too.
        hit_free = sum(1 for b in new_computed_blocks if b.ref_count == 0)
        if need > 0 and need + hit_free > self.num_free_blocks:
            return None
        if entry is None:
            entry = self._reqs[request_id] = _ReqBlocks()
        if new_computed_blocks:
            self.pool.touch(new_computed_blocks)
            entry.blocks.extend(new_computed_blocks)
            entry.hashes.extend(b.block_hash for b in new_computed_blocks)
        if need > 0:
            entry.blocks.extend(self.pool.take_new(need))
        return [b.block_id for b in entry.blocks]

    def cache_computed(self, request_id: str, token_ids: Sequence[int], num_computed: int) -> None:
        """Hash every full block whose tokens are all computed (drafts never count)."""
        entry = self._reqs.get(request_id)
        if not self.enable_prefix_caching or entry is None:
            return
        bs = self.block_size
        num_full = min(num_computed // bs, len(entry.blocks))
        parent = entry.hashes[-1] if entry.hashes else None
        for i in range(len(entry.hashes), num_full):
            chunk = tuple(token_ids[i * bs:(i + 1) * bs])
            parent = hash((parent, chunk))
            self.pool.cache(entry.blocks[i], parent, chunk)
            entry.hashes.append(parent)

    def trim(self, request_id: str, num_tokens: int) -> None:
        """Return blocks beyond what ``num_tokens`` needs (rejected draft slots)."""
        entry = self._reqs.get(request_id)
        if entry is None:
            return
        keep = max(self.blocks_for(num_tokens), len(entry.hashes))
        extra = entry.blocks[keep:]
        del entry.blocks[keep:]
        self.pool.release(list(reversed(extra)))

    def free(self, request_id: str) -> None:
        """Release all of a request's blocks; tail blocks are freed first so that shared
        prefix blocks stay cached longest."""
        entry = self._reqs.pop(request_id, None)
        if entry is not None:
            self.pool.release(list(reversed(entry.blocks)))

    def block_ids(self, request_id: str) -> list[int]:
        entry = self._reqs.get(request_id)
        return [b.block_id for b in entry.blocks] if entry else []

    def num_blocks_of(self, request_id: str) -> int:
        entry = self._reqs.get(request_id)
        return len(entry.blocks) if entry else 0
