/* Device and build queries behind the capability report (python -m transformer_engine info). */
#ifndef TRANSFORMER_ENGINE_DEVICE_H_
#define TRANSFORMER_ENGINE_DEVICE_H_

#include "transformer_engine/transformer_engine.h"

#ifdef __cplusplus
extern "C" {
#endif

/* "cuda" or "rocm": the vendor this library was compiled for. */
const char* nvte_build_backend(void);

/* Semicolon-separated device archs compiled in ("80;89;90a" or "gfx942;gfx90a"). */
const char* nvte_build_archs(void);

/* Number of visible devices, or 0 with a status other than success when the runtime has none
 * (no driver, no GPU); the message says why. */
NVTEStatus nvte_device_count(int* count);

/* Arch name of a device: "sm_90" on NVIDIA, "gfx942" on AMD (target features stripped), and its
 * marketing name. Buffers are NUL-terminated and truncated to their length. */
NVTEStatus nvte_device_arch(int device, char* arch, size_t arch_len, char* name, size_t name_len);

/* The device the calling thread currently uses. */
NVTEStatus nvte_current_device(int* device);

#ifdef __cplusplus
}
#endif

#endif /* TRANSFORMER_ENGINE_DEVICE_H_ */
