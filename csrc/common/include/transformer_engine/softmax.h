/* Fused scaled softmax over the last dimension (attention probabilities), forward and backward.
 *
 * Rows are the last dimension of the input; arithmetic is in fp32, results are rounded once to
 * the input dtype (float16 or bfloat16).
 *
 *   scaled:            y = softmax(scale * x)
 *   scaled masked:     y = softmax(where(mask, -inf, scale * x))      mask: True = masked out
 *   upper triangular:  y = softmax(where(j > i, -inf, scale * x))     causal, x is [..., sq, sk]
 *                      with sq == sk, i the query (row) and j the key (column) index
 *
 * A row whose every element is masked (or -inf) gives all zeros rather than NaN, and masked
 * elements are exactly 0.
 *
 * Masked: input is [b, h, sq, sk]; mask is [b or 1, h or 1, sq, sk] of one-byte booleans
 * (uint8 / bool, non-zero = masked) and is broadcast over the extents given as 1.
 *
 * Backward (all three): dx = scale * y * (dy - sum(dy * y)), with y the forward's output. For the
 * upper-triangular form the elements above the diagonal are written as 0 without being read.
 *
 * Rows of any length >= 1 are accepted (16k and more); an input with no rows is a no-op.
 */
#ifndef TRANSFORMER_ENGINE_SOFTMAX_H_
#define TRANSFORMER_ENGINE_SOFTMAX_H_

#include "transformer_engine/transformer_engine.h"

#ifdef __cplusplus
extern "C" {
#endif

NVTEStatus nvte_scaled_softmax_forward(const NVTETensor* input, NVTETensor* output, float scale,
                                       NVTEStream stream);

NVTEStatus nvte_scaled_softmax_backward(const NVTETensor* grad_output,
                                        const NVTETensor* softmax_output, NVTETensor* grad_input,
                                        float scale, NVTEStream stream);

NVTEStatus nvte_scaled_masked_softmax_forward(const NVTETensor* input, const NVTETensor* mask,
                                              NVTETensor* output, float scale, NVTEStream stream);

NVTEStatus nvte_scaled_masked_softmax_backward(const NVTETensor* grad_output,
                                               const NVTETensor* softmax_output,
                                               NVTETensor* grad_input, float scale,
                                               NVTEStream stream);

NVTEStatus nvte_scaled_upper_triang_masked_softmax_forward(const NVTETensor* input,
                                                           NVTETensor* output, float scale,
                                                           NVTEStream stream);

NVTEStatus nvte_scaled_upper_triang_masked_softmax_backward(const NVTETensor* grad_output,
                                                            const NVTETensor* softmax_output,
                                                            NVTETensor* grad_input, float scale,
                                                            NVTEStream stream);

#ifdef __cplusplus
}
#endif

#endif /* TRANSFORMER_ENGINE_SOFTMAX_H_ */
