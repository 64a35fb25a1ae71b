"""A decode step through a transformer block in two compiled calls (attnlab/kernels/block_step.cpp).

    pre  (compiled):  qkv = norm1(x) @ Wqkv                          one call
    mix  (Python):    rotate q, k; the cache stores k, v and attends  Attention.mix, the state's own code
    post (compiled):  h = x + attn @ Wo;  y = h + mlp(norm2(h))       one call

A forward whose tokens are all real (a decode step: one new token per row; a speculative verification: k + 1)
through a cache that says where its keys go (``decode_slots``: the contiguous and the paged KV cache) goes
further: pre, rotary, the cache's write and read (causal among the new tokens), and post in one call
(block_decode), the rotary angles computed once for every layer.

Why: once the weights stream at memory speed, a decode step of GPT-2 small spent ~2.2 ms of its ~20 in the ~390
small calls Python makes (norms, views, adds, GELU, 49 linears): measured here on a 64-wide 12-layer GPT-2 whose
arithmetic is next to nothing. The same parallel forward serves prefill and training: this path is taken only
for a few rows (a decode step: one new token per sequence, or a speculative verification's k+1) of an inference
call (no autograd) on a CPU with the compiled kernels, a block of softmax attention through a cache, with the
sdpa kernel and no ALiBi (a kernel under study is never replaced), and every linear in a layout the step can read
(nn.Linear; a DenseLinear whose measured path is ``few_rows`` or ``mv``, read by attnlab's product, or ``matmul``,
the (in, out) layout, handed to torch's product from C++; an Int8Linear on ``few_rows``). Anything else
(oneDNN's or MKL's packed layouts, torch's int8 kernel): ``step`` returns None and the block runs its ordinary
forward, the same function in torch's kernels.

The result is the block's forward computed in fp32 (a DenseLinear in the ``matmul`` layout multiplies in its
weight's dtype, through torch): it differs from the unfused path by rounding only (fp32: within ~1e-6 relative;
bf16 weights: closer to fp32 than the unfused path, whose intermediate activations are rounded to bf16).
"""
from __future__ import annotations

import contextlib

import torch
from torch import nn

from attnlab import kernels
from attnlab.models.attention import Attention, sdpa_attention
from attnlab.models.layers import MLP, RMSNorm
from attnlab.models.positional import Positional, Rope

_NONE = torch.empty(0)
# False: every block runs its forward (tests and benchmarks compare the two paths in one process). Process-wide:
# the engine runs in one thread (a server's engine thread), and the tracer that turns it off runs on its own.
ENABLED = True


def _linear(lin, widened: list) -> tuple | None:
    """(weight (out, in), fp32 scale or empty, bias or empty) as the compiled product takes them, or None."""
    if type(lin) is nn.Linear:
        w = lin.weight
        if w.dtype not in (torch.float32, torch.bfloat16) or not w.is_contiguous():
            return None
        return w, _NONE, _NONE if lin.bias is None else _wide(lin.bias, widened)
    path = getattr(lin, "path", None)
    if path == "matmul":  # DenseLinear's (in, out) layout: handed over as its (out, in) view, torch's product
        return lin.weight_t.t(), _NONE, _NONE if lin.bias is None else lin.bias
    if path not in ("few_rows", "mv"):  # oneDNN's or MKL's packed layout, torch's int8 kernel: not here
        return None
    return lin.weight, getattr(lin, "_scale32", _NONE), lin._bias32


def _wide(t: torch.Tensor, widened: list) -> torch.Tensor:
    """``t`` in fp32 for the kernel, which computes in fp32: a narrower tensor is widened once here, not at every
    step (a bf16 GPT-2 small spent ~0.5 ms a token widening its norms' weights), and noted in ``widened`` so the
    plan is rebuilt when the tensor changes (in place, or its data swapped)."""
    if t.dtype == torch.float32 or not t.numel():
        return t
    widened.append((t, _stamp(t)))
    return t.detach().float().contiguous()


def _stamp(t: torch.Tensor) -> tuple:
    """What changes when a tensor is written in place (its version), or its data swapped. Not seen: an in-place
    change through ``.data`` (no version bump) or to an inference tensor (no version counter): call ``forget``
    after one of those."""
    return (None if t.is_inference() else t._version), t.data_ptr(), t.dtype


def _norm(norm, widened: list) -> tuple | None:
    """(weight, bias or empty, is_rms, eps) or None."""
    if isinstance(norm, RMSNorm):
        return _wide(norm.weight, widened), _NONE, True, norm.eps
    if type(norm) is nn.LayerNorm and norm.elementwise_affine and norm.weight.dim() == 1:
        return _wide(norm.weight, widened), _NONE if norm.bias is None else _wide(norm.bias, widened), False, norm.eps
    return None


def _parts(block) -> tuple:
    """The modules and tensors a plan is built from, read from the modules' own dicts (nn.Module.__getattr__ is
    slow enough to show in a step): their identities say whether a kept plan still holds."""
    mods = block._modules
    attn, mlp = mods["attn"], mods.get("mlp")
    if type(attn) is not Attention or type(mlp) is not MLP:
        return ()
    leaves = (mods["attn_norm"], mods["mlp_norm"], *attn._modules.values(), *mlp._modules.values())
    return (*leaves, *(t for m in leaves for t in (*m._parameters.values(), *m._buffers.values())))


def plan(block) -> tuple | None:
    """The compiled calls' arguments for this block (norm + q/k/v; output projection + norm + MLP), or None where
    the compiled step does not apply. Kept on the block between steps, and rebuilt when any module or tensor it was
    built from has been replaced (set_precision swaps the Linears, a checkpoint load may swap parameters; a change
    of dtype or device in place is seen by the kernel itself, which reads the tensors it is given)."""
    parts = _parts(block)
    key = tuple(map(id, parts))  # the kept plan holds every part, so no id can be reused while it lives
    kept = block.__dict__.get("_step_plan")
    if kept is not None and kept[0] == key and all(_stamp(t) == stamp for t, stamp in kept[3]):
        return kept[1]
    widened = []  # (tensor, stamp) of each tensor the plan holds an fp32 copy of
    built = _build(block, widened) if parts else None
    block.__dict__["_step_plan"] = (key, built, parts, widened)
    return built


@contextlib.contextmanager
def disabled():
    """Every block runs its forward inside (the cost model's tracer counts the ops of that forward: it cannot see
    into a compiled call)."""
    global ENABLED
    was, ENABLED = ENABLED, False
    try:
        yield
    finally:
        ENABLED = was


def forget(model: nn.Module) -> None:
    """Drop every kept plan under ``model`` (after swapping its modules: a plan holds the tensors it was built
    from; or after changing a narrow norm weight in a way _stamp cannot see)."""
    for m in model.modules():
        m.__dict__.pop("_step_plan", None)


def _build(block, widened: list) -> tuple | None:
    attn, mlp = block.attn, block.mlp
    if attn.kernel is not sdpa_attention or not attn.causal:  # the compiled attention is causal softmax
        return None
    n1, n2 = _norm(block.attn_norm, widened), _norm(block.mlp_norm, widened)
    qkv, wo, w1, w2 = (_linear(m, widened) for m in (attn.wqkv, attn.wo, mlp.w1, mlp.w2))
    w3 = _linear(mlp.w3, widened) if mlp.gated else (_NONE, _NONE, _NONE)
    if None in (n1, n2, qkv, wo, w1, w2, w3):
        return None
    return (*n1, *qkv), (*wo, *n2, *w1, *w2, *w3)


def usable(x: torch.Tensor, pos_enc, state) -> bool:
    """The checks that hold for the whole step (once per forward, not per block)."""
    return (ENABLED and state is not None and x.device.type == "cpu" and x.shape[0] * x.shape[1] <= kernels.MAX_ROWS
            and x.dtype in (torch.float32, torch.bfloat16) and not torch.is_grad_enabled()
            and pos_enc.alibi_slopes is None and kernels.native() is not None)


def rotation(pos_enc, positions: torch.Tensor, B: int, T: int) -> tuple | None:
    """(cos, sin) (B*T, D) fp32 of rotary positions, computed once for every layer, or two empty tensors where the
    positions do not rotate q and k (learned, sinusoidal, none); None for anything else (the step then leaves
    rotation to Attention.mix)."""
    if type(pos_enc).rotate is Positional.rotate:
        return _NONE, _NONE
    if type(pos_enc) is not Rope or positions.shape != (B, T):
        return None
    cos, sin = pos_enc.cos_sin(positions, torch.float32)  # (B, 1, T, D)
    return cos.reshape(B * T, -1).contiguous(), sin.reshape(B * T, -1).contiguous()  # (B*T, D)


def step(block, x: torch.Tensor, positions, pos_enc, state, rot: tuple | None = None) -> torch.Tensor | None:
    """block(x, positions, pos_enc, state) for x (B, T, dim) in compiled calls, or None (see the module). With
    ``rot`` (rotation(): a decode step) and a cache that says where its keys go (decode_slots), one call does the
    whole block (block_decode); otherwise two, around Attention.mix."""
    attn = block._modules["attn"]
    # read every step: a kept plan's identities do not cover these attributes
    if block.training and block.dropout.p > 0:
        return None
    if getattr(attn, "kernel", None) is not sdpa_attention or not getattr(attn, "causal", False):
        return None
    p = plan(block)
    if p is None:
        return None
    pre, post = p
    mod = kernels.native()
    B, T, dim = x.shape
    x2 = x.reshape(B * T, dim)  # (B*T, dim)
    slots = None if rot is None else getattr(state, "decode_slots", lambda _: None)(attn.layer_idx)
    if slots is not None:
        return mod.block_decode(x2, *pre, *rot, *slots, attn.n_heads, attn.n_kv_heads, attn.head_dim, attn.scale,
                                *post).view(B, T, dim)
    # q, k, v in the model's activation dtype, as its forward makes them (a bf16 model's bf16 cache is then read
    # as it is, not widened whole for fp32 queries)
    qkv = mod.block_pre(x2, *pre).view(B, T, -1).to(x.dtype)
    mixed = attn.mix(qkv, positions, pos_enc, state).reshape(B * T, -1)  # (B*T, H*D)
    return mod.block_post(x2, mixed, *post).view(B, T, dim)
