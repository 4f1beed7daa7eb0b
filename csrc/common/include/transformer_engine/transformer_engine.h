/* The native core's C API: tensor descriptors, data types and error reporting.
 *
 * Every entry point is `NVTEStatus nvte_<op>(...)`. It takes non-owning tensor descriptors and a
 * stream, never allocates device memory, never synchronises the host and never aborts: bad input
 * returns a status and a message (nvte_last_error_message) naming the op, the argument and what
 * was expected. The header is plain C and names no vendor runtime, so the pybind11 module and the
 * XLA FFI handlers compile without CUDA or HIP headers.
 */
#ifndef TRANSFORMER_ENGINE_TRANSFORMER_ENGINE_H_
#define TRANSFORMER_ENGINE_TRANSFORMER_ENGINE_H_

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define NVTE_MAX_DIMS 8

/* Element types. The FP8 types name a format; its encoding (OCP or FNUZ) is the device's. */
typedef enum {
  kNVTEFloat32 = 0,
  kNVTEFloat16 = 1,
  kNVTEBFloat16 = 2,
  kNVTEFloat8E4M3 = 3,
  kNVTEFloat8E5M2 = 4,
  kNVTEInt32 = 5,
  kNVTEInt64 = 6,
  kNVTEByte = 7,
  kNVTENumTypes = 8
} NVTEDType;

typedef enum {
  kNVTESuccess = 0,
  kNVTEInvalidArgument = 1, /* wrong dtype, shape, alignment or null pointer: Python ValueError */
  kNVTEUnsupported = 2,     /* valid request this build or device cannot serve: NotImplementedError */
  kNVTEDeviceError = 3      /* the runtime or a vendor library failed: RuntimeError */
} NVTEStatus;

/* A stream of the vendor runtime, passed opaquely (the C API names no vendor type). */
typedef void* NVTEStream;

/* Non-owning view of a dense, row-major tensor in device memory.
 * For FP8 tensors `scale_inv` dequantises (value = stored * scale_inv[0]). For outputs that are
 * quantised, `scale` is applied before the cast and `amax` receives max|input| atomically
 * (max(amax, ...)), so the caller zeroes it when it wants this call's amax alone. Unused pointers
 * are NULL. */
typedef struct {
  void* data;
  NVTEDType dtype;
  int32_t ndim;
  int64_t shape[NVTE_MAX_DIMS];
  float* amax;
  float* scale;
  float* scale_inv;
} NVTETensor;

/* Message of the last failed call on this thread ("" if none). Valid until the next call. */
const char* nvte_last_error_message(void);

/* Name of a dtype ("bfloat16", "float8_e4m3", ...); "invalid" for out-of-range values. */
const char* nvte_dtype_name(NVTEDType dtype);

/* Bytes per element of a dtype, 0 for invalid values. */
size_t nvte_dtype_size(NVTEDType dtype);

#ifdef __cplusplus
}
#endif

#endif /* TRANSFORMER_ENGINE_TRANSFORMER_ENGINE_H_ */
