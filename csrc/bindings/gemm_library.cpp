#include <string>

#include "bindings.h"
#include "transformer_engine/gemm_library.h"

namespace te_py {

void register_gemm_library(py::module_& m) {
  // Build-time default only; the run-time choice (NVTE_USE_HIPBLASLT) is made in Python.
  m.def("default_hipblaslt", [] { return nvte_rocm_default_hipblaslt() != 0; });
  m.def("default_gemm_library", [] { return std::string(nvte_default_gemm_library()); });
}

}  // namespace te_py
