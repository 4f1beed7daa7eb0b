#include "bindings.h"

#include <string>

namespace te_py {

NVTETensor tensor_from_tuple(const py::tuple& t) {
  if (t.size() != 6)
    throw py::value_error("tensor descriptor must be (data_ptr, shape, dtype, amax_ptr, "
                          "scale_ptr, scale_inv_ptr), got " + std::to_string(t.size()) + " items");
  NVTETensor d{};
  d.data = reinterpret_cast<void*>(t[0].cast<uintptr_t>());
  const py::tuple shape = t[1].cast<py::tuple>();
  if (shape.size() > NVTE_MAX_DIMS)
    throw py::value_error("tensor has " + std::to_string(shape.size()) + " dims; at most " +
                          std::to_string(NVTE_MAX_DIMS) + " are supported");
  d.ndim = static_cast<int32_t>(shape.size());
  for (size_t i = 0; i < shape.size(); ++i) d.shape[i] = shape[i].cast<int64_t>();
  d.dtype = static_cast<NVTEDType>(t[2].cast<int>());
  d.amax = reinterpret_cast<float*>(t[3].cast<uintptr_t>());
  d.scale = reinterpret_cast<float*>(t[4].cast<uintptr_t>());
  d.scale_inv = reinterpret_cast<float*>(t[5].cast<uintptr_t>());
  return d;
}

void check_status(NVTEStatus status) {
  switch (status) {
    case kNVTESuccess: return;
    case kNVTEInvalidArgument: throw py::value_error(nvte_last_error_message());
    case kNVTEUnsupported:
      PyErr_SetString(PyExc_NotImplementedError, nvte_last_error_message());
      throw py::error_already_set();
    default: throw std::runtime_error(nvte_last_error_message());
  }
}

}  // namespace te_py

PYBIND11_MODULE(_native, m) {
  m.doc() = "Transformer Engine native core (C API bindings)";
  te_py::register_device(m);
  te_py::register_cast(m);
  te_py::register_recipe(m);
  te_py::register_normalization(m);
  te_py::register_softmax(m);
  te_py::register_gemm(m);
  te_py::register_gemm_library(m);
  te_py::register_activation(m);
  te_py::register_rope(m);
  te_py::register_attention(m);
  te_py::register_linear_step(m);
}
