// A decode step through one pre-norm block in two calls: everything before attention, and everything after it.
//
// Why this exists: with the weights streaming at memory speed (few_rows.cpp), what was left of a decode step was
// dispatch: GPT-2 small's step made about 390 small torch calls from Python (norms, views, adds, GELU, 49 linears),
// 2.2 ms a token here, measured on a 64-wide 12-layer GPT-2 whose arithmetic is next to nothing (HF: 3.7 ms).
// Here a block's norm + q/k/v projection is one call, and its output projection + residual + norm + MLP + residual
// another; the attention between them (rotation, the cache's write and read) stays with the cache that owns it.
//
//   pre:  qkv = norm1(x) @ Wqkv^T (* scale) + b
//   post: h = x + attn @ Wo^T + bo;  y = h + mlp(norm2(h)),  mlp = W2 gelu_tanh(W1 .) or W2 (silu(W1 .) * W3 .)
//
// All arithmetic in fp32 (the residual stream is widened once on entry and rounded once on exit to its dtype), the
// linears by few_rows.cpp's `run`, so each row's result is independent of the other rows in the call.
#include <torch/extension.h>

#include <cmath>
#include <vector>

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

// exp(-|u|) for a vector's worth of u at a time (simd.h's vexp takes arguments <= 0), the tail one by one.
template <typename F>
void with_exp_neg_abs(float* a, int64_t n, float k, F&& finish) {
  int64_t i = 0;
  for (; i + VW <= n; i += VW) {
    float e[VW];
    for (int j = 0; j < VW; j++) e[j] = -k * std::fabs(a[i + j]);
    store_x(e, vexp(load_x(e)));
    for (int j = 0; j < VW; j++) a[i + j] = finish(a[i + j], e[j]);
  }
  for (; i < n; i++) a[i] = finish(a[i], std::exp(-k * std::fabs(a[i])));
}

// GELU, tanh approximation (GPT-2): 0.5 v (1 + tanh(u)), u = sqrt(2/pi) (v + 0.044715 v^3), with
// tanh(u) = sign(u) (1 - e) / (1 + e), e = exp(-2|u|). Vectorised: std::tanh on 3072 values x 12 layers took
// ~0.5 ms a token here. Absolute error of tanh ~1e-7, added to 1.
void gelu_tanh(float* a, int64_t n) {
  const float c = std::sqrt(2.f / float(M_PI));
  std::vector<float> v(a, a + n);
  for (int64_t i = 0; i < n; i++) a[i] = c * (v[i] + 0.044715f * v[i] * v[i] * v[i]);  // u
  with_exp_neg_abs(a, n, 2.f, [](float u, float e) { const float t = (1.f - e) / (1.f + e); return u < 0 ? -t : t; });
  for (int64_t i = 0; i < n; i++) a[i] = 0.5f * v[i] * (1.f + a[i]);
}

// silu(a) * g (SwiGLU): sigmoid(a) = 1 / (1 + e) for a >= 0, e / (1 + e) below, e = exp(-|a|).
void silu_mul(float* a, const float* g, int64_t n) {
  std::vector<float> v(a, a + n);
  with_exp_neg_abs(a, n, 1.f, [](float x, float e) { return x >= 0 ? 1.f / (1.f + e) : e / (1.f + e); });
  for (int64_t i = 0; i < n; i++) a[i] = v[i] * a[i] * g[i];
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

}  // namespace

// x (M, K) fp32 or bf16; returns qkv (M, N) fp32.
torch::Tensor block_pre(torch::Tensor x, torch::Tensor norm_w, torch::Tensor norm_b, bool rms, double eps,
                        torch::Tensor w, torch::Tensor scale, torch::Tensor bias) {
  TORCH_CHECK(x.dim() == 2 && x.device().is_cpu(), "block_pre: x (M, K) on the CPU expected");
  const auto xf = x.to(torch::kFloat32).contiguous();
  const int64_t M = xf.size(0), K = xf.size(1);
  std::vector<float> h(M * K);
  norm_into(xf.data_ptr<float>(), M, K, norm_w, norm_b, rms, eps, h.data());
  auto y = torch::empty({M, w.size(0)}, xf.options());
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
  const auto xf = x.to(torch::kFloat32).contiguous();
  const auto af = attn.to(torch::kFloat32).contiguous();
  const int64_t M = xf.size(0), K = xf.size(1), F = w1.size(0);
  TORCH_CHECK(wo.size(0) == K && w2.size(0) == K && w2.size(1) == F, "block_post: projection shapes disagree");
  auto out = torch::empty({M, K}, xf.options());
  float* h = out.data_ptr<float>();
  linear_into(af.data_ptr<float>(), M, af.size(1), wo, so, bo, h);
  const float* xp = xf.data_ptr<float>();
  for (int64_t i = 0; i < M * K; i++) h[i] += xp[i];  // h = x + attention
  std::vector<float> n(M * K), a(M * F), m2(M * K);
  norm_into(h, M, K, norm_w, norm_b, rms, eps, n.data());
  linear_into(n.data(), M, K, w1, s1, b1, a.data());
  if (w3.numel()) {  // SwiGLU: silu(W1 n) * W3 n
    std::vector<float> g(M * F);
    linear_into(n.data(), M, K, w3, s3, b3, g.data());
    silu_mul(a.data(), g.data(), M * F);
  } else {
    gelu_tanh(a.data(), M * F);
  }
  linear_into(a.data(), M, F, w2, s2, b2, m2.data());
  for (int64_t i = 0; i < M * K; i++) h[i] += m2[i];
  return x.scalar_type() == torch::kFloat32 ? out : out.to(x.scalar_type());
}

// Push a tensor's bytes out of every cache level (timing a decode-sized product as decode meets its weight: coming
// from memory, not left in cache by the previous call). A tensor without plain storage is left alone.
void evict(torch::Tensor t) {
  if (!t.has_storage() || !t.device().is_cpu() || !t.numel()) return;
  const char* p = static_cast<const char*>(t.data_ptr());
  const int64_t n = t.numel() * t.element_size();
  for (int64_t i = 0; i < n; i += 64) _mm_clflush(p + i);
  _mm_clflush(p + n - 1);
  _mm_mfence();
}
