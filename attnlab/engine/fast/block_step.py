"""A decode step through a transformer block in compiled calls (attnlab/kernels/block_step.cpp), applied from
outside the model: ``BlockRunner`` is the ``run_blocks`` a LanguageModel's forward accepts (models/backbone.py).

    pre  (compiled):  qkv = norm1(x) @ Wqkv                          one call
    mix  (Python):    rotate q, k; the cache stores k, v and attends  Attention.mix, the state's own code
    post (compiled):  h = x + attn @ Wo;  y = h + mlp(norm2(h))       one call

A forward whose tokens are all real (a decode step: one new token per row; a speculative verification: k + 1)
through a cache that says where its keys go (``decode_slots``: the contiguous and the paged KV cache) goes
further: pre, rotary, the cache's write and read (causal among the new tokens), and post in one call
(block_decode), the rotary angles computed once for every layer.

Why: once the weights stream at memory speed, the hundreds of small calls Python makes per decode step (norms,
views, adds, GELU, every linear) cost a visible share of the step (docs/engine.md has the figures). The same
parallel forward serves prefill and training: this path is taken only for a few rows (kernels.MAX_ROWS) of an
inference call (no autograd) on a CPU with the compiled kernels, a block of softmax attention through a cache, with
the sdpa kernel and no ALiBi (a kernel under study is never replaced). A weight takes part through its public
``step_operands()`` (engine/quantize.py's DenseLinear and Int8Linear) or as a plain nn.Linear; a weight whose layout
the kernel cannot read (oneDNN's or MKL's packed ones, torch's int8 kernel) makes its block run its ordinary forward,
the same function in torch's kernels. Which path each step took is counted (kernels.paths).

The result is the block's forward computed in fp32 (a weight in the (in, out) layout multiplies in its own dtype,
through torch): it differs from the unfused path by rounding only (fp32: within ~1e-6 relative; bf16 weights:
closer to fp32 than the unfused path, whose intermediate activations are rounded to bf16).
"""
from __future__ import annotations

import torch
from torch import nn

from attnlab import kernels
from attnlab.kernels import paths
from attnlab.models.attention import Attention, sdpa_attention
from attnlab.models.layers import MLP, RMSNorm
from attnlab.models.positional import Positional, Rope

_NONE = torch.empty(0)
# Why a block runs its forward on purpose (the step is not for it), as against a fallback (kernels.paths).
_BY_DESIGN = ("not a softmax attention block", "kernel under study", "dropout in training")


def _linear(lin, widened: list) -> tuple | str:
    """(weight (out, in), fp32 scale or empty, bias or empty) as the compiled product takes them, or why not."""
    if type(lin) is nn.Linear:
        w = lin.weight
        if w.dtype not in (torch.float32, torch.bfloat16) or not w.is_contiguous():
            return f"a {str(w.dtype).removeprefix('torch.')} or non-contiguous nn.Linear weight"
        return w, _NONE, _NONE if lin.bias is None else _wide(lin.bias, widened)
    operands = getattr(lin, "step_operands", None)
    if operands is None:
        return f"a {type(lin).__name__} weight, which has no step_operands()"
    got = operands()
    return got if got is not None else f"a {type(lin).__name__} in the {getattr(lin, 'path', '?')} layout"


def _wide(t: torch.Tensor, widened: list) -> torch.Tensor:
    """``t`` in fp32 for the kernel, which computes in fp32: a narrower tensor is widened once here, not at every
    step (widening every norm's weight at every step is a visible share of a bf16 step), and noted in ``widened`` so the
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


def _norm(norm, widened: list) -> tuple | str:
    """(weight, bias or empty, is_rms, eps) or why not."""
    if isinstance(norm, RMSNorm):
        return _wide(norm.weight, widened), _NONE, True, norm.eps
    if type(norm) is nn.LayerNorm and norm.elementwise_affine and norm.weight.dim() == 1:
        return _wide(norm.weight, widened), _NONE if norm.bias is None else _wide(norm.bias, widened), False, norm.eps
    return f"a {type(norm).__name__} norm"


def _parts(block) -> tuple:
    """The modules and tensors a plan is built from, read from the modules' own dicts (nn.Module.__getattr__ is
    slow enough to show in a step): their identities say whether a kept plan still holds."""
    mods = block._modules
    attn, mlp = mods["attn"], mods.get("mlp")
    if type(attn) is not Attention or type(mlp) is not MLP:
        return ()
    leaves = (mods["attn_norm"], mods["mlp_norm"], *attn._modules.values(), *mlp._modules.values())
    return (*leaves, *(t for m in leaves for t in (*m._parameters.values(), *m._buffers.values())))


def _build(block, widened: list) -> tuple | str:
    """The compiled calls' arguments for ``block``, or why it runs its forward."""
    attn, mlp = block.attn, block.mlp
    got = (_norm(block.attn_norm, widened), _norm(block.mlp_norm, widened),
           *(_linear(m, widened) for m in (attn.wqkv, attn.wo, mlp.w1, mlp.w2)),
           _linear(mlp.w3, widened) if mlp.gated else (_NONE, _NONE, _NONE))
    why = next((g for g in got if isinstance(g, str)), None)
    if why is not None:
        return why
    n1, n2, qkv, wo, w1, w2, w3 = got
    return (*n1, *qkv), (*wo, *n2, *w1, *w2, *w3)


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


class BlockRunner:
    """Runs a backbone's blocks, each decode-sized call through the compiled step where the block allows it
    (``run_blocks`` of LanguageModel.forward). It keeps each block's plan (the compiled calls' arguments) between
    steps, and rebuilds it when any module or tensor it was built from has been replaced (a checkpoint load may swap
    parameters; a change of dtype or device in place is seen by the kernel itself, which reads the tensors it is
    given). A kept plan holds the tensors it was built from: call ``forget`` after swapping a model's modules."""

    def __init__(self):
        self._plans: dict = {}  # id(block) -> (key, plan or why not, parts, widened)

    def __call__(self, blocks, x: torch.Tensor, positions, pos_enc, state) -> torch.Tensor:
        why, fallback = self._why_not(x, pos_enc, state)
        if why is not None:
            if fallback:
                paths.fell_back("block step", why, len(blocks))
            elif why != "prefill":
                paths.ran(f"block forward: {why}", len(blocks))
            for block in blocks:
                x = block(x, positions, pos_enc, state)
            return x
        rot = rotation(pos_enc, positions, *x.shape[:2])
        for block in blocks:
            y = self.step(block, x, positions, pos_enc, state, rot)
            x = block(x, positions, pos_enc, state) if y is None else y
        return x

    @staticmethod
    def _why_not(x: torch.Tensor, pos_enc, state) -> tuple[str | None, bool]:
        """(why no block of this forward can take the compiled step, whether that is a fallback rather than by
        design); (None, False) where each block may. A call without a state, with autograd on, or of more than
        kernels.MAX_ROWS rows (a prefill) runs the parallel forward by design and is not counted ("prefill"); a
        short prompt of a few rows is decode-sized and may take the step."""
        if state is None or x.shape[0] * x.shape[1] > kernels.MAX_ROWS or torch.is_grad_enabled():
            return "prefill", False
        if x.device.type != "cpu":
            return "not on a CPU", False
        if pos_enc.alibi_slopes is not None:
            return "ALiBi", False
        if x.dtype not in (torch.float32, torch.bfloat16):
            return f"{str(x.dtype).removeprefix('torch.')} activations", True
        if kernels.native() is None:
            return "no compiled kernels here", True
        return None, False

    def plan(self, block) -> tuple | str:
        """The block's compiled calls' arguments (norm + q/k/v; output projection + norm + MLP), or why not."""
        parts = _parts(block)
        key = tuple(map(id, parts))  # the kept plan holds every part, so no id can be reused while it lives
        kept = self._plans.get(id(block))
        if kept is not None and kept[0] == key and all(_stamp(t) == stamp for t, stamp in kept[3]):
            return kept[1]
        widened = []  # (tensor, stamp) of each tensor the plan holds an fp32 copy of
        built = _build(block, widened) if parts else "not a softmax attention block"
        self._plans[id(block)] = (key, built, parts, widened)
        return built

    def kept_plan(self, block) -> tuple | None:
        """(the block's kept plan or why not, the (tensor, stamp) pairs it holds fp32 copies of), or None."""
        kept = self._plans.get(id(block))
        return None if kept is None else (kept[1], kept[3])

    def forget(self) -> None:
        """Drop every kept plan (after swapping modules, or changing a narrow norm weight in a way _stamp cannot
        see)."""
        self._plans.clear()

    def step(self, block, x: torch.Tensor, positions, pos_enc, state, rot: tuple | None = None):
        """block(x, positions, pos_enc, state) for x (B, T, dim) in compiled calls, or None (counted with its reason)
        where the block runs its forward. With ``rot`` (rotation(): a decode step) and a cache that says where its
        keys go (decode_slots), one call does the whole block (block_decode); otherwise two, around Attention.mix."""
        attn = block._modules["attn"]
        # read every step: a kept plan's identities do not cover these attributes
        why = ("not a softmax attention block" if type(attn) is not Attention
               else "kernel under study" if attn.kernel is not sdpa_attention or not attn.causal
               else "dropout in training" if block.training and block.dropout.p > 0 else None)
        p = self.plan(block) if why is None else why
        if isinstance(p, str):
            if p in _BY_DESIGN:
                paths.ran(f"block forward: {p}")
            else:  # the step was wanted: a weight or norm it cannot read
                paths.fell_back("block step", p)
            return None
        pre, post = p
        mod = kernels.native()
        B, T, dim = x.shape
        x2 = x.reshape(B * T, dim)  # (B*T, dim)
        slots = None if rot is None else getattr(state, "decode_slots", lambda _: None)(attn.layer_idx)
        if slots is not None:
            paths.ran("block_decode")
            return mod.block_decode(x2, *pre, *rot, *slots, attn.n_heads, attn.n_kv_heads, attn.head_dim,
                                    attn.scale, *post).view(B, T, dim)
        # q, k, v in the model's activation dtype, as its forward makes them (a bf16 model's bf16 cache is then read
        # as it is, not widened whole for fp32 queries)
        paths.ran("block_pre_post")
        qkv = mod.block_pre(x2, *pre).view(B, T, -1).to(x.dtype)
        mixed = attn.mix(qkv, positions, pos_enc, state).reshape(B * T, -1)  # (B*T, H*D)
        return mod.block_post(x2, mixed, *post).view(B, T, dim)
