// Host-side helpers over NVTETensor: element counts, 2-D views and the argument checks every op
// shares, so that error messages read the same everywhere.
#pragma once

#include <string>

#include "transformer_engine/transformer_engine.h"
#include "util/error.h"

namespace te {

inline bool is_fp8(NVTEDType t) { return t == kNVTEFloat8E4M3 || t == kNVTEFloat8E5M2; }
inline bool is_high_precision(NVTEDType t) {
  return t == kNVTEFloat32 || t == kNVTEFloat16 || t == kNVTEBFloat16;
}

std::string shape_str(const NVTETensor& t);

// Checks that the descriptor is well formed; `what` names the argument ("input", "output"). An
// FP8 tensor is refused on a device without FP8 (kNVTEUnsupported), so every FP8 cast and GEMM of
// the C API refuses there, not only the Python layer.
void check_tensor(const NVTETensor* t, const char* what);

// The current device's arch name when it has no FP8 at all (AMD MI200, gfx90a), else null.
// Defined per vendor (csrc/cuda, csrc/hip): NVIDIA converts FP8 in software below sm_89.
const char* fp8_unsupported_arch();

int64_t numel(const NVTETensor& t);

// [prod(shape[:-1]), shape[-1]]; a 0-d tensor is [1, 1], a 1-d one [1, n].
void as_2d(const NVTETensor& t, int64_t* rows, int64_t* cols);

void check_dtype_in(const NVTETensor& t, const char* what, bool ok, const char* expected);

void check_fp8_scaling(const NVTETensor& t, const char* what, bool need_scale);

inline bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }

}  // namespace te
