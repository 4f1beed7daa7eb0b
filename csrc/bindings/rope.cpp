// Bindings of the fused RoPE family. cu_seqlens is None unless the format is thd.
#include "bindings.h"
#include "transformer_engine/rope.h"

namespace te_py {

namespace {

using RopeFn = NVTEStatus (*)(const NVTETensor*, const NVTETensor*, const NVTETensor*,
                              NVTETensor*, NVTERopeFormat, int, NVTEStream);

void call_rope(RopeFn fn, const py::tuple& in, const py::tuple& freqs, const py::object& cu,
               const py::tuple& out, int format, bool interleaved, uintptr_t stream) {
  NVTETensor i = tensor_from_tuple(in), f = tensor_from_tuple(freqs), o = tensor_from_tuple(out);
  NVTETensor c{};
  const bool has_cu = !cu.is_none();
  if (has_cu) c = tensor_from_tuple(cu.cast<py::tuple>());
  check_status(fn(&i, &f, has_cu ? &c : nullptr, &o, static_cast<NVTERopeFormat>(format),
                  interleaved ? 1 : 0, stream_from_int(stream)));
}

}  // namespace

void register_rope(py::module_& m) {
  m.def("fused_rope_forward", [](const py::tuple& in, const py::tuple& freqs, const py::object& cu,
                                 const py::tuple& out, int format, bool interleaved,
                                 uintptr_t stream) {
    call_rope(nvte_fused_rope_forward, in, freqs, cu, out, format, interleaved, stream);
  });
  m.def("fused_rope_backward", [](const py::tuple& grad, const py::tuple& freqs,
                                  const py::object& cu, const py::tuple& grad_in, int format,
                                  bool interleaved, uintptr_t stream) {
    call_rope(nvte_fused_rope_backward, grad, freqs, cu, grad_in, format, interleaved, stream);
  });
}

}  // namespace te_py
