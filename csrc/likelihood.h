// likelihood.h: the math of the fused transition op, shared by the CPU (likelihood.cpp) and CUDA
// (likelihood_cuda.cu) implementations, so both run the very same formulas (docs/math.md §1, §3).
//
// Per sample n (row of D latent elements) with per-sample a, b, s (float64):
//   μ = a·x + b·v                                      compute dtype C (float32; float64 for float64)
//   e = x' − μ,  e_old = x' − μ_old,  δ = μ − μ_old,  δ_ref = μ − μ_ref    (float64)
//   sums: Σe², Σe_old·δ, Σδ², Σδ_ref²                   (float64)
//   log_prob  = −Σe²/(2s²)/D' − (D/D')·(log s + ½ log 2π)
//   guard     = Σ e_old·δ / s / D'                       reduce_D(ε_s·δ) with ε_s = e_old/s
//   log_ratio = (Σ e_old·δ − ½Σδ²) / s² / D'             lp_θ − lp_old as one difference
//   kl        = Σδ_ref² / (2s²) / D'
// with D' = D for reduce "mean" and 1 for "sum". μ_old / μ_ref are given as means, or as velocities
// (then μ_old = a·x + b·v_old, computed like μ).
//
// Rounding: μ is two products and one sum, each rounded once to C and never contracted to an fma,
// so it is bit-identical to samplers.kernels. The residuals are differences of two float32
// numbers, exact in float64; their products and sums are float64, so every rounding inside a
// reduction is a float64 one: bf16/fp16/fp32 inputs all reduce in float64.
//
// Everything above `FLOWGRPO_KERNELS_ONLY` compiles with nvcc alone (no torch headers); the torch
// glue below it is shared by both implementations.
#pragma once

#include <cmath>
#include <cstdint>

#if defined(__CUDACC__)
#define FLOWGRPO_HD __host__ __device__ __forceinline__
#else
#define FLOWGRPO_HD inline
#endif

namespace flowgrpo {

// Elements per partial sum on the CPU (the GPU has its own, kGpuChunk). Fixed, never derived from
// the thread count, so a row's result depends only on that row's data: same on 1 or 16 threads,
// alone or inside a batch.
constexpr int64_t kChunk = 8192;
constexpr double kHalfLog2Pi = 0.918938533204672741780329736406;

// Dtype codes of the raw input pointers (the CUDA kernels switch on them per element, uniformly).
enum DtypeCode : int { kF32 = 0, kF64 = 1, kF16 = 2, kBF16 = 3 };

// one rounding per product and sum: the CUDA intrinsics on a device (no fused multiply-add); on the host the plain
// operators, built with -ffp-contract=off
#if defined(__CUDA_ARCH__)
FLOWGRPO_HD float mul_rn(float p, float q) { return __fmul_rn(p, q); }
FLOWGRPO_HD float add_rn(float p, float q) { return __fadd_rn(p, q); }
FLOWGRPO_HD double mul_rn(double p, double q) { return __dmul_rn(p, q); }
FLOWGRPO_HD double add_rn(double p, double q) { return __dadd_rn(p, q); }
#else
FLOWGRPO_HD float mul_rn(float p, float q) { return p * q; }
FLOWGRPO_HD float add_rn(float p, float q) { return p + q; }
FLOWGRPO_HD double mul_rn(double p, double q) { return p * q; }
FLOWGRPO_HD double add_rn(double p, double q) { return p + q; }
#endif

// μ = x·a + v·b exactly as samplers.kernels rounds it (x*a, then += v*b).
template <typename C>
FLOWGRPO_HD C affine(C a, C x, C b, C v) {
  return add_rn(mul_rn(x, a), mul_rn(v, b));
}

// The four float64 sums of one row (or of one chunk of it).
struct Sums {
  double sq = 0;     // Σ e²
  double cross = 0;  // Σ e_old·δ
  double dd = 0;     // Σ δ²
  double kl = 0;     // Σ δ_ref²
};

struct RowTerms {
  double log_prob, guard, log_ratio, kl;
};

// numel = D; reduce_sum selects D' = 1 instead of D.
FLOWGRPO_HD RowTerms finalize_row(const Sums& s, double std, double numel, bool reduce_sum) {
  const double dp = reduce_sum ? 1.0 : numel;
  const double var = std * std;
  const double per_element = log(std) + kHalfLog2Pi;
  RowTerms t;
  t.log_prob = -s.sq / (2.0 * var) / dp - (reduce_sum ? numel : 1.0) * per_element;
  t.guard = s.cross / std / dp;
  t.log_ratio = (s.cross - 0.5 * s.dd) / var / dp;
  t.kl = s.kl / (2.0 * var) / dp;
  return t;
}

// Per-row coefficients of the backward: the derivatives of the four row terms with respect to the
// element residuals, times the incoming gradients (g_* are 0 for outputs that got no gradient).
struct GradCoef {
  double lp;     // g_lp / (s² D'):                 ∂lp/∂μ = e/(s²D'), ∂lp/∂x' = −e/(s²D')
  double ratio;  // g_lr / (s² D'):                 ∂lr/∂μ = e/(s²D'), ∂lr/∂x' = δ/(s²D'), ∂lr/∂μ_old = −e_old/(s²D')
  double guard;  // g_guard / (s D'):               ∂g/∂μ = e_old/(sD'), ∂g/∂x' = δ/(sD'), ∂g/∂μ_old = −(δ + e_old)/(sD')
  double kl;     // g_kl / (s² D'):                 ∂kl/∂μ = δ_ref/(s²D'), ∂kl/∂μ_ref = −δ_ref/(s²D')
};

FLOWGRPO_HD GradCoef grad_coefficients(double g_lp, double g_guard, double g_kl, double g_lr,
                                       double std, double numel, bool reduce_sum) {
  const double dp = reduce_sum ? 1.0 : numel;
  const double var = std * std;
  GradCoef c;
  c.lp = g_lp / var / dp;
  c.ratio = g_lr / var / dp;
  c.guard = g_guard / std / dp;
  c.kl = g_kl / var / dp;
  return c;
}

// Gradients of one element with respect to μ, x', μ_old and μ_ref (float64).
struct ElementGrad {
  double mu, x_next, mu_old, mu_ref;
};

FLOWGRPO_HD ElementGrad element_grad(const GradCoef& c, double g_mean, double e, double e_old,
                                     double delta, double delta_ref) {
  ElementGrad g;
  g.mu = g_mean + (c.lp + c.ratio) * e + c.guard * e_old + c.kl * delta_ref;
  g.x_next = -c.lp * e + (c.guard + c.ratio) * delta;
  g.mu_old = -c.guard * (delta + e_old) - c.ratio * e_old;
  g.mu_ref = -c.kl * delta_ref;
  return g;
}

}  // namespace flowgrpo

#if !defined(FLOWGRPO_KERNELS_ONLY)
#include <ATen/core/Tensor.h>
#include <c10/util/Optional.h>
#include <c10/util/string_view.h>

#include <array>
#include <optional>

namespace flowgrpo {

// The validated arguments of one call: every latent tensor as a [N, D] view with contiguous rows
// (any row stride, 0 for an expanded batch), the coefficients as contiguous float64 [N].
struct Problem {
  int64_t n = 0, d = 0;
  at::ScalarType compute = at::kFloat;
  at::Tensor x, v, x_next, old, ref;  // [N, D]; old/ref undefined when absent
  at::Tensor a, b, std;               // [N] float64
  bool has_old = false, has_ref = false, old_is_velocity = false, ref_is_velocity = false;
  bool reduce_sum = false;
};

Problem prepare(const at::Tensor& x, const at::Tensor& v, const at::Tensor& x_next,
                const at::Tensor& a, const at::Tensor& b, const at::Tensor& std,
                const std::optional<at::Tensor>& old, const std::optional<at::Tensor>& ref,
                bool old_is_velocity, bool ref_is_velocity, c10::string_view reduce);

// Per-sample incoming gradient [N] as contiguous float64 (zeros when absent or empty).
at::Tensor row_grad(const std::optional<at::Tensor>& g, const Problem& p);

DtypeCode dtype_code(at::ScalarType t);

}  // namespace flowgrpo
#endif
