// Argument checks shared by the softmax entry points (forward in softmax_fwd.cu, backward in
// softmax_bwd.cu, split so that their instantiations compile in parallel).
#pragma once

#include "util/tensor.h"

namespace te {
namespace softmax {

struct Rows {
  int64_t rows, cols;
};

inline Rows check_softmax_input(const NVTETensor* t, const char* what, int min_dims) {
  check_tensor(t, what);
  check_dtype_in(*t, what, t->dtype == kNVTEFloat16 || t->dtype == kNVTEBFloat16,
                 "float16 or bfloat16");
  TE_CHECK_ARG(t->ndim >= min_dims, what, " has shape ", shape_str(*t), "; expected at least ",
               min_dims, " dimensions");
  Rows r;
  as_2d(*t, &r.rows, &r.cols);
  TE_CHECK_ARG(r.cols >= 1 || r.rows == 0, what, " has shape ", shape_str(*t),
               "; expected a last dimension of at least 1");
  TE_CHECK_ARG(r.cols < (int64_t(1) << 31), what, " has rows of ", r.cols,
               " elements; at most 2^31 - 1 are supported");
  return r;
}

inline void check_same(const NVTETensor* t, const char* what, const NVTETensor& ref,
                       const char* ref_name) {
  check_tensor(t, what);
  TE_CHECK_ARG(t->ndim == ref.ndim, what, " has shape ", shape_str(*t), "; expected ",
               ref_name, "'s shape ", shape_str(ref));
  for (int i = 0; i < ref.ndim; ++i)
    TE_CHECK_ARG(t->shape[i] == ref.shape[i], what, " has shape ", shape_str(*t), "; expected ",
                 ref_name, "'s shape ", shape_str(ref));
  TE_CHECK_ARG(t->dtype == ref.dtype, what, " has dtype ", nvte_dtype_name(t->dtype),
               "; expected ", ref_name, "'s dtype ", nvte_dtype_name(ref.dtype));
}

// Causal softmax works on [..., sq, sk] with sq == sk; returns sq.
inline int64_t check_causal_shape(const NVTETensor& t, const char* what) {
  TE_CHECK_ARG(t.ndim >= 2 && t.shape[t.ndim - 2] == t.shape[t.ndim - 1], what, " has shape ",
               shape_str(t), "; expected [..., sq, sk] with sq == sk");
  return t.shape[t.ndim - 2];
}

}  // namespace softmax
}  // namespace te
