// Attention for a decode step: one query per row (or a few, causal among themselves), over each row's own keys, for
// every row and head in one call.
//
// Why this exists: a ragged batch (rows at different lengths) attended row by row through torch's SDPA, one call per
// row and layer (96 calls a step for 8 rows of GPT-2 small, about 230 us each, 17 GB/s of keys and values on the
// Sapphire Rapids here), and a paged cache copied the blocks of a row that is not a run before each call. Here
// one call reads every row's keys where they lie, through its block table if it has one, so nothing is copied.
//
// Keys of row b, head h, position j are at  k + b * stride_b + h * stride_h + slot(j) * stride_s  (the last
// dimension, D, contiguous), where slot(j) = j without a block table, else table[b][j / bs] * bs + j % bs. Query
// head h reads key head h / (H / Hkv) (grouped-query attention). Each (row, head) is computed by one thread, the
// same way whatever else is in the call: scores in fp32, softmax with the maximum subtracted, then the weighted
// sum of values. The rows and heads are spread over threads head-major, so long and short rows mix in each share.
#pragma once

#include <torch/extension.h>
#include <ATen/Parallel.h>

#include <vector>

#include "simd.h"

namespace {

using namespace attnlab;

constexpr int64_t PF_KEYS = 8;  // prefetch distance, in keys
constexpr int64_t MAX_VECS = 8;  // head sizes up to 8 vectors (128 with AVX-512) keep the output in registers

template <typename T>
inline void prefetch_row(const T* p, int64_t D) {  // every 64-byte line of a key or value row
  const char* c = reinterpret_cast<const char*>(p);
  for (int64_t i = 0; i < D * int64_t(sizeof(T)); i += 64) _mm_prefetch(c + i, _MM_HINT_T0);
}

template <typename T>
inline float dot(const float* a, const T* b, int64_t D) {
  vf acc = vzero();
  const int64_t Dv = D - D % VW;
  for (int64_t d = 0; d < Dv; d += VW) acc = fma(load_x(a + d), load_w(b + d), acc);
  float s = hsum(acc);
  for (int64_t d = Dv; d < D; d++) s = std::fma(a[d], widen(b[d]), s);
  return s;
}

// The cache's keys and values T: fp32, or bf16 (widened in registers, as few_rows.cpp does with weights: a bf16
// model's cache then costs half the bytes to read, and is never widened whole).
//
// Tq queries per row (a speculative verification's k + 1 new tokens): query i = b * Tq + j of row b sits at the
// row's position lp[b] - Tq + j and sees keys 0 .. lp[b] - Tq + j (causal among the new tokens); q and the output
// are (B * Tq, H, D).
template <typename T>
void attend(const float* qp, const T* kp, const T* vp, int64_t B, int64_t H, int64_t D, int64_t stride_b,
            int64_t stride_h, int64_t stride_s, const int64_t* tp, int64_t tn, int64_t bs, const int64_t* lp,
            int64_t groups, float sc, float* op, int64_t Tq = 1) {
  const bool paged = tp != nullptr;
  const int64_t Q = B * Tq;
  at::parallel_for(0, Q * H, 1, [&](int64_t t0, int64_t t1) {
    std::vector<float> s;
    std::vector<const T*> rows_k, rows_v;
    for (int64_t t = t0; t < t1; t++) {
      const int64_t i = t % Q, h = t / Q, b = i / Tq, n = lp[b] - (Tq - 1 - i % Tq);
      if (n <= 0) continue;
      const int64_t kvh = h / groups;
      const float* qr = qp + (i * H + h) * D;
      const int64_t base = b * stride_b + kvh * stride_h;
      rows_k.resize(n);
      rows_v.resize(n);
      for (int64_t j = 0; j < n; j++) {
        const int64_t slot = paged ? tp[b * tn + j / bs] * bs + j % bs : j;
        rows_k[j] = kp + base + slot * stride_s;
        rows_v[j] = vp + base + slot * stride_s;
      }
      s.resize(n + VW);
      float mx = -INFINITY;
      for (int64_t j = 0; j < n; j++) {
        // A block table's next block can be anywhere: ask for keys PF_KEYS ahead (the prefetcher follows only
        // a regular stride).
        if (j + PF_KEYS < n) prefetch_row(rows_k[j + PF_KEYS], D);
        s[j] = dot(qr, rows_k[j], D) * sc;
        mx = std::max(mx, s[j]);
      }
      const int64_t nv = n - n % VW;
      vf total = vzero();
      for (int64_t j = 0; j < nv; j += VW) {
        const vf e = vexp(load_x(&s[j]) - splat(mx));
        store_x(&s[j], e);
        total += e;
      }
      float sum = hsum(total);
      for (int64_t j = nv; j < n; j++) {
        float e[VW];
        store_x(e, vexp(splat(s[j] - mx)));
        s[j] = e[0];
        sum += s[j];
      }
      float* orow = op + (i * H + h) * D;
      const int64_t Dv = D - D % VW;
      if (D % VW == 0 && D / VW <= MAX_VECS) {  // the usual head sizes: one pass over the values, D in registers
        vf acc[MAX_VECS];
        const int64_t nvec = D / VW;
        for (int64_t c = 0; c < nvec; c++) acc[c] = vzero();
        for (int64_t j = 0; j < n; j++) {
          if (j + PF_KEYS < n) prefetch_row(rows_v[j + PF_KEYS], D);
          const vf p = splat(s[j]);
          for (int64_t c = 0; c < nvec; c++) acc[c] = fma(p, load_w(rows_v[j] + c * VW), acc[c]);
        }
        const vf inv = splat(1.f / sum);
        for (int64_t c = 0; c < nvec; c++) store_x(orow + c * VW, acc[c] * inv);
        continue;
      }
      for (int64_t d = 0; d < Dv; d += VW) {  // out[d..d+VW) = sum_j p_j v_j[d..d+VW)
        vf acc0 = vzero(), acc1 = vzero();
        int64_t j = 0;
        for (; j + 2 <= n; j += 2) {
          acc0 = fma(splat(s[j]), load_w(rows_v[j] + d), acc0);
          acc1 = fma(splat(s[j + 1]), load_w(rows_v[j + 1] + d), acc1);
        }
        if (j < n) acc0 = fma(splat(s[j]), load_w(rows_v[j] + d), acc0);
        store_x(orow + d, (acc0 + acc1) * splat(1.f / sum));
      }
      for (int64_t d = Dv; d < D; d++) {
        float a = 0;
        for (int64_t j = 0; j < n; j++) a = std::fma(s[j], widen(rows_v[j][d]), a);
        orow[d] = a / sum;
      }
    }
  });
}

}  // namespace

// q (B, H, D) fp32; k, v fp32 or bf16 storage addressed as above; tables (B, n) int64 or empty; lens (B,) int64.
// Returns (B, H, D) fp32. A row with no keys gets zeros.
torch::Tensor decode_attention(torch::Tensor q, torch::Tensor k, torch::Tensor v, int64_t stride_b, int64_t stride_h,
                               int64_t stride_s, torch::Tensor tables, int64_t bs, torch::Tensor lens, int64_t kv_heads,
                               double scale) {
  TORCH_CHECK(q.dim() == 3 && q.scalar_type() == torch::kFloat32 && q.is_contiguous(),
              "decode_attention: q must be a contiguous fp32 (B, H, D) tensor");
  TORCH_CHECK(k.scalar_type() == v.scalar_type() &&
              (k.scalar_type() == torch::kFloat32 || k.scalar_type() == torch::kBFloat16),
              "decode_attention: keys and values must be both fp32 or both bf16");
  TORCH_CHECK(k.stride(-1) == 1 && v.stride(-1) == 1, "decode_attention: the head dimension must be contiguous");
  const int64_t B = q.size(0), H = q.size(1), D = q.size(2);
  TORCH_CHECK(lens.numel() == B && lens.scalar_type() == torch::kLong, "decode_attention: lens must be (B,) int64");
  TORCH_CHECK(kv_heads > 0 && H % kv_heads == 0, "decode_attention: H must be a multiple of the key/value heads");
  const bool paged = tables.numel() > 0;
  TORCH_CHECK(!paged || (tables.dim() == 2 && tables.size(0) == B && tables.scalar_type() == torch::kLong && bs > 0),
              "decode_attention: tables must be (B, n) int64 with a block size > 0");
  auto out = torch::zeros({B, H, D}, q.options());
  const int64_t* tp = paged ? tables.data_ptr<int64_t>() : nullptr;
  const int64_t tn = paged ? tables.size(1) : 0;
  const int64_t groups = H / kv_heads;
  if (k.scalar_type() == torch::kFloat32)
    attend(q.data_ptr<float>(), k.data_ptr<float>(), v.data_ptr<float>(), B, H, D, stride_b, stride_h, stride_s, tp,
           tn, bs, lens.data_ptr<int64_t>(), groups, float(scale), out.data_ptr<float>());
  else
    attend(q.data_ptr<float>(), reinterpret_cast<const uint16_t*>(k.data_ptr<at::BFloat16>()),
           reinterpret_cast<const uint16_t*>(v.data_ptr<at::BFloat16>()), B, H, D, stride_b, stride_h, stride_s, tp,
           tn, bs, lens.data_ptr<int64_t>(), groups, float(scale), out.data_ptr<float>());
  return out;
}
