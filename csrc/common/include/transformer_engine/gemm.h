/* Dense GEMM with FP8 scaling and fused epilogues, one implementation on every vendor (cuBLASLt
 * on NVIDIA; hipBLASLt or rocBLAS on AMD, chosen by NVTE_USE_HIPBLASLT at call time). Two entry
 * points: nvte_gemm_with_c reads the addend C from its own buffer; nvte_gemm is the same call
 * with C = D.
 *
 * ---- Convention: the column-major (BLAS) view ----------------------------------------------
 * Every tensor is a dense row-major array viewed as 2-D, [rows, cols] = [prod(shape[:-1]),
 * shape[-1]]. Read in column-major order, that same memory is the cols x rows matrix, which is
 * what the BLAS libraries see. In that view nvte_gemm_with_c computes
 *
 *     D (m x n)  =  epilogue( alpha * op(A) * op(B)  +  beta * C )
 *
 * with op(X) = X^T when transX is true, and
 *     A: transa ? k x m : m x k      (row-major A has shape [m, k] when transa, else [k, m])
 *     B: transb ? n x k : k x n      (row-major B has shape [k, n] when transb, else [n, k])
 *     D: m x n                       (row-major D has shape [n, m])
 *     C: m x n, like D               (nvte_gemm: C is D)
 *
 * ---- The same thing in row-major (PyTorch) terms ---------------------------------------------
 *     D[n, m] = op_b(B) @ op_a(A) (+ beta C[n, m]),
 *     op_a(A) = A^T if transa else A,  op_b(B) = B^T if transb else B
 * Layout names give (transa, transb): "TN", "NN", "NT". For a Linear layer with weight W [out, in]
 * and input X [tokens, in]:
 *     fprop  Y  = X @ W^T   :  A = W,  B = X,  TN   -> D [tokens, out]
 *     dgrad  dX = dY @ W    :  A = W,  B = dY, NN   -> D [tokens, in]
 *     wgrad  dW = dY^T @ X  :  A = X,  B = dY, NT   -> D [out, in]
 * So m is D's last dimension (output features), n is its row count (tokens) and k the reduction.
 *
 * ---- Types -----------------------------------------------------------------------------------
 *   A, B float32 / float16 / bfloat16 (both the same): D is that dtype or float32.
 *   A, B FP8 (E4M3 x E4M3, E4M3 x E5M2, E5M2 x E4M3; E5M2 x E5M2 is refused): each operand's
 *     scale_inv[0] dequantises it (value = stored * scale_inv[0]); D is float32, bfloat16, float16,
 *     E4M3 or E5M2. An FP8 D is written as saturate(result * D.scale[0]); D.amax[0] receives
 *     max(D.amax[0], max|result|) (result before D.scale, as nvte_quantize does) and D.scale_inv,
 *     when given, 1 / D.scale[0]. All on the device. scale/amax/scale_inv of a high-precision D and
 *     the scale_inv of high-precision operands are ignored.
 *   FP8 needs m, n and k to be multiples of 16 and 16-byte aligned data (kNVTEInvalidArgument
 *     otherwise). cuBLASLt before Blackwell (sm_89, sm_90) multiplies FP8 only in the TN layout
 *     (transa && !transb); other layouts return kNVTEUnsupported: make the transposed copy with
 *     nvte_cast_transpose instead. rocBLAS has no FP8 (kNVTEUnsupported: use hipBLASLt).
 *   use_fast_accum: FP8 only. Accumulates in the tensor cores' reduced precision (faster; the
 *     default of forward GEMMs); pass false for wgrad. Libraries without the option ignore it.
 *
 * ---- Epilogues (r = alpha * op(A) op(B) + beta * C, in fp32 before rounding) ------------------
 *   None            D = r
 *   Bias            D = r + bias                     bias [m]
 *   GeluAux         aux = r;         D = gelu(r)     aux has D's shape
 *   BiasGeluAux     aux = r + bias;  D = gelu(aux)   (LayerNormMLP fc1 forward)
 *   DGelu           D = r * gelu'(aux)               aux is the saved pre-activation (input)
 *   DGeluBGrad      D = r * gelu'(aux);  bias = sum over the n rows of D   (bias is written)
 *   BGradB          D = r;  bias[j] = sum over k of op(B)[k, j]            (bias [n] is written)
 *                   The bias gradient of a Linear layer's wgrad (layout NT, B = dY: bias = the
 *                   column sums of dY, unscaled by alpha) in the same pass as dW. Needs transb
 *                   and high-precision operands (an FP8 dY gets its bias gradient from
 *                   nvte_cast_transpose_dbias); kNVTEUnsupported otherwise.
 * gelu is the tanh approximation 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))).
 * bias has D's dtype (bfloat16 or float16 when D is FP8) and m elements (n for BGradB). aux has
 * D's dtype (float16 or bfloat16 when D is FP8), same row-major shape as D. Unused bias/aux
 * pointers may be NULL.
 *
 * C is part of r, so it is added before the bias and the activation (as cuBLASLt defines its
 * epilogues), on every library: with a distinct C, Bias gives D = alpha op(A) op(B) + beta C + bias
 * (a Linear layer's output with its residual added: C = the residual, beta = 1) and BiasGeluAux
 * D = gelu(alpha op(A) op(B) + beta C + bias).
 *
 * ---- Accumulation and the addend C -----------------------------------------------------------
 *   nvte_gemm: beta != 0 reads D (beta = 1: accumulate into an existing buffer, e.g. fp32
 *   main_grad). D must then be high precision. beta == 0 never reads D, so it may hold garbage.
 *   nvte_gemm_with_c: C NULL or C->data == D->data is nvte_gemm (the rules above). A distinct C
 *   has D's shape (as 2-D) and dtype, needs a high-precision D (an FP8 D with a distinct C is
 *   kNVTEInvalidArgument, whatever beta), must not overlap D or a GELU aux output, and is 16-byte
 *   aligned for FP8 operands like A, B and D. Any beta is allowed; beta == 0 never reads C. C is
 *   only read, so a call can be repeated with the same result (D = residual + X W^T leaves the
 *   residual as it was).
 *
 * ---- Resources -------------------------------------------------------------------------------
 *   workspace: device memory of nvte_gemm_workspace_size() bytes (256-byte aligned), owned by the
 *   caller and reusable by every GEMM on the stream. A smaller one still works but lets the
 *   library choose only algorithms that fit (and at least 256 bytes are needed for an FP8 D).
 *   No host synchronisation; safe under stream capture. Empty problems (m or n = 0) launch nothing
 *   except zeroing a bias gradient; k = 0 gives D = epilogue(beta * C).
 */
#ifndef TRANSFORMER_ENGINE_GEMM_H_
#define TRANSFORMER_ENGINE_GEMM_H_

#include <stdbool.h>

#include "transformer_engine/transformer_engine.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum {
  kNVTEGemmEpilogueNone = 0,
  kNVTEGemmEpilogueBias = 1,
  kNVTEGemmEpilogueGeluAux = 2,
  kNVTEGemmEpilogueBiasGeluAux = 3,
  kNVTEGemmEpilogueDGelu = 4,
  kNVTEGemmEpilogueDGeluBGrad = 5,
  kNVTEGemmEpilogueBGradB = 6,
  kNVTENumGemmEpilogues = 7
} NVTEGemmEpilogue;

/* See the top of this file. bias and aux may be NULL when the epilogue does not use them;
 * bias is an output for DGeluBGrad and BGradB, aux an output for the Gelu epilogues and an input
 * for DGelu. */
NVTEStatus nvte_gemm(const NVTETensor* A, bool transa, const NVTETensor* B, bool transb,
                     NVTETensor* D, NVTETensor* bias, NVTETensor* aux, NVTEGemmEpilogue epilogue,
                     float alpha, float beta, bool use_fast_accum, void* workspace,
                     size_t workspace_size, NVTEStream stream);

/* nvte_gemm with the addend C read from its own buffer: D = epilogue(alpha op(A) op(B) + beta C)
 * (see "Accumulation and the addend C" above). C may be NULL (C is D: exactly nvte_gemm). Error
 * messages name nvte_gemm_with_c. */
NVTEStatus nvte_gemm_with_c(const NVTETensor* A, bool transa, const NVTETensor* B, bool transb,
                            const NVTETensor* C, NVTETensor* D, NVTETensor* bias, NVTETensor* aux,
                            NVTEGemmEpilogue epilogue, float alpha, float beta,
                            bool use_fast_accum, void* workspace, size_t workspace_size,
                            NVTEStream stream);

/* ---- Block-scaled FP8 (the Float8BlockScaling recipe) ------------------------------------------
 * How an FP8 operand's scale_inv pointer is read:
 *   Tensor:     one float, the whole operand (what nvte_gemm does)
 *   Block1x128: one float per 128 consecutive elements along k (nvte_quantize_blockwise,
 *               block_dim 1: [ceil(k / 128), round_up(rows, 4)] for a row-major [rows, k] operand)
 *   Block128x128: one float per 128x128 tile (block_dim 2: [ceil(rows / 128),
 *               round_up(ceil(k / 128), 4)])
 * nvte_gemm_block_scaled computes D = op(A) op(B) in the TN layout only (transa, !transb: both
 * operands row-major with k innermost), E4M3/E5M2 operands (not both E5M2, not both 128x128),
 * D float32, bfloat16 or float16, no addend, bias optional (Bias epilogue: D += bias [m]),
 * split (precise) accumulation always. Served by cuBLASLt >= 12.9 on sm_90 (Hopper); elsewhere
 * kNVTEUnsupported with the reason (hipBLASLt and rocBLAS: not supported). m, n, k multiples of
 * 16 and 16-byte aligned data. */
typedef enum {
  kNVTEGemmScaleTensor = 0,
  kNVTEGemmScaleBlock1x128 = 1,
  kNVTEGemmScaleBlock128x128 = 2
} NVTEGemmScaleMode;

NVTEStatus nvte_gemm_block_scaled(const NVTETensor* A, NVTEGemmScaleMode a_scale_mode,
                                  const NVTETensor* B, NVTEGemmScaleMode b_scale_mode,
                                  NVTETensor* D, const NVTETensor* bias, void* workspace,
                                  size_t workspace_size, NVTEStream stream);

/* Bytes of workspace nvte_gemm can use (the same for every problem, so one buffer per device
 * serves all calls). */
size_t nvte_gemm_workspace_size(void);

#ifdef __cplusplus
}
#endif

#endif /* TRANSFORMER_ENGINE_GEMM_H_ */
