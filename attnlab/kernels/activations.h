// Activations of the compiled block step, and the prefill's GELU, a vector at a time.
#pragma once

#include <torch/extension.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>

#include "simd.h"

namespace {

using namespace attnlab;

// GELU, tanh approximation (GPT-2): 0.5 v (1 + tanh(u)), u = sqrt(2/pi) (v + 0.044715 v^3), computed as
// v / (1 + exp(-2u)) (the same function: 0.5 (1 + tanh(u)) = sigmoid(2u)), the exponent clamped to +-87 (beyond
// it the result is v or 0 to fp32 precision). A vector at a time; the tail one by one, the same formula.
inline vf gelu_v(vf v) {
  const vf u = v + splat(0.044715f) * v * v * v;
  const vf e = vexp(vmin(vmax(splat(-2.f * 0.7978845608f) * u, splat(-87.f)), splat(87.f)));
  return v / (splat(1.f) + e);
}

inline float gelu_s(float v) {
  return v / (1.f + std::exp(std::min(std::max(-2.f * 0.7978845608f * (v + 0.044715f * v * v * v), -87.f), 87.f)));
}

void gelu_tanh(const float* a, float* o, int64_t n) {  // o may be a
  int64_t i = 0;
  for (; i + VW <= n; i += VW) store_x(o + i, gelu_v(load_x(a + i)));
  for (; i < n; i++) o[i] = gelu_s(a[i]);
}

// The same over bf16 in place: each value widened, its GELU in fp32, rounded once back to bf16.
void gelu_tanh_bf16(uint16_t* p, int64_t n) {
  int64_t i = 0;
  for (; i + VW <= n; i += VW) store_bf16(p + i, gelu_v(load_w(p + i)));
  for (; i < n; i++) p[i] = narrow(gelu_s(widen(p[i])));
}

// The gradient of gelu_v at v times g: with s = sigmoid(2u), d/dv [v s] = s + v s (1 - s) 2 du/dv,
// du/dv = sqrt(2/pi) (1 + 3 * 0.044715 v^2); the same clamp as the forward.
inline vf gelu_grad_v(vf v, vf g) {
  const vf v2 = v * v;
  const vf u = v + splat(0.044715f) * v2 * v;
  const vf s = splat(1.f) / (splat(1.f) + vexp(vmin(vmax(splat(-2.f * 0.7978845608f) * u, splat(-87.f)), splat(87.f))));
  const vf du2 = splat(2.f * 0.7978845608f) * (splat(1.f) + splat(3.f * 0.044715f) * v2);
  return g * (s + v * s * (splat(1.f) - s) * du2);
}

float gelu_grad(float v, float g) {
  const float u = v + 0.044715f * v * v * v;
  const float s = 1.f / (1.f + std::exp(std::min(std::max(-2.f * 0.7978845608f * u, -87.f), 87.f)));
  return g * (s + v * s * (1.f - s) * 2.f * 0.7978845608f * (1.f + 3.f * 0.044715f * v * v));
}

// silu(a) * g (SwiGLU): a / (1 + exp(-a)) * g, the exponent clamped as above.
void silu_mul(float* a, const float* g, int64_t n) {
  int64_t i = 0;
  for (; i + VW <= n; i += VW) {
    const vf v = load_x(a + i);
    store_x(a + i, v / (splat(1.f) + vexp(vmin(vmax(splat(-1.f) * v, splat(-87.f)), splat(87.f)))) * load_x(g + i));
  }
  for (; i < n; i++) a[i] = a[i] / (1.f + std::exp(std::min(std::max(-a[i], -87.f), 87.f))) * g[i];
}

}  // namespace

// Training's GELU: the forward into a new tensor (the input is kept for the backward), and the backward,
// g * gelu'(x). torch's CPU kernels for the tanh form took 2.1 ms forward and backward on a 32 x 64 x 256
// activation (one thread; its forward alone 4x its exact-erf GELU's), these 1.0 ms: vectorised like the prefill's.
torch::Tensor gelu_tanh_forward(torch::Tensor x) {
  TORCH_CHECK(x.scalar_type() == torch::kFloat32 && x.is_contiguous() && x.device().is_cpu(),
              "gelu_tanh_forward: a contiguous fp32 CPU tensor expected");
  auto y = torch::empty_like(x);
  const float* a = x.data_ptr<float>();
  float* o = y.data_ptr<float>();
  at::parallel_for(0, x.numel(), 1 << 14, [&](int64_t b, int64_t e) { gelu_tanh(a + b, o + b, e - b); });
  return y;
}

torch::Tensor gelu_tanh_backward(torch::Tensor x, torch::Tensor g) {
  TORCH_CHECK(x.scalar_type() == torch::kFloat32 && g.scalar_type() == torch::kFloat32 && x.is_contiguous() &&
              g.is_contiguous() && x.device().is_cpu() && g.device().is_cpu() && x.sizes() == g.sizes(),
              "gelu_tanh_backward: contiguous fp32 CPU tensors of one shape expected");
  auto out = torch::empty_like(x);
  const float* a = x.data_ptr<float>();
  const float* gr = g.data_ptr<float>();
  float* o = out.data_ptr<float>();
  at::parallel_for(0, x.numel(), 1 << 14, [&](int64_t b, int64_t e) {
    int64_t i = b;
    for (; i + VW <= e; i += VW) store_x(o + i, gelu_grad_v(load_x(a + i), load_x(gr + i)));
    for (; i < e; i++) o[i] = gelu_grad(a[i], gr[i]);
  });
  return out;
}

// GELU (tanh approximation) in place over a contiguous fp32 or bf16 tensor, in parallel: the prefill's MLP
// activation. torch's CPU gelu took 25 ms of a 425 ms GPT-2 small prefill of 512 tokens (1.3 ns an element, 2
// threads); on bf16 activations (a bf16 or int8 model's) 1.57 ms per 512 x 3072 against this kernel's 0.48.
void gelu_tanh_(torch::Tensor t) {
  TORCH_CHECK((t.scalar_type() == torch::kFloat32 || t.scalar_type() == torch::kBFloat16) && t.is_contiguous() &&
              t.device().is_cpu(), "gelu_tanh_: a contiguous fp32 or bf16 CPU tensor expected");
  if (t.scalar_type() == torch::kBFloat16) {
    auto* p = reinterpret_cast<uint16_t*>(t.data_ptr<at::BFloat16>());
    at::parallel_for(0, t.numel(), 1 << 14, [&](int64_t a, int64_t b) { gelu_tanh_bf16(p + a, b - a); });
    return;
  }
  float* p = t.data_ptr<float>();
  at::parallel_for(0, t.numel(), 1 << 14, [&](int64_t a, int64_t b) { gelu_tanh(p + a, p + a, b - a); });
}
