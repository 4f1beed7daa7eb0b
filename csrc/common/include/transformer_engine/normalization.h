/* LayerNorm and RMSNorm over the last dimension, forward and backward.
 *
 * x is viewed as [rows, cols] (cols = last extent, rows = product of the others); statistics are
 * computed in fp32 per row.
 *
 *   LayerNorm:  mu = mean(x),  rsigma = 1 / sqrt(mean((x - mu)^2) + epsilon)
 *               z  = (x - mu) * rsigma * g + beta
 *   RMSNorm:    rsigma = 1 / sqrt(mean(x^2) + epsilon)
 *               z  = x * rsigma * g
 *   g = gamma, or 1 + gamma with zero_centered_gamma (gamma stored as its offset from 1).
 *
 * Dtypes: x and z in float32, float16 or bfloat16; gamma/beta either in x's dtype or float32
 * (mixed precision). z is in x's dtype, or FP8 (float8_e4m3 / float8_e5m2) quantised exactly as
 * nvte_quantize would quantise the fp32 z: z_fp8 = saturate(z * z.scale[0]), z.scale_inv[0] =
 * 1 / z.scale[0], z.amax[0] = max(z.amax[0], max|z|). mu and rsigma are float32 [rows] and
 * optional (pass NULL to skip saving them, e.g. for inference).
 *
 * Backward, with xhat = (x - mu) * rsigma (LayerNorm) or x * rsigma (RMSNorm), dy = dz * g:
 *   dx     = rsigma * (dy - mean(dy) - xhat * mean(dy * xhat))     (LayerNorm)
 *   dx     = rsigma * (dy - xhat * mean(dy * xhat))                 (RMSNorm)
 *   dgamma = sum over rows of dz * xhat,  dbeta = sum over rows of dz
 * dz and dx are in x's dtype, dgamma/dbeta in gamma's. The weight gradients are reduced in two
 * stages (per-block partial sums in fp32, then a column reduction) through `workspace`, a byte
 * buffer the caller allocates: call once with workspace->data == NULL and the op only writes the
 * size it needs into workspace->shape[0] (ndim 1, dtype byte) and returns. The result is
 * deterministic (no atomics).
 *
 * Any cols >= 1 (not only multiples of the vector width) and any rows >= 0 are accepted; rows == 0
 * writes zero weight gradients (and, for FP8 output, scale_inv).
 *
 * The *_bwd_residual variants also take dresidual (x's shape and dtype: the gradient reaching x by
 * a residual connection, x + f(norm(x))) and write dx = (the backward above) + dresidual, summed in
 * fp32 and rounded once: the residual branch's gradient costs no separate add. dresidual may be
 * the same buffer as dx.
 */
#ifndef TRANSFORMER_ENGINE_NORMALIZATION_H_
#define TRANSFORMER_ENGINE_NORMALIZATION_H_

#include "transformer_engine/transformer_engine.h"

#ifdef __cplusplus
extern "C" {
#endif

NVTEStatus nvte_layernorm_fwd(const NVTETensor* x, const NVTETensor* gamma, const NVTETensor* beta,
                              float epsilon, int zero_centered_gamma, NVTETensor* z,
                              NVTETensor* mu, NVTETensor* rsigma, NVTEStream stream);

NVTEStatus nvte_rmsnorm_fwd(const NVTETensor* x, const NVTETensor* gamma, float epsilon,
                            int zero_centered_gamma, NVTETensor* z, NVTETensor* rsigma,
                            NVTEStream stream);

NVTEStatus nvte_layernorm_bwd(const NVTETensor* dz, const NVTETensor* x, const NVTETensor* mu,
                              const NVTETensor* rsigma, const NVTETensor* gamma,
                              int zero_centered_gamma, NVTETensor* dx, NVTETensor* dgamma,
                              NVTETensor* dbeta, NVTETensor* workspace, NVTEStream stream);

NVTEStatus nvte_rmsnorm_bwd(const NVTETensor* dz, const NVTETensor* x, const NVTETensor* rsigma,
                            const NVTETensor* gamma, int zero_centered_gamma, NVTETensor* dx,
                            NVTETensor* dgamma, NVTETensor* workspace, NVTEStream stream);

NVTEStatus nvte_layernorm_bwd_residual(const NVTETensor* dz, const NVTETensor* x,
                                       const NVTETensor* mu, const NVTETensor* rsigma,
                                       const NVTETensor* gamma, int zero_centered_gamma,
                                       const NVTETensor* dresidual, NVTETensor* dx,
                                       NVTETensor* dgamma, NVTETensor* dbeta,
                                       NVTETensor* workspace, NVTEStream stream);

NVTEStatus nvte_rmsnorm_bwd_residual(const NVTETensor* dz, const NVTETensor* x,
                                     const NVTETensor* rsigma, const NVTETensor* gamma,
                                     int zero_centered_gamma, const NVTETensor* dresidual,
                                     NVTETensor* dx, NVTETensor* dgamma, NVTETensor* workspace,
                                     NVTEStream stream);

#ifdef __cplusplus
}
#endif

#endif /* TRANSFORMER_ENGINE_NORMALIZATION_H_ */
