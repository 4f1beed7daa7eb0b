// Bindings of the fused attention family. Parameters travel as one tuple (see
// transformer_engine/pytorch/kernels/attention.py, _params_tuple) so Python and C share one order.
#include <string>

#include "bindings.h"
#include "transformer_engine/attention.h"

namespace te_py {
namespace {

NVTEAttnParams params_from_tuple(const py::tuple& t) {
  if (t.size() != 14 && t.size() != 15)
    throw py::value_error("attention params must be a 14-tuple (batch, heads_q, heads_kv, "
                          "seqlen_q, seqlen_kv, dim_qk, dim_v, dtype, format, mask, left, right, "
                          "scale, deterministic) or that plus the 12 layout strides of q, k, v, "
                          "out; got " + std::to_string(t.size()) + " items");
  NVTEAttnParams p{};
  p.batch = t[0].cast<int64_t>();
  p.num_heads_q = t[1].cast<int64_t>();
  p.num_heads_kv = t[2].cast<int64_t>();
  p.max_seqlen_q = t[3].cast<int64_t>();
  p.max_seqlen_kv = t[4].cast<int64_t>();
  p.head_dim_qk = t[5].cast<int64_t>();
  p.head_dim_v = t[6].cast<int64_t>();
  p.dtype = static_cast<NVTEDType>(t[7].cast<int>());
  p.qkv_format = static_cast<NVTEQKVFormat>(t[8].cast<int>());
  p.mask_type = static_cast<NVTEAttnMaskType>(t[9].cast<int>());
  p.window_left = t[10].cast<int64_t>();
  p.window_right = t[11].cast<int64_t>();
  p.softmax_scale = t[12].cast<float>();
  p.deterministic = t[13].cast<bool>();
  if (t.size() == 15 && !t[14].is_none()) {  // (q's 3, k's 3, v's 3, out's 3); 0s = dense
    const py::tuple s = t[14].cast<py::tuple>();
    if (s.size() != 12)
      throw py::value_error("attention params: strides must be a 12-tuple (3 each of q, k, v, "
                            "out), got " + std::to_string(s.size()) + " items");
    int64_t* dst[4] = {p.stride_q, p.stride_k, p.stride_v, p.stride_o};
    for (int i = 0; i < 12; ++i) dst[i / 3][i % 3] = s[i].cast<int64_t>();
  }
  return p;
}

// Optional descriptors: None -> no tensor.
struct OptTensor {
  NVTETensor t{};
  bool present = false;
  explicit OptTensor(const py::object& o) {
    if (!o.is_none()) {
      t = tensor_from_tuple(o.cast<py::tuple>());
      present = true;
    }
  }
  const NVTETensor* get() const { return present ? &t : nullptr; }
};

}  // namespace

void register_attention(py::module_& m) {
  // 0: auto (matrix units where mapped), 1: FMA only (the AMD code path); for tests.
  m.def("attention_set_portable_variant", [](int variant) {
    check_status(
        nvte_attention_set_portable_variant(static_cast<NVTEAttnPortableVariant>(variant)));
  });
  m.def("attention_backend_name", [](int backend) {
    return std::string(nvte_attention_backend_name(static_cast<NVTEAttnBackend>(backend)));
  });
  // (supported, reason): the backend's own answer; never raises for a refusal.
  m.def("attention_support", [](int backend, const py::tuple& params, int device) {
    NVTEAttnParams p = params_from_tuple(params);
    NVTEStatus st = nvte_attention_support(static_cast<NVTEAttnBackend>(backend), &p, device);
    const std::string reason = st == kNVTESuccess ? std::string() : nvte_last_error_message();
    return py::make_tuple(st == kNVTESuccess, reason);
  });
  m.def("attention_workspace_size", [](int backend, const py::tuple& params, bool is_backward,
                                       int device) {
    NVTEAttnParams p = params_from_tuple(params);
    size_t bytes = 0;
    check_status(nvte_attention_workspace_size(static_cast<NVTEAttnBackend>(backend), &p,
                                               is_backward, device, &bytes));
    return bytes;
  });
  m.def("attention_forward", [](int backend, const py::tuple& params, const py::tuple& q,
                                const py::tuple& k, const py::tuple& v, const py::tuple& out,
                                const py::tuple& lse, const py::object& cu_q,
                                const py::object& cu_kv, uintptr_t workspace,
                                size_t workspace_size, uintptr_t stream) {
    NVTEAttnParams p = params_from_tuple(params);
    NVTETensor qd = tensor_from_tuple(q), kd = tensor_from_tuple(k), vd = tensor_from_tuple(v);
    NVTETensor od = tensor_from_tuple(out), ld = tensor_from_tuple(lse);
    OptTensor cq(cu_q), ck(cu_kv);
    check_status(nvte_attention_forward(static_cast<NVTEAttnBackend>(backend), &p, &qd, &kd, &vd,
                                        &od, &ld, cq.get(), ck.get(),
                                        reinterpret_cast<void*>(workspace), workspace_size,
                                        stream_from_int(stream)));
  });
  m.def("attention_backward", [](int backend, const py::tuple& params, const py::tuple& q,
                                 const py::tuple& k, const py::tuple& v, const py::tuple& out,
                                 const py::tuple& d_out, const py::tuple& lse,
                                 const py::object& cu_q, const py::object& cu_kv,
                                 const py::tuple& dq, const py::tuple& dk, const py::tuple& dv,
                                 uintptr_t workspace, size_t workspace_size, uintptr_t stream) {
    NVTEAttnParams p = params_from_tuple(params);
    NVTETensor qd = tensor_from_tuple(q), kd = tensor_from_tuple(k), vd = tensor_from_tuple(v);
    NVTETensor od = tensor_from_tuple(out), dod = tensor_from_tuple(d_out);
    NVTETensor ld = tensor_from_tuple(lse);
    NVTETensor dqd = tensor_from_tuple(dq), dkd = tensor_from_tuple(dk);
    NVTETensor dvd = tensor_from_tuple(dv);
    OptTensor cq(cu_q), ck(cu_kv);
    check_status(nvte_attention_backward(static_cast<NVTEAttnBackend>(backend), &p, &qd, &kd, &vd,
                                         &od, &dod, &ld, cq.get(), ck.get(), &dqd, &dkd, &dvd,
                                         reinterpret_cast<void*>(workspace), workspace_size,
                                         stream_from_int(stream)));
  });
}

}  // namespace te_py
