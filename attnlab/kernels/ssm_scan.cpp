// The selective SSM's sequential scan, forward and backward, with each channel's state in registers.
//
//   h_t = exp(Delta_t A) * h_{t-1} + Delta_t u_t B_t,   y_t = C_t . h_t          (per batch row b, channel e)
//
// Written with torch ops the loop streams (B, E, N) tensors through memory a dozen times a step and autograd
// keeps (B, T, E, N) ones: 0.27-0.34 s a training step at the recall experiments' shape, most of the full
// report's time. Here a (b, e) pair's N states stay in a few vectors for all T steps. The backward pass keeps
// nothing from the forward: it reruns a channel's forward into a (T + 1, N) buffer, then walks back
//
//   g_h += g_y_t C_t;   g_C_t += g_y_t h_t;   g(Delta_t A) = g_h h_{t-1} a_t;   g(Delta_t u_t) = g_h . B_t;
//   g_B_t += g_h Delta_t u_t;   g_h *= a_t   (the state's gradient carried to step t - 1)
//
// Rows are split between threads by b only, so the sums over channels (g_B, g_C) stay in one thread and in one
// order; g_A is summed per row here and over rows by the caller. fp32, contiguous, CPU (ssm_loop.py checks).
#pragma once

#include <torch/extension.h>
#include <ATen/Parallel.h>

#include <cmath>
#include <vector>

#include "simd.h"

namespace {

using namespace attnlab;

void check_scan(const torch::Tensor& t, int64_t dims, const char* name) {
  TORCH_CHECK(t.dim() == dims && t.scalar_type() == torch::kFloat32 && t.is_contiguous() && t.device().is_cpu(),
              "ssm scan: ", name, " must be a contiguous fp32 CPU tensor of ", dims, " dimensions");
}

// One channel's step over its N states: h = exp(dl A) h + du B; returns C . h (the output before D u).
inline float scan_step(float* h, const float* A, const float* Bv, const float* Cv, float dl, float du, int64_t N,
                       float* a_out) {
  vf acc = vzero();
  int64_t n = 0;
  for (; n + VW <= N; n += VW) {
    const vf a = vexp(vmul(splat(dl), load_x(A + n)));
    const vf hv = fma(splat(du), load_x(Bv + n), vmul(a, load_x(h + n)));
    store_x(h + n, hv);
    if (a_out) store_x(a_out + n, a);
    acc = fma(hv, load_x(Cv + n), acc);
  }
  float y = hsum(acc);
  for (; n < N; n++) {
    const float a = std::exp(std::max(dl * A[n], -87.f));
    h[n] = a * h[n] + du * Bv[n];
    if (a_out) a_out[n] = a;
    y += h[n] * Cv[n];
  }
  return y;
}

}  // namespace

// u, delta (B, T, E); A (E, N); Bt, Ct (B, T, N); h0 (B, E, N) -> [y (B, T, E), h_T (B, E, N)]
std::vector<torch::Tensor> ssm_scan_forward(torch::Tensor u, torch::Tensor delta, torch::Tensor A, torch::Tensor Bt,
                                            torch::Tensor Ct, torch::Tensor h0) {
  check_scan(u, 3, "u"), check_scan(delta, 3, "delta"), check_scan(A, 2, "A");
  check_scan(Bt, 3, "B"), check_scan(Ct, 3, "C"), check_scan(h0, 3, "h0");
  const int64_t B = u.size(0), T = u.size(1), E = u.size(2), N = A.size(1);
  auto y = torch::empty_like(u);
  auto h_last = h0.clone();
  const float *pu = u.data_ptr<float>(), *pd = delta.data_ptr<float>(), *pA = A.data_ptr<float>();
  const float *pB = Bt.data_ptr<float>(), *pC = Ct.data_ptr<float>();
  float *py = y.data_ptr<float>(), *ph = h_last.data_ptr<float>();
  // Every (b, e) pair is independent in the forward pass: split them all between the threads.
  at::parallel_for(0, B * E, 1, [&](int64_t lo, int64_t hi) {
    for (int64_t be = lo; be < hi; be++) {
      const int64_t b = be / E, e = be % E;
      float* h = ph + be * N;
      for (int64_t t = 0; t < T; t++) {
        const int64_t i = (b * T + t) * E + e, j = (b * T + t) * N;
        py[i] = scan_step(h, pA + e * N, pB + j, pC + j, pd[i], pd[i] * pu[i], N, nullptr);
      }
    }
  });
  return {y, h_last};
}

// The gradients of y . g_y + h_T . g_last: [g_u, g_delta (B, T, E), g_A per row (B, E, N), g_B, g_C (B, T, N),
// g_h0 (B, E, N)].
std::vector<torch::Tensor> ssm_scan_backward(torch::Tensor u, torch::Tensor delta, torch::Tensor A, torch::Tensor Bt,
                                             torch::Tensor Ct, torch::Tensor h0, torch::Tensor g_y,
                                             torch::Tensor g_last) {
  check_scan(u, 3, "u"), check_scan(delta, 3, "delta"), check_scan(A, 2, "A");
  check_scan(Bt, 3, "B"), check_scan(Ct, 3, "C"), check_scan(h0, 3, "h0");
  check_scan(g_y, 3, "g_y"), check_scan(g_last, 3, "g_last");
  const int64_t B = u.size(0), T = u.size(1), E = u.size(2), N = A.size(1);
  auto g_u = torch::empty_like(u), g_delta = torch::empty_like(u);
  auto g_A = torch::zeros({B, E, N}, u.options());
  auto g_B = torch::zeros_like(Bt), g_C = torch::zeros_like(Ct);
  auto g_h0 = torch::empty_like(h0);
  const float *pu = u.data_ptr<float>(), *pd = delta.data_ptr<float>(), *pA = A.data_ptr<float>();
  const float *pB = Bt.data_ptr<float>(), *pC = Ct.data_ptr<float>(), *ph0 = h0.data_ptr<float>();
  const float *pgy = g_y.data_ptr<float>(), *pgl = g_last.data_ptr<float>();
  float *pgu = g_u.data_ptr<float>(), *pgd = g_delta.data_ptr<float>(), *pgA = g_A.data_ptr<float>();
  float *pgB = g_B.data_ptr<float>(), *pgC = g_C.data_ptr<float>(), *pgh0 = g_h0.data_ptr<float>();
  at::parallel_for(0, B, 1, [&](int64_t lo, int64_t hi) {
    std::vector<float> hs((T + 1) * N), as(T * N), gh(N);  // one channel's states h_{-1..T-1}, decays, g_h
    for (int64_t b = lo; b < hi; b++) {
      for (int64_t e = 0; e < E; e++) {
        const float* Ae = pA + e * N;
        std::copy(ph0 + (b * E + e) * N, ph0 + (b * E + e + 1) * N, hs.begin());
        for (int64_t t = 0; t < T; t++) {  // the forward pass again, keeping every state and decay
          const int64_t i = (b * T + t) * E + e, j = (b * T + t) * N;
          std::copy(hs.begin() + t * N, hs.begin() + (t + 1) * N, hs.begin() + (t + 1) * N);
          scan_step(hs.data() + (t + 1) * N, Ae, pB + j, pC + j, pd[i], pd[i] * pu[i], N, as.data() + t * N);
        }
        std::copy(pgl + (b * E + e) * N, pgl + (b * E + e + 1) * N, gh.begin());
        float* gA = pgA + (b * E + e) * N;
        for (int64_t t = T - 1; t >= 0; t--) {
          const int64_t i = (b * T + t) * E + e, j = (b * T + t) * N;
          const float gy = pgy[i], dl = pd[i], du = dl * pu[i];
          const float *h = hs.data() + (t + 1) * N, *hp = hs.data() + t * N, *a = as.data() + t * N;
          vf acc_dl = vzero(), acc_du = vzero();  // d/d(Delta) through a, and d/d(Delta u) through b
          int64_t n = 0;
          for (; n + VW <= N; n += VW) {
            const vf g = fma(splat(gy), load_x(pC + j + n), load_x(gh.data() + n));
            store_x(pgC + j + n, fma(splat(gy), load_x(h + n), load_x(pgC + j + n)));
            const vf av = load_x(a + n);
            const vf g_dA = vmul(vmul(g, load_x(hp + n)), av);
            acc_dl = fma(g_dA, load_x(Ae + n), acc_dl);
            store_x(gA + n, fma(g_dA, splat(dl), load_x(gA + n)));
            acc_du = fma(g, load_x(pB + j + n), acc_du);
            store_x(pgB + j + n, fma(g, splat(du), load_x(pgB + j + n)));
            store_x(gh.data() + n, vmul(g, av));
          }
          float g_dl_a = hsum(acc_dl), g_du = hsum(acc_du);
          for (; n < N; n++) {
            const float g = gh[n] + gy * pC[j + n];
            pgC[j + n] += gy * h[n];
            const float g_dA = g * hp[n] * a[n];
            g_dl_a += g_dA * Ae[n];
            gA[n] += g_dA * dl;
            g_du += g * pB[j + n];
            pgB[j + n] += g * du;
            gh[n] = g * a[n];
          }
          pgu[i] = g_du * dl;
          pgd[i] = g_dl_a + g_du * pu[i];
        }
        std::copy(gh.begin(), gh.end(), pgh0 + (b * E + e) * N);
      }
    }
  });
  return {g_u, g_delta, g_A, g_B, g_C, g_h0};
}
