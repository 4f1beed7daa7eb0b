/* Fused scaled dot-product attention, forward and backward, behind one backend enum.
 *
 *   out = softmax(softmax_scale * q k^T + mask) v        per batch, query head and sequence
 *   lse = log(sum_j exp(softmax_scale * q.k_j))          over the visible keys (natural log)
 *
 * ---- Backends --------------------------------------------------------------------------------
 *   kNVTEAttnBackendCudnn     cuDNN's fused flash attention (graph API). NVIDIA builds only, and
 *                             only when cuDNN and its frontend headers were found at build time;
 *                             otherwise every call returns kNVTEUnsupported saying why.
 *   kNVTEAttnBackendPortable  the portable tiled online-softmax kernels of csrc/common/attention
 *                             (one source, hipified for AMD): the AMD backend and the NVIDIA
 *                             fallback. float16/bfloat16, head dims 64 and 128 (q, k, v equal).
 *                             Products on the tensor cores where util/arch.h maps them
 *                             (NVIDIA sm_80+: register-level mma.sync), FMA elsewhere (AMD, for
 *                             now); see nvte_attention_set_portable_variant.
 *
 * ---- Layouts (qkv_format) --------------------------------------------------------------------
 *   BSHD [b, s, h, d];  SBHD [s, b, h, d];  THD [total_tokens, h, d] packed sequences given by
 *   cu_seqlens (int32 [b + 1], cumulative lengths). q, k, v, out, d_out and the gradients share
 *   the layout. Padding masks on BSHD/SBHD take cu_seqlens too: sequence i occupies the first
 *   cu[i+1] - cu[i] positions of its slot. max_seqlen_q/kv are the padded extents (BSHD/SBHD) or
 *   an upper bound of the lengths (THD).
 *   GQA/MQA: num_heads_q is a multiple of num_heads_kv; query head h uses kv head
 *   h / (num_heads_q / num_heads_kv).
 *
 * ---- Masks (per sequence with lengths sq, skv) -----------------------------------------------
 *   off = skv - sq for the bottom-right causal types and for the window of NoMask/Padding,
 *         0 for Causal and PaddingCausal. Query i sees key j when
 *           causal types:         j <= i + off                     (window_right is forced to 0)
 *           window_left  >= 0:    j >= i + off - window_left
 *           window_right >= 0:    j <= i + off + window_right
 *           padding types / THD:  i < sq and j < skv
 *   Arbitrary masks are not supported here (kNVTEUnsupported). A row that sees no key gives a
 *   zero output row and lse = -inf. Rows i >= sq of a padded layout are not written (the caller
 *   zero-fills out and the gradients when it wants zeros there).
 *
 * ---- Tensors ---------------------------------------------------------------------------------
 *   lse: float32 [b, num_heads_q, max_seqlen_q], written by the forward, read by the backward.
 *   Data pointers 16-byte aligned, head dims multiples of 8. The descriptors give the logical
 *   shapes; params.stride_* may say that q/k/v/out are strided views (see NVTEAttnParams).
 *
 * ---- Resources -------------------------------------------------------------------------------
 *   The caller provides workspace of nvte_attention_workspace_size() bytes (256-byte aligned).
 *   No host synchronisation. The cuDNN backend caches its built graphs per configuration and
 *   device (host cost is paid on the first call of a configuration).
 *   Determinism: with params.deterministic set, the portable backward runs three passes without
 *   atomics (bit-reproducible); otherwise, on NVIDIA sm_80+, one pass that sums dQ with fp32
 *   atomics into the workspace (dQ's last bits may vary between runs; the workspace then holds
 *   b * h_q * s_q * d fp32 more). cuDNN is asked for a deterministic algorithm when
 *   params.deterministic is set, and refuses if it has none.
 */
#ifndef TRANSFORMER_ENGINE_ATTENTION_H_
#define TRANSFORMER_ENGINE_ATTENTION_H_

#include <stdbool.h>

#include "transformer_engine/transformer_engine.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum {
  kNVTEAttnBackendCudnn = 1,
  kNVTEAttnBackendPortable = 2
} NVTEAttnBackend;

typedef enum { kNVTEQKVFormatBSHD = 0, kNVTEQKVFormatSBHD = 1, kNVTEQKVFormatTHD = 2 } NVTEQKVFormat;

typedef enum {
  kNVTEAttnMaskNone = 0,
  kNVTEAttnMaskPadding = 1,
  kNVTEAttnMaskCausal = 2,
  kNVTEAttnMaskPaddingCausal = 3,
  kNVTEAttnMaskCausalBottomRight = 4,
  kNVTEAttnMaskPaddingCausalBottomRight = 5,
  kNVTEAttnMaskArbitrary = 6
} NVTEAttnMaskType;

typedef struct {
  int64_t batch;
  int64_t num_heads_q;
  int64_t num_heads_kv;
  int64_t max_seqlen_q;
  int64_t max_seqlen_kv;
  int64_t head_dim_qk;
  int64_t head_dim_v;
  NVTEDType dtype; /* float16 or bfloat16 */
  NVTEQKVFormat qkv_format;
  NVTEAttnMaskType mask_type;
  int64_t window_left;  /* -1: unbounded */
  int64_t window_right; /* -1: unbounded */
  float softmax_scale;
  bool deterministic;
  /* Element strides of q, k, v and out over the layout's leading dims, in its order -- BSHD
   * (b, s, h), SBHD (s, b, h), THD (t, h, unused 0) -- the head dim being contiguous. A tensor
   * whose three entries are 0 (as in a zeroed struct) is dense in the layout. d_out takes out's
   * strides, dq/dk/dv those of q/k/v. Lets the views of one packed projection ([.., h, 3, d],
   * [.., 3 * h * d]) go in without copies and gradients be written into one packed buffer.
   * Non-zero strides are positive multiples of 8; only the cuDNN backend takes non-dense ones. */
  int64_t stride_q[3];
  int64_t stride_k[3];
  int64_t stride_v[3];
  int64_t stride_o[3];
} NVTEAttnParams;

/* Name of a backend ("cudnn", "portable", "invalid"). */
const char* nvte_attention_backend_name(NVTEAttnBackend backend);

/* kNVTESuccess when the backend can run this configuration on `device`; otherwise the status
 * and nvte_last_error_message() say why (kNVTEUnsupported for a valid request it cannot serve,
 * kNVTEInvalidArgument for malformed parameters). Runs nothing on the device. */
NVTEStatus nvte_attention_support(NVTEAttnBackend backend, const NVTEAttnParams* params,
                                  int device);

/* Bytes of workspace the forward (is_backward false) or backward call needs. */
NVTEStatus nvte_attention_workspace_size(NVTEAttnBackend backend, const NVTEAttnParams* params,
                                         bool is_backward, int device, size_t* bytes);

/* cu_seqlens_q / cu_seqlens_kv: NULL unless THD or a padding mask. */
NVTEStatus nvte_attention_forward(NVTEAttnBackend backend, const NVTEAttnParams* params,
                                  const NVTETensor* q, const NVTETensor* k, const NVTETensor* v,
                                  NVTETensor* out, NVTETensor* lse,
                                  const NVTETensor* cu_seqlens_q, const NVTETensor* cu_seqlens_kv,
                                  void* workspace, size_t workspace_size, NVTEStream stream);

NVTEStatus nvte_attention_backward(NVTEAttnBackend backend, const NVTEAttnParams* params,
                                   const NVTETensor* q, const NVTETensor* k, const NVTETensor* v,
                                   const NVTETensor* out, const NVTETensor* d_out,
                                   const NVTETensor* lse, const NVTETensor* cu_seqlens_q,
                                   const NVTETensor* cu_seqlens_kv, NVTETensor* dq,
                                   NVTETensor* dk, NVTETensor* dv, void* workspace,
                                   size_t workspace_size, NVTEStream stream);

/* Which kernels the portable backend uses, process-wide: Auto (the tensor cores where this
 * vendor build maps them -- NVIDIA sm_80+ --, else FMA) or FmaOnly (the FMA kernels every vendor runs;
 * lets NVIDIA test the code path AMD takes). Forward and backward alike. */
typedef enum { kNVTEAttnPortableAuto = 0, kNVTEAttnPortableFmaOnly = 1 } NVTEAttnPortableVariant;
NVTEStatus nvte_attention_set_portable_variant(NVTEAttnPortableVariant variant);

#ifdef __cplusplus
}
#endif

#endif /* TRANSFORMER_ENGINE_ATTENTION_H_ */
