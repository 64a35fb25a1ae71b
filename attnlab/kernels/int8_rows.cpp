// The two ends of Int8Linear's prefill-sized integer product (its w8a8 path), each in one pass over the rows:
// quantize_rows_int8 rounds each row of activations to int8 with a step of its own (s = max|x| / 127), and
// scale_rows_int32 turns the int32 sums of torch's integer GEMM (_int_mm, between them) into acc * s * scale + bias
// in the activations' dtype.
//
// Why this exists: as torch ops the two ends were eleven passes over the rows (widen, abs, max, divide, round,
// narrow; widen, two multiplies, an add, narrow), 1.0-1.8 ms beside a 0.8-3.1 ms GEMM for each of GPT-2 small's
// products at 512 rows, 2 threads: about a fifth of an int8 prefill. Here a row's maximum and its quantization run
// while the row is in L1, and the scaling reads each sum once. The arithmetic is those ops' own (an fp32 division by
// the step, rounding to nearest even; fp32 products in the same order), so the results are theirs bit for bit (for
// finite rows: a row holding an inf gets a NaN step where torch's gets an inf; either sends the call to the float
// product).
#pragma once

#include <torch/extension.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <tuple>
#include <type_traits>

#include "simd.h"

namespace {

using namespace attnlab;

// max |r[k]|, or NaN where the row holds an inf or a NaN (max drops a NaN, so that is checked apart: x * 0 is NaN
// exactly where x is an inf or a NaN, and a NaN stays in a sum).
template <typename T>
inline float row_amax(const T* r, int64_t K) {
  vf vm = vzero(), vbad = vzero();
  int64_t k = 0;
  for (; k + VW <= K; k += VW) {
    const vf v = load_w(r + k);
    vm = vmax(vm, vmax(v, vsub(vzero(), v)));
    vbad = vadd(vbad, vmul(v, vzero()));
  }
  float amax = hmax(vm), bad = hsum(vbad);
  for (; k < K; k++) {
    amax = std::max(amax, std::fabs(widen(r[k])));
    bad += widen(r[k]) * 0.f;
  }
  return std::isnan(bad) ? std::numeric_limits<float>::quiet_NaN() : amax;
}

template <typename T>
inline void quantize_row(const T* r, int64_t K, float s, int8_t* q) {
  int64_t k = 0;
#if defined(__AVX512F__)  // elsewhere one at a time: w8a8 is timed against widening there, so a slow loop loses
  const __m512 vs = _mm512_set1_ps(s);
  // |r[k] / s| <= 127 (to float rounding), so the saturating narrow never saturates
  for (; k + 16 <= K; k += 16)
    _mm_storeu_si128(reinterpret_cast<__m128i*>(q + k),
                     _mm512_cvtsepi32_epi8(_mm512_cvtps_epi32(_mm512_div_ps(load_w(r + k), vs))));
#endif
  for (; k < K; k++) q[k] = int8_t(std::nearbyint(widen(r[k]) / s));
}

template <typename T>
void quantize_all(const T* x, int64_t M, int64_t K, int8_t* q, float* step) {
  at::parallel_for(0, M, std::max<int64_t>(1, (1 << 16) / std::max<int64_t>(K, 1)), [&](int64_t m0, int64_t m1) {
    for (int64_t m = m0; m < m1; m++) {
      const float amax = row_amax(x + m * K, K);
      // torch's clamp(min=1e-12) then / 127, in fp32; amax first, so that a NaN stays (std::max returns its first
      // argument when the comparison fails)
      step[m] = std::max(amax, 1e-12f) / 127.f;
      if (std::isfinite(step[m])) quantize_row(x + m * K, K, step[m], q + m * K);
    }
  });
}

template <typename Y>
void scale_all(const int32_t* acc, const float* step, const float* scale, const float* bias, Y* y, int64_t M,
               int64_t N) {
  at::parallel_for(0, M, std::max<int64_t>(1, (1 << 16) / std::max<int64_t>(N, 1)), [&](int64_t m0, int64_t m1) {
    for (int64_t m = m0; m < m1; m++) {
      const int32_t* a = acc + m * N;
      Y* o = y + m * N;
      const vf s = splat(step[m]);
      int64_t n = 0;
      for (; n + VW <= N; n += VW) {
        vf v = vmul(vmul(load_i32(a + n), s), load_x(scale + n));
        if (bias) v = vadd(v, load_x(bias + n));
        if constexpr (std::is_same_v<Y, float>) store_x(o + n, v);
        else store_bf16(o + n, v);
      }
      for (; n < N; n++) {
        float v = float(a[n]) * step[m] * scale[n];
        if (bias) v += bias[n];
        if constexpr (std::is_same_v<Y, float>) o[n] = v;
        else o[n] = narrow(v);
      }
    }
  });
}

}  // namespace

// x (M, K) fp32 or bf16 -> (int8 (M, K), fp32 steps (M, 1), whether every step is finite): row m is
// round(x[m] / s_m), s_m = max(max|x[m]|, 1e-12) / 127; a row holding an inf or a NaN gets a step that is not finite
// and is left unquantized (the caller hands such a call to a float product).
std::tuple<torch::Tensor, torch::Tensor, bool> quantize_rows_int8(torch::Tensor x) {
  TORCH_CHECK(x.dim() == 2 && x.is_contiguous() && x.device().is_cpu() &&
              (x.scalar_type() == torch::kFloat32 || x.scalar_type() == torch::kBFloat16),
              "quantize_rows_int8: a contiguous (M, K) fp32 or bf16 CPU tensor expected");
  const int64_t M = x.size(0), K = x.size(1);
  auto q = torch::empty({M, K}, x.options().dtype(torch::kChar));
  auto step = torch::empty({M, 1}, x.options().dtype(torch::kFloat32));
  if (x.scalar_type() == torch::kFloat32)
    quantize_all(x.data_ptr<float>(), M, K, q.data_ptr<int8_t>(), step.data_ptr<float>());
  else
    quantize_all(reinterpret_cast<const uint16_t*>(x.data_ptr<at::BFloat16>()), M, K, q.data_ptr<int8_t>(),
                 step.data_ptr<float>());
  const float* sp = step.data_ptr<float>();
  return {q, step, std::all_of(sp, sp + M, [](float v) { return std::isfinite(v); })};
}

// acc (M, N) int32, step (M, 1) fp32, scale (N,) fp32, bias (N,) fp32 or empty -> (M, N) in dtype (fp32 or bf16):
// acc * step * scale (+ bias), in that order, in fp32, rounded once to dtype.
torch::Tensor scale_rows_int32(torch::Tensor acc, torch::Tensor step, torch::Tensor scale, torch::Tensor bias,
                               torch::ScalarType dtype) {
  TORCH_CHECK(acc.dim() == 2 && acc.is_contiguous() && acc.scalar_type() == torch::kInt && acc.device().is_cpu(),
              "scale_rows_int32: contiguous (M, N) int32 sums on the CPU expected");
  const int64_t M = acc.size(0), N = acc.size(1);
  TORCH_CHECK(step.scalar_type() == torch::kFloat32 && step.is_contiguous() && step.numel() == M,
              "scale_rows_int32: one fp32 step per row expected");
  TORCH_CHECK(scale.scalar_type() == torch::kFloat32 && scale.is_contiguous() && scale.numel() == N,
              "scale_rows_int32: one fp32 scale per column expected");
  TORCH_CHECK(!bias.numel() || (bias.scalar_type() == torch::kFloat32 && bias.is_contiguous() && bias.numel() == N),
              "scale_rows_int32: the bias must be empty or one fp32 entry per column");
  TORCH_CHECK(dtype == torch::kFloat32 || dtype == torch::kBFloat16, "scale_rows_int32: fp32 or bf16 out");
  auto y = torch::empty({M, N}, acc.options().dtype(dtype));
  const float* bp = bias.numel() ? bias.data_ptr<float>() : nullptr;
  if (dtype == torch::kFloat32)
    scale_all(acc.data_ptr<int32_t>(), step.data_ptr<float>(), scale.data_ptr<float>(), bp, y.data_ptr<float>(), M, N);
  else
    scale_all(acc.data_ptr<int32_t>(), step.data_ptr<float>(), scale.data_ptr<float>(), bp,
              reinterpret_cast<uint16_t*>(y.data_ptr<at::BFloat16>()), M, N);
  return y;
}
