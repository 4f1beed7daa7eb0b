/* Delayed-scaling update for many tensors in one launch.
 *
 * Each group holds n tensors of one FP8 format: an amax history [history_len, n] (fp32, row 0 is
 * the current step's amax, written there by the quantizing kernels), and scale / scale_inv [n].
 * For every tensor j of every group whose current amax history[0, j] is finite:
 *
 *   amax     = max_l history[l, j]            (algo kNVTEAmaxMax)
 *            = history[0, j]                   (algo kNVTEAmaxMostRecent)
 *   history  = roll(history, -1 along l);  history[0, j] = 0
 *   s        = (fp8_max / amax) / 2^margin
 *   scale[j] = s if amax > 0, amax finite and s finite, else scale[j] unchanged
 *   scale_inv[j] = 1 / scale[j]
 *
 * A non-finite history[0, j] (NaN or +-inf: a step that overflowed) never enters the history:
 * the history is not rolled, history[0, j] = 0, scale[j] and scale_inv[j] keep the last finite
 * update's values, and skipped[j] (when the group's skipped pointer is not null) grows by one.
 *
 * Groups are passed as a host array; the kernel arguments carry their pointers, so no host
 * synchronisation or device allocation happens and the call is safe under graph capture.
 *
 * Current scaling of n tensors (1..4, float32/float16/bfloat16, any shapes) of one FP8 format in
 * one launch (nvte_current_scaling_scales): for each i
 *
 *   amax         = max |inputs[i]|                 (NaN propagates)
 *   s            = fp8_max / amax
 *   scale[i]     = s if amax > 0, amax finite and s finite, else scale[i] unchanged
 *   scale_inv[i] = 1 / scale[i]
 *   skipped[i]  += 1 if amax is NaN or +-inf      (skipped: int32 [n], or NULL: not counted)
 *
 * exactly as nvte_delayed_scaling_update sets and counts them for a one-row history holding that
 * amax with margin 0 (same bits as nvte_compute_amax into amax[i] followed by that update): a
 * bad step keeps the last finite scale and is counted; an amax of 0 keeps the scale uncounted.
 * amax [n] fp32 and counter (one int32) are scratch that must be zero on entry and are left
 * zero; launches that share them must not run concurrently.
 */
#ifndef TRANSFORMER_ENGINE_RECIPE_H_
#define TRANSFORMER_ENGINE_RECIPE_H_

#include "transformer_engine/transformer_engine.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum { kNVTEAmaxMax = 0, kNVTEAmaxMostRecent = 1 } NVTEAmaxAlgo;

typedef struct {
  float* amax_history; /* [history_len, num_tensors] */
  float* scale;        /* [num_tensors] */
  float* scale_inv;    /* [num_tensors] */
  int64_t history_len;
  int64_t num_tensors;
  float fp8_max;       /* largest finite value of the group's format on this device */
  int32_t* skipped;    /* [num_tensors] updates skipped for a non-finite amax, or NULL (last, so
                          a 6-value initializer leaves it NULL) */
} NVTEScalingGroup;

NVTEStatus nvte_delayed_scaling_update(const NVTEScalingGroup* groups, int64_t num_groups,
                                       NVTEAmaxAlgo algo, float margin, NVTEStream stream);

NVTEStatus nvte_current_scaling_scales(const NVTETensor* const* inputs, int64_t n, float* amax,
                                       int* counter, float* scale, float* scale_inv, int* skipped,
                                       float fp8_max, NVTEStream stream);

#ifdef __cplusplus
}
#endif

#endif /* TRANSFORMER_ENGINE_RECIPE_H_ */
