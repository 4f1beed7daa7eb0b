// ROCm side of transformer_engine/gemm_library.h: the GEMM library chosen at install time.
// NVTE_DEFAULT_HIPBLASLT comes from CMake (build_tools passes NVTE_USE_HIPBLASLT of the install).
#include "transformer_engine/gemm_library.h"

#ifndef NVTE_DEFAULT_HIPBLASLT
#define NVTE_DEFAULT_HIPBLASLT 1
#endif

extern "C" int nvte_rocm_default_hipblaslt(void) { return NVTE_DEFAULT_HIPBLASLT ? 1 : 0; }

extern "C" const char* nvte_default_gemm_library(void) {
  return NVTE_DEFAULT_HIPBLASLT ? "hipBLASLt" : "rocBLAS";
}
