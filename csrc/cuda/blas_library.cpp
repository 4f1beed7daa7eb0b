// NVIDIA side of transformer_engine/gemm_library.h: cuBLASLt is the only GEMM library, and the
// ROCm choice does not apply (the function exists so both vendors export the same C API).
#include "transformer_engine/gemm_library.h"

extern "C" int nvte_rocm_default_hipblaslt(void) { return 0; }

extern "C" const char* nvte_default_gemm_library(void) { return "cuBLASLt"; }
