// Vector helpers shared by attnlab's kernels: one vector of fp32 lanes at the width of the CPU the code is built on.
#pragma once

#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>

#include <c10/util/BFloat16.h>

namespace attnlab {

// One vector of fp32 lanes: 16 with AVX-512, 8 with AVX2+FMA, 1 elsewhere. Intrinsics, because GCC's generic
// vector code widened int8 lanes one by one and bf16 lanes in two halves (measured: 4x and 2x slower).
#if defined(__AVX512F__)
constexpr int VW = 16;
using vf = __m512;
inline vf vzero() { return _mm512_setzero_ps(); }
inline vf load_x(const float* p) { return _mm512_loadu_ps(p); }
inline vf fma(vf a, vf b, vf c) { return _mm512_fmadd_ps(a, b, c); }
inline vf load_w(const uint16_t* p) {  // a bf16 is the upper half of an fp32
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i*)p)), 16));
}
inline vf load_w(const int8_t* p) { return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i*)p))); }
inline vf load_w(const float* p) { return _mm512_loadu_ps(p); }
inline void store_lanes(float* t, vf v) { _mm512_storeu_ps(t, v); }
inline vf load_i32(const int32_t* p) {
  return _mm512_cvtepi32_ps(_mm512_loadu_si512(p));
}
#elif defined(__AVX2__) && defined(__FMA__)
constexpr int VW = 8;
using vf = __m256;
inline vf vzero() { return _mm256_setzero_ps(); }
inline vf load_x(const float* p) { return _mm256_loadu_ps(p); }
inline vf fma(vf a, vf b, vf c) { return _mm256_fmadd_ps(a, b, c); }
inline vf load_w(const uint16_t* p) {
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i*)p)), 16));
}
inline vf load_w(const int8_t* p) { return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i*)p))); }
inline vf load_w(const float* p) { return _mm256_loadu_ps(p); }
inline void store_lanes(float* t, vf v) { _mm256_storeu_ps(t, v); }
inline vf load_i32(const int32_t* p) {
  return _mm256_cvtepi32_ps(_mm256_loadu_si256((const __m256i*)p));
}
#else
constexpr int VW = 1;
using vf = float;
inline vf vzero() { return 0.f; }
inline vf load_x(const float* p) { return *p; }
inline vf fma(vf a, vf b, vf c) { return std::fma(a, b, c); }
inline vf load_w(const uint16_t* p) {
  uint32_t u = uint32_t(*p) << 16;
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}
inline vf load_w(const int8_t* p) { return float(*p); }
inline vf load_w(const float* p) { return *p; }
inline void store_lanes(float* t, vf v) { *t = v; }
inline vf load_i32(const int32_t* p) { return float(*p); }
#endif

inline float widen(uint16_t v) {
  uint32_t u = uint32_t(v) << 16;
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}
inline float widen(int8_t v) { return float(v); }
inline float widen(float v) { return v; }

// fp32 -> bf16 bits as torch rounds them one at a time (c10::BFloat16: to nearest, ties to even; a NaN -> 0x7FC0).
inline uint16_t narrow(float f) { return c10::BFloat16(f).x; }

// VW lanes rounded by narrow's rule, a vector at a time where there is AVX-512.
#if defined(__AVX512F__)
inline void store_bf16(uint16_t* p, vf v) {
  const __m512i u = _mm512_castps_si512(v);
  __m512i r = _mm512_add_epi32(u, _mm512_add_epi32(_mm512_set1_epi32(0x7FFF),
                                                   _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1))));
  r = _mm512_mask_mov_epi32(_mm512_srli_epi32(r, 16), _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q),
                            _mm512_set1_epi32(0x7FC0));
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), _mm512_cvtepi32_epi16(r));
}
#else
inline void store_bf16(uint16_t* p, vf v) {
  float t[VW];
  store_lanes(t, v);
  for (int i = 0; i < VW; i++) p[i] = narrow(t[i]);
}
#endif
// The sums of four vectors' lanes at once, out[i] = sum of v[i]'s lanes, in a fixed order (halves added, then
// pairs): each result depends on its own vector alone. One lane-by-lane sum per vector cost ~20 instructions, a
// fifth of a 768-long bf16 dot product's work, and held K = 768 matrices (GPT-2's q/k/v, MLP-in, LM head) to
// 23-26 GB/s here against 34 for K = 3072.
#if defined(__AVX512F__)
inline void sum4(vf a, vf b, vf c, vf d, float out[4]) {
  auto half = [](vf v) {
    const __m256 lo = _mm512_castps512_ps256(v);
    const __m256 hi = _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1));
    const __m256 s = _mm256_add_ps(lo, hi);
    return _mm_add_ps(_mm256_castps256_ps128(s), _mm256_extractf128_ps(s, 1));
  };
  _mm_storeu_ps(out, _mm_hadd_ps(_mm_hadd_ps(half(a), half(b)), _mm_hadd_ps(half(c), half(d))));
}
#elif defined(__AVX2__) && defined(__FMA__)
inline void sum4(vf a, vf b, vf c, vf d, float out[4]) {
  auto half = [](vf v) { return _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1)); };
  _mm_storeu_ps(out, _mm_hadd_ps(_mm_hadd_ps(half(a), half(b)), _mm_hadd_ps(half(c), half(d))));
}
#else
inline void sum4(vf a, vf b, vf c, vf d, float out[4]) {
  out[0] = a;
  out[1] = b;
  out[2] = c;
  out[3] = d;
}
#endif

inline float lanes_sum(vf v) {  // a fixed order: the result depends on v alone
  float t[VW];
  store_lanes(t, v);
  float s = 0;
  for (int i = 0; i < VW; i++) s += t[i];
  return s;
}

#if defined(__AVX512F__)
inline float hsum(vf v) { return _mm512_reduce_add_ps(v); }
inline vf vadd(vf a, vf b) { return _mm512_add_ps(a, b); }
inline vf vsub(vf a, vf b) { return _mm512_sub_ps(a, b); }
inline vf vmul(vf a, vf b) { return _mm512_mul_ps(a, b); }
inline vf splat(float a) { return _mm512_set1_ps(a); }
inline void store_x(float* p, vf v) { _mm512_storeu_ps(p, v); }
inline vf vmax(vf a, vf b) { return _mm512_max_ps(a, b); }
inline vf vmin(vf a, vf b) { return _mm512_min_ps(a, b); }
inline float hmax(vf v) { return _mm512_reduce_max_ps(v); }
// exp(x) for x <= 87 (softmax after subtracting the maximum; sigmoids): x = n ln2 + r, |r| <= ln2/2, e^r by its Taylor
// polynomial to r^7/7! (relative error < 2e-7), times 2^n; below -87 the result is 0.
inline vf vexp(vf x) {
  x = _mm512_max_ps(x, _mm512_set1_ps(-87.f));
  const vf n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504f)), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  vf r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693145751953125f), x);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(1.428606765330187e-06f), r);
  vf p = _mm512_set1_ps(1.f / 5040);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.f / 720));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.f / 120));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.f / 24));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.f / 6));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0.5f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.f));
  return _mm512_scalef_ps(p, n);
}
#elif defined(__AVX2__) && defined(__FMA__)
inline float hsum(vf v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}
inline vf splat(float a) { return _mm256_set1_ps(a); }
inline vf vadd(vf a, vf b) { return _mm256_add_ps(a, b); }
inline vf vsub(vf a, vf b) { return _mm256_sub_ps(a, b); }
inline vf vmul(vf a, vf b) { return _mm256_mul_ps(a, b); }
inline void store_x(float* p, vf v) { _mm256_storeu_ps(p, v); }
inline vf vmax(vf a, vf b) { return _mm256_max_ps(a, b); }
inline vf vmin(vf a, vf b) { return _mm256_min_ps(a, b); }
inline float hmax(vf v) {
  float t[8];
  _mm256_storeu_ps(t, v);
  float m = t[0];
  for (int i = 1; i < 8; i++) m = std::max(m, t[i]);
  return m;
}
inline vf vexp(vf x) {
  x = _mm256_max_ps(x, _mm256_set1_ps(-87.f));
  const vf n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504f)), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  vf r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693145751953125f), x);
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(1.428606765330187e-06f), r);
  vf p = _mm256_set1_ps(1.f / 5040);
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.f / 720));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.f / 120));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.f / 24));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.f / 6));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(0.5f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.f));
  const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  return _mm256_mul_ps(p, _mm256_castsi256_ps(e));  // n >= -126 here (x >= -87)
}
#else
inline float hsum(vf v) { return v; }
inline vf splat(float a) { return a; }
inline vf vadd(vf a, vf b) { return a + b; }
inline vf vsub(vf a, vf b) { return a - b; }
inline vf vmul(vf a, vf b) { return a * b; }
inline void store_x(float* p, vf v) { *p = v; }
inline vf vmax(vf a, vf b) { return std::max(a, b); }
inline vf vmin(vf a, vf b) { return std::min(a, b); }
inline float hmax(vf v) { return v; }
inline vf vexp(vf x) { return std::exp(std::max(x, -87.f)); }
#endif

}  // namespace attnlab
