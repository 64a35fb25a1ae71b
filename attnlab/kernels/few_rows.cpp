// y = x @ w^T * scale + bias for a few rows x (fp32 or bf16) and a weight w in fp32, bf16 or int8.
//
// Why this exists: decode multiplies one row (or a few) by every weight, so it is bound by how fast the weights
// stream from memory. Narrow weights halve (bf16) or quarter (int8) the bytes, but on the CPUs here torch's own
// one-row kernels for them streamed at 10-20 GB/s against fp32's 27-30 (oneDNN/AMX is built for many rows), so
// bf16 decoded no faster than fp32. Here each weight element is widened to fp32 in registers and multiplied in
// fp32 (fp32 accumulation, as the library kernels do), so the narrow weight is read once at the width it is stored.
// fp32 weights too: torch's fp32 GEMMs streamed 14-19 GB/s at 8 rows against 27-30 at one; here a weight vector,
// once loaded, serves 4 rows, so a batch of rows reads each weight from memory once.
//
// Compiled on the machine that runs it (-march=native: AVX-512 where there is AVX-512, AVX2 elsewhere), in vectors
// of the machine's width; 4 output channels at a time, each widened weight vector used for up to 4 rows. Every
// output element is the same sum in the same order whatever the number of rows or threads (threads split whole
// blocks of channels), so a row's result does not depend on which other rows share the call: a batch equals each
// row alone, bit for bit.
#pragma once

#include <torch/extension.h>
#include <ATen/Parallel.h>

#include "simd.h"

#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>

namespace {

using namespace attnlab;

constexpr int64_t PF_ROWS = 8;  // prefetch distance, in weight rows (measured: 4 and 8 alike, 8 a little ahead)
constexpr int64_t RB = 4;  // output channels per block: 4 independent sums per row hide the multiply-add latency

// Rows m0..m0+MB-1 of x times channels n..n+RB-1 of w: each weight vector is widened once and used for MB rows.
template <int MB, typename W>
inline void block(const float* x, const W* w, int64_t n, int64_t m0, int64_t K, float out[MB][RB]) {
  vf acc[MB][RB];
  for (int m = 0; m < MB; m++)
    for (int i = 0; i < RB; i++) acc[m][i] = vzero();
  const W* wr[RB];
  for (int i = 0; i < RB; i++) wr[i] = w + (n + i) * K;
  const int64_t Kv = K - K % VW;
  for (int64_t k = 0; k < Kv; k += VW) {
    vf wv[RB];
    for (int i = 0; i < RB; i++) {
      // Ask for the same place PF_ROWS rows on (two blocks ahead, where this thread goes next): without it the
      // streams ran at 16-20 GB/s here, with it 29-31 (GPT-2 small's 12 layers at one row, 2 threads: bf16
      // 8.6 -> 5.8 ms, int8 3.8 -> 2.7 ms). A prefetch past the matrix's end is harmless (it never faults).
      _mm_prefetch(reinterpret_cast<const char*>(wr[i] + k + PF_ROWS * K), _MM_HINT_T0);
      wv[i] = load_w(wr[i] + k);
    }
    for (int m = 0; m < MB; m++) {
      const vf xv = load_x(x + (m0 + m) * K + k);
      for (int i = 0; i < RB; i++) acc[m][i] = fma(xv, wv[i], acc[m][i]);
    }
  }
  static_assert(RB == 4, "sum4 reduces four channels at once");
  for (int m = 0; m < MB; m++) {
    sum4(acc[m][0], acc[m][1], acc[m][2], acc[m][3], out[m]);
    for (int i = 0; i < RB; i++)
      for (int64_t k = Kv; k < K; k++) out[m][i] = std::fma(x[(m0 + m) * K + k], widen(wr[i][k]), out[m][i]);
  }
}

template <typename W, typename Y>
inline void store(Y* y, const float* scale, const float* bias, int64_t N, int64_t m, int64_t n, float v) {
  if (scale) v *= scale[n];
  if (bias) v += bias[n];
  y[m * N + n] = Y(v);
}

template <typename W, typename Y>
void run(const float* x, const W* w, const float* scale, const float* bias, Y* y, int64_t M, int64_t N, int64_t K) {
  const int64_t blocks = N / RB;
  // Threads split whole blocks of channels; rows go 4 at a time, then 2, then 1 (the same arithmetic for a row
  // whichever group it falls in: each (row, channel) sum runs over k in the same order).
  at::parallel_for(0, blocks + (N % RB ? 1 : 0), 1, [&](int64_t b0, int64_t b1) {
    for (int64_t blk = b0; blk < b1; blk++) {
      const int64_t n = blk * RB;
      if (blk == blocks) {  // the last channels when N is not a multiple of RB
        for (int64_t c = n; c < N; c++)
          for (int64_t m = 0; m < M; m++) {
            vf acc = vzero();
            const int64_t Kv = K - K % VW;
            for (int64_t k = 0; k < Kv; k += VW) acc = fma(load_x(x + m * K + k), load_w(w + c * K + k), acc);
            float s = lanes_sum(acc);
            for (int64_t k = Kv; k < K; k++) s = std::fma(x[m * K + k], widen(w[c * K + k]), s);
            store<W>(y, scale, bias, N, m, c, s);
          }
        continue;
      }
      int64_t m = 0;
      for (; m + 4 <= M; m += 4) {
        float out[4][RB];
        block<4>(x, w, n, m, K, out);
        for (int r = 0; r < 4; r++)
          for (int i = 0; i < RB; i++) store<W>(y, scale, bias, N, m + r, n + i, out[r][i]);
      }
      for (; m + 2 <= M; m += 2) {
        float out[2][RB];
        block<2>(x, w, n, m, K, out);
        for (int r = 0; r < 2; r++)
          for (int i = 0; i < RB; i++) store<W>(y, scale, bias, N, m + r, n + i, out[r][i]);
      }
      for (; m < M; m++) {
        float out[1][RB];
        block<1>(x, w, n, m, K, out);
        for (int i = 0; i < RB; i++) store<W>(y, scale, bias, N, m, n + i, out[0][i]);
      }
    }
  });
}

}  // namespace

// x (M, K) fp32 or bf16; w (N, K) fp32, bf16 or int8, contiguous; scale (N,) fp32 or empty; bias (N,) fp32 or empty.
// Returns (M, N) in x's dtype.
torch::Tensor few_rows_linear(torch::Tensor x, torch::Tensor w, torch::Tensor scale, torch::Tensor bias) {
  TORCH_CHECK(x.dim() == 2 && w.dim() == 2 && x.size(1) == w.size(1), "linear: x (M, K) and w (N, K) expected");
  TORCH_CHECK(w.is_contiguous() && x.device().is_cpu(), "linear: a contiguous CPU weight expected");
  const auto xf = x.to(torch::kFloat32).contiguous();
  const int64_t M = xf.size(0), K = xf.size(1), N = w.size(0);
  const float* sp = scale.numel() ? scale.data_ptr<float>() : nullptr;
  const float* bp = bias.numel() ? bias.data_ptr<float>() : nullptr;
  TORCH_CHECK(!sp || scale.numel() == N, "linear: scale must have one entry per output channel");
  TORCH_CHECK(!bp || bias.numel() == N, "linear: bias must have one entry per output channel");
  auto y = torch::empty({M, N}, x.options());
  const float* xp = xf.data_ptr<float>();
  const bool y32 = x.scalar_type() == torch::kFloat32;
  TORCH_CHECK(y32 || x.scalar_type() == torch::kBFloat16, "linear: x must be fp32 or bf16");
  if (w.scalar_type() == torch::kBFloat16) {
    const auto* wp = reinterpret_cast<const uint16_t*>(w.data_ptr<at::BFloat16>());
    if (y32) run(xp, wp, sp, bp, y.data_ptr<float>(), M, N, K);
    else run(xp, wp, sp, bp, y.data_ptr<at::BFloat16>(), M, N, K);
  } else if (w.scalar_type() == torch::kFloat32) {
    const auto* wp = w.data_ptr<float>();
    if (y32) run(xp, wp, sp, bp, y.data_ptr<float>(), M, N, K);
    else run(xp, wp, sp, bp, y.data_ptr<at::BFloat16>(), M, N, K);
  } else {
    TORCH_CHECK(w.scalar_type() == torch::kChar, "linear: w must be fp32, bf16 or int8");
    const auto* wp = w.data_ptr<int8_t>();
    if (y32) run(xp, wp, sp, bp, y.data_ptr<float>(), M, N, K);
    else run(xp, wp, sp, bp, y.data_ptr<at::BFloat16>(), M, N, K);
  }
  return y;
}
