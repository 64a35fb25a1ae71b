// Rotate-half rotary embedding over a whole (B, H, T, D) tensor, for prefill and training.
//
// torch's form, positional.apply_rotary, is five passes (slice, neg, cat, two products, a sum) and as many again
// in autograd's backward (with zero-filled slice gradients), a tenth of a small model's training step. One pass
// computes the same thing: out = x * cos + cat(-x[half:], x[:half]) * sin, the two products rounded apart and
// then added (built with -ffp-contract=off: no fused multiply-add), so the result equals torch's bit for bit.
// The backward is the transpose, one pass too (rope_row_t).
#pragma once

#include <torch/extension.h>
#include <ATen/Parallel.h>

namespace {

// One row of D: in and out may not alias; c, s the row's angles (D each).
inline void rope_row(const float* in, float* out, const float* c, const float* s, int64_t D) {
  const int64_t half = D / 2;
  for (int64_t i = 0; i < half; i++) {
    const float a = in[i] * c[i], p = -in[i + half] * s[i];
    out[i] = a + p;
  }
  for (int64_t i = half; i < D; i++) {
    const float a = in[i] * c[i], p = in[i - half] * s[i];
    out[i] = a + p;
  }
}

// The transpose of rope_row (its gradient): out1 = x1 c1 - x2 s1, out2 = x2 c2 + x1 s2 give
// g_x1 = g1 c1 + g2 s2 and g_x2 = g2 c2 - g1 s1, exact for any angles (sin's halves need not be equal).
inline void rope_row_t(const float* in, float* out, const float* c, const float* s, int64_t D) {
  const int64_t half = D / 2;
  for (int64_t i = 0; i < half; i++) {
    const float a = in[i] * c[i], p = in[i + half] * s[i + half];
    out[i] = a + p;
  }
  for (int64_t i = half; i < D; i++) {
    const float a = in[i] * c[i], p = -in[i - half] * s[i - half];
    out[i] = a + p;
  }
}

}  // namespace

// x (B, H, T, D) fp32 with unit stride in D (any other strides: the heads may be a view of a fused projection);
// cos, sin (T, D) contiguous fp32. -> a new (B, H, T, D) laid out as torch's elementwise ops lay out theirs: heads
// merged, (B, T, H, D) in memory, when x's heads sit inside its positions (a view of a projection; what the compiled
// prefill attention reads), contiguous otherwise. ``inverse``: the transpose, g -> the gradient of x.
torch::Tensor rope_apply(torch::Tensor x, torch::Tensor cos, torch::Tensor sin, bool inverse) {
  TORCH_CHECK(x.dim() == 4 && x.scalar_type() == torch::kFloat32 && x.device().is_cpu() && x.stride(3) == 1,
              "rope_apply: an fp32 CPU (B, H, T, D) tensor with unit stride in D expected");
  const int64_t B = x.size(0), H = x.size(1), T = x.size(2), D = x.size(3);
  TORCH_CHECK(D % 2 == 0 && cos.is_contiguous() && sin.is_contiguous() && cos.device().is_cpu() &&
              sin.device().is_cpu() && cos.scalar_type() == torch::kFloat32 &&
              sin.scalar_type() == torch::kFloat32 && cos.dim() == 2 && cos.size(0) == T && cos.size(1) == D &&
              sin.sizes() == cos.sizes(), "rope_apply: contiguous fp32 (T, D) cos and sin expected, D even");
  const bool merged = x.stride(1) < x.stride(2);
  auto out = merged ? torch::empty({B, T, H, D}, x.options()).transpose(1, 2) : torch::empty({B, H, T, D}, x.options());
  const int64_t ob = out.stride(0), oh = out.stride(1), ot = out.stride(2);
  const float* xp = x.data_ptr<float>();
  const float* cp = cos.data_ptr<float>();
  const float* sp = sin.data_ptr<float>();
  float* op = out.data_ptr<float>();
  const int64_t sb = x.stride(0), sh = x.stride(1), st = x.stride(2);
  at::parallel_for(0, B * H, 1, [&](int64_t a, int64_t e) {
    for (int64_t bh = a; bh < e; bh++) {
      const float* in = xp + (bh / H) * sb + (bh % H) * sh;
      float* o = op + (bh / H) * ob + (bh % H) * oh;
      for (int64_t t = 0; t < T; t++) {
        if (inverse) rope_row_t(in + t * st, o + t * ot, cp + t * D, sp + t * D, D);
        else rope_row(in + t * st, o + t * ot, cp + t * D, sp + t * D, D);
      }
    }
  });
  return out;
}
