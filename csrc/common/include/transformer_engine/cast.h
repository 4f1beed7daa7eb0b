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

#include <stdbool.h>

#include "transformer_engine/transformer_engine.h"

#ifdef __cplusplus
extern "C" {
#endif

NVTEStatus nvte_quantize(const NVTETensor* input, NVTETensor* output, NVTEStream stream);

NVTEStatus nvte_dequantize(const NVTETensor* input, NVTETensor* output, NVTEStream stream);

/* Updates *amax (fp32, one element, device memory) with max|input|. */
NVTEStatus nvte_compute_amax(const NVTETensor* input, float* amax, NVTEStream stream);


/* ---- Block-wise scaling (the Float8BlockScaling recipe) ---------------------------------------
 * input [rows, cols] (its 2-D view) is cast to FP8 with one fp32 scale per block, from the block's
 * own amax (no history):
 *   block_dim 1: 1x128 blocks, 128 consecutive elements of a row (the last block of a row may be
 *                shorter);  block_dim 2: 128x128 tiles (edge tiles may be smaller).
 *   amax = max|x| over the block (NaN if the block holds NaN)
 *   scale = fp8_max / amax, or 1 where amax is 0, NaN or infinite; FLT_MAX where that overflows;
 *           with pow2_scales the largest power of two <= scale
 *   out = saturate_fp8(x * scale) (round to nearest even, NaN stays NaN), scale_inv = 1 / scale
 * output->scale_inv receives the scale_inv array in the layout cuBLASLt's block-scaled FP8 GEMM
 * reads (float32, row-major; entries of the padding are not written):
 *   block_dim 1: [ceil(cols / 128), round_up(rows, 4)],   element [j, i] for row i, column block j
 *   block_dim 2: [ceil(rows / 128), round_up(ceil(cols / 128), 4)], element [I, J] for tile (I, J)
 * output_t (optional: NULL, or data NULL) receives the transpose [cols, rows], quantised along
 * its own rows, i.e. in 1x128 blocks of the transpose (128x1 blocks of input) for block_dim 1,
 * with its scale_inv in the block_dim-1 layout of a [cols, rows] tensor; for block_dim 2 the same
 * tiles transposed (same bits, tile scales in the block_dim-2 layout of [cols, rows]).
 * output->amax and output->scale are not used. Empty inputs launch nothing. */
NVTEStatus nvte_quantize_blockwise(const NVTETensor* input, NVTETensor* output,
                                   NVTETensor* output_t, int block_dim, bool pow2_scales,
                                   NVTEStream stream);

/* Elements of the scale_inv array above for a [rows, cols] tensor (padding included). */
size_t nvte_blockwise_scale_elems(int64_t rows, int64_t cols, int block_dim);

#ifdef __cplusplus
}
#endif

#endif /* TRANSFORMER_ENGINE_CAST_H_ */
