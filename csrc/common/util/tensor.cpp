#include "util/tensor.h"

#include <sstream>

namespace te {

std::string shape_str(const NVTETensor& t) {
  std::ostringstream os;
  os << "[";
  for (int i = 0; i < t.ndim; ++i) os << (i ? ", " : "") << t.shape[i];
  os << "]";
  return os.str();
}

void check_tensor(const NVTETensor* t, const char* what) {
  TE_CHECK_ARG(t != nullptr, what, " is a null descriptor");
  TE_CHECK_ARG(t->dtype >= 0 && t->dtype < kNVTENumTypes, what, " has invalid dtype code ",
               static_cast<int>(t->dtype));
  TE_CHECK_ARG(t->ndim >= 0 && t->ndim <= NVTE_MAX_DIMS, what, " has ", t->ndim,
               " dims; expected 0..", NVTE_MAX_DIMS);
  for (int i = 0; i < t->ndim; ++i)
    TE_CHECK_ARG(t->shape[i] >= 0, what, " has negative extent in shape ", shape_str(*t));
  TE_CHECK_ARG(t->data != nullptr || numel(*t) == 0, what, " with shape ", shape_str(*t),
               " has a null data pointer");
  if (is_fp8(t->dtype)) {
    if (const char* arch = fp8_unsupported_arch())
      throw Error(kNVTEUnsupported,
                  concat(what, " is ", nvte_dtype_name(t->dtype), ", but this device (", arch,
                         ") has no FP8: use bfloat16 or float16 (FP8 needs MI300 / gfx942 or newer)"));
  }
}

int64_t numel(const NVTETensor& t) {
  int64_t n = 1;
  for (int i = 0; i < t.ndim; ++i) n *= t.shape[i];
  return n;
}

void as_2d(const NVTETensor& t, int64_t* rows, int64_t* cols) {
  if (t.ndim == 0) {
    *rows = *cols = 1;
    return;
  }
  *cols = t.shape[t.ndim - 1];
  int64_t r = 1;
  for (int i = 0; i + 1 < t.ndim; ++i) r *= t.shape[i];
  *rows = r;
}

void check_dtype_in(const NVTETensor& t, const char* what, bool ok, const char* expected) {
  TE_CHECK_ARG(ok, what, " has dtype ", nvte_dtype_name(t.dtype), "; expected ", expected);
}

void check_fp8_scaling(const NVTETensor& t, const char* what, bool need_scale) {
  if (need_scale)
    TE_CHECK_ARG(t.scale != nullptr, what, " (", nvte_dtype_name(t.dtype),
                 ") needs a scale pointer");
}

}  // namespace te
