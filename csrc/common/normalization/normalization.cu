// C entry points of the normalization family: argument checks, then dispatch on the input dtype
// to the launchers in fwd_<dtype>.cu / bwd_<dtype>.cu.
#include "normalization/norm_common.h"
#include "transformer_engine/normalization.h"
#include "util/device_utils.cuh"
#include "util/tensor.h"

namespace te {
namespace norm {
namespace {

struct Shape2d {
  int64_t rows, cols;
};

Shape2d check_input(const NVTETensor* x, const char* what) {
  check_tensor(x, what);
  check_dtype_in(*x, what, is_high_precision(x->dtype), "float32, float16 or bfloat16");
  TE_CHECK_ARG(x->ndim >= 1, what, " is 0-d; expected at least one dimension to normalize over");
  Shape2d s;
  as_2d(*x, &s.rows, &s.cols);
  TE_CHECK_ARG(s.cols >= 1, what, " has shape ", shape_str(*x),
               "; expected a last dimension of at least 1");
  TE_CHECK_ARG(s.cols < (int64_t(1) << 31), what, " has ", s.cols,
               " columns; at most 2^31 - 1 are supported");
  return s;
}

void check_like(const NVTETensor* t, const char* what, const NVTETensor& x, const char* x_name) {
  check_tensor(t, what);
  TE_CHECK_ARG(numel(*t) == numel(x), what, " has shape ", shape_str(*t), "; expected ",
               numel(x), " elements like ", x_name, " ", shape_str(x));
  TE_CHECK_ARG(t->dtype == x.dtype, what, " has dtype ", nvte_dtype_name(t->dtype),
               "; expected ", x_name, "'s dtype ", nvte_dtype_name(x.dtype));
}

void check_weight(const NVTETensor* w, const char* what, const NVTETensor& x, int64_t cols,
                  NVTEDType w_type) {
  check_tensor(w, what);
  TE_CHECK_ARG(numel(*w) == cols, what, " has shape ", shape_str(*w), "; expected ", cols,
               " elements (the last dimension of x)");
  TE_CHECK_ARG(w->dtype == w_type, what, " has dtype ", nvte_dtype_name(w->dtype),
               "; expected ", nvte_dtype_name(w_type), " (x's dtype ", nvte_dtype_name(x.dtype),
               " or float32, the same for every weight)");
}

void check_stat(const NVTETensor* s, const char* what, int64_t rows) {
  check_tensor(s, what);
  TE_CHECK_ARG(s->dtype == kNVTEFloat32, what, " has dtype ", nvte_dtype_name(s->dtype),
               "; expected float32");
  TE_CHECK_ARG(numel(*s) == rows, what, " has shape ", shape_str(*s), "; expected ", rows,
               " elements (one per row)");
}

NVTEDType weight_type(const NVTETensor* gamma, const NVTETensor& x) {
  check_tensor(gamma, "gamma");
  const bool ok = gamma->dtype == x.dtype || gamma->dtype == kNVTEFloat32;
  TE_CHECK_ARG(ok, "gamma has dtype ", nvte_dtype_name(gamma->dtype), "; expected x's dtype ",
               nvte_dtype_name(x.dtype), " or float32");
  return gamma->dtype;
}

void forward(const NVTETensor* x, const NVTETensor* gamma, const NVTETensor* beta, float epsilon,
             int zero_centered_gamma, NVTETensor* z, NVTETensor* mu, NVTETensor* rsigma,
             bool rms, NVTEStream stream) {
  const Shape2d s = check_input(x, "x");
  const NVTEDType w_type = weight_type(gamma, *x);
  check_weight(gamma, "gamma", *x, s.cols, w_type);
  if (!rms) check_weight(beta, "beta", *x, s.cols, w_type);
  check_tensor(z, "z");
  TE_CHECK_ARG(numel(*z) == numel(*x), "z has shape ", shape_str(*z), "; expected ", numel(*x),
               " elements like x ", shape_str(*x));
  TE_CHECK_ARG(z->dtype == x->dtype || is_fp8(z->dtype), "z has dtype ",
               nvte_dtype_name(z->dtype), "; expected x's dtype ", nvte_dtype_name(x->dtype),
               ", float8_e4m3 or float8_e5m2");
  if (is_fp8(z->dtype)) check_fp8_scaling(*z, "z", true);
  if (mu != nullptr) check_stat(mu, "mu", s.rows);
  if (rsigma != nullptr) check_stat(rsigma, "rsigma", s.rows);
  TE_CHECK_ARG(epsilon >= 0.f && epsilon < INFINITY, "epsilon is ", epsilon,
               "; expected a finite value >= 0");
  NormFwdParams p{};
  p.x = x->data;
  p.gamma = gamma->data;
  p.beta = rms ? nullptr : beta->data;
  p.z = z->data;
  p.mu = mu != nullptr ? static_cast<float*>(mu->data) : nullptr;
  p.rsigma = rsigma != nullptr ? static_cast<float*>(rsigma->data) : nullptr;
  p.rows = s.rows;
  p.cols = s.cols;
  p.epsilon = epsilon;
  p.zero_centered_gamma = zero_centered_gamma != 0;
  p.rms = rms;
  p.x_type = x->dtype;
  p.w_type = w_type;
  p.z_type = z->dtype;
  p.scale = z->scale;
  p.amax = z->amax;
  p.scale_inv = z->scale_inv;
  cudaStream_t st = to_stream(stream);
  switch (x->dtype) {
    case kNVTEFloat32: launch_norm_fwd_typed<float>(p, st); break;
    case kNVTEFloat16: launch_norm_fwd_typed<fp16>(p, st); break;
    default: launch_norm_fwd_typed<bf16>(p, st); break;
  }
}

int64_t run_backward(const NormBwdParams& p, cudaStream_t st, bool launch) {
  switch (p.x_type) {
    case kNVTEFloat32: return run_norm_bwd_typed<float>(p, st, launch);
    case kNVTEFloat16: return run_norm_bwd_typed<fp16>(p, st, launch);
    default: return run_norm_bwd_typed<bf16>(p, st, launch);
  }
}

void backward(const NVTETensor* dz, const NVTETensor* x, const NVTETensor* mu,
              const NVTETensor* rsigma, const NVTETensor* gamma, int zero_centered_gamma,
              const NVTETensor* dresidual, NVTETensor* dx, NVTETensor* dgamma,
              NVTETensor* dbeta, NVTETensor* workspace, bool rms, NVTEStream stream) {
  const Shape2d s = check_input(x, "x");
  check_like(dz, "dz", *x, "x");
  check_like(dx, "dx", *x, "x");
  if (dresidual != nullptr) check_like(dresidual, "dresidual", *x, "x");
  if (!rms) check_stat(mu, "mu", s.rows);
  check_stat(rsigma, "rsigma", s.rows);
  const NVTEDType w_type = weight_type(gamma, *x);
  check_weight(gamma, "gamma", *x, s.cols, w_type);
  check_weight(dgamma, "dgamma", *x, s.cols, w_type);
  if (!rms) check_weight(dbeta, "dbeta", *x, s.cols, w_type);
  TE_CHECK_ARG(workspace != nullptr, "workspace is a null descriptor");

  NormBwdParams p{};
  p.dz = dz->data;
  p.x = x->data;
  p.mu = rms ? nullptr : static_cast<const float*>(mu->data);
  p.rsigma = static_cast<const float*>(rsigma->data);
  p.gamma = gamma->data;
  p.dx = dx->data;
  p.dresidual = dresidual != nullptr ? dresidual->data : nullptr;
  p.dgamma = dgamma->data;
  p.dbeta = rms ? nullptr : dbeta->data;
  p.rows = s.rows;
  p.cols = s.cols;
  p.zero_centered_gamma = zero_centered_gamma != 0;
  p.rms = rms;
  p.x_type = x->dtype;
  p.w_type = w_type;
  cudaStream_t st = to_stream(stream);

  const size_t need = bwd_workspace_bytes(run_backward(p, st, false), s.cols, rms);
  if (workspace->data == nullptr) {
    workspace->dtype = kNVTEByte;
    workspace->ndim = 1;
    workspace->shape[0] = static_cast<int64_t>(need);
    return;
  }
  check_tensor(workspace, "workspace");
  const size_t have = size_t(numel(*workspace)) * nvte_dtype_size(workspace->dtype);
  TE_CHECK_ARG(have >= need, "workspace holds ", have, " bytes; expected at least ", need,
               " (query the size with a null workspace data pointer)");
  TE_CHECK_ARG(aligned16(workspace->data), "workspace is not 16-byte aligned");
  p.workspace = static_cast<float*>(workspace->data);
  run_backward(p, st, true);
}

}  // namespace
}  // namespace norm
}  // namespace te

using namespace te;

extern "C" NVTEStatus nvte_layernorm_fwd(const NVTETensor* x, const NVTETensor* gamma,
                                         const NVTETensor* beta, float epsilon,
                                         int zero_centered_gamma, NVTETensor* z, NVTETensor* mu,
                                         NVTETensor* rsigma, NVTEStream stream) {
  return guard("nvte_layernorm_fwd", [&] {
    norm::forward(x, gamma, beta, epsilon, zero_centered_gamma, z, mu, rsigma, false, stream);
  });
}

extern "C" NVTEStatus nvte_rmsnorm_fwd(const NVTETensor* x, const NVTETensor* gamma,
                                       float epsilon, int zero_centered_gamma, NVTETensor* z,
                                       NVTETensor* rsigma, NVTEStream stream) {
  return guard("nvte_rmsnorm_fwd", [&] {
    norm::forward(x, gamma, nullptr, epsilon, zero_centered_gamma, z, nullptr, rsigma, true,
                  stream);
  });
}

extern "C" NVTEStatus nvte_layernorm_bwd(const NVTETensor* dz, const NVTETensor* x,
                                         const NVTETensor* mu, const NVTETensor* rsigma,
                                         const NVTETensor* gamma, int zero_centered_gamma,
                                         NVTETensor* dx, NVTETensor* dgamma, NVTETensor* dbeta,
                                         NVTETensor* workspace, NVTEStream stream) {
  return guard("nvte_layernorm_bwd", [&] {
    norm::backward(dz, x, mu, rsigma, gamma, zero_centered_gamma, nullptr, dx, dgamma, dbeta,
                   workspace, false, stream);
  });
}

extern "C" NVTEStatus nvte_layernorm_bwd_residual(const NVTETensor* dz, const NVTETensor* x,
                                                  const NVTETensor* mu, const NVTETensor* rsigma,
                                                  const NVTETensor* gamma, int zero_centered_gamma,
                                                  const NVTETensor* dresidual, NVTETensor* dx,
                                                  NVTETensor* dgamma, NVTETensor* dbeta,
                                                  NVTETensor* workspace, NVTEStream stream) {
  return guard("nvte_layernorm_bwd_residual", [&] {
    TE_CHECK_ARG(dresidual != nullptr, "dresidual is a null descriptor");
    norm::backward(dz, x, mu, rsigma, gamma, zero_centered_gamma, dresidual, dx, dgamma, dbeta,
                   workspace, false, stream);
  });
}

extern "C" NVTEStatus nvte_rmsnorm_bwd(const NVTETensor* dz, const NVTETensor* x,
                                       const NVTETensor* rsigma, const NVTETensor* gamma,
                                       int zero_centered_gamma, NVTETensor* dx,
                                       NVTETensor* dgamma, NVTETensor* workspace,
                                       NVTEStream stream) {
  return guard("nvte_rmsnorm_bwd", [&] {
    norm::backward(dz, x, nullptr, rsigma, gamma, zero_centered_gamma, nullptr, dx, dgamma,
                   nullptr, workspace, true, stream);
  });
}

extern "C" NVTEStatus nvte_rmsnorm_bwd_residual(const NVTETensor* dz, const NVTETensor* x,
                                                const NVTETensor* rsigma, const NVTETensor* gamma,
                                                int zero_centered_gamma,
                                                const NVTETensor* dresidual, NVTETensor* dx,
                                                NVTETensor* dgamma, NVTETensor* workspace,
                                                NVTEStream stream) {
  return guard("nvte_rmsnorm_bwd_residual", [&] {
    TE_CHECK_ARG(dresidual != nullptr, "dresidual is a null descriptor");
    norm::backward(dz, x, nullptr, rsigma, gamma, zero_centered_gamma, dresidual, dx, dgamma,
                   nullptr, workspace, true, stream);
  });
}
