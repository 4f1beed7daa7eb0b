#include "bindings.h"
#include "transformer_engine/device.h"

namespace te_py {

void register_device(py::module_& m) {
  m.def("build_backend", [] { return std::string(nvte_build_backend()); });
  m.def("build_archs", [] { return std::string(nvte_build_archs()); });
  // (count, reason): count 0 with the runtime's reason when there is no usable device.
  m.def("device_count", [] {
    int n = 0;
    NVTEStatus s = nvte_device_count(&n);
    return py::make_tuple(s == kNVTESuccess ? n : 0,
                          s == kNVTESuccess ? std::string() : std::string(nvte_last_error_message()));
  });
  m.def("current_device", [] {
    int d = 0;
    check_status(nvte_current_device(&d));
    return d;
  });
  m.def("device_arch", [](int device) {
    char arch[64] = {0}, name[256] = {0};
    check_status(nvte_device_arch(device, arch, sizeof(arch), name, sizeof(name)));
    return py::make_tuple(std::string(arch), std::string(name));
  });
  m.def("dtype_name", [](int d) { return std::string(nvte_dtype_name(static_cast<NVTEDType>(d))); });
}

}  // namespace te_py
