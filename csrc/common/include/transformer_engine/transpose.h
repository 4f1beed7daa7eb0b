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
 * cast_transpose_multi does the cast_transpose of n (1..4) tensors in one launch, with the same
 * bits as n separate calls (a step's input and weight: on a small step the launch costs more host
 * time than the kernel); the inputs share one high-precision dtype, the outputs one FP8 dtype,
 * and each output has its own scale, scale_inv and amax. Arguments are checked as for n calls.
 * cast_transpose_multi_current_scaling computes the scales first (Float8CurrentScaling, as
 * nvte_current_scaling_scales in recipe.h computes them into scale[i] / scale_inv[i], with amax
 * and counter as its zeroed scratch, and counts a non-finite amax into skipped[i] unless skipped
 * is NULL), then casts each input with its scale: outputs[i].scale must be scale + i and
 * outputs[i].amax NULL. One launch when the grid fits on the device at
 * once (a cooperative launch), two otherwise; the same bits either way.
 *
 * Fusions of cast_transpose (one read of each input; FP8 outputs only; `output` may have any
 * shape with rows * cols elements, `output_t` is [cols, rows]; q, amax and scale_inv as above,
 * amax taken over the unscaled fp32 values v that are quantized):
 *
 *   cast_transpose_dbias:  v = in;  dbias[c] = sum_r in[r, c]
 *   act_cast_transpose:    v = act(in)                       in [rows, cols]
 *   gated_act_cast_transpose:
 *                          v = act(a) * b,  a = in[r, c], b = in[r, N + c]
 *                                                            in [rows, 2N], v [rows, N]
 *   dact_dbias_cast_transpose:
 *                          v = grad * act'(act_input)        grad, act_input [rows, cols]
 *   dgated_act_dbias_cast_transpose:
 *                          v[r, c] = grad[r, c] * b * act'(a),  v[r, N + c] = grad[r, c] * act(a)
 *                                                            grad [rows, N], act_input [rows, 2N]
 *   and for the dbias forms dbias[c] = sum_r v[r, c] ([cols]; [2N] for the gated form).
 *
 * Activations are those of activation.h (same formulas, computed the same way: a fused result
 * is bit-identical to nvte_activation / nvte_dactivation with an FP8 output followed by a
 * transpose). Inputs are float32, float16 or bfloat16 (grad in act_input's dtype); dbias is
 * float32, float16 or bfloat16, summed in fp32 from the unrounded v. The dbias column sums go
 * through a caller-provided fp32 workspace, with the protocol of nvte_dbias_dactivation: call
 * once with a zeroed workspace descriptor (data NULL, ndim 0) to get its shape and dtype written
 * into it (nothing runs), allocate it, call again. In the two backward forms dbias may be NULL
 * (no bias gradient; workspace is then ignored and may be NULL). Empty tensors are accepted.
 *
 * cast_transpose_dbias with the scaling of a training step folded in (a small step's backward
 * is host-bound: each fused launch saves one), same bits as the separate calls:
 *   _current_scaling: output's scale computed first from amax(input), as
 *       nvte_current_scaling_scales (recipe.h) computes and counts it (n = 1; output->scale must
 *       be `scale`, output->amax NULL; skipped: one int32 or NULL); one launch where the grid
 *       fits on the device at once, else two;
 *   _update: then nvte_delayed_scaling_update(groups, num_groups, algo, margin), run by the
 *       kernel's last block for up to 4 groups (counter: one int32, zero on entry and left
 *       zero), as a launch of its own otherwise. The groups may include output's own amax
 *       history: the update sees the amax this cast records.
 */
#ifndef TRANSFORMER_ENGINE_TRANSPOSE_H_
#define TRANSFORMER_ENGINE_TRANSPOSE_H_

#include "transformer_engine/activation.h"
#include "transformer_engine/recipe.h"
#include "transformer_engine/transformer_engine.h"

#ifdef __cplusplus
extern "C" {
#endif

NVTEStatus nvte_transpose(const NVTETensor* input, NVTETensor* output, NVTEStream stream);

NVTEStatus nvte_cast_transpose(const NVTETensor* input, NVTETensor* output,
                               NVTETensor* output_t, NVTEStream stream);

/* nvte_cast_transpose on rows [row_begin, row_end) of input (its 2-D view) only: those rows of
 * output and those columns of output_t, with output's scale, amax and scale_inv as the whole
 * cast's. Casting a tensor band by band gives the whole cast's bytes; each band is a smaller
 * launch, which work on other streams can get in between. */
NVTEStatus nvte_cast_transpose_rows(const NVTETensor* input, NVTETensor* output,
                                    NVTETensor* output_t, int64_t row_begin, int64_t row_end,
                                    NVTEStream stream);

NVTEStatus nvte_cast_transpose_multi(int64_t n, const NVTETensor* const* inputs,
                                     NVTETensor* const* outputs, NVTETensor* const* outputs_t,
                                     NVTEStream stream);

NVTEStatus nvte_cast_transpose_multi_current_scaling(
    int64_t n, const NVTETensor* const* inputs, NVTETensor* const* outputs,
    NVTETensor* const* outputs_t, float* amax, int* counter, float* scale, float* scale_inv,
    int* skipped, float fp8_max, NVTEStream stream);

NVTEStatus nvte_cast_transpose_dbias(const NVTETensor* input, NVTETensor* output,
                                     NVTETensor* output_t, NVTETensor* dbias,
                                     NVTETensor* workspace, NVTEStream stream);

NVTEStatus nvte_cast_transpose_dbias_current_scaling(
    const NVTETensor* input, NVTETensor* output, NVTETensor* output_t, NVTETensor* dbias,
    NVTETensor* workspace, float* amax, int* counter, float* scale, float* scale_inv,
    int* skipped, float fp8_max, NVTEStream stream);

NVTEStatus nvte_cast_transpose_dbias_update(
    const NVTETensor* input, NVTETensor* output, NVTETensor* output_t, NVTETensor* dbias,
    NVTETensor* workspace, const NVTEScalingGroup* groups, int64_t num_groups, NVTEAmaxAlgo algo,
    float margin, int* counter, NVTEStream stream);

NVTEStatus nvte_act_cast_transpose(NVTEActivation act, const NVTETensor* input,
                                   NVTETensor* output, NVTETensor* output_t, NVTEStream stream);

NVTEStatus nvte_gated_act_cast_transpose(NVTEActivation act, const NVTETensor* input,
                                         NVTETensor* output, NVTETensor* output_t,
                                         NVTEStream stream);

NVTEStatus nvte_dact_dbias_cast_transpose(NVTEActivation act, const NVTETensor* grad,
                                          const NVTETensor* act_input, NVTETensor* output,
                                          NVTETensor* output_t, NVTETensor* dbias,
                                          NVTETensor* workspace, NVTEStream stream);

NVTEStatus nvte_dgated_act_dbias_cast_transpose(NVTEActivation act, const NVTETensor* grad,
                                                const NVTETensor* act_input, NVTETensor* output,
                                                NVTETensor* output_t, NVTETensor* dbias,
                                                NVTETensor* workspace, NVTEStream stream);

#ifdef __cplusplus
}
#endif

#endif /* TRANSFORMER_ENGINE_TRANSPOSE_H_ */
