"""Measured work and depth: run a model under a dispatch-level tracer and read both off the op graph.

Every aten op the model dispatches is recorded with its FLOPs (torch.utils.flop_counter's formulas, the
same FlopCounterMode uses) and its data dependencies. Depth = the longest chain of dependent compute
ops: an op's output sits one step deeper than its deepest input. Views, reshapes and factory ops
(no tensor inputs) add no step. Dependencies are tracked per storage, so an in-place write (the KV
cache) makes later readers of that buffer depend on the writer. This is the measured counterpart of
the cost model's "sequential depth": a transformer's depth does not grow with T; an RNN's does.

A fused recurrent kernel (torch's LSTM/GRU/RNN on oneDNN or cuDNN) dispatches as one op per layer, yet inside
it runs one dependent step per token: it counts as that many steps (``recurrent_steps``), so the depth of a
recurrence is O(T) whether it runs as a visible loop or as a fused kernel.
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves
from torch.utils.flop_counter import flop_registry

aten = torch.ops.aten
# torch's counter has no formula for the CPU flash kernel; its signature starts (q, k, v, ...) like the
# CUDA flash kernel's, whose formula (the full T x S score rectangle, as torch counts it) applies.
_EXTRA = {aten._scaled_dot_product_flash_attention_for_cpu: flop_registry[aten._scaled_dot_product_flash_attention]}


def _seq_len(x, batch_first: bool, batch_sizes) -> int:
    """Tokens a fused recurrent kernel steps through: len(batch_sizes) for a packed input, else the time axis."""
    return len(batch_sizes) if batch_sizes else int(x.shape[1] if batch_first and x.dim() == 3 else x.shape[0])


# Fused recurrent kernels -> the dependent steps inside one call, from the op's schema: one per token per layer.
# mkldnn_rnn_layer(input, w0..w3, hx, cx, reverse, batch_sizes, mode, hidden, num_layers, biases, bidir,
# batch_first, train) runs one layer on a time-major input (torch transposes first, whatever batch_first says);
# _cudnn_rnn(input, weight, stride, buf, hx, cx, mode, hidden, proj, num_layers, batch_first, dropout, train, bidir,
# batch_sizes, state) runs num_layers; lstm/gru/rnn (input, hx, params, biases, num_layers, dropout, train, bidir,
# batch_first) when a backend dispatches them whole.
_RECURRENT = {
    aten.mkldnn_rnn_layer: lambda a: _seq_len(a[0], False, a[8]),
    aten._cudnn_rnn: lambda a: _seq_len(a[0], a[10], a[14]) * a[9],
    **{op: (lambda a: _seq_len(a[0], a[8], None) * a[4]) for op in (aten.lstm, aten.gru, aten.rnn_tanh, aten.rnn_relu)},
}


def recurrent_steps(func, args) -> int:
    """Dependent steps inside ``func`` when it is a fused recurrent kernel (its whole recurrence), else 0."""
    steps = _RECURRENT.get(func._overloadpacket)
    if steps is None or not isinstance(args[0], torch.Tensor):  # lstm.data's first argument is packed data
        return 0
    return int(steps(args))


@dataclass
class TraceResult:
    flops: int = 0
    depth: int = 0
    ops: int = 0
    recurrent_steps: int = 0  # dependent steps counted inside fused recurrent kernels (each a single op)
    flops_by_op: Counter = field(default_factory=Counter)
    ops_by_name: Counter = field(default_factory=Counter)

    @property
    def matmul_ops(self) -> int:
        """Dispatched matrix products of a weight (every Linear runs one mm or addmm; attention runs neither)."""
        return sum(self.ops_by_name[k] for k in ("mm", "addmm", "mv", "_weight_int8pack_mm", "_linear_pointwise",
                                                 "_mkl_linear"))

    def to_dict(self) -> dict:
        return {"flops": self.flops, "depth": self.depth, "ops": self.ops, "recurrent_steps": self.recurrent_steps,
                "flops_by_op": {str(k): v for k, v in self.flops_by_op.most_common()},
                "ops_by_name": dict(self.ops_by_name.most_common())}


class WorkDepthTracer(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.result = TraceResult()
        self._depth: dict[int, int] = {}
        self._alive: list = []
        self._alive_storages: dict = {}

    def _key(self, t: torch.Tensor) -> int:
        """The tensor's storage (views share it). Storages seen are kept alive for the trace: a freed storage's
        address can be handed to a new one, which would then inherit a stale depth. (Keying by the id of
        ``untyped_storage()`` was wrong: that is a fresh wrapper object on every call, its id soon reused.)"""
        try:
            storage = t.untyped_storage()
        except (RuntimeError, NotImplementedError):
            self._alive.append(t)
            return id(t)
        key = storage._cdata
        self._alive_storages.setdefault(key, storage)
        return key

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        inputs = [t for t in tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)]
        d_in = max((self._depth.get(self._key(t), 0) for t in inputs), default=0)
        compute = bool(inputs) and not func.is_view and func._overloadpacket not in (aten.detach, aten.alias)
        inner = recurrent_steps(func, args) if compute else 0
        d_out = d_in + max(1, inner) if compute else d_in
        for o in tree_leaves(out):
            if isinstance(o, torch.Tensor):
                k = self._key(o)
                mutated = any(self._key(t) == k for t in inputs)
                self._depth[k] = max(self._depth.get(k, 0), d_out) if mutated else d_out
        if compute:
            r = self.result
            r.ops += 1
            r.recurrent_steps += inner
            r.ops_by_name[func._overloadpacket.__name__] += 1
            r.depth = max(r.depth, d_out)
            formula = flop_registry.get(func._overloadpacket) or _EXTRA.get(func._overloadpacket)
            if formula is not None:
                n = int(formula(*args, **kwargs, out_val=out))
                r.flops += n
                r.flops_by_op[func._overloadpacket.__name__] += n
        return out


def trace(model, tokens: torch.Tensor, state=None, **kwargs) -> TraceResult:
    """One forward of ``model`` on ``tokens`` (B, T) (``kwargs``: the forward's, e.g. last_only), traced.
    Gradients off; works on the meta device."""
    tracer = WorkDepthTracer()
    with torch.no_grad(), tracer:
        model(tokens, state, **kwargs)
    return tracer.result


def engine_ops(cfg, batch: int, prompt: int, context: int, dtype: str = "fp32") -> dict:
    """Dispatched ops of the engine's two forwards (a structural count, not a timing): the prefill of ``batch``
    prompts of ``prompt`` tokens into a fresh KV cache (logits at the last position only), and one decode step of
    ``batch`` sequences with ``context`` tokens cached. Counted on the CPU, on a copy of the model 8 wide per head
    (the ops, and the kernels chosen, do not depend on the width; the meta device would count the math fallback of
    attention instead of the CPU's fused kernel), at ``dtype`` as set_precision runs it.
    {"prefill": TraceResult, "decode": TraceResult}."""
    from dataclasses import replace

    from attnlab.engine.quantize import set_precision
    from attnlab.models import build_model

    narrow = replace(cfg, dim=8 * cfg.n_heads, head_dim=8, hidden_dim=None,
                     vocab_size=min(cfg.vocab_size, 64), max_seq_len=max(cfg.max_seq_len, prompt + 1, context + 2))
    # Counted on the blocks' Python forward (compiled=False): the engine's compiled decode step
    # (engine/fast/block_step.py) is one call a block that this tracer cannot see into. The counts are structural (ops of a layer, of the head, of the
    # step); cost.cpu's per-op cost is calibrated over these same counts from the probe's timings of whatever
    # path the engine takes, so it is the cost per counted op of that path.
    # (inference mode would hide how composite ops (linear) dispatch)
    with torch.inference_mode(False):
        torch.manual_seed(0)
        model = set_precision(build_model(narrow), dtype, layout=False, compiled=False)
        tokens = lambda T: torch.zeros(batch, T, dtype=torch.long)  # noqa: E731
        prefill = trace(model, tokens(prompt), model.new_state(batch, prompt + 1), last_only=True)
        state = model.new_state(batch, context + 1)
        state.pos = torch.full((batch,), context)  # as if `context` tokens were cached: the step attends to all
        decode = trace(model, tokens(1), state)
    return {"prefill": prefill, "decode": decode}
