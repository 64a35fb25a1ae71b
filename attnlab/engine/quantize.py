"""Weight precision for inference: fp32, bf16, or int8 weight-only quantization with per-channel scales.

Decode reads every weight once per token, so its speed is bounded by bytes of weights / memory
bandwidth: bf16 halves the bytes, int8 quarters them. int8 here is weight-only (as in gpt-fast):
each output channel c of a Linear keeps w_q[c] = round(w[c] / s_c), s_c = max|w[c]| / 127, and the
matmul runs with bf16 activations through torch's int8-weight kernel (``_weight_int8pack_mm``), so
no fp32 copy of the weights is ever materialised.
"""
from __future__ import annotations

import warnings

import torch
import torch.nn.functional as F
from torch import nn

from attnlab.errors import AttnlabError

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16, "int8": torch.bfloat16}
_warned = set()


def _warn_once(key: str, message: str) -> None:
    if key not in _warned:
        _warned.add(key)
        warnings.warn(message, stacklevel=3)


class DenseLinear(nn.Module):
    """An inference-only Linear whose weight is laid out for fast row-vector products.

    Decode multiplies one row vector by every weight matrix, so the layout decides how fast the matrix
    streams from memory. On CPU the weight is prepacked for oneDNN (the blocked layout torch's own
    compiler uses); measured here on GPT-2 small's matrices, 1.1-1.3x faster than nn.Linear in fp32 and
    about 1.5x in bf16. Elsewhere (or without oneDNN) it is stored (in, out), like GPT-2's Conv1D, which
    streams the 50257 x 768 LM head about 2x faster than nn.Linear's (out, in). ``path`` records which ran.
    Small matrices skip oneDNN: each of its calls costs ~15 us whatever the size, against ~4 us for a plain
    row-times-(in, out) product of a 128 x 384 matrix (measured here), and a draft model is all small matrices.

    ``rows``: how many rows (batch x tokens) the decode calls will usually carry — 1 for plain decoding, k+1 for
    the target of speculative decoding. oneDNN lays the weight out for that size, and the layout matters:
    measured here on a 384-wide, 6-layer model, weights packed for 1 row made a 4-row call 1.54x a 1-row call
    (7.1 vs 4.6 ms), packed for 4 rows 1.16x (4.9 vs 4.2 ms); on GPT-2 small's 768-wide matrices packing for
    1 row is ~8% faster at 1 row and ~30% slower at 4. Prefill (hundreds of rows) runs alike with either.
    """

    ONEDNN_MIN_ELEMENTS = 256 * 1024  # below this (1 MiB in fp32) the fixed cost outweighs the faster streaming

    def __init__(self, linear: nn.Linear, dtype: torch.dtype, rows: int = 1):
        super().__init__()
        w = linear.weight.detach().to(dtype)
        self.bias = None if linear.bias is None else nn.Parameter(linear.bias.detach().to(dtype), requires_grad=False)
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.path = "matmul"
        if (w.device.type == "cpu" and torch.backends.mkldnn.is_available() and dtype in (torch.float32, torch.bfloat16)
                and w.numel() >= self.ONEDNN_MIN_ELEMENTS):
            try:
                packed = torch.ops.mkldnn._reorder_linear_weight(w.contiguous(), rows)
                torch.ops.mkldnn._linear_pointwise(torch.zeros(1, w.shape[1], dtype=dtype), packed, None, "none", [], "")
                self.packed, self.path = packed, "onednn"
                self.weight_bytes = w.numel() * w.element_size()
                return
            except (RuntimeError, AttributeError):
                _warn_once("onednn", "oneDNN weight prepacking unavailable; using the (in, out) matmul layout")
        self.weight_t = nn.Parameter(w.t().contiguous(), requires_grad=False)

    def forward(self, x):
        shape = x.shape
        x2 = x.reshape(-1, shape[-1])  # (B*T, in)
        if self.path == "onednn":
            y = torch.ops.mkldnn._linear_pointwise(x2, self.packed, self.bias, "none", [], "")
        elif self.bias is None:
            y = x2 @ self.weight_t
        else:
            y = torch.addmm(self.bias, x2, self.weight_t)
        return y.reshape(*shape[:-1], self.out_features)


def _replace_linears(model: nn.Module, make) -> None:
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if isinstance(child, nn.Linear):
                setattr(parent, name, make(child))


class Int8Linear(nn.Module):
    """y = (x @ w_q^T) * scale + bias, w_q int8 (out, in), scale (out,)."""

    def __init__(self, linear: nn.Linear, act_dtype: torch.dtype):
        super().__init__()
        w = linear.weight.detach().float()
        scale = w.abs().amax(dim=1).clamp(min=1e-12) / 127.0
        self.register_buffer("weight", (w / scale[:, None]).round().clamp(-127, 127).to(torch.int8))
        self.register_buffer("scale", scale.to(act_dtype))
        self.bias = None if linear.bias is None else nn.Parameter(linear.bias.detach().to(act_dtype), requires_grad=False)
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.path = "int8pack"

    def forward(self, x):
        shape = x.shape
        x2 = x.reshape(-1, shape[-1])  # (B*T, in)
        try:
            y = torch._weight_int8pack_mm(x2, self.weight, self.scale)
        except (RuntimeError, AttributeError):  # no int8 kernel for this device/dtype: dequantize per call
            _warn_once("int8", "int8 weight kernel unavailable here; dequantizing per call (slower)")
            self.path = "dequantize"
            y = F.linear(x2, self.weight.to(x.dtype)) * self.scale
        if self.bias is not None:
            y = y + self.bias
        return y.reshape(*shape[:-1], self.out_features)

    @property
    def dequantized(self) -> torch.Tensor:
        return self.weight.float() * self.scale.float()[:, None]


def quantize_int8(model: nn.Module, act_dtype: torch.dtype = torch.bfloat16) -> nn.Module:
    """Replace every Linear (projections, MLP, LM head) with Int8Linear; the rest runs in act_dtype."""
    if getattr(model.cfg, "is_recurrent", False):
        raise AttnlabError("int8 quantization supports the transformer family; use fp32 or bf16 for rnn/lstm/gru")
    model = model.to(act_dtype)
    _replace_linears(model, lambda lin: Int8Linear(lin, act_dtype))
    model.precision = "int8"
    return model


def set_precision(model: nn.Module, dtype: str, layout: bool = True, rows: int = 1) -> nn.Module:
    """Make a model ready for inference (in place; no training afterwards).

    dtype: fp32 | bf16 | fp16 | int8 (weight-only, bf16 activations). ``layout`` (dense dtypes, transformer
    family) switches Linears to the decode-friendly layout of DenseLinear, prepared for calls of ``rows`` rows
    (1: plain decoding; k+1: a speculative target's verify pass)."""
    if rows < 1:
        raise AttnlabError(f"rows={rows} must be >= 1")
    if dtype not in DTYPES:
        raise AttnlabError(f"dtype {dtype!r} is not supported; choose one of: {', '.join(DTYPES)}")
    model.eval()
    if dtype == "int8":
        return quantize_int8(model)
    model = model.to(DTYPES[dtype])
    if layout and not getattr(model.cfg, "is_recurrent", False):
        _replace_linears(model, lambda lin: DenseLinear(lin, DTYPES[dtype], rows))
    model.precision, model.rows = dtype, rows
    return model


def weight_bytes(model: nn.Module) -> int:
    """Bytes of parameters and buffers as stored (a tied matrix once; prepacked matrices at their dense size)."""
    seen, total = set(), sum(getattr(m, "weight_bytes", 0) for m in model.modules())
    for t in list(model.parameters()) + list(model.buffers()):
        if t.data_ptr() in seen:
            continue
        seen.add(t.data_ptr())
        total += t.numel() * t.element_size()
    return total
