// ROCm implementation of the GEMM vendor interface: chooses hipBLASLt or rocBLAS per call.
//
// NVTE_USE_HIPBLASLT is read on every call (a getenv is a few tens of nanoseconds), so a change
// between calls takes effect, as transformer_engine.common.config documents. Its value counts,
// not its presence: 1/true/yes/on selects hipBLASLt, 0/false/no/off rocBLAS, unset or empty the
// build-time default NVTE_DEFAULT_HIPBLASLT (set from the same variable at install).
#include <cctype>
#include <cstdlib>
#include <string>

#include "hip_gemm_backends.h"
#include "util/error.h"

#ifndef NVTE_DEFAULT_HIPBLASLT
#define NVTE_DEFAULT_HIPBLASLT 1
#endif

namespace te {
namespace gemm {

bool use_hipblaslt_now() {
  const char* raw = std::getenv("NVTE_USE_HIPBLASLT");
  if (raw == nullptr) return NVTE_DEFAULT_HIPBLASLT != 0;
  std::string v;
  for (const char* p = raw; *p; ++p)
    if (!std::isspace(static_cast<unsigned char>(*p)))
      v += static_cast<char>(std::tolower(static_cast<unsigned char>(*p)));
  if (v.empty()) return NVTE_DEFAULT_HIPBLASLT != 0;
  if (v == "1" || v == "true" || v == "yes" || v == "on") return true;
  if (v == "0" || v == "false" || v == "no" || v == "off") return false;
  throw Error(kNVTEInvalidArgument,
              concat("environment variable NVTE_USE_HIPBLASLT=", raw, ": expected 0 or 1"));
}

const char* backend_name() { return use_hipblaslt_now() ? "hipBLASLt" : "rocBLAS"; }

void backend_check(const GemmArgs& args) {
  if (use_hipblaslt_now())
    hipblaslt_check(args);
  else
    rocblas_check(args);
}

void backend_run(const GemmArgs& args) {
  if (use_hipblaslt_now())
    hipblaslt_run(args);
  else
    rocblas_run(args);
}

}  // namespace gemm
}  // namespace te
