/* Fused rotary position embedding (RoPE), forward and backward.
 *
 * Layouts of the input x (and of the output, which has x's shape):
 *   kNVTERopeSBHD  [s, b, h, d]   position of token (i, j) is i
 *   kNVTERopeBSHD  [b, s, h, d]   position of token (j, i) is i
 *   kNVTERopeTHD   [t, h, d]      packed sequences: cu_seqlens [n + 1] int32, sequence k holds
 *                                 tokens cu_seqlens[k] .. cu_seqlens[k+1]-1 and token t's
 *                                 position is t - cu_seqlens[k]
 * freqs: float32 [s_max, 1, 1, R] (any shape with s_max * R elements, R = freqs' last dim):
 * freqs[p, k] is the angle of element k at position p. R is the rotary dim: even, <= d; elements
 * k >= R of every head pass through unchanged. s_max must cover every position (s for sbhd/bshd;
 * for thd the caller guarantees it: rows past s_max are written as NaN so the error shows).
 *
 * With c = cos(freqs[p, k]) and s = sin(freqs[p, k]) (fp32), for k < R:
 *   out[k] = x[k] * c[k] + rot(x)[k] * s[k]
 * rot, non-interleaved ("rotate half", H = R/2):   rot(x)[k] = -x[k + H] (k < H),  x[k - H] (k >= H)
 * rot, interleaved (pairs 2i, 2i+1):                rot(x)[2i] = -x[2i + 1],       rot(x)[2i+1] = x[2i]
 * Backward applies the transpose of that linear map to the output gradient g:
 *   non-interleaved:  dx[k] = g[k] c[k] + g[k+H] s[k+H] (k < H),  g[k] c[k] - g[k-H] s[k-H] (k >= H)
 *   interleaved:      dx[2i] = g[2i] c[2i] + g[2i+1] s[2i+1],  dx[2i+1] = g[2i+1] c[2i+1] - g[2i] s[2i]
 * Arithmetic is fp32; x, out, g and dx are float32, float16 or bfloat16 of one dtype.
 */
#ifndef TRANSFORMER_ENGINE_ROPE_H_
#define TRANSFORMER_ENGINE_ROPE_H_

#include "transformer_engine/transformer_engine.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum { kNVTERopeSBHD = 0, kNVTERopeBSHD = 1, kNVTERopeTHD = 2 } NVTERopeFormat;

/* cu_seqlens: int32 [n + 1] for kNVTERopeTHD, NULL (or an empty descriptor) otherwise. */
NVTEStatus nvte_fused_rope_forward(const NVTETensor* input, const NVTETensor* freqs,
                                   const NVTETensor* cu_seqlens, NVTETensor* output,
                                   NVTERopeFormat format, int interleaved, NVTEStream stream);

NVTEStatus nvte_fused_rope_backward(const NVTETensor* grad_output, const NVTETensor* freqs,
                                    const NVTETensor* cu_seqlens, NVTETensor* grad_input,
                                    NVTERopeFormat format, int interleaved, NVTEStream stream);

#ifdef __cplusplus
}
#endif

#endif /* TRANSFORMER_ENGINE_ROPE_H_ */
