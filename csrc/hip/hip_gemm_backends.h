// The two ROCm GEMM libraries behind the vendor interface of csrc/common/gemm/gemm_backend.h.
// Both are compiled into every ROCm build; gemm_select.cpp picks one per call from
// NVTE_USE_HIPBLASLT (value 1: hipBLASLt, 0: rocBLAS, unset: the build-time default).
#pragma once

#include "gemm/gemm_backend.h"

namespace te {
namespace gemm {

void hipblaslt_check(const GemmArgs& args);
void hipblaslt_run(const GemmArgs& args);

void rocblas_check(const GemmArgs& args);
void rocblas_run(const GemmArgs& args);

// hipBLASLt (true) or rocBLAS (false) for a call made now.
bool use_hipblaslt_now();

}  // namespace gemm
}  // namespace te
