/* Which vendor GEMM library a build calls when nothing is chosen at run time.
 *
 * NVIDIA builds have one: cuBLASLt. ROCm builds compile in both rocBLAS and hipBLASLt; the
 * default between them is fixed at install time by NVTE_USE_HIPBLASLT (1 = hipBLASLt, the
 * default, 0 = rocBLAS) and the same variable overrides it at run time (read by
 * transformer_engine.common.config, at call time). Both functions exist in every build so that
 * the exported C API is the same on both vendors.
 */
#ifndef TRANSFORMER_ENGINE_GEMM_LIBRARY_H_
#define TRANSFORMER_ENGINE_GEMM_LIBRARY_H_

#ifdef __cplusplus
extern "C" {
#endif

/* ROCm: 1 when the build-time default is hipBLASLt, 0 when it is rocBLAS. NVIDIA: 0. */
int nvte_rocm_default_hipblaslt(void);

/* Name of the default GEMM library of this build: "cuBLASLt", "hipBLASLt" or "rocBLAS". */
const char* nvte_default_gemm_library(void);

#ifdef __cplusplus
}
#endif

#endif /* TRANSFORMER_ENGINE_GEMM_LIBRARY_H_ */
