// likelihood.cpp: the flowgrpo::transition_terms op schema, its argument checks (shared with CUDA)
// and its CPU implementation. The math lives in likelihood.h; docs/ops.md explains the op.
//
// CPU layout: each row is cut into fixed chunks of kChunk elements, one work item per
// (row, chunk), run on torch's intra-op (OpenMP) pool. A chunk is processed in tiles of kTile
// elements: inputs that are not already in the compute dtype are converted into L1 tile buffers,
// then one loop computes μ and the residual products into kLanes independent float64 lanes. Lane l
// sums the elements whose in-row index is l mod kLanes, in order, so the result is the same
// whatever the ISA, the vector width or the thread count; chunk sums are added in chunk order.
// The hot loops are compiled for AVX-512, AVX2 and baseline x86-64 and picked at load time.
#include "likelihood.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>
#include <torch/library.h>

#include <algorithm>
#include <cstring>
#include <vector>

#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__) && !defined(FLOWGRPO_NO_CLONES)
#define FLOWGRPO_CLONES __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define FLOWGRPO_CLONES
#endif

namespace flowgrpo {

// ---------------------------------------------------------------------------------------------
// Argument checks, shared with likelihood_cuda.cu
// ---------------------------------------------------------------------------------------------

DtypeCode dtype_code(at::ScalarType t) {
  switch (t) {
    case at::kFloat: return kF32;
    case at::kDouble: return kF64;
    case at::kHalf: return kF16;
    case at::kBFloat16: return kBF16;
    default: TORCH_CHECK(false, "flowgrpo::transition_terms: unsupported dtype ", t);
  }
}

namespace {

at::Tensor as_rows(const at::Tensor& t, int64_t n, int64_t d) {
  at::Tensor rows = t.reshape({n, d});  // a view when the inner dims are contiguous
  if (d > 1 && rows.stride(1) != 1) rows = rows.contiguous();
  return rows;
}

void check_latent(const at::Tensor& t, const char* name, const at::Tensor& x) {
  TORCH_CHECK(t.sizes() == x.sizes(), "flowgrpo::transition_terms: ", name, " has shape ",
              t.sizes(), " but x has shape ", x.sizes());
  TORCH_CHECK(t.device() == x.device(), "flowgrpo::transition_terms: ", name, " is on ",
              t.device(), " but x is on ", x.device());
  dtype_code(t.scalar_type());
}

at::Tensor per_sample(const at::Tensor& t, const char* name, const at::Tensor& x) {
  const int64_t n = x.size(0);
  TORCH_CHECK(t.dim() == 1 && t.size(0) == n, "flowgrpo::transition_terms: ", name,
              " must be a per-sample tensor [", n, "], got shape ", t.sizes());
  TORCH_CHECK(at::isFloatingType(t.scalar_type()), "flowgrpo::transition_terms: ", name,
              " must be floating point, got ", t.scalar_type());
  TORCH_CHECK(t.device() == x.device(), "flowgrpo::transition_terms: ", name, " is on ",
              t.device(), " but x is on ", x.device());
  return t.to(at::kDouble).contiguous();
}

}  // namespace

Problem prepare(const at::Tensor& x, const at::Tensor& v, const at::Tensor& x_next,
                const at::Tensor& a, const at::Tensor& b, const at::Tensor& std,
                const std::optional<at::Tensor>& old, const std::optional<at::Tensor>& ref,
                bool old_is_velocity, bool ref_is_velocity, c10::string_view reduce) {
  TORCH_CHECK(x.dim() >= 2, "flowgrpo::transition_terms: x must be [N, *latent], got shape ",
              x.sizes());
  TORCH_CHECK(reduce == "mean" || reduce == "sum",
              "flowgrpo::transition_terms: reduce must be 'mean' or 'sum', got '", reduce, "'");
  check_latent(x, "x", x);
  check_latent(v, "v", x);
  check_latent(x_next, "x_next", x);
  Problem p;
  p.n = x.size(0);
  p.d = x.numel() / std::max<int64_t>(p.n, 1);
  if (p.n == 0) {
    p.d = 1;
    for (int64_t i = 1; i < x.dim(); ++i) p.d *= x.size(i);
  }
  TORCH_CHECK(p.d > 0, "flowgrpo::transition_terms: a sample has no latent elements, shape ",
              x.sizes());
  p.compute = x.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
  p.x = as_rows(x, p.n, p.d);
  p.v = as_rows(v, p.n, p.d);
  p.x_next = as_rows(x_next, p.n, p.d);
  p.a = per_sample(a, "a", x);
  p.b = per_sample(b, "b", x);
  p.std = per_sample(std, "std", x);
  p.has_old = old.has_value() && old->defined();
  p.has_ref = ref.has_value() && ref->defined();
  if (p.has_old) {
    check_latent(*old, "old", x);
    p.old = as_rows(*old, p.n, p.d);
  }
  if (p.has_ref) {
    check_latent(*ref, "ref", x);
    p.ref = as_rows(*ref, p.n, p.d);
  }
  p.old_is_velocity = p.has_old && old_is_velocity;
  p.ref_is_velocity = p.has_ref && ref_is_velocity;
  p.reduce_sum = reduce == "sum";
  return p;
}

at::Tensor row_grad(const std::optional<at::Tensor>& g, const Problem& p) {
  if (!g.has_value() || !g->defined() || g->numel() == 0)
    return at::zeros({p.n}, p.x.options().dtype(at::kDouble));
  TORCH_CHECK(g->numel() == p.n, "flowgrpo::transition_terms_backward: a per-sample gradient has ",
              g->numel(), " elements, expected ", p.n);
  return g->to(at::kDouble).reshape({p.n}).contiguous();
}

// ---------------------------------------------------------------------------------------------
// CPU implementation
// ---------------------------------------------------------------------------------------------

namespace {

constexpr int64_t kTile = 1024;  // divides kChunk; a multiple of kLanes
constexpr int kLanes = 16;
static_assert(kChunk % kTile == 0 && kTile % kLanes == 0, "tile sizes");

template <typename C>
constexpr at::ScalarType scalar_type_of() {
  return std::is_same<C, double>::value ? at::kDouble : at::kFloat;
}

template <typename S, typename C>
FLOWGRPO_CLONES void convert(const S* __restrict src, C* __restrict dst, int64_t len) {
  for (int64_t i = 0; i < len; ++i) dst[i] = static_cast<C>(static_cast<float>(src[i]));
}

template <typename C>
FLOWGRPO_CLONES void convert_bf16(const uint16_t* __restrict src, C* __restrict dst, int64_t len) {
  for (int64_t i = 0; i < len; ++i) {
    const uint32_t bits = static_cast<uint32_t>(src[i]) << 16;
    float f;
    std::memcpy(&f, &bits, sizeof f);
    dst[i] = static_cast<C>(f);
  }
}

template <typename C>
void convert_any(const void* src, at::ScalarType t, C* dst, int64_t len) {
  switch (t) {
    case at::kFloat: convert(static_cast<const float*>(src), dst, len); break;
    case at::kDouble:
      for (int64_t i = 0; i < len; ++i) dst[i] = static_cast<C>(static_cast<const double*>(src)[i]);
      break;
    case at::kHalf: convert(static_cast<const c10::Half*>(src), dst, len); break;
    case at::kBFloat16: convert_bf16(static_cast<const uint16_t*>(src), dst, len); break;
    default: TORCH_CHECK(false, "unsupported dtype ", t);
  }
}

// Elements [start, start + len) of row `row` of a [N, D] view, in the compute dtype: a pointer
// into the tensor when it already is, else converted into `buf`.
template <typename C>
const C* tile_of(const at::Tensor& t, int64_t row, int64_t start, int64_t len, C* buf) {
  const char* p = static_cast<const char*>(t.data_ptr()) +
                  (row * t.stride(0) + start) * static_cast<int64_t>(t.element_size());
  if (t.scalar_type() == scalar_type_of<C>()) return reinterpret_cast<const C*>(p);
  convert_any(p, t.scalar_type(), buf, len);
  return buf;
}

// float → bf16 with round-to-nearest-even (NaN → 0x7fc0), as c10::BFloat16 does, but vectorisable
template <typename C>
FLOWGRPO_CLONES void store_bf16(const C* __restrict src, uint16_t* __restrict dst, int64_t len) {
  for (int64_t i = 0; i < len; ++i) {
    const float f = static_cast<float>(src[i]);
    uint32_t u;
    std::memcpy(&u, &f, sizeof u);
    const uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
    dst[i] = f != f ? uint16_t{0x7fc0} : static_cast<uint16_t>(rounded);
  }
}

template <typename C>
void store_tile(const C* src, at::Tensor& out, int64_t row, int64_t start, int64_t len) {
  char* p = static_cast<char*>(out.data_ptr()) +
            (row * out.stride(0) + start) * static_cast<int64_t>(out.element_size());
  switch (out.scalar_type()) {
    case at::kFloat:
      for (int64_t i = 0; i < len; ++i) reinterpret_cast<float*>(p)[i] = static_cast<float>(src[i]);
      break;
    case at::kDouble:
      for (int64_t i = 0; i < len; ++i) reinterpret_cast<double*>(p)[i] = static_cast<double>(src[i]);
      break;
    case at::kHalf:
      for (int64_t i = 0; i < len; ++i)
        reinterpret_cast<c10::Half*>(p)[i] = c10::Half(static_cast<float>(src[i]));
      break;
    case at::kBFloat16: store_bf16(src, reinterpret_cast<uint16_t*>(p), len); break;
    default: TORCH_CHECK(false, "unsupported dtype ", out.scalar_type());
  }
}

// out = a·x + b·w (a velocity-form μ_old / μ_ref); in place when w == out.
template <typename C>
FLOWGRPO_CLONES void affine_tile(int64_t len, C a, C b, const C* __restrict x, const C* w, C* out) {
  for (int64_t i = 0; i < len; ++i) out[i] = affine(a, x[i], b, w[i]);
}

struct Lanes {
  double sq[kLanes] = {}, cross[kLanes] = {}, dd[kLanes] = {}, kl[kLanes] = {};
};

template <typename C, bool OLD, bool REF>
__attribute__((always_inline)) inline void forward_element(
    int64_t k, int l, C a, C b, const C* __restrict X, const C* __restrict V,
    const C* __restrict XN, const C* __restrict MO, const C* __restrict MR, C* __restrict M,
    Lanes& acc) {
  const C mu = affine(a, X[k], b, V[k]);
  M[k] = mu;
  const double m = mu, xn = XN[k];
  const double e = xn - m;
  acc.sq[l] += e * e;
  if constexpr (OLD) {
    const double mo = MO[k];
    const double e_old = xn - mo, delta = m - mo;
    acc.cross[l] += e_old * delta;
    acc.dd[l] += delta * delta;
  }
  if constexpr (REF) {
    const double delta_ref = m - static_cast<double>(MR[k]);
    acc.kl[l] += delta_ref * delta_ref;
  }
}

template <typename C, bool OLD, bool REF>
FLOWGRPO_CLONES void forward_tile(int64_t len, C a, C b, const C* __restrict X,
                                  const C* __restrict V, const C* __restrict XN,
                                  const C* __restrict MO, const C* __restrict MR,
                                  C* __restrict M, Lanes& acc_out) {
  Lanes acc = acc_out;
  int64_t i = 0;
  for (; i + kLanes <= len; i += kLanes) {
#pragma omp simd
    for (int l = 0; l < kLanes; ++l)
      forward_element<C, OLD, REF>(i + l, l, a, b, X, V, XN, MO, MR, M, acc);
  }
  for (int l = 0; i < len; ++i, ++l) forward_element<C, OLD, REF>(i, l, a, b, X, V, XN, MO, MR, M, acc);
  acc_out = acc;
}

// One tile of a row's inputs: x, v, x' and the old and reference means (null where absent; from a velocity, μ = a·x + b·w
// into the buffer), each converted to C in its buffer unless already contiguous C.
template <typename C>
struct RowTiles {
  const C *x, *v, *x_next, *old, *ref;
};

template <typename C>
RowTiles<C> row_tiles(const Problem& p, int64_t row, int64_t t0, int64_t len, C a, C b, C* bx, C* bv, C* bxn, C* bo,
                      C* br) {
  RowTiles<C> t{tile_of(p.x, row, t0, len, bx), tile_of(p.v, row, t0, len, bv), tile_of(p.x_next, row, t0, len, bxn),
                nullptr, nullptr};
  if (p.has_old) {
    t.old = tile_of(p.old, row, t0, len, bo);
    if (p.old_is_velocity) affine_tile(len, a, b, t.x, t.old, bo), t.old = bo;
  }
  if (p.has_ref) {
    t.ref = tile_of(p.ref, row, t0, len, br);
    if (p.ref_is_velocity) affine_tile(len, a, b, t.x, t.ref, br), t.ref = br;
  }
  return t;
}

template <typename C>
Sums forward_chunk(const Problem& p, int64_t row, int64_t begin, int64_t end, C* mean_row) {
  alignas(64) C bx[kTile], bv[kTile], bxn[kTile], bo[kTile], br[kTile], bm[kTile];
  const C a = static_cast<C>(p.a.data_ptr<double>()[row]);
  const C b = static_cast<C>(p.b.data_ptr<double>()[row]);
  Lanes acc;
  for (int64_t t0 = begin; t0 < end; t0 += kTile) {
    const int64_t len = std::min(kTile, end - t0);
    const auto [X, V, XN, MO, MR] = row_tiles(p, row, t0, len, a, b, bx, bv, bxn, bo, br);
    C* M = mean_row ? mean_row + t0 : bm;
    if (p.has_old && p.has_ref) forward_tile<C, true, true>(len, a, b, X, V, XN, MO, MR, M, acc);
    else if (p.has_old) forward_tile<C, true, false>(len, a, b, X, V, XN, MO, MR, M, acc);
    else if (p.has_ref) forward_tile<C, false, true>(len, a, b, X, V, XN, MO, MR, M, acc);
    else forward_tile<C, false, false>(len, a, b, X, V, XN, MO, MR, M, acc);
  }
  Sums s;
  for (int l = 0; l < kLanes; ++l) {
    s.sq += acc.sq[l];
    s.cross += acc.cross[l];
    s.dd += acc.dd[l];
    s.kl += acc.kl[l];
  }
  return s;
}

void check_std_positive(const Problem& p) {
  const double* s = p.std.data_ptr<double>();
  for (int64_t i = 0; i < p.n; ++i)
    TORCH_CHECK_VALUE(s[i] > 0, "flowgrpo::transition_terms needs std > 0 (got ", s[i], " in row ", i,
                "): ODE steps, eta = 0 and cps at sigma' = 0 have no density; do not train them");
}

template <typename C>
void forward_cpu(const Problem& p, at::Tensor& mean, at::Tensor& lp, at::Tensor& guard,
                 at::Tensor& ratio, at::Tensor& kl) {
  const int64_t chunks = (p.d + kChunk - 1) / kChunk;
  std::vector<Sums> partial(static_cast<size_t>(p.n * chunks));
  C* mean_data = mean.numel() ? mean.data_ptr<C>() : nullptr;
  at::parallel_for(0, p.n * chunks, 1, [&](int64_t begin, int64_t end) {
    for (int64_t w = begin; w < end; ++w) {
      const int64_t row = w / chunks, c = w % chunks;
      const int64_t start = c * kChunk, stop = std::min(p.d, start + kChunk);
      partial[w] = forward_chunk<C>(p, row, start, stop, mean_data ? mean_data + row * p.d : nullptr);
    }
  });
  const double* sd = p.std.data_ptr<double>();
  for (int64_t row = 0; row < p.n; ++row) {
    Sums s;
    for (int64_t c = 0; c < chunks; ++c) {
      const Sums& q = partial[row * chunks + c];
      s.sq += q.sq, s.cross += q.cross, s.dd += q.dd, s.kl += q.kl;
    }
    const RowTerms t = finalize_row(s, sd[row], static_cast<double>(p.d), p.reduce_sum);
    lp.data_ptr<C>()[row] = static_cast<C>(t.log_prob);
    if (p.has_old) {
      guard.data_ptr<C>()[row] = static_cast<C>(t.guard);
      ratio.data_ptr<C>()[row] = static_cast<C>(t.log_ratio);
    }
    if (p.has_ref) kl.data_ptr<C>()[row] = static_cast<C>(t.kl);
  }
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor> transition_terms_cpu(
    const at::Tensor& x, const at::Tensor& v, const at::Tensor& x_next, const at::Tensor& a,
    const at::Tensor& b, const at::Tensor& std, const std::optional<at::Tensor>& old,
    const std::optional<at::Tensor>& ref, bool old_is_velocity, bool ref_is_velocity,
    c10::string_view reduce, bool return_mean) {
  TORCH_CHECK(x.device().is_cpu(), "flowgrpo::transition_terms (CPU): x is on ", x.device());
  const Problem p = prepare(x, v, x_next, a, b, std, old, ref, old_is_velocity, ref_is_velocity, reduce);
  check_std_positive(p);
  const auto opts = x.options().dtype(p.compute);
  at::Tensor mean = return_mean ? at::empty(x.sizes(), opts) : at::empty({0}, opts);
  at::Tensor lp = at::empty({p.n}, opts);
  at::Tensor guard = at::empty({p.has_old ? p.n : 0}, opts);
  at::Tensor ratio = at::empty({p.has_old ? p.n : 0}, opts);
  at::Tensor kl = at::empty({p.has_ref ? p.n : 0}, opts);
  if (p.n > 0) {
    if (p.compute == at::kDouble) forward_cpu<double>(p, mean, lp, guard, ratio, kl);
    else forward_cpu<float>(p, mean, lp, guard, ratio, kl);
  }
  return {mean, lp, guard, ratio, kl};
}

// ---- backward: one elementwise pass ----

// ALL = false: only grad_v is wanted (the learner's case); the other gradients are then dead code.
template <typename C, bool OLD, bool REF, bool ALL>
FLOWGRPO_CLONES void backward_tile(int64_t len, C a, C b, GradCoef c, double w_old, double w_ref,
                                   double s_old, double s_ref, const C* __restrict X,
                                   const C* __restrict V, const C* __restrict XN,
                                   const C* __restrict MO, const C* __restrict MR,
                                   const C* __restrict GM, C* __restrict GX, C* __restrict GV,
                                   C* __restrict GXN, C* __restrict GO, C* __restrict GR) {
  const double ad = a, bd = b;
#pragma omp simd
  for (int64_t i = 0; i < len; ++i) {
    const double m = affine(a, X[i], b, V[i]), xn = XN[i];
    const double e = xn - m;
    double e_old = 0, delta = 0, delta_ref = 0;
    if constexpr (OLD) {
      const double mo = MO[i];
      e_old = xn - mo;
      delta = m - mo;
    }
    if constexpr (REF) delta_ref = m - static_cast<double>(MR[i]);
    const ElementGrad g = element_grad(c, static_cast<double>(GM[i]), e, e_old, delta, delta_ref);
    GV[i] = static_cast<C>(bd * g.mu);
    if constexpr (ALL) {
      GX[i] = static_cast<C>(ad * (g.mu + w_old * g.mu_old + w_ref * g.mu_ref));
      GXN[i] = static_cast<C>(g.x_next);
      if constexpr (OLD) GO[i] = static_cast<C>(s_old * g.mu_old);
      if constexpr (REF) GR[i] = static_cast<C>(s_ref * g.mu_ref);
    }
  }
}

struct BackwardOut {
  at::Tensor* t[5];  // grad_x, grad_v, grad_x_next, grad_old, grad_ref (numel 0: not wanted)
};

template <typename C>
void backward_chunk(const Problem& p, const at::Tensor& grad_mean, const double* const* g,
                    BackwardOut& out, int64_t row, int64_t begin, int64_t end) {
  alignas(64) C bx[kTile], bv[kTile], bxn[kTile], bo[kTile], br[kTile], bgm[kTile];
  alignas(64) C res[5][kTile];
  const C a = static_cast<C>(p.a.data_ptr<double>()[row]);
  const C b = static_cast<C>(p.b.data_ptr<double>()[row]);
  const double sd = p.std.data_ptr<double>()[row];
  const GradCoef coef = grad_coefficients(g[0][row], g[1][row], g[2][row], g[3][row], sd,
                                          static_cast<double>(p.d), p.reduce_sum);
  const double w_old = p.old_is_velocity ? 1.0 : 0.0, w_ref = p.ref_is_velocity ? 1.0 : 0.0;
  const double s_old = p.old_is_velocity ? static_cast<double>(b) : 1.0;
  const double s_ref = p.ref_is_velocity ? static_cast<double>(b) : 1.0;
  const bool has_gm = grad_mean.defined();
  bool all = false;  // any gradient other than grad_v wanted?
  for (int k : {0, 2, 3, 4}) all = all || out.t[k]->numel() > 0;
  if (!has_gm) std::fill(bgm, bgm + kTile, C(0));
  for (int64_t t0 = begin; t0 < end; t0 += kTile) {
    const int64_t len = std::min(kTile, end - t0);
    const auto [X, V, XN, MO, MR] = row_tiles(p, row, t0, len, a, b, bx, bv, bxn, bo, br);
    const C* GM = has_gm ? tile_of(grad_mean, row, t0, len, bgm) : bgm;
    // write straight into an output of the compute dtype, else into a tile buffer converted below
    C* dst[5];
    for (int k = 0; k < 5; ++k) {
      at::Tensor& o = *out.t[k];
      dst[k] = (o.numel() && o.scalar_type() == scalar_type_of<C>())
                   ? o.data_ptr<C>() + row * o.stride(0) + t0
                   : res[k];
    }
    const auto tile = [&](auto kernel) {
      kernel(len, a, b, coef, w_old, w_ref, s_old, s_ref, X, V, XN, MO, MR, GM, dst[0], dst[1], dst[2], dst[3], dst[4]);
    };
    if (!all) {
      if (p.has_old && p.has_ref) tile(backward_tile<C, true, true, false>);
      else if (p.has_old) tile(backward_tile<C, true, false, false>);
      else if (p.has_ref) tile(backward_tile<C, false, true, false>);
      else tile(backward_tile<C, false, false, false>);
    } else {
      if (p.has_old && p.has_ref) tile(backward_tile<C, true, true, true>);
      else if (p.has_old) tile(backward_tile<C, true, false, true>);
      else if (p.has_ref) tile(backward_tile<C, false, true, true>);
      else tile(backward_tile<C, false, false, true>);
    }
    for (int k = 0; k < 5; ++k) {
      at::Tensor& o = *out.t[k];
      if (o.numel() && dst[k] == res[k]) store_tile(res[k], o, row, t0, len);
    }
  }
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor> transition_terms_backward_cpu(
    const std::optional<at::Tensor>& grad_mean, const std::optional<at::Tensor>& grad_log_prob,
    const std::optional<at::Tensor>& grad_guard, const std::optional<at::Tensor>& grad_log_ratio,
    const std::optional<at::Tensor>& grad_kl, const at::Tensor& x, const at::Tensor& v,
    const at::Tensor& x_next, const at::Tensor& a, const at::Tensor& b, const at::Tensor& std,
    const std::optional<at::Tensor>& old, const std::optional<at::Tensor>& ref,
    bool old_is_velocity, bool ref_is_velocity, c10::string_view reduce,
    std::array<bool, 5> output_mask) {
  TORCH_CHECK(x.device().is_cpu(), "flowgrpo::transition_terms_backward (CPU): x is on ", x.device());
  const Problem p = prepare(x, v, x_next, a, b, std, old, ref, old_is_velocity, ref_is_velocity, reduce);
  const at::Tensor g_lp = row_grad(grad_log_prob, p), g_guard = row_grad(grad_guard, p);
  const at::Tensor g_kl = row_grad(grad_kl, p), g_ratio = row_grad(grad_log_ratio, p);
  at::Tensor gm;
  if (grad_mean.has_value() && grad_mean->defined() && grad_mean->numel()) {
    TORCH_CHECK(grad_mean->sizes() == x.sizes(), "flowgrpo::transition_terms_backward: grad_mean has shape ",
                grad_mean->sizes(), ", expected ", x.sizes());
    gm = as_rows(*grad_mean, p.n, p.d);
  }
  const at::Tensor* like[5] = {&x, &v, &x_next, p.has_old ? &*old : &x, p.has_ref ? &*ref : &x};
  const bool present[5] = {true, true, true, p.has_old, p.has_ref};
  at::Tensor grads[5];
  bool wanted[5];
  BackwardOut out;
  for (int k = 0; k < 5; ++k) {
    const at::Tensor& t = *like[k];
    wanted[k] = output_mask[k] && present[k];
    grads[k] = wanted[k]
                   ? at::empty({p.n, p.d}, t.options().memory_format(at::MemoryFormat::Contiguous))
                   : at::empty({0}, t.options());
    out.t[k] = &grads[k];
  }
  const double* g[4] = {g_lp.data_ptr<double>(), g_guard.data_ptr<double>(),
                        g_kl.data_ptr<double>(), g_ratio.data_ptr<double>()};
  if (p.n > 0) {
    const int64_t chunks = (p.d + kChunk - 1) / kChunk;
    at::parallel_for(0, p.n * chunks, 1, [&](int64_t begin, int64_t end) {
      for (int64_t w = begin; w < end; ++w) {
        const int64_t row = w / chunks, c = w % chunks;
        const int64_t start = c * kChunk, stop = std::min(p.d, start + kChunk);
        if (p.compute == at::kDouble) backward_chunk<double>(p, gm, g, out, row, start, stop);
        else backward_chunk<float>(p, gm, g, out, row, start, stop);
      }
    });
  }
  for (int k = 0; k < 5; ++k)
    if (wanted[k]) grads[k] = grads[k].view(like[k]->sizes());
  return {grads[0], grads[1], grads[2], grads[3], grads[4]};
}

}  // namespace

TORCH_LIBRARY(flowgrpo, m) {
  m.def(
      "transition_terms(Tensor x, Tensor v, Tensor x_next, Tensor a, Tensor b, Tensor std, "
      "Tensor? old, Tensor? ref, bool old_is_velocity, bool ref_is_velocity, str reduce, "
      "bool return_mean) -> (Tensor mean, Tensor log_prob, Tensor guard, Tensor log_ratio, "
      "Tensor kl)");
  m.def(
      "transition_terms_backward(Tensor? grad_mean, Tensor? grad_log_prob, Tensor? grad_guard, "
      "Tensor? grad_log_ratio, Tensor? grad_kl, Tensor x, Tensor v, Tensor x_next, Tensor a, "
      "Tensor b, Tensor std, Tensor? old, Tensor? ref, bool old_is_velocity, "
      "bool ref_is_velocity, str reduce, bool[5] output_mask) -> (Tensor grad_x, Tensor grad_v, "
      "Tensor grad_x_next, Tensor grad_old, Tensor grad_ref)");
}

TORCH_LIBRARY_IMPL(flowgrpo, CPU, m) {
  m.impl("transition_terms", &transition_terms_cpu);
  m.impl("transition_terms_backward", &transition_terms_backward_cpu);
}

}  // namespace flowgrpo
