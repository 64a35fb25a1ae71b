// Causal attention for a prefill: T new queries per row over S >= T keys (the last T of which are the new tokens),
// fp32, every row and head in one call, the output written as (B, T, H, D) so the heads need no merging copy.
//
// Why this exists: torch's CPU flash kernel took about 5 ms a layer for GPT-2 small's 512-token prefill here (12
// heads of 64), some 60 ms of a 400 ms time to first token, for 0.4 GFLOP: a fifth of the machine's fp32 rate.
//
// How: the queries go in blocks of QB = QB_VECS vectors' lanes, transposed once per block (Qt, D x QB), so a key's
// scores against the whole block are D broadcast-FMAs into QB_VECS vectors, with no horizontal sums. Keys go in
// chunks of KC; each chunk's scores update a running maximum and sum per query (the online softmax of
// FlashAttention, Dao et al. 2022), and the output block is rescaled and accumulated from the chunk's weights and
// values. Query i of a block sits at position S - T + t0 + i and sees keys 0 .. that position: the causal mask
// aligned at the end, as a cache with a prefix needs. Each (row, head, query block) is computed by one thread,
// whatever else is in the call.
#pragma once

#include <torch/extension.h>
#include <ATen/Parallel.h>

#include <limits>
#include <vector>

#include "simd.h"

namespace {

using namespace attnlab;

// Register blocking, sized to the register file: AVX-512's 32 vector registers hold a 3-vector query block against 8
// keys (24 sums) and 6 output rows of up to 4 vectors (24 sums); AVX2's 16 hold 2 query vectors against 4 keys (8
// sums), and keep the 4 output rows that fit there only for heads of up to 2 vectors (GPT-2's 64-wide heads are 8
// AVX2 vectors: 2 rows, spilled). The wider
// blocking read the query vectors and value vectors fewer times per multiply-add: GPT-2 small's 512-token layer took
// 1.2x less time (12 heads of 64, 2 threads, alternating with the 2-against-4 blocking in one process). Which keys or
// queries share a block changes no sum: every score is the same dot product over d in the same order, so the
// result is the same bits either way.
constexpr int64_t QB_VECS = VW == 16 ? 3 : 2;
constexpr int KU = VW == 16 ? 8 : 4;  // keys per pass of the score loop
constexpr int PV_ROWS = VW == 16 ? 6 : 4;  // output rows in registers at a time, for heads of up to 4 vectors
constexpr int64_t QB = QB_VECS * VW;  // queries per block
constexpr int64_t KC = 64;  // keys per chunk

// Output rows += weights x values for one chunk: o (QB, D) row-major, p (kc, QB) the chunk's weights, alpha (QB,)
// each row's rescale. DV = D / VW vectors per row, R rows at a time in registers.
template <int DV>
void accumulate(float* o, const float* p, const float* alpha, const float* v, int64_t stride_s, int64_t kc) {
  constexpr int R = std::min<int64_t>(DV <= 4 ? PV_ROWS : 2, QB);  // a scalar build's block is 2 queries
  static_assert(QB % R == 0, "the query block must split into whole groups of rows");
  for (int64_t i0 = 0; i0 < QB; i0 += R) {
    vf acc[R][DV];
    for (int r = 0; r < R; r++) {
      const vf a = splat(alpha[i0 + r]);
      for (int c = 0; c < DV; c++) acc[r][c] = vmul(load_x(o + (i0 + r) * DV * VW + c * VW), a);
    }
    for (int64_t j = 0; j < kc; j++) {
      const float* vj = v + j * stride_s;
      vf vv[DV];
      for (int c = 0; c < DV; c++) vv[c] = load_x(vj + c * VW);
      for (int r = 0; r < R; r++) {
        const vf w = splat(p[j * QB + i0 + r]);
        for (int c = 0; c < DV; c++) acc[r][c] = fma(w, vv[c], acc[r][c]);
      }
    }
    for (int r = 0; r < R; r++)
      for (int c = 0; c < DV; c++) store_x(o + (i0 + r) * DV * VW + c * VW, acc[r][c]);
  }
}

template <int DV>
void attend_block(const float* q, int64_t q_stride_t, const float* k, const float* v, int64_t stride_s, int64_t T,
                  int64_t S, int64_t t0, float scale, float* out, int64_t out_stride_t, std::vector<float>& buf) {
  constexpr int64_t D = DV * VW;
  const int64_t nq = std::min(QB, T - t0);
  const int64_t first_pos = S - T + t0;  // query i sees keys 0 .. first_pos + i
  const int64_t n_keys = first_pos + nq;
  buf.resize(D * QB + KC * QB + QB * D + 3 * QB);
  float* qt = buf.data();         // (D, QB): the block's queries, scaled, transposed
  float* s = qt + D * QB;         // (KC, QB): a chunk's scores, then weights
  float* o = s + KC * QB;         // (QB, D)
  float* m = o + QB * D;          // (QB,) running maximum
  float* l = m + QB;              // (QB,) running sum
  float* alpha = l + QB;          // (QB,) rescale of the chunk
  if (nq < QB) std::fill(qt, qt + D * QB, 0.f);  // the block's missing queries: scores of 0, never written out
  std::fill(o, o + QB * D, 0.f);
  std::fill(l, l + QB, 0.f);
  for (int64_t i = 0; i < nq; i++)
    for (int64_t d = 0; d < D; d++) qt[d * QB + i] = q[(t0 + i) * q_stride_t + d] * scale;
  const float neg_inf = -std::numeric_limits<float>::infinity();
  for (int64_t i = 0; i < QB; i++) m[i] = neg_inf;
  for (int64_t j0 = 0; j0 < n_keys; j0 += KC) {
    const int64_t kc = std::min(KC, n_keys - j0);
    int64_t j = 0;
    for (; j + KU <= kc; j += KU) {  // KU keys at a time against the whole block
      vf acc[KU][QB_VECS];
      for (int u = 0; u < KU; u++)
        for (int n = 0; n < QB_VECS; n++) acc[u][n] = vzero();
      const float* kj = k + (j0 + j) * stride_s;
      for (int64_t d = 0; d < D; d++) {
        vf qv[QB_VECS];
        for (int n = 0; n < QB_VECS; n++) qv[n] = load_x(qt + d * QB + n * VW);
        for (int u = 0; u < KU; u++) {
          const vf b = splat(kj[u * stride_s + d]);
          for (int n = 0; n < QB_VECS; n++) acc[u][n] = fma(b, qv[n], acc[u][n]);
        }
      }
      for (int u = 0; u < KU; u++)
        for (int n = 0; n < QB_VECS; n++) store_x(s + (j + u) * QB + n * VW, acc[u][n]);
    }
    for (; j < kc; j++) {
      vf acc[QB_VECS];
      for (int n = 0; n < QB_VECS; n++) acc[n] = vzero();
      const float* kj = k + (j0 + j) * stride_s;
      for (int64_t d = 0; d < D; d++) {
        const vf b = splat(kj[d]);
        for (int n = 0; n < QB_VECS; n++) acc[n] = fma(b, load_x(qt + d * QB + n * VW), acc[n]);
      }
      for (int n = 0; n < QB_VECS; n++) store_x(s + j * QB + n * VW, acc[n]);
    }
    const bool diagonal = j0 + kc - 1 > first_pos;  // some query in the block may not see some key of the chunk
    if (diagonal)
      for (int64_t jj = 0; jj < kc; jj++)
        for (int64_t i = 0; i < std::min(QB, j0 + jj - first_pos); i++) s[jj * QB + i] = neg_inf;  // key past i
    for (int n = 0; n < QB_VECS; n++) {  // the online softmax, a vector of queries at a time
      vf mx = load_x(m + n * VW);
      for (int64_t jj = 0; jj < kc; jj++) mx = vmax(mx, load_x(s + jj * QB + n * VW));
      // every query sees key 0, so after the first chunk mx is finite; before it m is -inf and alpha 0
      const vf a = vexp(vsub(load_x(m + n * VW), mx));
      vf sum = vzero();
      for (int64_t jj = 0; jj < kc; jj++) {
        const vf p = vexp(vsub(load_x(s + jj * QB + n * VW), mx));
        store_x(s + jj * QB + n * VW, p);
        sum = vadd(sum, p);
      }
      store_x(alpha + n * VW, a);
      store_x(l + n * VW, fma(load_x(l + n * VW), a, sum));
      store_x(m + n * VW, mx);
    }
    if (diagonal) {  // masked keys weigh exactly 0 (vexp clamps its argument at -87)
      float fix[QB];
      for (int64_t i = 0; i < QB; i++) fix[i] = 0.f;
      for (int64_t jj = 0; jj < kc; jj++)
        for (int64_t i = 0; i < std::min(QB, j0 + jj - first_pos); i++) {
          fix[i] += s[jj * QB + i];
          s[jj * QB + i] = 0.f;
        }
      for (int64_t i = 0; i < QB; i++) l[i] -= fix[i];
    }
    accumulate<DV>(o, s, alpha, v + j0 * stride_s, stride_s, kc);
  }
  for (int64_t i = 0; i < nq; i++) {
    const vf inv = splat(1.f / l[i]);
    for (int c = 0; c < DV; c++) store_x(out + (t0 + i) * out_stride_t + c * VW, vmul(load_x(o + i * D + c * VW), inv));
  }
}

using BlockFn = void (*)(const float*, int64_t, const float*, const float*, int64_t, int64_t, int64_t, int64_t, float,
                         float*, int64_t, std::vector<float>&);

BlockFn block_fn(int64_t D) {
  switch (D / VW) {
    case 1: return attend_block<1>;
    case 2: return attend_block<2>;
    case 3: return attend_block<3>;
    case 4: return attend_block<4>;
    case 5: return attend_block<5>;
    case 6: return attend_block<6>;
    case 7: return attend_block<7>;
    case 8: return attend_block<8>;
    default: return nullptr;
  }
}

// q (B, H, T, D), k and v (B, Hkv, S, D), fp32, each with its last dimension contiguous (views of a projection's
// output or of a cache are fine). Returns (B, T, H, D).
torch::Tensor prefill_attention(torch::Tensor q, torch::Tensor k, torch::Tensor v, double scale) {
  TORCH_CHECK(q.dim() == 4 && k.dim() == 4 && v.dim() == 4, "prefill_attention: q, k, v must be 4-d");
  TORCH_CHECK(q.scalar_type() == torch::kFloat && k.scalar_type() == torch::kFloat && v.scalar_type() == torch::kFloat,
              "prefill_attention: fp32 only");
  TORCH_CHECK(q.stride(3) == 1 && k.stride(3) == 1 && v.stride(3) == 1, "prefill_attention: last dim not contiguous");
  const int64_t B = q.size(0), H = q.size(1), T = q.size(2), D = q.size(3);
  const int64_t Hkv = k.size(1), S = k.size(2);
  TORCH_CHECK(k.size(0) == B && v.size(0) == B && v.size(1) == Hkv && v.size(2) == S && k.size(3) == D &&
              v.size(3) == D, "prefill_attention: k and v must be (B, Hkv, S, D) like q's B and D");
  TORCH_CHECK(Hkv > 0 && H % Hkv == 0, "prefill_attention: query heads must be a multiple of key heads");
  TORCH_CHECK(S >= T, "prefill_attention: fewer keys than queries");
  TORCH_CHECK(k.stride(2) == v.stride(2), "prefill_attention: k and v must share their position stride");
  const BlockFn fn = block_fn(D);
  TORCH_CHECK(D % VW == 0 && fn != nullptr, "prefill_attention: head size must be a multiple of ", VW, " up to ",
              8 * VW);
  auto out = torch::empty({B, T, H, D}, q.options());
  const int64_t nqb = (T + QB - 1) / QB, groups = H / Hkv;
  const float* qp = q.data_ptr<float>();
  const float* kp = k.data_ptr<float>();
  const float* vp = v.data_ptr<float>();
  float* op = out.data_ptr<float>();
  at::parallel_for(0, B * H * nqb, 1, [&](int64_t w0, int64_t w1) {
    std::vector<float> buf;
    for (int64_t w = w0; w < w1; w++) {
      const int64_t b = w / (H * nqb), h = (w / nqb) % H, qb = w % nqb;
      const int64_t kh = h / groups;
      fn(qp + b * q.stride(0) + h * q.stride(1), q.stride(2), kp + b * k.stride(0) + kh * k.stride(1),
         vp + b * v.stride(0) + kh * v.stride(1), k.stride(2), T, S, qb * QB, float(scale),
         op + (b * T * H + h) * D, H * D, buf);
    }
  });
  return out;
}

}  // namespace
