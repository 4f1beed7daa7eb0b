/* Transposes of 2-D row-major tensors, plain and fused with the FP8 cast.
 *
 *   transpose:       out[j, i] = in[i, j]                     (any dtype, same in and out)
 *   cast_transpose:  out[i, j] = q(in[i, j]),  out_t[j, i] = q(in[i, j]),
 *                    q(x) = saturate_fp8(x * scale[0])
 *                    with scale_inv and amax written as nvte_quantize does.
 *
 * FP8 GEMMs on Hopper take both operands "TN", so a tensor used on both sides of a matmul pair
 * needs both the row-major and the transposed FP8 copy: cast_transpose makes the two in one pass
 * over the input. The row-major and transposed outputs share scale, scale_inv and amax, which
 * are taken from `output`. Tensors with more than two dims are viewed as [prod(leading), last].
 */
#ifndef TRANSFORMER_ENGINE_TRANSPOSE_H_
#define TRANSFORMER_ENGINE_TRANSPOSE_H_

#include "transformer_engine/transformer_engine.h"

#ifdef __cplusplus
extern "C" {
#endif

NVTEStatus nvte_transpose(const NVTETensor* input, NVTETensor* output, NVTEStream stream);

NVTEStatus nvte_cast_transpose(const NVTETensor* input, NVTETensor* output,
                               NVTETensor* output_t, NVTEStream stream);

#ifdef __cplusplus
}
#endif

#endif /* TRANSFORMER_ENGINE_TRANSPOSE_H_ */
