// The interface behind nvte_attention_*: attention.cpp validates a request into AttnArgs and
// hands it to the portable kernels (portable_*.cu) or to the vendor's fused backend, which each
// vendor build implements once (csrc/cuda: cuDNN; csrc/hip: none yet, reports "unsupported").
//
// Vendor-neutral on purpose: the ROCm build hipifies csrc/common and csrc/hip includes this file
// from the hipified tree under the same name.
#pragma once

#include <stddef.h>
#include <stdint.h>

#include <string>

#include "transformer_engine/attention.h"

namespace te {
namespace attention {

// Element strides of one tensor over its layout's leading dims, in the layout's order:
// BSHD (b, s, h), SBHD (s, b, h), THD (t, h, 0); the head dim is contiguous.
struct LayoutStrides {
  int64_t v[3] = {0, 0, 0};
  bool operator==(const LayoutStrides& o) const {
    return v[0] == o.v[0] && v[1] == o.v[1] && v[2] == o.v[2];
  }
};

// A validated call. Strides are in elements: the resolved ones of params.stride_* (dense in the
// layout where params left them zero); d_out uses out's, dq/dk/dv those of q/k/v.
struct AttnArgs {
  NVTEAttnParams p{};
  LayoutStrides stride_q, stride_k, stride_v, stride_o;
  bool dense = true;              // every stride is the dense one of the layout
  bool bottom_right = false;      // diagonal offset skv - sq (see attention.h)
  bool uses_lengths = false;      // THD or padding: per-sequence lengths from cu_seqlens
  int64_t window_left = -1, window_right = -1;  // effective (causal forces right = 0)
  const void* q = nullptr;
  const void* k = nullptr;
  const void* v = nullptr;
  void* o = nullptr;
  const void* d_o = nullptr;
  float* lse = nullptr;
  const int32_t* cu_q = nullptr;
  const int32_t* cu_kv = nullptr;
  void* dq = nullptr;
  void* dk = nullptr;
  void* dv = nullptr;
  void* workspace = nullptr;
  size_t workspace_size = 0;
  NVTEStream stream = nullptr;
};

inline bool mask_is_causal(NVTEAttnMaskType m) {
  return m == kNVTEAttnMaskCausal || m == kNVTEAttnMaskPaddingCausal ||
         m == kNVTEAttnMaskCausalBottomRight || m == kNVTEAttnMaskPaddingCausalBottomRight;
}
inline bool mask_is_padding(NVTEAttnMaskType m) {
  return m == kNVTEAttnMaskPadding || m == kNVTEAttnMaskPaddingCausal ||
         m == kNVTEAttnMaskPaddingCausalBottomRight;
}
inline bool mask_is_bottom_right(NVTEAttnMaskType m) {
  return m == kNVTEAttnMaskCausalBottomRight || m == kNVTEAttnMaskPaddingCausalBottomRight;
}

// ---- portable kernels (csrc/common/attention/portable_*.cu) ---------------------------------
// Throws kNVTEUnsupported for what the portable kernel cannot run.
void portable_check(const NVTEAttnParams& p);
size_t portable_workspace_size(const NVTEAttnParams& p, bool is_backward);
void portable_forward(const AttnArgs& a);
void portable_backward(const AttnArgs& a);

// ---- the vendor's fused backend (one implementation per vendor build) -----------------------
// Throws kNVTEUnsupported ("not built: ...", "... is NVIDIA-only", or the library's refusal).
void vendor_check(const AttnArgs& a, int device);
size_t vendor_workspace_size(const AttnArgs& a, bool is_backward, int device);
void vendor_forward(const AttnArgs& a);
void vendor_backward(const AttnArgs& a);

}  // namespace attention
}  // namespace te
