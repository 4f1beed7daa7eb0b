/* Elementwise activations, their gated forms, backward passes and the fused dbias + dact.
 *
 * Activations act(x), computed in fp32 whatever the storage dtype:
 *   kNVTEGelu    0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))     (tanh approximation)
 *   kNVTERelu    max(x, 0)
 *   kNVTEQGelu   x sigmoid(1.702 x)                                    ("quick" gelu)
 *   kNVTESRelu   max(x, 0)^2                                           (squared relu)
 *   kNVTESilu    x sigmoid(x)                                          (swish)
 *   kNVTESigmoid sigmoid(x) = 1 / (1 + exp(-x))                        (its gated form: glu)
 *
 * Plain forms (input and output of one shape):
 *   activation:    y = act(x)
 *   dactivation:   dx = dy * act'(x)                   (x: the forward's input, not its output)
 *
 * Gated forms (geglu = gelu, reglu = relu, qgeglu = qgelu, sreglu = srelu, swiglu = silu,
 * glu = sigmoid).
 * The input's last dimension holds 2N values: the FIRST half a = x[..., :N] goes through the
 * activation, the SECOND half b = x[..., N:] is the linear gate. The output is [..., N]:
 *   gated_activation:    y = act(a) * b
 *   dgated_activation:   dx[..., :N] = dy * b * act'(a),   dx[..., N:] = dy * act(a)
 * with dy [..., N] and dx [..., 2N].
 *
 * Fused bias-gradient backward (plain forms only), over the 2-D view [rows, cols]:
 *   dbias_dactivation:   dx = dy * act'(x),   dbias[c] = sum_r dx[r, c]
 * dbias is summed in fp32 from the unrounded dx and stored in dbias's dtype. The column sums are
 * reduced in two stages through a caller-provided workspace: call once with a zeroed workspace
 * descriptor (data NULL, ndim 0) to get its shape and dtype written into it (nothing runs),
 * allocate it, call again (an empty workspace, e.g. [0, cols] when rows == 0, may stay NULL).
 *
 * FP8 outputs. y (forward) and dx (backward) may be float8_e4m3 / float8_e5m2: the fp32 result v
 * is then stored as saturate_fp8(v * scale[0]), scale_inv[0] = 1 / scale[0] and
 * amax[0] = max(amax[0], max|v|), exactly as nvte_quantize does to an fp32 tensor holding v.
 * Otherwise the output dtype must equal the input's (dy and x always share one dtype).
 * Inputs are float32, float16 or bfloat16; tensors with more dims are viewed as
 * [prod(leading), last]; empty tensors are accepted (an FP8 output still gets its scale_inv).
 *
 * Plain bias gradient (no activation), of a 2-D grad [rows, cols]:
 *   dbias:   dbias[c] = sum_r grad[r, c]
 * summed in fp32 in a fixed order (the same bits on every call) and stored in dbias's dtype;
 * rows == 0 gives zeros. Same workspace protocol as dbias_dactivation; the query reports
 * [0, cols] when no workspace is needed (few rows), and the call then accepts a NULL one.
 */
#ifndef TRANSFORMER_ENGINE_ACTIVATION_H_
#define TRANSFORMER_ENGINE_ACTIVATION_H_

#include "transformer_engine/transformer_engine.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum {
  kNVTEGelu = 0,
  kNVTERelu = 1,
  kNVTEQGelu = 2,
  kNVTESRelu = 3,
  kNVTESilu = 4,
  kNVTESigmoid = 5,
  kNVTENumActivations = 6
} NVTEActivation;

/* Name of an activation ("gelu", ...); "invalid" for out-of-range values. */
const char* nvte_activation_name(NVTEActivation act);

NVTEStatus nvte_activation(NVTEActivation act, const NVTETensor* input, NVTETensor* output,
                           NVTEStream stream);

NVTEStatus nvte_dactivation(NVTEActivation act, const NVTETensor* grad, const NVTETensor* input,
                            NVTETensor* output, NVTEStream stream);

NVTEStatus nvte_gated_activation(NVTEActivation act, const NVTETensor* input, NVTETensor* output,
                                 NVTEStream stream);

NVTEStatus nvte_dgated_activation(NVTEActivation act, const NVTETensor* grad,
                                  const NVTETensor* input, NVTETensor* output, NVTEStream stream);

/* output: dx; dbias: [cols] in float32, float16 or bfloat16; workspace: see above. */
NVTEStatus nvte_dbias_dactivation(NVTEActivation act, const NVTETensor* grad,
                                  const NVTETensor* input, NVTETensor* output, NVTETensor* dbias,
                                  NVTETensor* workspace, NVTEStream stream);

/* grad: exactly 2-D [rows, cols], float32, float16 or bfloat16; dbias: cols elements in float32,
 * float16 or bfloat16; workspace: see above. */
NVTEStatus nvte_dbias(const NVTETensor* grad, NVTETensor* dbias, NVTETensor* workspace,
                      NVTEStream stream);

/* Named entry points of Transformer Engine's API, each the generic call with its activation. */
#define NVTE_DECLARE_ACTIVATION_(name, gated_name)                                              \
  NVTEStatus nvte_##name(const NVTETensor* input, NVTETensor* output, NVTEStream stream);      \
  NVTEStatus nvte_d##name(const NVTETensor* grad, const NVTETensor* input, NVTETensor* output, \
                          NVTEStream stream);                                                   \
  NVTEStatus nvte_##gated_name(const NVTETensor* input, NVTETensor* output, NVTEStream stream); \
  NVTEStatus nvte_d##gated_name(const NVTETensor* grad, const NVTETensor* input,              \
                                NVTETensor* output, NVTEStream stream);                         \
  NVTEStatus nvte_dbias_d##name(const NVTETensor* grad, const NVTETensor* input,              \
                                NVTETensor* output, NVTETensor* dbias, NVTETensor* workspace,   \
                                NVTEStream stream);
NVTE_DECLARE_ACTIVATION_(gelu, geglu)
NVTE_DECLARE_ACTIVATION_(relu, reglu)
NVTE_DECLARE_ACTIVATION_(qgelu, qgeglu)
NVTE_DECLARE_ACTIVATION_(srelu, sreglu)
NVTE_DECLARE_ACTIVATION_(silu, swiglu)
NVTE_DECLARE_ACTIVATION_(sigmoid, glu)
#undef NVTE_DECLARE_ACTIVATION_

/* Clamped SwiGLU (the gated activation of gpt-oss), with parameters limit (finite, > 0) and
 * alpha (finite). The input's last dimension holds 2N values, a = x[..., :N], b = x[..., N:]:
 *   a' = min(a, limit),   b' = clamp(b, -limit, limit)
 *   clamped_swiglu:   y = a' sigmoid(alpha a') (b' + 1)                          ([..., N])
 *   clamped_dswiglu:  dx[..., :N] = dy (b' + 1) (s + alpha a s (1 - s))  where a <= limit, else 0
 *                     dx[..., N:] = dy a' sigmoid(alpha a')        where -limit <= b <= limit, else 0
 *                     (s = sigmoid(alpha a); dy [..., N], dx [..., 2N])
 * The clamps pass the gradient where their input lies in the closed range. Dtypes and FP8
 * outputs as for the gated forms above; no dbias form. */
NVTEStatus nvte_clamped_swiglu(const NVTETensor* input, NVTETensor* output, float limit,
                               float alpha, NVTEStream stream);
NVTEStatus nvte_clamped_dswiglu(const NVTETensor* grad, const NVTETensor* input,
                                NVTETensor* output, float limit, float alpha, NVTEStream stream);

#ifdef __cplusplus
}
#endif

#endif /* TRANSFORMER_ENGINE_ACTIVATION_H_ */
