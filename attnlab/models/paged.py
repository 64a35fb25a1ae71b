"""Paged KV cache: fixed-size blocks from one pool, a block table per sequence, prefix sharing by block.

Contiguous caches preallocate max_len slots per sequence; most of it is never used when sequences end at
different lengths. Here (after vLLM's PagedAttention, Kwon et al. 2023, and nano-vllm's block manager) every
layer's keys live in one pool of ``n_blocks`` blocks of ``block_size`` tokens; sequence b owns the blocks
listed in its table, so it holds ceil(pos[b] / block_size) blocks, never more. A finished sequence's blocks go
back to the free list and the next sequence reuses them.

Prefix sharing: a full block is keyed by a cryptographic hash (BLAKE2b) of its token ids chained with the
previous block's key, so a key names the whole prefix up to the block's end; a match is checked against the
block's tokens and its parent key, so no chosen input can alias another prefix (the class of vLLM's
CVE-2025-25183, where Python's ``hash()`` keys could be made to collide). The chain starts at a root key derived
from a salt: sequences with different salts (tenants, a request's ``cache_salt``) never share a block, so one
client cannot learn another's prompt from which of its guesses come back cached. Blocks are reference-counted; a new sequence whose prompt
starts with cached blocks takes them (no prefill for those tokens). Where its prompt diverges inside a cached
block, the block is copied and the matching part reused (copy on divergence); a write into a block that
other sequences share copies it first (copy on write). A freed block keeps its key until it is reallocated,
so a later request can still find it (free blocks without a key are handed out first); a finished
sequence's last, partly filled block is kept the same way, so a chat's next turn reuses every token.
"""
from __future__ import annotations

import hashlib
import heapq
from array import array
from collections import OrderedDict

import torch

from attnlab.errors import AttnlabError
from attnlab.models.cache_attention import DECODE_DTYPES, fused_decode, per_row_attention
from attnlab.models.state import Rows, as_positions


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


class PagedKVCache(Rows):
    """A batch of sequences whose keys and values live in a shared ``BlockPool``."""

    def __init__(self, pool: BlockPool):
        self.pool = pool
        self.pos = torch.zeros(0, dtype=torch.long)
        self.tables: list[list[int]] = []
        self.history: list[list[int]] = []  # token ids consumed per row (block keys are computed from them)
        self.keys: list[list[bytes]] = []  # per row: keys of its full blocks, in order
        self.roots: list[bytes] = []  # per row: the salted key its chain starts from
        self._lengths, self._T = None, 0

    @property
    def block_size(self) -> int:
        return self.pool.block_size

    @property
    def nbytes(self) -> int:
        """Bytes of the blocks this batch holds (a block shared by two rows counted once)."""
        return len({b for t in self.tables for b in t}) * self.pool.bytes_per_block

    @property
    def bytes_per_token(self) -> int:
        return self.pool.bytes_per_block // self.block_size

    @property
    def used_bytes(self) -> int:
        return self.nbytes

    # -- sequences ---------------------------------------------------------------------------------------
    def add_sequence(self, prompt: list[int] | None = None, salt: str = "") -> int:
        """A new row; with a prompt, its longest cached prefix under ``salt`` is taken from the pool (pos says how
        much). At least the prompt's last token is left to run, since its logits are what the caller needs."""
        self.tables.append([])
        self.history.append([])
        self.keys.append([])
        self.roots.append(root_key(salt))
        self.pos = torch.cat([self.pos, torch.zeros(1, dtype=torch.long)])
        row = self.batch_size - 1
        if prompt:
            self._reuse_prefix(row, list(prompt)[:len(prompt) - 1])
        return row

    def _reuse_prefix(self, row: int, prompt: list[int]) -> None:
        pool, bs = self.pool, self.block_size
        parent, n = self.roots[row], 0
        while n + bs <= len(prompt):  # whole blocks, by key
            chunk = tuple(prompt[n:n + bs])
            key = block_key(parent, chunk)
            pool.lookups += 1
            b = pool.find(key, chunk, parent)
            if b is None:
                break
            pool.hits += 1
            pool.incref(b)
            self.tables[row].append(b)
            self.keys[row].append(key)
            parent, n = key, n + bs
        rest = prompt[n:n + bs]
        if rest:  # copy on divergence: a cached block that starts like the rest of the prompt
            best, best_m = None, 0
            for b in sorted(pool.children.get(parent, ())):
                toks = pool.tokens[b]
                m = 0
                while m < min(len(rest), len(toks)) and toks[m] == rest[m]:
                    m += 1
                if m > best_m:
                    best, best_m = b, m
            if best is not None:
                pool.incref(best)  # hold it while copying: allocate() must not evict it
                try:
                    dst = pool.allocate(self.tables[row][-1] if self.tables[row] else -1)
                except OutOfBlocks:
                    dst = None  # no room for the copy: those tokens are prefilled instead
                finally:
                    pool.decref(best)
                if dst is not None:
                    pool.copy_block(best, dst, best_m)
                    self.tables[row].append(dst)
                    n += best_m
        self.history[row] = prompt[:n]
        self.pos[row] = n

    def release(self, row: int) -> None:
        """Free a row's blocks. A last, partly filled block of its own stays findable by its tokens (keyed
        like a full block, but shorter), so the next turn of a chat reuses all of it by copy."""
        p, bs, table = int(self.pos[row]), self.block_size, self.tables[row]
        if p % bs and len(table) > p // bs and self.pool.ref[table[p // bs]] == 1:
            keys = self.keys[row][:p // bs]
            tail = tuple(self.history[row][p - p % bs:p])
            parent = keys[-1] if keys else self.roots[row]
            self.pool.register(table[p // bs], block_key(parent, tail), tail, parent)
        for b in table:
            self.pool.decref(b)
        self._drop([row])

    def _drop(self, rows) -> None:
        gone = set(rows)
        keep = [r for r in range(self.batch_size) if r not in gone]
        self.tables = [self.tables[r] for r in keep]
        self.history = [self.history[r] for r in keep]
        self.keys = [self.keys[r] for r in keep]
        self.roots = [self.roots[r] for r in keep]
        self.pos = self.pos[keep]

    def take(self, rows) -> "PagedKVCache":
        rows = list(rows)
        out = PagedKVCache(self.pool)
        out.tables = [self.tables[r] for r in rows]
        out.history = [self.history[r] for r in rows]
        out.keys = [self.keys[r] for r in rows]
        out.roots = [self.roots[r] for r in rows]
        out.pos = self.pos[rows].clone()
        self._drop(rows)
        return out

    def extend(self, other: "PagedKVCache") -> None:
        if other.pool is not self.pool:
            raise AttnlabError("paged caches can only be joined when they share one block pool")
        self.tables += other.tables
        self.history += other.history
        self.keys += other.keys
        self.roots += other.roots
        self.pos = torch.cat([self.pos, other.pos])
        other.tables, other.history, other.keys, other.roots, other.pos = [], [], [], [], other.pos[:0]

    def rollback(self, pos) -> None:
        new = as_positions(pos, self.batch_size)
        if bool((new < 0).any()) or bool((new > self.pos).any()):
            raise AttnlabError(f"cannot roll a paged cache at {self.pos.tolist()} back to {new.tolist()}")
        bs = self.block_size
        for r in range(self.batch_size):
            p = int(new[r])
            keep = -(-p // bs)
            for b in self.tables[r][keep:]:
                self.pool.decref(b)
            self.tables[r] = self.tables[r][:keep]
            self.history[r] = self.history[r][:p]
            self.keys[r] = self.keys[r][:p // bs]
        self.pos = new

    # -- a forward ---------------------------------------------------------------------------------------
    def _writable(self, row: int, i: int) -> None:
        """Block i of a row is about to be written: copy it if shared, unkey it if keyed."""
        pool, b = self.pool, self.tables[row][i]
        if pool.ref[b] > 1:
            dst = pool.allocate(self.tables[row][i - 1] if i else -1)
            pool.copy_block(b, dst)
            pool.decref(b)
            self.tables[row][i] = dst
        elif pool.key[b] is not None:
            pool.forget(b)  # its contents are about to change: drop its key

    def begin(self, tokens, lengths=None):
        positions = self._begin(tokens, lengths)
        bs, B, T = self.block_size, self.batch_size, self._T
        n_new = [T if self._lengths is None else int(self._lengths[r]) for r in range(B)]
        host = tokens.tolist()
        write_slots, write_src = [], []
        try:
            for r in range(B):
                p = int(self.pos[r])
                if p % bs:
                    self._writable(r, p // bs)
                while len(self.tables[r]) * bs < p + n_new[r]:
                    table = self.tables[r]
                    table.append(self.pool.allocate(table[-1] if table else -1))
                table = self.tables[r]
                for i in range(n_new[r]):
                    write_slots.append(table[(p + i) // bs] * bs + (p + i) % bs)
                    write_src.append(r * T + i)
        except OutOfBlocks:
            self._trim_tables()
            raise
        self._pending = [host[r][:n_new[r]] for r in range(B)]
        dev = self.pool.k[0].device
        ends = (self.pos + torch.tensor(n_new, dtype=torch.long)).tolist()
        reads = []  # per row: the first slot of a run of consecutive blocks (a view), or its block ids (a copy)
        for r in range(B):
            nb = -(-ends[r] // bs)
            t = self.tables[r][:nb]
            run = t[-1] - t[0] == nb - 1 and all(t[i] == t[0] + i for i in range(nb))
            reads.append(t[0] * bs if run else torch.tensor(t, device=dev))
        src = None if self._lengths is None else torch.tensor(write_src, device=dev)
        self._plan = (torch.tensor(write_slots, device=dev), src, reads, ends, n_new)
        self._tables = None  # the block tables as a tensor, built by the first layer that needs them this step
        self._ends = torch.tensor(ends, dtype=torch.long)
        return positions

    def _table_tensor(self) -> torch.Tensor:
        """(B, max blocks) int64: each row's blocks holding its keys after this forward (0-padded), once a step."""
        if self._tables is None:
            bs, ends = self.block_size, self._plan[3]
            nb = [-(-e // bs) for e in ends]
            self._tables = torch.tensor([t[:n] + [0] * (max(nb) - n) for t, n in zip(self.tables, nb)],
                                        dtype=torch.long)  # (B, max blocks)
        return self._tables

    def decode_slots(self, layer: int) -> tuple | None:
        """As KVCache.decode_slots, through the pool: stride_b = 0, the write slots and block tables absolute."""
        write_slots, write_src = self._plan[:2]
        pk, pv = self.pool.k[layer], self.pool.v[layer]
        if (write_src is not None or pk.device.type != "cpu" or pk.dtype not in DECODE_DTYPES or pk.stride(-1) != 1
                or pv.stride() != pk.stride()):
            return None
        return pk, pv, 0, pk.stride(0), pk.stride(1), write_slots, self._table_tensor(), self.block_size, self._ends

    def _trim_tables(self) -> None:
        bs = self.block_size
        for r in range(self.batch_size):
            keep = -(-int(self.pos[r]) // bs)
            for b in self.tables[r][keep:]:
                self.pool.decref(b)
            self.tables[r] = self.tables[r][:keep]

    def attention(self, layer: int, q, k, v, run):
        write_slots, write_src, reads, ends, news = self._plan
        pk, pv = self.pool.k[layer], self.pool.v[layer]
        B, Hkv, T, D = k.shape
        new_k = k.permute(1, 0, 2, 3).reshape(Hkv, B * T, D)  # (Hkv, B*T, D)
        new_v = v.permute(1, 0, 2, 3).reshape(Hkv, B * T, D)
        if write_src is not None:
            new_k, new_v = new_k[:, write_src], new_v[:, write_src]
        pk[:, write_slots] = new_k.to(pk.dtype)  # index_put does not convert (the compiled step's k is fp32)
        pv[:, write_slots] = new_v.to(pv.dtype)
        bs = self.block_size
        if T == 1:  # a decode step: every row's keys read through its block table, none copied
            out = fused_decode(q, pk, pv, (0, pk.stride(0), pk.stride(1)), self._ends, run, self._table_tensor(), bs)
            if out is not None:
                return out

        def rows_of(pool):
            def keys(b, end):  # (1, Hkv, end, D): a view of a run, else the row's blocks copied in order
                where = reads[b]
                if isinstance(where, int):
                    return pool[None, :, where:where + end]
                blocks = pool.view(Hkv, -1, bs, D).index_select(1, where)  # (Hkv, nb, bs, D)
                return blocks.view(1, Hkv, -1, D)[:, :, :end]
            return keys

        return per_row_attention(q, rows_of(pk), rows_of(pv), ends, news, run)

    def commit(self) -> None:
        super().commit()
        bs, pool = self.block_size, self.pool
        for r, new in enumerate(self._pending):
            hist = self.history[r]
            hist.extend(new)
            keys = self.keys[r]
            while (len(keys) + 1) * bs <= len(hist):  # newly full blocks get their prefix key
                i = len(keys)
                chunk = tuple(hist[i * bs:(i + 1) * bs])
                parent = keys[-1] if keys else self.roots[r]
                key = block_key(parent, chunk)
                keys.append(key)
                pool.register(self.tables[r][i], key, chunk, parent)
        self._pending = []
