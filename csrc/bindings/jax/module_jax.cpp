// The _native_jax module: the XLA FFI handlers as PyCapsules, which
// transformer_engine/jax/cpp_extensions registers with jax.ffi.register_ffi_target for the
// platform of the build ("CUDA" or "ROCM"). Built only where JAX (and so XLA's FFI headers) is
// installed; the _native module does not depend on it.
#include <pybind11/pybind11.h>

#include "ffi_tensor.h"

namespace py = pybind11;

PYBIND11_MODULE(_native_jax, m) {
  m.doc() = "Transformer Engine XLA FFI handlers (capsules for jax.ffi.register_ffi_target)";
  py::dict handlers;
#define TE_JAX_EXPORT_(name) handlers[#name] = py::capsule(reinterpret_cast<void*>(name));
  TE_JAX_HANDLERS(TE_JAX_EXPORT_)
#undef TE_JAX_EXPORT_
  m.def("handlers", [handlers] { return handlers; },
        "Name -> capsule of every FFI handler of this build");
}
