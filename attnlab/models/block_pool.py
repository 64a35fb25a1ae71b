"""The block pool behind the paged KV cache (paged.py): K/V storage in fixed-size blocks, the free lists that keep a
sequence's blocks a run, reference counts, and the prefix keys by which blocks are shared.

A full block is keyed by a cryptographic hash (BLAKE2b) of its token ids chained with the previous block's key, so a
key names the whole prefix up to the block's end; a match is checked against the block's tokens and its parent key,
so no chosen input can alias another prefix (the class of vLLM's CVE-2025-25183, where Python's ``hash()`` keys could
be made to collide). The chain starts at a root key derived from a salt, so sequences with different salts never
share a block.
"""
from __future__ import annotations

import hashlib
import heapq
from array import array
from collections import OrderedDict

import torch

from attnlab.errors import AttnlabError

# Tokens per KV block, the default of every paged cache (the engine's EngineConfig.block_size, serve's --block-size):
# small enough that a sequence wastes at most 15 slots, large enough that a block table stays short.
KV_BLOCK_SIZE = 16


class OutOfBlocks(AttnlabError):
    """The pool has no free block left; the caller may wait for sequences to finish, or preempt one."""


class BlockPool:
    """K/V storage for every layer as (Hkv, n_blocks * block_size, D), plus the block manager."""

    def __init__(self, n_layers: int, n_blocks: int, block_size: int, n_kv_heads: int, head_dim: int,
                 dtype=torch.float32, device="cpu"):
        if n_blocks < 1 or block_size < 1:
            raise AttnlabError(f"a paged cache needs n_blocks >= 1 and block_size >= 1, got {n_blocks}, {block_size}")
        self.n_blocks, self.block_size = n_blocks, block_size
        shape = (n_kv_heads, n_blocks * block_size, head_dim)  # token slots in block order: a run is a view
        # Zeros: masked slots are still multiplied by 0, and uninitialised memory may hold NaN.
        self.k = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(n_layers)]
        self.v = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(n_layers)]
        self.ref = [0] * n_blocks
        self.key: list[bytes | None] = [None] * n_blocks  # prefix key of a full, registered block
        self.tokens: list[tuple | None] = [None] * n_blocks  # its token ids (a key hit is checked against them)
        self.by_key: dict[bytes, int] = {}
        self.children: dict[bytes, set[int]] = {}  # prefix key -> registered blocks that continue it
        self.parent: list[bytes | None] = [None] * n_blocks
        self._clean = list(range(n_blocks))  # free, no key: a min-heap (lazy: see _in_heap)
        self._in_heap = set(self._clean)  # the free blocks without a key
        self._cached: OrderedDict[int, None] = OrderedDict()  # free but keyed: evicted oldest first
        self.hits = self.lookups = 0  # prefix-cache statistics, in blocks

    @property
    def free_blocks(self) -> int:
        return len(self._in_heap) + len(self._cached)

    @property
    def used_blocks(self) -> int:
        return self.n_blocks - self.free_blocks

    @property
    def bytes_per_block(self) -> int:
        t = self.k[0]
        return 2 * len(self.k) * t.shape[0] * self.block_size * t.shape[2] * t.element_size()

    @property
    def nbytes(self) -> int:
        return self.bytes_per_block * self.n_blocks

    def allocate(self, after: int | None = None) -> int:
        """A free block for a sequence, chosen so that its blocks stay a run (read as a view, not copied):

        - growing (``after`` = the sequence's last block): the next block if it is free and has no key; once no
          block without a key is left anywhere, the next block even if it holds a cached prefix (some cached
          block must be evicted then, and this one keeps the run);
        - a first block (after=-1): the middle of the largest gap of free blocks without a key (room to grow in
          place; the gap's start when it begins at block 0); if there is no such gap of two or more, the same
          over every free block, cached ones included;
        - else the lowest free block without a key, else the oldest cached one (its prefix is evicted).

        Why: in a long-lived server the pool fills with cached prefixes; evicting oldest-first then scatters
        every new sequence over the pool, and a scattered row's keys are gathered block by block at every layer
        of every step."""
        b = None
        if after is not None and after >= 0 and after + 1 < self.n_blocks:
            nxt = after + 1
            if nxt in self._in_heap or (nxt in self._cached and not self._in_heap):
                b = nxt
        elif after == -1:
            b = self._gap_middle(self._in_heap)
            if b is None:
                b = self._gap_middle(self._in_heap.union(self._cached))
        if b is not None:
            self._take(b)
        else:
            b = self._pop_free()
        self.ref[b] = 1
        return b

    def _take(self, b: int) -> None:
        """Take free block b out of the free sets (a cached one loses its key: its prefix is evicted)."""
        if b in self._in_heap:
            self._in_heap.discard(b)  # its heap entry stays until popped (lazy)
        else:
            del self._cached[b]
            self.forget(b)

    def _pop_free(self) -> int:
        while self._clean:
            b = heapq.heappop(self._clean)
            if b in self._in_heap:  # entries taken out of order stay in the heap until popped
                self._in_heap.discard(b)
                return b
        if self._cached:
            b, _ = self._cached.popitem(last=False)
            self.forget(b)
            return b
        raise OutOfBlocks(f"the KV pool's {self.n_blocks} blocks of {self.block_size} tokens are all in use; "
                          "allocate more blocks, or wait for a sequence to finish")

    def _gap_middle(self, free) -> int | None:
        """The block in the middle of the longest run of blocks in ``free``, or None (no run of two or more)."""
        best_start, best_len, start = 0, 0, None
        for i in range(self.n_blocks + 1):
            inside = i < self.n_blocks and i in free
            if inside and start is None:
                start = i
            elif not inside and start is not None:
                if i - start > best_len:
                    best_start, best_len = start, i - start
                start = None
        if best_len < 2:
            return None
        return best_start + (best_len - 1) // 2 if best_start > 0 else best_start

    def incref(self, b: int) -> None:
        if self.ref[b] == 0:
            self._cached.pop(b, None)
        self.ref[b] += 1

    def decref(self, b: int) -> None:
        self.ref[b] -= 1
        assert self.ref[b] >= 0, "block freed twice"
        if self.ref[b] == 0:
            if self.key[b] is None:
                heapq.heappush(self._clean, b)
                self._in_heap.add(b)
            else:
                self._cached[b] = None

    def forget(self, b: int) -> None:
        if self.key[b] is not None and self.by_key.get(self.key[b]) == b:
            del self.by_key[self.key[b]]
            siblings = self.children.get(self.parent[b])
            if siblings is not None:
                siblings.discard(b)
                if not siblings:
                    del self.children[self.parent[b]]
        self.key[b] = self.tokens[b] = self.parent[b] = None

    def register(self, b: int, key: bytes, tokens: tuple, parent: bytes) -> None:
        if key in self.by_key or self.key[b] is not None:
            return  # an identical block is already cached (this one stays private), or this one is keyed
        self.key[b], self.tokens[b], self.parent[b] = key, tokens, parent
        self.by_key[key] = b
        self.children.setdefault(parent, set()).add(b)

    def find(self, key: bytes, tokens: tuple, parent: bytes) -> int | None:
        """The cached block continuing ``parent`` with exactly ``tokens`` (the chain is checked, not only the key)."""
        b = self.by_key.get(key)
        return b if b is not None and self.tokens[b] == tokens and self.parent[b] == parent else None

    def copy_block(self, src: int, dst: int, n: int | None = None) -> None:
        bs = self.block_size
        n = bs if n is None else n
        for t in self.k + self.v:
            t[:, dst * bs:dst * bs + n] = t[:, src * bs:src * bs + n]


def root_key(salt: str = "") -> bytes:
    """Where a sequence's chain of block keys starts: sequences share cached blocks only under the same salt."""
    return hashlib.blake2b(b"attnlab-prefix-root\0" + salt.encode("utf-8", "surrogatepass"), digest_size=16).digest()


def block_key(parent: bytes, tokens: tuple) -> bytes:
    """The key of a block: its tokens chained with the key of everything before it (the parent's key)."""
    return hashlib.blake2b(parent + array("q", tokens).tobytes(), digest_size=16).digest()
