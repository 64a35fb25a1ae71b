"""Weight precision for inference: fp32, bf16, or int8 weights with per-channel scales.

Decode reads every weight once per token, so its speed is bounded by bytes of weights / memory
bandwidth: bf16 halves the bytes, int8 quarters them. int8 keeps its activations in bf16 (as gpt-fast does): each
output channel c of a Linear keeps w_q[c] = round(w[c] / s_c), s_c = max|w[c]| / 127, and a few-row matmul runs
through torch's int8-weight kernel (``_weight_int8pack_mm``) or attnlab's (which, on a CPU with VNNI, meets each
row quantized to int16 for the product: kernels/few_rows.cpp), so no fp32 copy of the weights is ever
materialised. A many-row call (a prefill) is compute-bound instead, and may quantize its activations to int8
(Int8Linear's ``w8a8``).
"""
from __future__ import annotations

import warnings

import torch
import torch.nn.functional as F
from torch import nn

from attnlab import kernels
from attnlab.engine import many_rows
from attnlab.engine.fast.inference import InferenceModel
from attnlab.errors import AttnlabError
from attnlab.runtime import native_bf16
from attnlab.timing import time_calls

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16, "int8": torch.bfloat16}
_warned = set()
_NONE = torch.empty(0)  # "no scale" / "no bias" for the compiled kernel


# Up to this many rows (a decode step, a speculative verification, a server's batch) a product streams its weight
# from memory, as decode meets it: its candidates are timed cold, and only layouts the compiled block step can read
# compete. The packed ones are opaque (they cannot be flushed for a fair timing, and a block holding one runs its
# Python forward), and cold they were slower than the plain layouts at 1 and 8 rows (docs/engine.md).
COLD_ROWS = kernels.MAX_ROWS


def _evict(module) -> None:
    """Flush the module's weights from every cache level (where the compiled kernels built, which do it)."""
    mod = kernels.native()
    if mod is None:
        return
    for t in (*module._parameters.values(), *module._buffers.values(), *(
            getattr(module, n, None) for n in ("packed", "weight_t"))):
        if isinstance(t, torch.Tensor) and t.layout == torch.strided:
            mod.evict(t)


def _time_paths(module, paths: list[str], xs: list[torch.Tensor], probe_calls: int, install=None,
                cold: bool = False) -> str:
    """Set module.path to each of ``paths`` in turn (after ``install(path)`` where given: lays its weights out),
    time ``probe_calls`` calls at each input (best of each, summed), return the fastest path's name (a path whose
    kernel is missing on this machine is skipped). ``cold``: the weights are flushed from the caches before each
    timed call. Why: decode streams every weight from memory once per token (a model of hundreds of MB does not stay
    in any cache), and warm timings favour a layout that is not the fastest when the weight comes from memory."""
    best, best_s = paths[0], float("inf")
    for path in paths:
        total = 0.0
        try:
            if install is not None:
                install(path)
            module.path = path
            for x in xs:
                total += time_calls(lambda: module(x), probe_calls, 2,
                                    before=(lambda: _evict(module)) if cold else None)["min_s"]
        except (RuntimeError, AttributeError):
            continue
        if total < best_s:
            best, best_s = path, total
    return best


def _warn_once(key: str, message: str) -> None:
    if key not in _warned:
        _warned.add(key)
        warnings.warn(message, stacklevel=3)


class DenseLinear(nn.Module):
    """An inference-only Linear whose weight is laid out for the calls decode makes: a few rows at a time.

    Decode multiplies a few row vectors by every weight matrix, so the weight's layout and the kernel decide
    how fast the matrix streams from memory, and which is fastest depends on the CPU (oneDNN's prepacked layout won
    on one AMD machine, MKL's packed GEMM and a plain product on an Intel one: docs/engine.md). So the layout is
    chosen by measurement on the machine it runs on: each candidate (``mkl`` packed, fp32 only; ``onednn`` packed;
    ``matmul`` with the weight stored (in, out), like GPT-2's Conv1D; ``mv``, a matrix-vector product, for
    one row) is timed at ``rows`` rows and the
    fastest kept; the choice is remembered per shape, dtype and row count. ``path`` records which runs.

    ``rows``: how many rows (batch x tokens) the decode calls will usually carry: 1 for plain decoding, k+1
    for the target of speculative decoding, B for a batch of B sequences. Packed layouts are laid out for
    that size (weights packed for 1 row make a 4-row call much slower than weights packed for 4). Prefill (more than ``rows`` and kernels.MAX_ROWS rows) reads the same weight through
    engine/many_rows, whose library GEMM is chosen by its own measurement (``many_paths``: one for a batch's decode
    step, one for a prompt); a weight packed by
    oneDNN is read by oneDNN at every row count.

    ``few_rows`` (fp32 or bf16 on a CPU where attnlab's kernel builds: attnlab/kernels): up to kernels.MAX_ROWS
    rows, each weight vector is read once for up to 4 rows and a bf16 one widened in registers, all in fp32
    arithmetic (torch's own few-row kernels stream a bf16 weight slower than an fp32 one, and lose bandwidth as the
    rows grow); more rows (prefill) go to engine/many_rows.

    ``varying``: the row count changes from call to call (a server's batch grows and shrinks between 1 and
    ``rows``). Only layouts that serve every row count compete (``mkl``'s packed weight serves exactly its
    row count and falls back to a plain product otherwise; ``mv`` serves one row), each timed over 1, rows/4
    and rows rows, since the best layout at one row count can be the worst at another (docs/engine.md).
    """

    _chosen: dict = {}  # (in, out, dtype, rows, bias) -> path, measured once per process
    PROBE_CALLS = 5

    def __init__(self, linear: nn.Linear, dtype: torch.dtype, rows: int = 1, varying: bool = False):
        super().__init__()
        w = linear.weight.detach().to(dtype).contiguous()
        self.bias = None if linear.bias is None else nn.Parameter(linear.bias.detach().to(dtype), requires_grad=False)
        self.in_features, self.out_features, self.rows = linear.in_features, linear.out_features, rows
        self.weight_bytes = w.numel() * w.element_size()
        self._bias32 = _NONE if self.bias is None else self.bias.detach().float()  # the kernel adds it in fp32
        builders = self._candidates(w, dtype, rows)
        if varying:
            builders = {k: b for k, b in builders.items() if k in ("matmul", "onednn", "few_rows")}
        key = (self.in_features, self.out_features, dtype, rows, self.bias is not None, varying)
        path = self._chosen.get(key)
        if path not in builders:
            counts = sorted({1, max(1, rows // 4), rows}) if varying else [rows]
            path = self._measure(builders, dtype, counts)
            self._chosen[key] = path
        self.path = path
        builders[path]()
        # bucket -> the library GEMM of calls above the few rows (a oneDNN-packed weight stays oneDNN's)
        self.many_paths = {kind: "onednn" if path == "onednn" else
                           many_rows.choose(self._plain_weight(), self.bias, rows)
                           for kind, rows in many_rows.PROBE_ROWS.items()}

    def _plain_weight(self) -> torch.Tensor:
        """The (out, in) weight whatever the layout (a transposed view of the (in, out) one); not for ``onednn``."""
        return self.weight if hasattr(self, "weight") else self.weight_t.t()

    def _candidates(self, w: torch.Tensor, dtype, rows: int) -> dict:
        """path -> a function that installs that layout on self."""
        out = {"matmul": lambda: setattr(self, "weight_t", nn.Parameter(w.t().contiguous(), requires_grad=False))}
        if rows == 1:  # one row: a matrix-vector product over the (out, in) weight
            out["mv"] = lambda: self.register_buffer("weight", w, persistent=False)
        if w.device.type != "cpu":
            return out
        if dtype in (torch.float32, torch.bfloat16) and kernels.native() is not None:
            def few_rows():
                self.register_buffer("weight", w, persistent=False)
            out["few_rows"] = few_rows
        if torch.backends.mkldnn.is_available() and dtype in (torch.float32, torch.bfloat16):
            def onednn():
                self.packed = torch.ops.mkldnn._reorder_linear_weight(w, rows)
            out["onednn"] = onednn
        if torch.backends.mkl.is_available() and dtype == torch.float32:
            def mkl():
                self.packed = torch.ops.mkl._mkl_reorder_linear_weight(w, rows)
                self.register_buffer("weight", w, persistent=False)  # MKL's own path for other row counts
            out["mkl"] = mkl
        return out

    def _measure(self, builders: dict, dtype, counts: list[int]) -> str:
        """Install each candidate, time PROBE_CALLS calls at each row count (best of each, summed), keep the
        fastest's name."""
        xs = [torch.randn(n, self.in_features).to(dtype) for n in counts]
        cold = max(counts) <= COLD_ROWS and kernels.native() is not None
        if cold:  # oneDNN's and MKL's packed weights: not candidates here (COLD_ROWS)
            builders = {k: b for k, b in builders.items() if k not in ("onednn", "mkl")} or builders
        best = _time_paths(self, list(builders), xs, self.PROBE_CALLS, install=lambda path: builders[path](),
                           cold=cold)
        for name in ("packed", "weight_t", "weight"):
            if hasattr(self, name):
                delattr(self, name)
        return best

    def step_operands(self) -> tuple | None:
        """(weight (out, in), fp32 scale or empty, fp32 bias or empty) as the compiled decode step reads this matrix
        (engine/fast/block_step.py), or None for a layout it cannot read (oneDNN's or MKL's packed weights). The
        ``matmul`` layout is handed over as its (out, in) view, multiplied by torch's product."""
        if self.path == "matmul":
            return self.weight_t.t(), _NONE, _NONE if self.bias is None else self.bias
        if self.path in ("few_rows", "mv"):
            return self.weight, _NONE, self._bias32
        return None

    def forward(self, x):
        shape = x.shape
        x2 = x.reshape(-1, shape[-1])  # (B*T, in)
        if self.path == "onednn":
            y = torch.ops.mkldnn._linear_pointwise(x2, self.packed, self.bias, "none", [], "")
        elif x2.shape[0] > max(kernels.MAX_ROWS, self.rows):  # prefill-sized: the measured library GEMM
            y = many_rows.linear(self.many_paths[many_rows.bucket(x2.shape[0])], x2, self._plain_weight(), self.bias)
        elif self.path == "few_rows":
            y = kernels.native().linear(x2, self.weight, _NONE, self._bias32)
        elif self.path == "mv":
            if x2.shape[0] == 1:
                y = torch.mv(self.weight, x2[0])[None]
                y = y if self.bias is None else y + self.bias
            else:
                y = F.linear(x2, self.weight, self.bias)
        elif self.path == "mkl":
            with torch.no_grad():  # inference only; MKL's kernel writes into an out= tensor autograd refuses
                y = torch.ops.mkl._mkl_linear(x2, self.packed, self.weight, self.bias, self.rows)
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
    """y = (x @ w_q^T) * scale + bias, w_q int8 (out, in), scale (out,).

    Two kernels, the faster at ``rows`` rows kept by measurement (per shape and row count, once per process, as
    DenseLinear): ``int8pack``, torch's ``_weight_int8pack_mm`` (bf16 activations), and ``few_rows``, attnlab's
    compiled kernel (attnlab/kernels: int8 widened in registers in fp32 arithmetic, or on a CPU with VNNI exact
    integer sums against rows quantized to int16; up to kernels.MAX_ROWS rows; more rows go to int8pack). Both use
    the same int8 weights and the same (bf16-rounded) scales.

    From ``MANY_ROWS`` rows (a prefill, a long verification) such a call is compute-bound, and int8pack's kernel is a
    vector loop, so from a few dozen rows one of two dense products wins, the faster kept per shape and kind of call
    (many_rows.bucket) by measurement (docs/engine.md):

    - ``widen``: the weight widened to the activations' dtype for the call, the scale applied to it, and multiplied
      by the dense kernel (engine/many_rows' choice, oneDNN's AMX GEMM where the CPU has it);
    - ``w8a8``: the activations quantized too, per row (s_r = max|x[r]| / 127, as CTranslate2 does), and multiplied
      as integers (torch's ``_int_mm``, int32 sums) against an (in, out) copy of the int8 weight, then scaled by
      s_r * s_c: an integer product does twice a bf16 one's work per instruction where the CPU has VNNI. Its error
      is the activations' rounding, half a step of 1/127 of each row's largest entry (about 1% of a product, against
      bf16's 0.3%: the test bounds both)."""

    CHUNK_ROWS = 8192
    MANY_ROWS = 32
    PROBE_CALLS = 5
    MANY_PATHS = ("widen", "w8a8")
    _chosen: dict = {}  # (in, out, rows, bias, varying) -> path
    _many_chosen: dict = {}  # (in, out, bias, activations' dtype, bucket) -> one of MANY_PATHS

    def __init__(self, linear: nn.Linear, act_dtype: torch.dtype, rows: int = 1, varying: bool = False):
        super().__init__()
        w = linear.weight.detach().float()
        scale = w.abs().amax(dim=1).clamp(min=1e-12) / 127.0
        self.register_buffer("weight", (w / scale[:, None]).round().clamp(-127, 127).to(torch.int8))
        self.register_buffer("scale", scale.to(act_dtype))
        self.bias = None if linear.bias is None else nn.Parameter(linear.bias.detach().to(act_dtype), requires_grad=False)
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self._scale32 = self.scale.float()  # the kernel's fp32 copies of the same (rounded) values
        self._bias32 = _NONE if self.bias is None else self.bias.detach().float()
        self.path = "int8pack"
        if self.weight.device.type == "cpu" and kernels.native() is not None:
            key = (self.in_features, self.out_features, rows, self.bias is not None, varying)
            if key not in self._chosen:
                counts = sorted({1, max(1, rows // 4), rows}) if varying else [rows]
                xs = [torch.randn(n, self.in_features).to(act_dtype) for n in counts]
                self._chosen[key] = _time_paths(self, ["int8pack", "few_rows"], xs, self.PROBE_CALLS,
                                                cold=max(counts) <= COLD_ROWS)
            self.path = self._chosen[key]
        self.many = dict.fromkeys(many_rows.PROBE_ROWS, "widen")  # bucket -> the many-row path
        wide = self._widen_to(act_dtype, self.weight.device)
        if wide is not None:  # the prefill products, measured now rather than in the first prefill
            for rows in many_rows.PROBE_ROWS.values():
                many_rows.choose(self.weight.to(wide), None, rows)
            self._choose_many(act_dtype)

    def _choose_many(self, act_dtype: torch.dtype) -> None:
        """Time ``widen`` and ``w8a8`` at each bucket's probe rows (once per shape and process), keep the faster;
        the (in, out) int8 copy that ``w8a8`` reads is made only to time it or where it runs."""
        keys = {kind: (self.in_features, self.out_features, self.bias is not None, act_dtype, kind)
                for kind in many_rows.PROBE_ROWS}
        if all(key in self._many_chosen for key in keys.values()) and \
                "w8a8" not in (self._many_chosen[key] for key in keys.values()):
            self.many = {kind: self._many_chosen[key] for kind, key in keys.items()}  # widen throughout: no copy
            return
        self.weight_in_out = self.weight.t().contiguous()  # (in, out): _int_mm's layout for its second operand
        for kind, rows in many_rows.PROBE_ROWS.items():
            key = keys[kind]
            if key not in self._many_chosen:
                x = torch.randn(rows, self.in_features).to(act_dtype)
                best, best_s = "widen", float("inf")
                for path in self.MANY_PATHS:
                    try:
                        with torch.inference_mode():
                            took = time_calls(lambda: self._many_rows(path, x), many_rows.PROBE_CALLS, 1)["min_s"]
                    except RuntimeError:  # no integer product in this build
                        continue
                    if took < best_s:
                        best, best_s = path, took
                self._many_chosen[key] = best
            self.many[kind] = self._many_chosen[key]
        if "w8a8" not in self.many.values():
            del self.weight_in_out

    def _many_rows(self, path: str, x2: torch.Tensor) -> torch.Tensor:
        """(M, in) -> (M, out) on a many-row ``path``, bias included, in x2's dtype."""
        if path == "w8a8":
            mod = kernels.native() if x2.dtype in (torch.float32, torch.bfloat16) else None
            if mod is not None:  # the same arithmetic, one pass at each end (kernels/int8_rows.cpp)
                xq, s, finite = mod.quantize_rows_int8(x2.contiguous())  # (M, in) int8, (M, 1) each row's step
                if finite:
                    acc = torch._int_mm(xq, self.weight_in_out)  # (M, out) int32
                    return mod.scale_rows_int32(acc, s, self._scale32, self._bias32, x2.dtype)
            else:
                xf = x2.float()
                s = xf.abs().amax(dim=1, keepdim=True).clamp_(min=1e-12).div_(127.0)  # (M, 1)
                if bool(torch.isfinite(s).all()):
                    xq = torch.div(xf, s).round_().to(torch.int8)
                    y = torch._int_mm(xq, self.weight_in_out).to(torch.float32).mul_(s).mul_(self._scale32)
                    if self.bias is not None:
                        y.add_(self._bias32)
                    return y.to(x2.dtype)
            # an inf or NaN has no integer step: the rows would come back as garbage, not as the inf or NaN that a
            # float product passes on; the widened product passes them on as any float model does
            return self._many_rows("widen", x2)
        wide = self._widen_to(x2.dtype, x2.device)
        # the weight dequantized in the product's dtype: a pass over the (out, in) weight instead of an fp32 pass over
        # the (rows, out) product, which cost as much as the GEMM (docs/engine.md)
        w = self.weight.to(wide).mul_(self._scale32.to(wide)[:, None])
        y = many_rows.linear(many_rows.choose(w, None, x2.shape[0]), x2.to(wide), w, None).to(x2.dtype)
        return y if self.bias is None else y + self.bias

    def step_operands(self) -> tuple | None:
        """(int8 weight (out, in), fp32 scale, fp32 bias or empty) for the compiled decode step, or None where this
        matrix runs torch's int8 kernel (whose packing the step cannot read)."""
        return (self.weight, self._scale32, self._bias32) if self.path == "few_rows" else None

    def forward(self, x):
        shape = x.shape
        x2 = x.reshape(-1, shape[-1])  # (B*T, in)
        if self.path == "few_rows" and x2.shape[0] <= kernels.MAX_ROWS:
            y = kernels.native().linear(x2, self.weight, self._scale32, self._bias32)
            return y.reshape(*shape[:-1], self.out_features)
        if x2.shape[0] >= self.MANY_ROWS and self._widen_to(x2.dtype, x2.device) is not None:
            return self._many_rows(self.many[many_rows.bucket(x2.shape[0])], x2).reshape(*shape[:-1], self.out_features)
        try:
            if self.out_features > self.CHUNK_ROWS:  # a wide matrix (the LM head) in row chunks: torch's kernel
                # streams a chunk faster than the whole (docs/engine.md)
                y = torch.cat([torch._weight_int8pack_mm(x2, w, s)
                               for w, s in zip(self.weight.split(self.CHUNK_ROWS), self.scale.split(self.CHUNK_ROWS))],
                              dim=-1)
            else:
                y = torch._weight_int8pack_mm(x2, self.weight, self.scale)
        except (RuntimeError, AttributeError):  # no int8 kernel for this device/dtype: dequantize per call
            _warn_once("int8", "int8 weight kernel unavailable here; dequantizing per call (slower)")
            self.path = "dequantize"
            y = F.linear(x2, self.weight.to(x.dtype)) * self.scale
        if self.bias is not None:
            y = y + self.bias
        return y.reshape(*shape[:-1], self.out_features)

    def _widen_to(self, dtype: torch.dtype, device: torch.device) -> torch.dtype | None:
        """The dtype a many-row call widens the weight to: the activations' own where the device runs it natively
        (an emulated bf16 matmul is far slower than fp32: runtime's dtype policy), else fp32; None on a device
        whose dense kernel is not known to beat int8pack (left to int8pack)."""
        if device.type != "cpu":
            return None
        return dtype if dtype == torch.float32 or native_bf16("cpu") else torch.float32

    @property
    def dequantized(self) -> torch.Tensor:
        return self.weight.float() * self.scale.float()[:, None]


def quantize_int8(model: nn.Module, act_dtype: torch.dtype = torch.bfloat16, rows: int = 1,
                  varying: bool = False) -> nn.Module:
    """Replace every Linear (projections, MLP, LM head) with Int8Linear (its kernel chosen for calls of ``rows``
    rows, as DenseLinear's layout), in place; the rest runs in act_dtype. Returns the model."""
    if getattr(model.cfg, "is_recurrent", False):
        raise AttnlabError("int8 quantization supports the transformer family; use fp32 or bf16 for rnn/lstm/gru")
    model = model.to(act_dtype)
    _replace_linears(model, lambda lin: Int8Linear(lin, act_dtype, rows, varying))
    return model


def set_precision(model: nn.Module, dtype: str, layout: bool = True, rows: int = 1, varying: bool = False,
                  compiled: bool = True) -> InferenceModel:
    """The model ready for inference, as an InferenceModel (engine/fast) around it; the model's weights are converted
    in place (no training afterwards).

    dtype: fp32 | bf16 | fp16 | int8 (int8 weights, bf16 activations; a prefill may quantize its activations too:
    Int8Linear's w8a8). ``layout`` (dense dtypes, transformer
    family) switches Linears to the decode-friendly layout of DenseLinear, prepared for calls of ``rows`` rows
    (1: plain decoding; k+1: a speculative target's verify pass; with ``varying``, anything from 1 to ``rows``:
    a server's batch). ``compiled``: decode steps through the compiled block step where it applies (False: the
    blocks' own forward, as a tracer counting their ops needs)."""
    if rows < 1:
        raise AttnlabError(f"rows={rows} must be >= 1")
    if dtype not in DTYPES:
        raise AttnlabError(f"dtype {dtype!r} is not supported; choose one of: {', '.join(DTYPES)}")
    if isinstance(model, InferenceModel):
        model = model.model
    model.eval()
    if dtype == "int8":
        model = quantize_int8(model, rows=rows, varying=varying)
    else:
        model = model.to(DTYPES[dtype])
        if layout and not getattr(model.cfg, "is_recurrent", False):
            _replace_linears(model, lambda lin: DenseLinear(lin, DTYPES[dtype], rows, varying))
    return InferenceModel(model, dtype, rows, cache_dtype=cache_dtype(model, dtype), compiled=compiled)


def cache_dtype(model: nn.Module, dtype: str) -> torch.dtype | None:
    """The KV cache's dtype for ``model`` at weight precision ``dtype`` on a CPU (None: the weights' own).

    attnlab's decode attention (kernels/decode_attention.cpp) reads a bf16 cache widening it in registers, so where
    it runs the cache stays bf16: half the bytes to hold and to read every step. Where it does not (no compiler,
    ALiBi, a kernel under study), torch's attention would widen a bf16 cache whole every step, so the cache is fp32
    and only the new queries are widened (docs/engine.md has the figures). new_state(dtype=) overrides either."""
    if dtype == "fp32" or model.cfg.is_recurrent or next(model.parameters()).device.type != "cpu":
        return None
    fused = model.cfg.kernel == "sdpa" and model.cfg.pos != "alibi" and kernels.native() is not None
    return torch.bfloat16 if fused and DTYPES[dtype] == torch.bfloat16 else torch.float32


def weight_bytes(model: nn.Module) -> int:
    """Bytes of parameters and buffers as stored (a tied matrix once; a DenseLinear's matrix once, at its dense
    size, whatever layout holds it): what a decode step reads. An Int8Linear's (in, out) copy for w8a8 prefills is
    left out (decode never reads it; it adds the int8 matrix's bytes again to the memory held)."""
    seen, total = set(), 0
    for m in model.modules():
        if isinstance(m, DenseLinear):
            total += m.weight_bytes
            seen.update(t.data_ptr() for t in list(m.parameters(recurse=False)) + list(m.buffers(recurse=False))
                        if t is not m.bias)
    for t in list(model.parameters()) + list(model.buffers()):
        if t.data_ptr() in seen:
            continue
        seen.add(t.data_ptr())
        total += t.numel() * t.element_size()
    return total
