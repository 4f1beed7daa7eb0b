// One binding call per direction of a Linear step on the modules' direct path
// (transformer_engine/pytorch/module/linear.py), FP8 or high precision: the same C API calls, in
// the same order and with the same descriptors, as the separate bindings (compute_amax,
// delayed_scaling_update, cast_transpose / quantize, cast_transpose_dbias, gemm) make, so the
// kernels and their bits are the same. Why one call: on a slow host the Python side of a small
// step costs more than its kernels, and each separate call builds nested descriptor tuples in
// Python and parses them here; flat integers cost a fraction of that.
//
// Pointers are device addresses as Python ints (0: absent); dtypes are NVTEDType codes. The caller
// (the module) has checked shapes and dtypes; the C API still validates every call and a failure
// raises the usual exception (kernels already queued by earlier calls of the step stay queued).
//
// Each call keeps the GIL while it launches (pybind11's default): the module's per-stream scratch
// (module/_fast.py, call_scratch) relies on no other Python thread launching between the
// kernels of one call.
#include "bindings.h"
#include "transformer_engine/activation.h"
#include "transformer_engine/cast.h"
#include "transformer_engine/gemm.h"
#include "transformer_engine/recipe.h"
#include "transformer_engine/transpose.h"

namespace te_py {
namespace {

NVTETensor matrix(uintptr_t data, int64_t rows, int64_t cols, int dtype, uintptr_t amax = 0,
                  uintptr_t scale = 0, uintptr_t scale_inv = 0) {
  NVTETensor t{};
  t.data = reinterpret_cast<void*>(data);
  t.dtype = static_cast<NVTEDType>(dtype);
  t.ndim = 2;
  t.shape[0] = rows;
  t.shape[1] = cols;
  t.amax = reinterpret_cast<float*>(amax);
  t.scale = reinterpret_cast<float*>(scale);
  t.scale_inv = reinterpret_cast<float*>(scale_inv);
  return t;
}

NVTETensor vector(uintptr_t data, int64_t n, int dtype) {
  NVTETensor t{};
  t.data = reinterpret_cast<void*>(data);
  t.dtype = static_cast<NVTEDType>(dtype);
  t.ndim = 1;
  t.shape[0] = n;
  return t;
}

// The FP8 scaling of one direction of a module: its amax history [history_len, slots] (row 0 is
// where the casts record), scale and scale_inv [slots] (fp32 device pointers), the format's max;
// current scaling: an int32 counter (zero between launches) for nvte_current_scaling_scales and
// the int32 [slots] counts of updates skipped for a non-finite amax (0: not counted).
struct Scaling {
  uintptr_t history, scale, scale_inv, counter, skipped;
  float fp8_max;
  bool delayed;
  float* amax_of(int slot) const {  // delayed scaling records the amax; current scaling does not
    return delayed ? reinterpret_cast<float*>(history) + slot : nullptr;
  }
  uintptr_t scale_of(int slot) const { return scale + 4 * static_cast<uintptr_t>(slot); }
  int* skipped_ptr() const { return reinterpret_cast<int*>(skipped); }  // slots from 0
};

// The constant groups of a call travel as one tuple each, made once in Python and read here
// without pybind11's per-argument conversion (about 25 ns an argument on a fast host, several
// times that on a slow, shared host; the FP8 calls had over 30 arguments):
//   scaling: a recipe state's (history, scale, scale_inv, fp8_max, counter[, skipped]) of one
//            direction (RecipeState._pointers in transformer_engine/pytorch/quantization.py)
//   env:     the call's (workspace, workspace bytes, stream) (module/_fast.py, NativeCall.env)
uintptr_t int_at(const py::tuple& t, size_t i) {
  const unsigned long long v = PyLong_AsUnsignedLongLong(PyTuple_GET_ITEM(t.ptr(), i));
  if (v == static_cast<unsigned long long>(-1) && PyErr_Occurred()) throw py::error_already_set();
  return static_cast<uintptr_t>(v);
}

Scaling scaling_from(const py::tuple& t, bool delayed) {
  if (t.size() != 5 && t.size() != 6)
    throw py::value_error(
        "scaling: expected (history, scale, scale_inv, fp8_max, counter[, skipped])");
  const double fp8_max = PyFloat_AsDouble(PyTuple_GET_ITEM(t.ptr(), 3));
  if (fp8_max == -1.0 && PyErr_Occurred()) throw py::error_already_set();
  return Scaling{int_at(t, 0), int_at(t, 1), int_at(t, 2), int_at(t, 4),
                 t.size() == 6 ? int_at(t, 5) : 0, static_cast<float>(fp8_max), delayed};
}

struct CallEnv {
  void* workspace;
  size_t workspace_size;
  NVTEStream stream;
};

CallEnv env_from(const py::tuple& t) {
  if (t.size() != 3) throw py::value_error("env: expected (workspace, workspace bytes, stream)");
  return CallEnv{reinterpret_cast<void*>(int_at(t, 0)), static_cast<size_t>(int_at(t, 1)),
                 stream_from_int(int_at(t, 2))};
}

// dbias [cols] = the column sums of dy [rows, cols] (nvte_dbias), its fp32 partial sums in the
// call's GEMM workspace: the GEMMs that use that buffer run on the same stream, before or after
// the two column-sum kernels, never during them. The partials need at most a few MiB (see
// csrc/common/activation/dbias.cu), far less than the GEMM workspace.
void column_sums(uintptr_t dy, int64_t rows, int64_t cols, int dtype, uintptr_t dbias,
                 int dbias_dtype, const CallEnv& e) {
  NVTETensor g = matrix(dy, rows, cols, dtype);
  NVTETensor db = vector(dbias, cols, dbias_dtype);
  NVTETensor ws{};
  check_status(nvte_dbias(&g, &db, &ws, nullptr));  // size query
  const size_t bytes = size_t(ws.shape[0]) * size_t(ws.shape[1]) * sizeof(float);
  if (bytes > e.workspace_size)
    throw py::value_error("dbias: the column sums need " + std::to_string(bytes) +
                          " bytes of workspace; the GEMM workspace has " +
                          std::to_string(e.workspace_size));
  ws.data = bytes ? e.workspace : nullptr;
  check_status(nvte_dbias(&g, &db, &ws, e.stream));
}

// Current scaling: the scales of inputs 0..n-1 (slots 0..n-1) in one launch, with the one-row
// history as the amax scratch (the same bits as an amax launch per input and the update).
// Delayed scaling: nothing here.
void current_scales(const Scaling& s, const NVTETensor* const* inputs, int n, NVTEStream stream) {
  if (s.delayed) return;
  check_status(nvte_current_scaling_scales(
      inputs, n, reinterpret_cast<float*>(s.history), reinterpret_cast<int*>(s.counter),
      reinterpret_cast<float*>(s.scale), reinterpret_cast<float*>(s.scale_inv), s.skipped_ptr(),
      s.fp8_max, stream));
}

// The FP8 output descriptor of x [rows, cols] cast with slot's scale (and amax, delayed).
NVTETensor cast_output(const NVTETensor& x, const Scaling& s, int slot, int fp8_dtype,
                       uintptr_t data, uintptr_t scale_inv) {
  NVTETensor out = matrix(data, x.shape[0], x.shape[1], fp8_dtype, 0, s.scale_of(slot), scale_inv);
  out.amax = s.amax_of(slot);
  return out;
}

// nvte_cast_transpose_multi of n inputs with their slots' scales (0..n-1); current scaling
// computes those scales first, in the same launch where the grid fits on the device.
void multi_cast_transpose(const Scaling& s, int n, const NVTETensor* const* inputs,
                          NVTETensor* const* outputs, NVTETensor* const* outputs_t,
                          NVTEStream stream) {
  if (s.delayed) {
    check_status(nvte_cast_transpose_multi(n, inputs, outputs, outputs_t, stream));
    return;
  }
  check_status(nvte_cast_transpose_multi_current_scaling(
      n, inputs, outputs, outputs_t, reinterpret_cast<float*>(s.history),
      reinterpret_cast<int*>(s.counter), reinterpret_cast<float*>(s.scale),
      reinterpret_cast<float*>(s.scale_inv), s.skipped_ptr(), s.fp8_max, stream));
}

// x [rows, cols] -> FP8 data (and its transpose [cols, rows] when t != 0) with slot's scale.
void cast(const NVTETensor& x, const Scaling& s, int slot, int fp8_dtype, uintptr_t data,
          uintptr_t t, uintptr_t scale_inv, NVTEStream stream) {
  const int64_t rows = x.shape[0], cols = x.shape[1];
  NVTETensor out = cast_output(x, s, slot, fp8_dtype, data, scale_inv);
  if (t) {
    NVTETensor out_t = matrix(t, cols, rows, fp8_dtype);
    check_status(nvte_cast_transpose(&x, &out, &out_t, stream));
  } else {
    check_status(nvte_quantize(&x, &out, stream));
  }
}

// The forward GEMM y = op(A) op(B) (+ bias): nvte_gemm, or nvte_gemm_with_c with the residual
// as C (beta 1) when there is one; errors name the entry point used.
void forward_gemm(const NVTETensor& a, const NVTETensor& b, uintptr_t residual, NVTETensor& d,
                  NVTETensor& bias_desc, bool has_bias, const CallEnv& e) {
  NVTETensor* bias = has_bias ? &bias_desc : nullptr;
  const NVTEGemmEpilogue epi = has_bias ? kNVTEGemmEpilogueBias : kNVTEGemmEpilogueNone;
  if (!residual) {
    check_status(nvte_gemm(&a, true, &b, false, &d, bias, nullptr, epi, 1.0f, 0.0f, true,
                           e.workspace, e.workspace_size, e.stream));
    return;
  }
  const NVTETensor c = matrix(residual, d.shape[0], d.shape[1], d.dtype);
  check_status(nvte_gemm_with_c(&a, true, &b, false, &c, &d, bias, nullptr, epi, 1.0f, 1.0f, true,
                                e.workspace, e.workspace_size, e.stream));
}

}  // namespace

void register_linear_fast(py::module_& m) {
  // y [tokens, out] = x [tokens, in] @ W [out, in]^T (+ bias) (+ residual) in FP8 (forward
  // slots: x 0, W 1). residual != 0: a [tokens, out] tensor of y's dtype (y_dtype high precision)
  // added in the GEMM (its C operand, beta 1; before the bias, which is the same sum).
  // cast_w: W is high precision and is cast here into wq (its transpose into wq_t when != 0);
  // otherwise wq (dtype wq_dtype) already holds W's FP8 data and w / w_dtype are ignored.
  // x's FP8 data goes to xq, its transpose to xq_t when != 0, its scale_inv to x_sinv.
  m.def("linear_fp8_forward",
        [](uintptr_t x, int x_dtype, int64_t tokens, int64_t in_features, uintptr_t w, int w_dtype,
           int64_t out_features, bool cast_w, const py::tuple& scaling, bool delayed,
           int fp8_dtype, uintptr_t xq, uintptr_t xq_t, uintptr_t x_sinv, uintptr_t wq,
           int wq_dtype, uintptr_t wq_t, uintptr_t w_sinv, uintptr_t y, int y_dtype,
           uintptr_t bias, int bias_dtype, uintptr_t residual, const py::tuple& env) {
          const CallEnv e = env_from(env);
          const NVTEStream stream = e.stream;
          const Scaling s = scaling_from(scaling, delayed);
          const NVTETensor xd = matrix(x, tokens, in_features, x_dtype);
          const NVTETensor wd = matrix(w, out_features, in_features, w_dtype);
          const NVTETensor* inputs[2] = {&xd, &wd};
          if (cast_w && xq_t && wq_t && x_dtype == w_dtype) {
            // both with transposes (a training step): one launch for the two casts, current
            // scaling's scales included where the grid fits on the device at once
            NVTETensor outs[2] = {cast_output(xd, s, 0, fp8_dtype, xq, x_sinv),
                                  cast_output(wd, s, 1, fp8_dtype, wq, w_sinv)};
            NVTETensor outs_t[2] = {matrix(xq_t, in_features, tokens, fp8_dtype),
                                    matrix(wq_t, in_features, out_features, fp8_dtype)};
            NVTETensor* o[2] = {&outs[0], &outs[1]};
            NVTETensor* ot[2] = {&outs_t[0], &outs_t[1]};
            multi_cast_transpose(s, 2, inputs, o, ot, stream);
          } else {
            current_scales(s, inputs, cast_w ? 2 : 1, stream);
            cast(xd, s, 0, fp8_dtype, xq, xq_t, x_sinv, stream);
            if (cast_w) cast(wd, s, 1, fp8_dtype, wq, wq_t, w_sinv, stream);
          }
          NVTETensor a = matrix(wq, out_features, in_features, wq_dtype, 0, 0, w_sinv);
          NVTETensor b = matrix(xq, tokens, in_features, fp8_dtype, 0, 0, x_sinv);
          NVTETensor d = matrix(y, tokens, out_features, y_dtype);
          NVTETensor bd = vector(bias, out_features, bias_dtype);
          forward_gemm(a, b, residual, d, bd, bias != 0, e);
        });

  // dx [tokens, in] = dy @ W and dW [out, in] (+)= dy^T @ x in FP8 (backward slot 0: dy).
  // dy is cast into dyq (scale_inv dy_sinv), with its transpose into dyq_t when dW is made; with
  // dbias != 0 (and dyq_t) the same pass writes the bias gradient, through dbias_ws (fp32,
  // dbias_ws_elems elements: see cast_transpose_dbias_workspace). dx == 0: no dgrad (w_t unused);
  // dw == 0: no wgrad (x_t unused). dw_beta 1 accumulates into dw (an fp32 main_grad).
  // update_groups (None or a list of delayed_scaling_update groups): the delayed-scaling update
  // of the step this backward finishes, launched last (module/linear.py: the step's final update
  // rides this call instead of a call of its own).
  m.def("linear_fp8_backward",
        [](uintptr_t dy, int dy_dtype, int64_t tokens, int64_t out_features, int64_t in_features,
           const py::tuple& scaling, bool delayed, int fp8_dtype, uintptr_t dyq, uintptr_t dyq_t,
           uintptr_t dy_sinv, uintptr_t dbias, int dbias_dtype, uintptr_t dbias_ws,
           int64_t dbias_ws_elems, uintptr_t w_t, int w_t_dtype, uintptr_t w_sinv, uintptr_t dx,
           int dx_dtype, uintptr_t x_t, int x_t_dtype, uintptr_t x_sinv, uintptr_t dw,
           int dw_dtype, float dw_beta, const py::tuple& env, const py::object& update_groups,
           int update_algo, float update_margin) {
          const CallEnv e = env_from(env);
          const NVTEStream stream = e.stream;
          const Scaling s = scaling_from(scaling, delayed);
          const NVTETensor dyd = matrix(dy, tokens, out_features, dy_dtype);
          const NVTETensor* inputs[1] = {&dyd};
          bool updated = false;  // the step's update (update_groups) already queued
          if (dbias) {
            // the step's scaling rides the cast where it can: current scaling's scale, or the
            // step's delayed update (see transpose.h)
            NVTETensor q = cast_output(dyd, s, 0, fp8_dtype, dyq, dy_sinv);
            NVTETensor q_t = matrix(dyq_t, out_features, tokens, fp8_dtype);
            NVTETensor db = vector(dbias, out_features, dbias_dtype);
            NVTETensor ws = vector(dbias_ws, dbias_ws_elems, kNVTEFloat32);
            if (!s.delayed) {
              check_status(nvte_cast_transpose_dbias_current_scaling(
                  &dyd, &q, &q_t, &db, &ws, reinterpret_cast<float*>(s.history),
                  reinterpret_cast<int*>(s.counter), reinterpret_cast<float*>(s.scale),
                  reinterpret_cast<float*>(s.scale_inv), s.skipped_ptr(), s.fp8_max, stream));
            } else if (!update_groups.is_none()) {
              const std::vector<NVTEScalingGroup> g =
                  scaling_groups_from_list(update_groups.cast<py::list>());
              check_status(nvte_cast_transpose_dbias_update(
                  &dyd, &q, &q_t, &db, &ws, g.data(), static_cast<int64_t>(g.size()),
                  static_cast<NVTEAmaxAlgo>(update_algo), update_margin,
                  reinterpret_cast<int*>(s.counter), stream));
              updated = true;
            } else {
              check_status(nvte_cast_transpose_dbias(&dyd, &q, &q_t, &db, &ws, stream));
            }
          } else if (dyq_t) {
            NVTETensor q = cast_output(dyd, s, 0, fp8_dtype, dyq, dy_sinv);
            NVTETensor q_t = matrix(dyq_t, out_features, tokens, fp8_dtype);
            NVTETensor* o[1] = {&q};
            NVTETensor* ot[1] = {&q_t};
            multi_cast_transpose(s, 1, inputs, o, ot, stream);
          } else {
            current_scales(s, inputs, 1, stream);
            cast(dyd, s, 0, fp8_dtype, dyq, 0, dy_sinv, stream);
          }
          void* ws = e.workspace;
          const size_t workspace_size = e.workspace_size;
          if (dx) {
            NVTETensor a = matrix(w_t, in_features, out_features, w_t_dtype, 0, 0, w_sinv);
            NVTETensor b = matrix(dyq, tokens, out_features, fp8_dtype, 0, 0, dy_sinv);
            NVTETensor d = matrix(dx, tokens, in_features, dx_dtype);
            check_status(nvte_gemm(&a, true, &b, false, &d, nullptr, nullptr,
                                   kNVTEGemmEpilogueNone, 1.0f, 0.0f, true, ws, workspace_size,
                                   stream));
          }
          if (dw) {
            NVTETensor a = matrix(x_t, in_features, tokens, x_t_dtype, 0, 0, x_sinv);
            NVTETensor b = matrix(dyq_t, out_features, tokens, fp8_dtype, 0, 0, dy_sinv);
            NVTETensor d = matrix(dw, out_features, in_features, dw_dtype);
            check_status(nvte_gemm(&a, true, &b, false, &d, nullptr, nullptr,
                                   kNVTEGemmEpilogueNone, 1.0f, dw_beta, false, ws, workspace_size,
                                   stream));
          }
          if (!update_groups.is_none() && !updated)
            delayed_scaling_update_from_list(update_groups.cast<py::list>(), update_algo,
                                             update_margin, stream);
        });

  // High precision (x, W, dy, y, dx, dW all of dtype; bias and its gradient of bias_dtype): the
  // same GEMMs as module/_fast.py's gemm() makes, in one call per direction.
  // y [tokens, out] = x [tokens, in] @ W [out, in]^T (+ bias when bias != 0) (+ residual when
  // residual != 0: [tokens, out] of dtype, the GEMM's C operand with beta 1).
  m.def("linear_hp_forward",
        [](uintptr_t x, int64_t tokens, int64_t in_features, uintptr_t w, int64_t out_features,
           int dtype, uintptr_t y, uintptr_t bias, int bias_dtype, uintptr_t residual,
           const py::tuple& env) {
          const CallEnv e = env_from(env);
          NVTETensor a = matrix(w, out_features, in_features, dtype);
          NVTETensor b = matrix(x, tokens, in_features, dtype);
          NVTETensor d = matrix(y, tokens, out_features, dtype);
          NVTETensor bd = vector(bias, out_features, bias_dtype);
          forward_gemm(a, b, residual, d, bd, bias != 0, e);
        });

  // dbias [cols] = dy [rows, cols]'s column sums (nvte_dbias, see column_sums above): the bias
  // gradient of the modules' direct path.
  m.def("dbias_direct", [](uintptr_t dy, int64_t rows, int64_t cols, int dtype, uintptr_t dbias,
                           int dbias_dtype, const py::tuple& env) {
    column_sums(dy, rows, cols, dtype, dbias, dbias_dtype, env_from(env));
  });

  // When dbias != 0 and not dbias_epilogue, first dbias [out] = dy's column sums (nvte_dbias, in
  // dbias_dtype). Then dx [tokens, in] = dy [tokens, out] @ W [out, in] when dx != 0; then
  // dW [out, in] = dy^T @ x when dw != 0, with dbias = dy's column sums from the same GEMM's
  // epilogue when dbias != 0 and dbias_epilogue (dbias_dtype = dtype).
  m.def("linear_hp_backward",
        [](uintptr_t dy, int64_t tokens, int64_t out_features, int64_t in_features, int dtype,
           uintptr_t w, uintptr_t dx, uintptr_t x, uintptr_t dw, uintptr_t dbias, int dbias_dtype,
           bool dbias_epilogue, const py::tuple& env) {
          const CallEnv e = env_from(env);
          const NVTEStream stream = e.stream;
          void* ws = e.workspace;
          const size_t workspace_size = e.workspace_size;
          NVTETensor b = matrix(dy, tokens, out_features, dtype);
          if (dbias && !dbias_epilogue) {
            column_sums(dy, tokens, out_features, dtype, dbias, dbias_dtype, e);
            dbias = 0;
          }
          if (dx) {
            NVTETensor a = matrix(w, out_features, in_features, dtype);
            NVTETensor d = matrix(dx, tokens, in_features, dtype);
            check_status(nvte_gemm(&a, false, &b, false, &d, nullptr, nullptr,
                                   kNVTEGemmEpilogueNone, 1.0f, 0.0f, true, ws, workspace_size,
                                   stream));
          }
          if (dw) {
            NVTETensor a = matrix(x, tokens, in_features, dtype);
            NVTETensor d = matrix(dw, out_features, in_features, dtype);
            NVTETensor db = vector(dbias, out_features, dbias_dtype);
            check_status(nvte_gemm(&a, false, &b, true, &d, dbias ? &db : nullptr, nullptr,
                                   dbias ? kNVTEGemmEpilogueBGradB : kNVTEGemmEpilogueNone, 1.0f,
                                   0.0f, true, ws, workspace_size, stream));
          }
        });
}

}  // namespace te_py
