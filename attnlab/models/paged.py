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

The pool, its free lists and its keys are block_pool.py's.
"""
from __future__ import annotations

import torch

from attnlab.errors import AttnlabError
from attnlab.models.block_pool import BlockPool, OutOfBlocks, block_key, root_key
from attnlab.models.cache_attention import DECODE_DTYPES, fused_decode, per_row_attention
from attnlab.models.state import Rows, as_positions


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

    def attention(self, layer: int, q, k, v, attend):
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
            out = fused_decode(q, pk, pv, (0, pk.stride(0), pk.stride(1)), self._ends, attend, self._table_tensor(), bs)
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

        return per_row_attention(q, rows_of(pk), rows_of(pv), ends, news, attend)

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
