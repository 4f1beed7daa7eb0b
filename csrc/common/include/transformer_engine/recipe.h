/* Delayed-scaling update for many tensors in one launch.
 *
 * Each group holds n tensors of one FP8 format: an amax history [history_len, n] (fp32, row 0 is
 * the current step's amax, written there by the quantizing kernels), and scale / scale_inv [n].
 * For every tensor j of every group:
 *
 *   amax     = max_l history[l, j]            (algo kNVTEAmaxMax)
 *            = history[0, j]                   (algo kNVTEAmaxMostRecent)
 *   history  = roll(history, -1 along l);  history[0, j] = 0
 *   s        = (fp8_max / amax) / 2^margin
 *   scale[j] = s if amax > 0, amax finite and s finite, else scale[j] unchanged
 *   scale_inv[j] = 1 / scale[j]
 *
 * Groups are passed as a host array; the kernel arguments carry their pointers, so no host
 * synchronisation or device allocation happens and the call is safe under graph capture.
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
} NVTEScalingGroup;

NVTEStatus nvte_delayed_scaling_update(const NVTEScalingGroup* groups, int64_t num_groups,
                                       NVTEAmaxAlgo algo, float margin, NVTEStream stream);

#ifdef __cplusplus
}
#endif

#endif /* TRANSFORMER_ENGINE_RECIPE_H_ */
