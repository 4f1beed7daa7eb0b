/* Casts between high precision and FP8 with per-tensor scaling.
 *
 *   quantize:    out = saturate_fp8(in * scale[0]),  out.scale_inv[0] = 1 / scale[0],
 *                out.amax[0] = max(out.amax[0], max|in|)
 *   dequantize:  out = float(in) * in.scale_inv[0]
 *   amax:        out_amax[0] = max(out_amax[0], max|in|)
 *
 * Rounding is to nearest even; values beyond the format's largest finite value saturate to it
 * (448 / 57344 for OCP E4M3 / E5M2, 240 / 57344 for FNUZ); NaN stays NaN.
 * High-precision dtypes: float32, float16, bfloat16. The tensors' element counts must agree.
 */
#ifndef TRANSFORMER_ENGINE_CAST_H_
#define TRANSFORMER_ENGINE_CAST_H_

#include "transformer_engine/transformer_engine.h"

#ifdef __cplusplus
extern "C" {
#endif

NVTEStatus nvte_quantize(const NVTETensor* input, NVTETensor* output, NVTEStream stream);

NVTEStatus nvte_dequantize(const NVTETensor* input, NVTETensor* output, NVTEStream stream);

/* Updates *amax (fp32, one element, device memory) with max|input|. */
NVTEStatus nvte_compute_amax(const NVTETensor* input, float* amax, NVTEStream stream);

#ifdef __cplusplus
}
#endif

#endif /* TRANSFORMER_ENGINE_CAST_H_ */
