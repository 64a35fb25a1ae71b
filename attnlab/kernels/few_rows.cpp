// y = x @ w^T * scale + bias for a few rows x (fp32 or bf16) and a weight w in fp32, bf16 or int8.
//
// Why this exists: decode multiplies one row (or a few) by every weight, so it is bound by how fast the weights
// stream from memory. Narrow weights halve (bf16) or quarter (int8) the bytes, but on the CPUs here torch's own
// one-row kernels for them streamed at 10-20 GB/s against fp32's 27-30 (oneDNN/AMX is built for many rows), so
// bf16 decoded no faster than fp32. Here each weight element is widened to fp32 in registers and multiplied in
// fp32 (fp32 accumulation, as the library kernels do), so the narrow weight is read once at the width it is stored.
// fp32 weights too: torch's fp32 GEMMs streamed 14-19 GB/s at 8 rows against 27-30 at one; here a weight vector,
// once loaded, serves 4 rows (6 in the float path with AVX-512), so a batch of rows reads each weight from memory
// once. On a CPU with AVX512-VNNI an int8 weight meets rows quantized to int16 instead, in exact integer arithmetic
// (run's int8 overload, below).
//
// Compiled on the machine that runs it (-march=native: AVX-512 where there is AVX-512, AVX2 elsewhere), in vectors
// of the machine's width; 4 output channels at a time, each widened weight vector used for up to 4 rows (6 in the
// float path with AVX-512). Every output element is the same sum in the same order whatever the number of rows or
// threads (threads split whole blocks of channels), so a row's result does not depend on which other rows share
// the call: a batch equals each row alone, bit for bit.
#pragma once

#include <torch/extension.h>
#include <ATen/Parallel.h>

#include "simd.h"

#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>
#include <vector>

namespace {

using namespace attnlab;

constexpr int64_t PF_ROWS = 8;  // prefetch distance, in weight rows (measured: 4 and 8 alike, 8 a little ahead)
constexpr int64_t RB = 4;  // output channels per block: 4 independent sums per row hide the multiply-add latency
// Rows per pass of run_float: with AVX-512's 32 registers, 6 rows' 24 sums, the 4 weight vectors and a row vector fit
// (16 rows in 3 passes over a block's weights, not 4: 1.07-1.12x for GPT-2 small's fp32 weights at 16 rows, 1.11x
// at 6, bf16 1.03x and 1.08x; 2 threads, alternating in one process). AVX2 keeps 4 rows, whose 16 sums alone fill
// its 16 registers (the compiler spills around them), so more rows could only spill more.
constexpr int FLOAT_ROWS = VW == 16 ? 6 : 4;

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
      // 8.6 -> 5.8 ms, int8 3.8 -> 2.7 ms). Into L2 (T1), not L1: two blocks ahead is 8 rows of K weights, at
      // K = 768 fp32 half of L1 beside the block in use, so prefetches into L1 evicted lines still to be read
      // (docs/engine.md: 1.25x fp32, 1.5x int8 at one row). A prefetch past the matrix's end is harmless (it never
      // faults).
      _mm_prefetch(reinterpret_cast<const char*>(wr[i] + k + PF_ROWS * K), _MM_HINT_T1);
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

// Rows in groups of G, then one group of the 1 to G-1 left (f(integral_constant<MB>, first row)). Each group is a
// pass over the block's weights, so the passes are as few as the register budget allows: 7 rows (a k = 6 verify) in
// 2 passes, not 4 + 2 + 1; 3 rows in one (as 2 + 1 they had cost 1.1x 4 rows).
template <int G = 4, typename F>
inline void row_groups(int64_t M, F&& f) {
  static_assert(G == 4 || G == 6, "groups of 4 or 6 rows");
  int64_t m = 0;
  for (; m + G <= M; m += G) f(std::integral_constant<int, G>{}, m);
  switch (M - m) {
    case 5: if constexpr (G > 5) f(std::integral_constant<int, 5>{}, m); break;
    case 4: if constexpr (G > 4) f(std::integral_constant<int, 4>{}, m); break;
    case 3: f(std::integral_constant<int, 3>{}, m); break;
    case 2: f(std::integral_constant<int, 2>{}, m); break;
    case 1: f(std::integral_constant<int, 1>{}, m); break;
    default: break;
  }
}

// Every weight widened to fp32 in registers (load_w) and multiplied in fp32.
template <typename W, typename Y>
void run_float(const float* x, const W* w, const float* scale, const float* bias, Y* y, int64_t M, int64_t N,
               int64_t K) {
  const int64_t blocks = N / RB;
  // Threads split whole blocks of channels; rows go in row_groups (the same arithmetic for a row whichever group it
  // falls in: each (row, channel) sum runs over k in the same order).
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
      row_groups<FLOAT_ROWS>(M, [&](auto mb, int64_t m) {
        constexpr int MB = decltype(mb)::value;
        float out[MB][RB];
        block<MB>(x, w, n, m, K, out);
        for (int r = 0; r < MB; r++)
          for (int i = 0; i < RB; i++) store<W>(y, scale, bias, N, m + r, n + i, out[r][i]);
      });
    }
  });
}

template <typename W, typename Y>
void run(const float* x, const W* w, const float* scale, const float* bias, Y* y, int64_t M, int64_t N, int64_t K) {
  run_float(x, w, scale, bias, y, M, N, K);
}

#if defined(__AVX512BW__) && defined(__AVX512VNNI__)
// int8 weights on a CPU with AVX512-VNNI: integer dot products. Widening every int8 weight to fp32 (load_w) costs
// three vector instructions per 16 weights, and at one row that work, not memory, set the pace (int8 GPT-2 small
// at 2 threads: ~23 GB/s of weights against fp32's ~37 and a 46-49 GB/s sum). Here each row of x is quantized to
// int16 (step s = max|x| / 32767, rounded to nearest: its error is at most s / 2, 2^-16 of the row's largest
// entry), and 32 weights widened to int16 take one instruction and one multiply-add of pairs into int32
// (vpdpwssd). A row holding an inf or a NaN, or whose largest entry is too small for an fp32 reciprocal, runs
// the fp32 path alone (run_float, one row), so it passes them on and the rows beside it are unchanged.
//
// Exact integer sums: a lane of an int32 accumulator gains two products of |.| <= 128 * 32767 per instruction, so
// after KC / 32 instructions it holds at most KC / 16 * 4.2e6 = 1.1e9 < 2^31; each KC-long chunk's lanes are then
// added in int64. Every (row, channel) dot product is thus the exact integer, whatever rows share the call or
// however threads split the channels; it is scaled once, in double, by the row's step, then as the float path by
// the channel's scale and bias.
constexpr int64_t K_CHUNK = 4096;  // KC in the sums above
constexpr int XQ_MAX = 32767;

// Rows m0..m0+MB-1 of xq (int16, K each) times channels n..n+RB-1 of w: exact int64 sums.
template <int MB>
inline void block_i16(const int16_t* xq, const int8_t* w, int64_t n, int64_t m0, int64_t K, int64_t out[MB][RB]) {
  const int8_t* wr[RB];
  for (int i = 0; i < RB; i++) wr[i] = w + (n + i) * K;
  for (int m = 0; m < MB; m++)
    for (int i = 0; i < RB; i++) out[m][i] = 0;
  const int64_t Kv = K - K % 32;
  for (int64_t k0 = 0; k0 < Kv; k0 += K_CHUNK) {
    const int64_t k1 = std::min(Kv, k0 + K_CHUNK);
    __m512i acc[MB][RB];
    for (int m = 0; m < MB; m++)
      for (int i = 0; i < RB; i++) acc[m][i] = _mm512_setzero_si512();
    for (int64_t k = k0; k < k1; k += 32) {
      __m512i wv[RB];
      for (int i = 0; i < RB; i++) {
        _mm_prefetch(reinterpret_cast<const char*>(wr[i] + k + PF_ROWS * K), _MM_HINT_T1);  // as block's, into L2
        wv[i] = _mm512_cvtepi8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(wr[i] + k)));
      }
      for (int m = 0; m < MB; m++) {
        const __m512i xv = _mm512_loadu_si512(xq + (m0 + m) * K + k);
        for (int i = 0; i < RB; i++) acc[m][i] = _mm512_dpwssd_epi32(acc[m][i], xv, wv[i]);
      }
    }
    for (int m = 0; m < MB; m++)
      for (int i = 0; i < RB; i++) {
        const __m512i lo = _mm512_cvtepi32_epi64(_mm512_castsi512_si256(acc[m][i]));
        const __m512i hi = _mm512_cvtepi32_epi64(_mm512_extracti64x4_epi64(acc[m][i], 1));
        out[m][i] += _mm512_reduce_add_epi64(_mm512_add_epi64(lo, hi));
      }
  }
  for (int m = 0; m < MB; m++)
    for (int i = 0; i < RB; i++)
      for (int64_t k = Kv; k < K; k++) out[m][i] += int64_t(xq[(m0 + m) * K + k]) * wr[i][k];
}

// Each row's step, and the row quantized into xq; a row without a step (an inf or a NaN in it, or a largest entry
// below 32767 / FLT_MAX) is left zero and listed in ``apart``, for the fp32 path.
inline void quantize_rows(const float* x, int64_t M, int64_t K, int16_t* xq, double* step,
                          std::vector<int64_t>& apart) {
  for (int64_t m = 0; m < M; m++) {
    const float* r = x + m * K;
    const int64_t Kv = K - K % 16;
    // the maximum drops a NaN (max_ps returns its second operand), so finiteness is checked apart: x * 0 is NaN
    // exactly where x is an inf or a NaN, and a NaN stays in a sum
    __m512 vmax = _mm512_setzero_ps(), vbad = _mm512_setzero_ps();
    for (int64_t k = 0; k < Kv; k += 16) {
      const __m512 v = _mm512_loadu_ps(r + k);
      vmax = _mm512_max_ps(vmax, _mm512_abs_ps(v));
      vbad = _mm512_add_ps(vbad, _mm512_mul_ps(v, _mm512_setzero_ps()));
    }
    float amax = _mm512_reduce_max_ps(vmax), bad = _mm512_reduce_add_ps(vbad);
    for (int64_t k = Kv; k < K; k++) {
      amax = std::max(amax, std::fabs(r[k]));
      bad += r[k] * 0.f;
    }
    step[m] = double(amax) / XQ_MAX;
    if (std::isnan(bad) || (amax > 0 && !(XQ_MAX / double(amax) <= std::numeric_limits<float>::max()))) {
      step[m] = 0;
      apart.push_back(m);
      continue;
    }
    const float inv = amax > 0 ? float(XQ_MAX / double(amax)) : 0.f;
    const __m512 vinv = _mm512_set1_ps(inv);
    int16_t* q = xq + m * K;
    // |r[k] * inv| <= 32767 (to float rounding), so the saturating pack never saturates; rounding to nearest even
    for (int64_t k = 0; k < Kv; k += 16)
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(q + k),
                          _mm512_cvtsepi32_epi16(_mm512_cvtps_epi32(_mm512_mul_ps(_mm512_loadu_ps(r + k), vinv))));
    for (int64_t k = Kv; k < K; k++) q[k] = int16_t(std::nearbyint(r[k] * inv));
  }
}

template <typename Y>
void run(const float* x, const int8_t* w, const float* scale, const float* bias, Y* y, int64_t M, int64_t N,
         int64_t K) {
  std::vector<int16_t> xq(M * K);
  std::vector<double> step(M);
  std::vector<int64_t> apart;
  quantize_rows(x, M, K, xq.data(), step.data(), apart);
  const int64_t blocks = N / RB;
  at::parallel_for(0, blocks + (N % RB ? 1 : 0), 1, [&](int64_t b0, int64_t b1) {
    for (int64_t blk = b0; blk < b1; blk++) {
      const int64_t n = blk * RB;
      if (blk == blocks) {  // the last channels when N is not a multiple of RB
        for (int64_t c = n; c < N; c++)
          for (int64_t m = 0; m < M; m++) {
            int64_t s = 0;
            for (int64_t k = 0; k < K; k++) s += int64_t(xq[m * K + k]) * w[c * K + k];
            store<int8_t>(y, scale, bias, N, m, c, float(double(s) * step[m]));
          }
        continue;
      }
      row_groups(M, [&](auto mb, int64_t m) {
        constexpr int MB = decltype(mb)::value;
        int64_t out[MB][RB];
        block_i16<MB>(xq.data(), w, n, m, K, out);
        for (int r = 0; r < MB; r++)
          for (int i = 0; i < RB; i++)
            store<int8_t>(y, scale, bias, N, m + r, n + i, float(double(out[r][i]) * step[m + r]));
      });
    }
  });
  for (const int64_t m : apart) run_float(x + m * K, w, scale, bias, y + m * N, 1, N, K);  // one row: as alone
}
#endif

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
