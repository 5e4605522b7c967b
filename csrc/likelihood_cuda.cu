// likelihood_cuda.cu: the CUDA implementation of flowgrpo::transition_terms(_backward).
// The math is likelihood.h's (the CPU implementation runs the same functions); this file only
// lays it out on the GPU.
//
// Layout: one block of kThreads threads per (row, chunk of kGpuChunk elements); thread t handles the
// elements t, t + kThreads, ... of its chunk (coalesced). Each thread accumulates the four sums in
// float64, the block reduces them in a fixed order (warp shuffles, then shared memory) into one
// partial per (row, chunk), and a second small kernel adds a row's partials in chunk order. No
// atomics: results are bit-reproducible run to run and do not depend on the batch a row sits in.
// Inputs of any float dtype are read directly (a uniform switch on the dtype code per load), so
// mixed bf16 latents and float32 stored means need no conversion pass.
//
// Compiling with -DFLOWGRPO_KERNELS_ONLY builds the device code without any torch header
// (tests/likelihood/test_ops.py does this with nvcc for sm_90 on machines without a CUDA torch).
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "likelihood.h"

namespace flowgrpo {
namespace gpu {

constexpr int kThreads = 256;
// Elements per block: 16 per thread. Smaller than the CPU's kChunk so that one image row already
// fills several SMs; fixed, so a row's sums never depend on the batch (CPU and GPU partitions
// differ, so their results may differ in the last bits; each is reproducible).
constexpr int64_t kGpuChunk = 4096;

struct InRows {  // a [N, D] view with contiguous rows; data == nullptr when absent
  const void* data;
  int64_t row_stride;  // elements
  int dtype;           // DtypeCode
};

struct OutRows {  // a contiguous [N, D] output; data == nullptr when not wanted
  void* data;
  int dtype;
};

template <typename C>
__device__ __forceinline__ C load(const InRows& r, int64_t row, int64_t i) {
  const int64_t k = row * r.row_stride + i;
  switch (r.dtype) {
    case kF32: return static_cast<C>(static_cast<const float*>(r.data)[k]);
    case kF64: return static_cast<C>(static_cast<const double*>(r.data)[k]);
    case kF16: return static_cast<C>(__half2float(static_cast<const __half*>(r.data)[k]));
    default: return static_cast<C>(__bfloat162float(static_cast<const __nv_bfloat16*>(r.data)[k]));
  }
}

// value rounded to the compute dtype C first (as the CPU implementation does), then to the output's
template <typename C>
__device__ __forceinline__ void store(const OutRows& r, int64_t k, double value) {
  const C c = static_cast<C>(value);
  switch (r.dtype) {
    case kF32: static_cast<float*>(r.data)[k] = static_cast<float>(c); break;
    case kF64: static_cast<double*>(r.data)[k] = static_cast<double>(c); break;
    case kF16: static_cast<__half*>(r.data)[k] = __float2half_rn(static_cast<float>(c)); break;
    default: static_cast<__nv_bfloat16*>(r.data)[k] = __float2bfloat16_rn(static_cast<float>(c));
  }
}

struct ForwardArgs {
  InRows x, v, x_next, old, ref;
  const double* a;
  const double* b;
  int64_t n, d, chunks;
  bool old_is_velocity, ref_is_velocity;
  void* mean;        // C [N, D] contiguous, or nullptr
  double* partial;   // [N * chunks * 4]
};

__device__ __forceinline__ double warp_sum(double value) {
  for (int offset = 16; offset > 0; offset >>= 1) value += __shfl_down_sync(0xffffffffu, value, offset);
  return value;
}

// the row and the element range [begin, end) this block works on: block b takes chunk b % chunks of row b / chunks
struct BlockSpan {
  int64_t row, begin, end;
};

__device__ __forceinline__ BlockSpan block_span(int64_t chunks, int64_t d) {
  const int64_t work = blockIdx.x;
  const int64_t begin = (work % chunks) * kGpuChunk;
  return {work / chunks, begin, begin + kGpuChunk < d ? begin + kGpuChunk : d};
}

template <typename C>
__global__ void __launch_bounds__(kThreads, 4) forward_kernel(ForwardArgs p) {
  const BlockSpan span = block_span(p.chunks, p.d);
  const int64_t row = span.row, begin = span.begin, end = span.end;
  const C a = static_cast<C>(p.a[row]), b = static_cast<C>(p.b[row]);
  const bool has_old = p.old.data != nullptr, has_ref = p.ref.data != nullptr;
  double acc[4] = {0.0, 0.0, 0.0, 0.0};  // Σe², Σe_old·δ, Σδ², Σδ_ref²
#pragma unroll 4
  for (int64_t i = begin + threadIdx.x; i < end; i += kThreads) {
    const C xi = load<C>(p.x, row, i);
    const C mu = affine(a, xi, b, load<C>(p.v, row, i));
    if (p.mean != nullptr) static_cast<C*>(p.mean)[row * p.d + i] = mu;
    const double m = mu, xn = load<C>(p.x_next, row, i);
    const double e = xn - m;
    acc[0] += e * e;
    if (has_old) {
      C mo = load<C>(p.old, row, i);
      if (p.old_is_velocity) mo = affine(a, xi, b, mo);
      const double e_old = xn - static_cast<double>(mo), delta = m - static_cast<double>(mo);
      acc[1] += e_old * delta;
      acc[2] += delta * delta;
    }
    if (has_ref) {
      C mr = load<C>(p.ref, row, i);
      if (p.ref_is_velocity) mr = affine(a, xi, b, mr);
      const double delta_ref = m - static_cast<double>(mr);
      acc[3] += delta_ref * delta_ref;
    }
  }
  __shared__ double warp_partial[kThreads / 32][4];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    const double s = warp_sum(acc[k]);
    if (lane == 0) warp_partial[warp][k] = s;
  }
  __syncthreads();
  if (threadIdx.x < 4) {
    double s = 0.0;
    for (int w = 0; w < kThreads / 32; ++w) s += warp_partial[w][threadIdx.x];
    p.partial[static_cast<int64_t>(blockIdx.x) * 4 + threadIdx.x] = s;
  }
}

template <typename C>
__global__ void finalize_kernel(const double* partial, const double* std, int64_t n,
                                int64_t chunks, double numel, bool reduce_sum, C* log_prob,
                                C* guard, C* log_ratio, C* kl) {
  const int64_t row = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (row >= n) return;
  Sums s;
  for (int64_t c = 0; c < chunks; ++c) {
    const double* q = partial + (row * chunks + c) * 4;
    s.sq += q[0], s.cross += q[1], s.dd += q[2], s.kl += q[3];
  }
  const RowTerms t = finalize_row(s, std[row], numel, reduce_sum);
  log_prob[row] = static_cast<C>(t.log_prob);
  if (guard != nullptr) guard[row] = static_cast<C>(t.guard), log_ratio[row] = static_cast<C>(t.log_ratio);
  if (kl != nullptr) kl[row] = static_cast<C>(t.kl);
}

struct BackwardArgs {
  InRows x, v, x_next, old, ref, grad_mean;
  const double *a, *b, *std, *g_lp, *g_guard, *g_kl, *g_ratio;
  int64_t n, d, chunks;
  bool old_is_velocity, ref_is_velocity, reduce_sum;
  OutRows out[5];  // grad_x, grad_v, grad_x_next, grad_old, grad_ref
};

template <typename C>
__global__ void __launch_bounds__(kThreads, 4) backward_kernel(BackwardArgs p) {
  const BlockSpan span = block_span(p.chunks, p.d);
  const int64_t row = span.row, begin = span.begin, end = span.end;
  const C a = static_cast<C>(p.a[row]), b = static_cast<C>(p.b[row]);
  const GradCoef coef = grad_coefficients(p.g_lp[row], p.g_guard[row], p.g_kl[row], p.g_ratio[row],
                                          p.std[row], static_cast<double>(p.d), p.reduce_sum);
  const bool has_old = p.old.data != nullptr, has_ref = p.ref.data != nullptr;
  const double w_old = p.old_is_velocity ? 1.0 : 0.0, w_ref = p.ref_is_velocity ? 1.0 : 0.0;
  const double s_old = p.old_is_velocity ? static_cast<double>(b) : 1.0;
  const double s_ref = p.ref_is_velocity ? static_cast<double>(b) : 1.0;
#pragma unroll 4
  for (int64_t i = begin + threadIdx.x; i < end; i += kThreads) {
    const C xi = load<C>(p.x, row, i);
    const double m = affine(a, xi, b, load<C>(p.v, row, i));
    const double xn = load<C>(p.x_next, row, i);
    const double e = xn - m;
    double e_old = 0.0, delta = 0.0, delta_ref = 0.0;
    if (has_old) {
      C mo = load<C>(p.old, row, i);
      if (p.old_is_velocity) mo = affine(a, xi, b, mo);
      e_old = xn - static_cast<double>(mo);
      delta = m - static_cast<double>(mo);
    }
    if (has_ref) {
      C mr = load<C>(p.ref, row, i);
      if (p.ref_is_velocity) mr = affine(a, xi, b, mr);
      delta_ref = m - static_cast<double>(mr);
    }
    const double gm = p.grad_mean.data != nullptr ? static_cast<double>(load<C>(p.grad_mean, row, i)) : 0.0;
    const ElementGrad g = element_grad(coef, gm, e, e_old, delta, delta_ref);
    const int64_t k = row * p.d + i;
    if (p.out[0].data) store<C>(p.out[0], k, static_cast<double>(a) * (g.mu + w_old * g.mu_old + w_ref * g.mu_ref));
    if (p.out[1].data) store<C>(p.out[1], k, static_cast<double>(b) * g.mu);
    if (p.out[2].data) store<C>(p.out[2], k, g.x_next);
    if (p.out[3].data) store<C>(p.out[3], k, s_old * g.mu_old);
    if (p.out[4].data) store<C>(p.out[4], k, s_ref * g.mu_ref);
  }
}

// Explicit instantiations, so a kernels-only nvcc build emits the device code.
template __global__ void forward_kernel<float>(ForwardArgs);
template __global__ void forward_kernel<double>(ForwardArgs);
template __global__ void finalize_kernel<float>(const double*, const double*, int64_t, int64_t, double, bool, float*, float*, float*, float*);
template __global__ void finalize_kernel<double>(const double*, const double*, int64_t, int64_t, double, bool, double*, double*, double*, double*);
template __global__ void backward_kernel<float>(BackwardArgs);
template __global__ void backward_kernel<double>(BackwardArgs);

}  // namespace gpu
}  // namespace flowgrpo

#if !defined(FLOWGRPO_KERNELS_ONLY)
#include <ATen/ATen.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

namespace flowgrpo {
namespace {

gpu::InRows in_rows(const at::Tensor& t) {
  if (!t.defined()) return {nullptr, 0, kF32};
  return {t.data_ptr(), t.stride(0), dtype_code(t.scalar_type())};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor> transition_terms_cuda(
    const at::Tensor& x, const at::Tensor& v, const at::Tensor& x_next, const at::Tensor& a,
    const at::Tensor& b, const at::Tensor& std, const std::optional<at::Tensor>& old,
    const std::optional<at::Tensor>& ref, bool old_is_velocity, bool ref_is_velocity,
    c10::string_view reduce, bool return_mean) {
  TORCH_CHECK(x.is_cuda(), "flowgrpo::transition_terms (CUDA): x is on ", x.device());
  const c10::cuda::CUDAGuard device_guard(x.device());
  const Problem p = prepare(x, v, x_next, a, b, std, old, ref, old_is_velocity, ref_is_velocity, reduce);
  const auto opts = x.options().dtype(p.compute);
  at::Tensor mean = return_mean ? at::empty(x.sizes(), opts) : at::empty({0}, opts);
  at::Tensor lp = at::empty({p.n}, opts);
  at::Tensor guard = at::empty({p.has_old ? p.n : 0}, opts);
  at::Tensor ratio = at::empty({p.has_old ? p.n : 0}, opts);
  at::Tensor kl = at::empty({p.has_ref ? p.n : 0}, opts);
  if (p.n == 0) return {mean, lp, guard, ratio, kl};
  const int64_t chunks = (p.d + gpu::kGpuChunk - 1) / gpu::kGpuChunk;
  at::Tensor partial = at::empty({p.n * chunks * 4}, opts.dtype(at::kDouble));
  gpu::ForwardArgs args{in_rows(p.x), in_rows(p.v), in_rows(p.x_next), in_rows(p.old), in_rows(p.ref),
                        p.a.data_ptr<double>(), p.b.data_ptr<double>(), p.n, p.d, chunks,
                        p.old_is_velocity, p.ref_is_velocity,
                        return_mean ? mean.data_ptr() : nullptr, partial.data_ptr<double>()};
  const auto stream = c10::cuda::getCurrentCUDAStream();
  const int rows_per_block = 128;
  const auto finalize_blocks = static_cast<unsigned>((p.n + rows_per_block - 1) / rows_per_block);
  if (p.compute == at::kDouble) {
    gpu::forward_kernel<double><<<static_cast<unsigned>(p.n * chunks), gpu::kThreads, 0, stream>>>(args);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    gpu::finalize_kernel<double><<<finalize_blocks, rows_per_block, 0, stream>>>(
        partial.data_ptr<double>(), p.std.data_ptr<double>(), p.n, chunks, static_cast<double>(p.d),
        p.reduce_sum, lp.data_ptr<double>(), p.has_old ? guard.data_ptr<double>() : nullptr,
        p.has_old ? ratio.data_ptr<double>() : nullptr, p.has_ref ? kl.data_ptr<double>() : nullptr);
  } else {
    gpu::forward_kernel<float><<<static_cast<unsigned>(p.n * chunks), gpu::kThreads, 0, stream>>>(args);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    gpu::finalize_kernel<float><<<finalize_blocks, rows_per_block, 0, stream>>>(
        partial.data_ptr<double>(), p.std.data_ptr<double>(), p.n, chunks, static_cast<double>(p.d),
        p.reduce_sum, lp.data_ptr<float>(), p.has_old ? guard.data_ptr<float>() : nullptr,
        p.has_old ? ratio.data_ptr<float>() : nullptr, p.has_ref ? kl.data_ptr<float>() : nullptr);
  }
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return {mean, lp, guard, ratio, kl};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor> transition_terms_backward_cuda(
    const std::optional<at::Tensor>& grad_mean, const std::optional<at::Tensor>& grad_log_prob,
    const std::optional<at::Tensor>& grad_guard, const std::optional<at::Tensor>& grad_log_ratio,
    const std::optional<at::Tensor>& grad_kl, const at::Tensor& x, const at::Tensor& v,
    const at::Tensor& x_next, const at::Tensor& a, const at::Tensor& b, const at::Tensor& std,
    const std::optional<at::Tensor>& old, const std::optional<at::Tensor>& ref,
    bool old_is_velocity, bool ref_is_velocity, c10::string_view reduce,
    std::array<bool, 5> output_mask) {
  TORCH_CHECK(x.is_cuda(), "flowgrpo::transition_terms_backward (CUDA): x is on ", x.device());
  const c10::cuda::CUDAGuard device_guard(x.device());
  const Problem p = prepare(x, v, x_next, a, b, std, old, ref, old_is_velocity, ref_is_velocity, reduce);
  const at::Tensor g_lp = row_grad(grad_log_prob, p), g_guard = row_grad(grad_guard, p);
  const at::Tensor g_kl = row_grad(grad_kl, p), g_ratio = row_grad(grad_log_ratio, p);
  at::Tensor gm;
  if (grad_mean.has_value() && grad_mean->defined() && grad_mean->numel()) {
    TORCH_CHECK(grad_mean->sizes() == x.sizes(), "flowgrpo::transition_terms_backward: grad_mean has shape ",
                grad_mean->sizes(), ", expected ", x.sizes());
    gm = grad_mean->reshape({p.n, p.d});
    if (p.d > 1 && gm.stride(1) != 1) gm = gm.contiguous();
  }
  const at::Tensor* like[5] = {&x, &v, &x_next, p.has_old ? &*old : &x, p.has_ref ? &*ref : &x};
  const bool present[5] = {true, true, true, p.has_old, p.has_ref};
  at::Tensor grads[5];
  gpu::BackwardArgs args{in_rows(p.x), in_rows(p.v), in_rows(p.x_next), in_rows(p.old), in_rows(p.ref),
                         in_rows(gm), p.a.data_ptr<double>(), p.b.data_ptr<double>(),
                         p.std.data_ptr<double>(), g_lp.data_ptr<double>(), g_guard.data_ptr<double>(),
                         g_kl.data_ptr<double>(), g_ratio.data_ptr<double>(), p.n, p.d, 0,
                         p.old_is_velocity, p.ref_is_velocity, p.reduce_sum, {}};
  for (int k = 0; k < 5; ++k) {
    const at::Tensor& t = *like[k];
    const bool wanted = output_mask[k] && present[k];
    grads[k] = wanted ? at::empty(t.sizes(), t.options().memory_format(at::MemoryFormat::Contiguous))
                      : at::empty({0}, t.options());
    args.out[k] = {wanted ? grads[k].data_ptr() : nullptr, dtype_code(t.scalar_type())};
  }
  if (p.n > 0) {
    args.chunks = (p.d + gpu::kGpuChunk - 1) / gpu::kGpuChunk;
    const auto stream = c10::cuda::getCurrentCUDAStream();
    const auto blocks = static_cast<unsigned>(p.n * args.chunks);
    if (p.compute == at::kDouble) gpu::backward_kernel<double><<<blocks, gpu::kThreads, 0, stream>>>(args);
    else gpu::backward_kernel<float><<<blocks, gpu::kThreads, 0, stream>>>(args);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  }
  return {grads[0], grads[1], grads[2], grads[3], grads[4]};
}

}  // namespace

TORCH_LIBRARY_IMPL(flowgrpo, CUDA, m) {
  m.impl("transition_terms", &transition_terms_cuda);
  m.impl("transition_terms_backward", &transition_terms_backward_cuda);
}

}  // namespace flowgrpo
#endif
