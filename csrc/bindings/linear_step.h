// The parameters of one FP8 Linear step (y = x W^T + b and its gradients) on the modules' eager
// path: everything that stays the same from call to call of a (module, token count, recipe,
// dtype) problem, built once (make_linear_fp8_params) and kept by the caller in a LinearFp8Plan
// (linear_step.cpp). A call then passes only the addresses that change per call.
//
// The step's FP8 operands live in three byte arenas the caller allocates with the sizes below;
// the layout is decided here, where the kernels use it:
//   kept             what the backward reads: [x scale_inv | W scale_inv | x^T | W^T]
//   forward scratch  the FP8 data of x and W, read by the forward GEMM only
//   backward scratch dy's FP8 data and transpose, its scale_inv, the bias-gradient workspace
// Every region, a 4-byte scale_inv too, starts on a 256-byte boundary: cuBLASLt refuses FP8 GEMMs
// whose scale pointers are only 4-byte aligned (CUBLAS_STATUS_NOT_SUPPORTED), the vectorised
// kernels want 16 bytes.
#pragma once

#include <cstddef>
#include <cstdint>

#include "transformer_engine/transformer_engine.h"

namespace te_py {

constexpr size_t kRegionAlign = 256;

inline size_t aligned_bytes(size_t n) { return (n + kRegionAlign - 1) & ~(kRegionAlign - 1); }

// One region of an arena: a [rows, cols] matrix (cols 0: a vector of rows elements).
struct Region {
  size_t offset = 0;  // bytes from the arena's start
  int64_t rows = 0, cols = 0;
  NVTEDType dtype = kNVTEFloat32;
  bool used = false;
};

// The FP8 scaling of one direction of a module: its amax history [history_len, slots] (row 0 is
// where the casts record), scale and scale_inv [slots] (fp32 device pointers), the format's max;
// current scaling: an int32 counter (zero between launches) for nvte_current_scaling_scales and
// the int32 [slots] counts of updates skipped for a non-finite amax (0: not counted).
struct Scaling {
  uintptr_t history = 0, scale = 0, scale_inv = 0, counter = 0, skipped = 0;
  float fp8_max = 0.0f;
  bool delayed = true;
  float* amax_of(int slot) const {  // delayed scaling records the amax; current scaling does not
    return delayed ? reinterpret_cast<float*>(history) + slot : nullptr;
  }
  uintptr_t scale_of(int slot) const { return scale + 4 * static_cast<uintptr_t>(slot); }
  int* skipped_ptr() const { return reinterpret_cast<int*>(skipped); }  // slots from 0
};

struct LinearFp8Params {
  // x [tokens, in], W [out, in], y [tokens, out]
  int64_t tokens = 0, in_features = 0, out_features = 0;
  // dtype: x, y, dy, dx and the forward bias; w_dtype: the high-precision W cast in the forward
  // (fresh_w); wq_dtype: W's FP8 data; fp8_fwd / fp8_bwd: the recipe's formats; dbias_dtype: the
  // bias gradient that the backward's cast of dy sums (dbias_in_cast)
  NVTEDType dtype, w_dtype, wq_dtype, fp8_fwd, fp8_bwd, dbias_dtype;
  bool fresh_w = false;  // W is cast by the forward (else its FP8 data comes with each call)
  bool need_dgrad = false, need_wgrad = false;
  bool dbias_in_cast = false;
  Scaling fwd, bwd;  // forward slots: x 0, W 1; backward slot: dy 0
  int64_t dbias_ws_elems = 0;  // fp32 elements of the column-sum workspace (nvte size query)
  Region x_sinv, w_sinv, x_t, w_t;     // kept
  Region xq, wq;                       // forward scratch
  Region dyq, dyq_t, dy_sinv, dbias_ws;  // backward scratch
  size_t kept_bytes = 0, forward_scratch_bytes = 0, backward_scratch_bytes = 0;
};

// The layout and the workspace size of a step (the shapes, dtypes, flags and scalings set);
// throws a Python ValueError (pybind11) naming LinearFp8Plan on arguments it cannot serve.
void lay_out_linear_fp8(LinearFp8Params& p);

}  // namespace te_py
