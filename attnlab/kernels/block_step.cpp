// A decode step through one pre-norm block in one compiled call (block_decode), or two around Python's attention
// (block_pre, block_post) where the cache cannot say where its keys go.
//
// Why this exists: with the weights streaming at memory speed (few_rows.cpp), what was left of a decode step was
// dispatch: GPT-2 small's step made about 390 small torch calls from Python (norms, views, adds, GELU, 49 linears),
// 2.2 ms a token here, measured on a 64-wide 12-layer GPT-2 whose arithmetic is next to nothing (HF: 3.7 ms); two
// calls a block left 1.4 ms, one call 1.0 ms.
//
//   pre:    qkv = norm1(x) @ Wqkv^T (* scale) + b
//   decode: pre; rotate q, k; write k, v into the cache; attend over each row's keys; post
//   post:   h = x + attn @ Wo^T + bo;  y = h + mlp(norm2(h)),  mlp = W2 gelu_tanh(W1 .) or W2 (silu(W1 .) * W3 .)
//
// All arithmetic in fp32 (the residual stream is widened once on entry and rounded once on exit to its dtype), the
// linears by few_rows.cpp's `run` (int8 weights, where the CPU has VNNI, against rows quantized to int16 in exact
// integer sums; or torch's product for a weight kept (in, out)), so each row's result is independent of the other
// rows in the call.
#pragma once

#include <torch/extension.h>

#include <cmath>
#include <vector>

#include "activations.h"
#include "decode_attention.cpp"  // attend
#include "few_rows.cpp"          // run

namespace {

// y (M, N) fp32 = x (M, K) fp32 @ w^T (* scale) + bias, for w fp32, bf16 or int8 (N, K) contiguous.
// A weight stored (in, out) and handed over as its transposed view (a layout torch's own product streamed faster
// for some shapes here) goes to torch's product instead, in the weight's dtype.
void linear_into(const float* x, int64_t M, int64_t K, const torch::Tensor& w, const torch::Tensor& scale,
                 const torch::Tensor& bias, float* y) {
  TORCH_CHECK(w.dim() == 2 && w.size(1) == K && w.device().is_cpu(), "block step: a CPU weight (N, ", K,
              ") expected, got ", w.sizes());
  const int64_t N = w.size(0);
  if (!w.is_contiguous()) {
    TORCH_CHECK(w.t().is_contiguous() && !scale.numel(), "block step: a weight (N, K) or the transpose of a (K, N) one");
    const auto xt = torch::from_blob(const_cast<float*>(x), {M, K}, torch::kFloat32).to(w.scalar_type());
    auto yt = torch::from_blob(y, {M, N}, torch::kFloat32);
    auto r = bias.numel() ? at::addmm(bias.to(w.scalar_type()), xt, w.t()) : at::mm(xt, w.t());  // (M, K) @ (K, N)
    yt.copy_(r);
    return;
  }
  TORCH_CHECK(!scale.numel() || (scale.scalar_type() == torch::kFloat32 && scale.numel() == N),
              "block step: scale must be fp32 with one entry per output channel");
  TORCH_CHECK(!bias.numel() || bias.numel() == N, "block step: bias must have one entry per output channel");
  const auto b32 = bias.numel() ? bias.to(torch::kFloat32) : bias;  // a bf16 model's bias: widened (N values)
  const float* sp = scale.numel() ? scale.data_ptr<float>() : nullptr;
  const float* bp = b32.numel() ? b32.data_ptr<float>() : nullptr;
  switch (w.scalar_type()) {
    case torch::kFloat32: run(x, w.data_ptr<float>(), sp, bp, y, M, N, K); break;
    case torch::kBFloat16: run(x, reinterpret_cast<const uint16_t*>(w.data_ptr<at::BFloat16>()), sp, bp, y, M, N, K); break;
    case torch::kChar: run(x, w.data_ptr<int8_t>(), sp, bp, y, M, N, K); break;
    default: TORCH_CHECK(false, "block step: weights must be fp32, bf16 or int8");
  }
}

torch::Tensor f32(const torch::Tensor& t) { return t.numel() ? t.to(torch::kFloat32).contiguous() : t; }

// out (M, K) = LayerNorm (w, b: the bias may be empty) or RMSNorm (w) of x (M, K), all fp32. Statistics in double:
// for these widths the result then rounds like torch's own fp32 norms to within an ulp or two.
void norm_into(const float* x, int64_t M, int64_t K, const torch::Tensor& w, const torch::Tensor& b, bool rms,
               double eps, float* out) {
  TORCH_CHECK(w.numel() == K && (!b.numel() || b.numel() == K), "block step: norm weights of width ", K, " expected");
  const auto w32 = f32(w), b32 = f32(b);
  const float* wp = w32.data_ptr<float>();
  const float* bp = b32.numel() ? b32.data_ptr<float>() : nullptr;
  for (int64_t m = 0; m < M; m++) {
    const float* r = x + m * K;
    double mean = 0, sq = 0;
    if (!rms) {
      for (int64_t k = 0; k < K; k++) mean += r[k];
      mean /= K;
    }
    for (int64_t k = 0; k < K; k++) sq += (r[k] - mean) * (r[k] - mean);
    const float inv = float(1.0 / std::sqrt(sq / K + eps));
    float* o = out + m * K;
    for (int64_t k = 0; k < K; k++) {
      const float v = (r[k] - float(mean)) * inv * wp[k];
      o[k] = bp ? v + bp[k] : v;
    }
  }
}

// x (M, K) activations as fp32 rows: x's own memory where it is fp32 and contiguous, else a copy in buf (a bf16 x
// widened; a non-contiguous fp32 one, which the callers never pass, copied). Not f32() (torch's conversion, for the
// weights): a bf16 residual (an int8 or bf16 model's) is one or a few rows here, and torch's conversion call (~8 us)
// three times a block was ~0.3 ms of an int8 GPT-2 small step, a loop over the rows next to nothing.
const float* rows_f32(const torch::Tensor& x, std::vector<float>& buf) {
  if (x.scalar_type() == torch::kFloat32 && x.is_contiguous()) return x.data_ptr<float>();
  TORCH_CHECK(x.scalar_type() == torch::kFloat32 || x.scalar_type() == torch::kBFloat16,
              "block step: fp32 or bf16 activations expected");
  const auto xc = x.contiguous();
  buf.resize(xc.numel());
  if (xc.scalar_type() == torch::kFloat32) {
    std::copy(xc.data_ptr<float>(), xc.data_ptr<float>() + xc.numel(), buf.begin());
    return buf.data();
  }
  const auto* p = reinterpret_cast<const uint16_t*>(xc.data_ptr<at::BFloat16>());
  for (int64_t i = 0; i < xc.numel(); i++) buf[i] = widen(p[i]);
  return buf.data();
}

}  // namespace

// x (M, K) fp32 or bf16; returns qkv (M, N) fp32.
torch::Tensor block_pre(torch::Tensor x, torch::Tensor norm_w, torch::Tensor norm_b, bool rms, double eps,
                        torch::Tensor w, torch::Tensor scale, torch::Tensor bias) {
  TORCH_CHECK(x.dim() == 2 && x.device().is_cpu(), "block_pre: x (M, K) on the CPU expected");
  const int64_t M = x.size(0), K = x.size(1);
  std::vector<float> xw, h(M * K);
  norm_into(rows_f32(x, xw), M, K, norm_w, norm_b, rms, eps, h.data());
  auto y = torch::empty({M, w.size(0)}, x.options().dtype(torch::kFloat32));
  linear_into(h.data(), M, K, w, scale, bias, y.data_ptr<float>());
  return y;
}

// x (M, K) the block's input (fp32 or bf16), attn (M, A) the attention's output before its projection; the three
// MLP weights (w3 empty for the GELU MLP). Returns the block's output (M, K) in x's dtype.
torch::Tensor block_post(torch::Tensor x, torch::Tensor attn, torch::Tensor wo, torch::Tensor so, torch::Tensor bo,
                         torch::Tensor norm_w, torch::Tensor norm_b, bool rms, double eps, torch::Tensor w1,
                         torch::Tensor s1, torch::Tensor b1, torch::Tensor w2, torch::Tensor s2, torch::Tensor b2,
                         torch::Tensor w3, torch::Tensor s3, torch::Tensor b3) {
  TORCH_CHECK(x.dim() == 2 && attn.dim() == 2 && attn.size(0) == x.size(0), "block_post: x (M, K), attn (M, A)");
  const int64_t M = x.size(0), K = x.size(1), F = w1.size(0);
  TORCH_CHECK(x.device().is_cpu() && attn.device().is_cpu(), "block_post: x and attn on the CPU expected");
  TORCH_CHECK(wo.size(0) == K && w2.size(0) == K && w2.size(1) == F && (!w3.numel() || w3.size(0) == F),
              "block_post: projection shapes disagree");
  const bool f32_out = x.scalar_type() == torch::kFloat32;
  auto out = torch::empty({M, K}, x.options());
  std::vector<float> xw, aw, hw(f32_out ? 0 : M * K);
  float* h = f32_out ? out.data_ptr<float>() : hw.data();  // the sum in fp32, rounded once to a bf16 x's dtype
  linear_into(rows_f32(attn, aw), M, attn.size(1), wo, so, bo, h);
  const float* xp = rows_f32(x, xw);
  for (int64_t i = 0; i < M * K; i++) h[i] += xp[i];  // h = x + attention
  std::vector<float> n(M * K), a(M * F), m2(M * K);
  norm_into(h, M, K, norm_w, norm_b, rms, eps, n.data());
  linear_into(n.data(), M, K, w1, s1, b1, a.data());
  if (w3.numel()) {  // SwiGLU: silu(W1 n) * W3 n
    std::vector<float> g(M * F);
    linear_into(n.data(), M, K, w3, s3, b3, g.data());
    silu_mul(a.data(), g.data(), M * F);
  } else {
    gelu_tanh(a.data(), a.data(), M * F);
  }
  linear_into(a.data(), M, F, w2, s2, b2, m2.data());
  for (int64_t i = 0; i < M * K; i++) h[i] += m2[i];
  if (!f32_out) {
    auto* o = reinterpret_cast<uint16_t*>(out.data_ptr<at::BFloat16>());
    for (int64_t i = 0; i < M * K; i++) o[i] = narrow(h[i]);
  }
  return out;
}

// Every slot a call will write or read lies inside the cache: the kernels index raw memory with these numbers.
void check_store(const torch::Tensor& k, const torch::Tensor& v, int64_t stride_b, int64_t stride_h, int64_t stride_s,
                 int64_t B, int64_t Hkv, int64_t D, const torch::Tensor& wslots, int64_t Tq, const torch::Tensor& tables,
                 int64_t bs, const torch::Tensor& lens) {
  TORCH_CHECK(k.device().is_cpu() && v.device().is_cpu() && k.stride(-1) == 1 && v.strides() == k.strides() &&
              k.sizes() == v.sizes() && k.size(-1) == D, "block_decode: keys and values must be CPU tensors of one "
              "layout, head dimension ", D, " contiguous");
  const int64_t slots = k.size(-2), rows = stride_b ? k.size(0) : 1;
  TORCH_CHECK(stride_b == 0 || B <= rows, "block_decode: ", B, " rows for a cache of ", rows);
  TORCH_CHECK(Hkv <= k.size(-3), "block_decode: ", Hkv, " key/value heads for a cache of ", k.size(-3));
  const int64_t* w = wslots.data_ptr<int64_t>();
  for (int64_t i = 0; i < wslots.numel(); i++)
    TORCH_CHECK(w[i] >= 0 && w[i] < slots, "block_decode: write slot ", w[i], " outside the cache's ", slots);
  const int64_t* l = lens.data_ptr<int64_t>();
  const int64_t tn = tables.numel() ? tables.size(1) : 0;
  for (int64_t b = 0; b < B; b++)
    TORCH_CHECK(l[b] >= Tq && l[b] <= (tn ? tn * bs : slots), "block_decode: row ", b, " holds ", l[b],
                " keys, outside its cache");
  const int64_t* t = tables.numel() ? tables.data_ptr<int64_t>() : nullptr;
  for (int64_t i = 0; t && i < tables.numel(); i++)
    TORCH_CHECK(t[i] >= 0 && (t[i] + 1) * bs <= slots, "block_decode: block ", t[i], " outside the pool");
}

// A whole decode step of one block in one call: block_pre, then what Attention.mix and the cache do for one new
// token per row (rotate q and k, write k and v into the cache, attend over each row's keys), then block_post.
// Why: the Python between the two calls (views, the cache's slice writes, the kernel's argument checks) cost
// ~70 us a layer here, ~0.9 ms of a GPT-2 small step.
//
// x (M, dim): Tq = M / B new tokens for each of B sequences, token i of row i / Tq (1 for a decode step, k + 1 for
// a speculative verification). cos, sin (M, D) fp32 for rotary positions, or empty. The cache: keys and values
// (fp32 or bf16) of row b, head h, slot s at store + b * stride_b + h * stride_h + s * stride_s; token i's key goes
// to slot wslots[i] (a contiguous cache: its position; a paged pool, stride_b = 0: the absolute slot its block
// table gives), and row b then holds lens[b] keys, found through tables (B, n) of bs-token blocks where given; its
// new tokens attend causally (decode_attention.cpp, attend). Returns the block's output (M, dim) in x's dtype.
torch::Tensor block_decode(torch::Tensor x, torch::Tensor n1w, torch::Tensor n1b, bool rms1, double eps1,
                           torch::Tensor wqkv, torch::Tensor sqkv, torch::Tensor bqkv, torch::Tensor cos,
                           torch::Tensor sin, torch::Tensor k_store, torch::Tensor v_store, int64_t stride_b,
                           int64_t stride_h, int64_t stride_s, torch::Tensor wslots, torch::Tensor tables, int64_t bs,
                           torch::Tensor lens, int64_t H, int64_t Hkv, int64_t D, double scale, torch::Tensor wo,
                           torch::Tensor so, torch::Tensor bo, torch::Tensor n2w, torch::Tensor n2b, bool rms2,
                           double eps2, torch::Tensor w1, torch::Tensor s1, torch::Tensor b1, torch::Tensor w2,
                           torch::Tensor s2, torch::Tensor b2, torch::Tensor w3, torch::Tensor s3, torch::Tensor b3) {
  const auto qkv = block_pre(x, n1w, n1b, rms1, eps1, wqkv, sqkv, bqkv);  // (M, (H + 2 Hkv) D) fp32
  const int64_t M = qkv.size(0), W = qkv.size(1), B = lens.numel();
  TORCH_CHECK(W == (H + 2 * Hkv) * D && H % Hkv == 0, "block_decode: q/k/v width does not match the heads");
  TORCH_CHECK(B > 0 && M % B == 0 && wslots.numel() == M && wslots.scalar_type() == torch::kLong &&
              lens.scalar_type() == torch::kLong, "block_decode: wslots (M,) and lens (B,) int64, M = B * Tq");
  const int64_t Tq = M / B;  // new tokens per row: 1, or a speculative verification's k + 1
  TORCH_CHECK(k_store.scalar_type() == v_store.scalar_type() &&
              (k_store.scalar_type() == torch::kFloat32 || k_store.scalar_type() == torch::kBFloat16),
              "block_decode: the cache must be fp32 or bf16");
  wslots = wslots.contiguous();
  lens = lens.contiguous();
  tables = tables.contiguous();
  const bool paged = tables.numel() > 0;
  TORCH_CHECK(!paged || (tables.dim() == 2 && tables.size(0) == B && tables.scalar_type() == torch::kLong && bs > 0),
              "block_decode: tables must be (B, n) int64 with a block size > 0");
  check_store(k_store, v_store, stride_b, stride_h, stride_s, B, Hkv, D, wslots, Tq, tables, bs, lens);
  const bool rot = cos.numel() > 0;
  const auto c32 = rot ? cos.to(torch::kFloat32).contiguous() : cos, s32 = rot ? sin.to(torch::kFloat32).contiguous() : sin;
  TORCH_CHECK(!rot || (c32.numel() == M * D && s32.numel() == M * D), "block_decode: cos, sin must be (M, D)");
  auto q = torch::empty({M, H, D}, qkv.options());
  float* qp = q.data_ptr<float>();
  const float* src = qkv.data_ptr<float>();
  const int64_t* ws = wslots.data_ptr<int64_t>();
  const int64_t half = D / 2;
  std::vector<float> kr(D);
  // Rotate-half rotary, as positional.apply_rotary: out = x * cos + cat(-x[half:], x[:half]) * sin, the two
  // products rounded apart and then added (no fused multiply-add), so the rotated q, k equal torch's bit for bit.
  auto rotate = [&](const float* in, float* out, int64_t b) {
    if (!rot) {
      std::copy(in, in + D, out);
      return;
    }
    const float* c = c32.data_ptr<float>() + b * D;
    const float* s = s32.data_ptr<float>() + b * D;
    for (int64_t i = 0; i < D; i++) {
      const float r = i < half ? -in[i + half] : in[i - half];
      const float a = in[i] * c[i], p = r * s[i];
      out[i] = a + p;
    }
  };
  const bool bf = k_store.scalar_type() == torch::kBFloat16;
  for (int64_t i = 0; i < M; i++) {  // token i: row i / Tq of the cache
    const float* row = src + i * W;
    for (int64_t h = 0; h < H; h++) rotate(row + h * D, qp + (i * H + h) * D, i);
    for (int64_t h = 0; h < Hkv; h++) {
      const int64_t off = (i / Tq) * stride_b + h * stride_h + ws[i] * stride_s;
      rotate(row + (H + h) * D, kr.data(), i);
      const float* vr = row + (H + Hkv + h) * D;
      if (bf) {
        auto* kd = k_store.data_ptr<at::BFloat16>() + off;
        auto* vd = v_store.data_ptr<at::BFloat16>() + off;
        for (int64_t d = 0; d < D; d++) {
          kd[d] = at::BFloat16(kr[d]);  // round to nearest even, as torch's conversion
          vd[d] = at::BFloat16(vr[d]);
        }
      } else {
        std::copy(kr.begin(), kr.end(), k_store.data_ptr<float>() + off);
        std::copy(vr, vr + D, v_store.data_ptr<float>() + off);
      }
    }
  }
  auto attn = torch::zeros({M, H * D}, qkv.options());
  const int64_t* tp = paged ? tables.data_ptr<int64_t>() : nullptr;
  const int64_t tn = paged ? tables.size(1) : 0;
  if (bf)
    attend(qp, reinterpret_cast<const uint16_t*>(k_store.data_ptr<at::BFloat16>()),
           reinterpret_cast<const uint16_t*>(v_store.data_ptr<at::BFloat16>()), B, H, D, stride_b, stride_h, stride_s,
           tp, tn, bs, lens.data_ptr<int64_t>(), H / Hkv, float(scale), attn.data_ptr<float>(), Tq);
  else
    attend(qp, k_store.data_ptr<float>(), v_store.data_ptr<float>(), B, H, D, stride_b, stride_h, stride_s, tp, tn,
           bs, lens.data_ptr<int64_t>(), H / Hkv, float(scale), attn.data_ptr<float>(), Tq);
  return block_post(x, attn, wo, so, bo, n2w, n2b, rms2, eps2, w1, s1, b1, w2, s2, b2, w3, s3, b3);
}
