"""How a KV cache attends for a forward: attnlab's compiled decode kernel over the keys where they lie, or the
model's kernel row by row over exactly each row's keys. Shared by the contiguous cache (state.py) and the paged one
(paged.py)."""
from __future__ import annotations

import torch

from attnlab import kernels
from attnlab.kernels import paths

NO_TABLE = torch.empty(0, dtype=torch.long)
DECODE_DTYPES = (torch.float32, torch.bfloat16)  # the cache dtypes attnlab's decode attention reads


def fused_decode(q, k_store, v_store, strides: tuple, lens, attend, tables=None, block_size: int = 0):
    """A decode step's attention (one new query per row) for every row and head in one call of attnlab's kernel
    (kernels/decode_attention.cpp), reading each row's keys where they lie: row b, head h, position j at
    store + b * strides[0] + h * strides[1] + slot(j) * strides[2], slot(j) = j, or through ``tables`` (B, n) of
    ``block_size``-token blocks. Returns (B, H, 1, D) fp32, or None where it does not apply, and the caller attends
    with the layer's own kernel: a kernel under study or ALiBi (``attend.decode_scale`` is None), more than one query
    per row, or off the CPU, by design; keys neither fp32 nor bf16, or no compiled kernel, as a counted fallback
    (kernels.paths).
    Why: a ragged batch went row by row through SDPA (one call per row and layer), and a paged row whose blocks are
    not a run was copied before each call."""
    scale = attend.decode_scale
    if scale is None or q.shape[2] != 1 or k_store.device.type != "cpu":
        return None
    if k_store.dtype not in DECODE_DTYPES:
        paths.fell_back("decode_attention", f"a {str(k_store.dtype).removeprefix('torch.')} cache")
        return None
    mod = kernels.native()
    if mod is None:
        paths.fell_back("decode_attention", "no compiled kernels here")
        return None
    B, H, _, D = q.shape
    lens = lens if isinstance(lens, torch.Tensor) else torch.as_tensor(lens, dtype=torch.long)
    out = mod.decode_attention(q.reshape(B, H, D).float().contiguous(), k_store, v_store, *strides,
                               NO_TABLE if tables is None else tables, block_size, lens, k_store.shape[-3], scale)
    paths.ran("decode_attention")
    return out.view(B, H, 1, D)


def per_row_attention(q, k_rows, v_rows, ends: list[int], news: list[int], attend) -> torch.Tensor:
    """Attention for a ragged batch, one kernel call per row over exactly its own keys.

    q (B, H, T, D); k_rows(b) / v_rows(b) give row b's keys (1, Hkv, >= ends[b], D) (a tensor indexed by row,
    or a function); row b's news[b] real queries are its last ones. One padded call would read every row's
    keys up to the longest row's length (about twice the keys the rows own for lengths spread evenly); per-row
    calls read each key once."""
    out = torch.zeros_like(q)
    for b, (end, n) in enumerate(zip(ends, news)):
        kb = k_rows[b:b + 1, :, :end] if torch.is_tensor(k_rows) else k_rows(b, end)
        vb = v_rows[b:b + 1, :, :end] if torch.is_tensor(v_rows) else v_rows(b, end)
        out[b:b + 1, :, :n] = attend(q[b:b + 1, :, :n], kb, vb)
    return out
