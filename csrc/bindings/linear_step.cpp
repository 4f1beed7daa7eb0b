// The Linear step of the modules' eager path (transformer_engine/pytorch/kernels/linear_step.py)
// in one binding call per direction, FP8 or high precision: the same C API calls, in the same
// order and with the same descriptors, as the separate bindings (compute_amax,
// delayed_scaling_update, cast_transpose / quantize, cast_transpose_dbias, gemm) make, so the
// kernels and their bits are the same. Why one call: on a slow host the Python side of a small
// step costs more than its kernels, and each separate call builds nested descriptor tuples in
// Python and parses them here.
//
// FP8: LinearFp8Plan holds a step's parameters and buffer layout (linear_step.h), built once per
// problem; its forward / backward take the per-call addresses only. High precision: flat calls.
// Pointers are device addresses as Python ints (0: absent); dtypes are NVTEDType codes. The caller
// has checked shapes and dtypes against the plan; the C API still validates every call and a
// failure raises the usual exception (kernels already queued by earlier calls of the step stay
// queued).
//
// Each call keeps the GIL while it launches (pybind11's default): the per-stream scratch of the
// eager path (kernels/eager.py, call_scratch) relies on no other Python thread launching
// between the kernels of one call.
#include "linear_step.h"

#include <string>

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


// The constant groups of a call travel as one tuple each, made once in Python and read here
// without pybind11's per-argument conversion (about 25 ns an argument on a fast host, several
// times that on a slow, shared host):
//   scaling: a recipe state's (history, scale, scale_inv, fp8_max, counter[, skipped]) of one
//            direction (RecipeState.ptrs_fwd / ptrs_bwd in transformer_engine/pytorch/quantization.py)
//   env:     the call's (workspace, workspace bytes, stream) (kernels/eager.py, NativeCall.env)
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
  Scaling s;
  s.history = int_at(t, 0);
  s.scale = int_at(t, 1);
  s.scale_inv = int_at(t, 2);
  s.counter = int_at(t, 4);
  s.skipped = t.size() == 6 ? int_at(t, 5) : 0;
  s.fp8_max = static_cast<float>(fp8_max);
  s.delayed = delayed;
  return s;
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

// ----- the FP8 step -------------------------------------------------------------------------------

void require(bool ok, const std::string& what) {
  if (!ok) throw py::value_error("LinearFp8Plan: " + what);
}

bool is_fp8(NVTEDType t) { return t == kNVTEFloat8E4M3 || t == kNVTEFloat8E5M2; }
bool is_high_precision(NVTEDType t) {
  return t == kNVTEFloat32 || t == kNVTEFloat16 || t == kNVTEBFloat16;
}

// Places a region of bytes_of(rows * cols elements) at *end of an arena and moves *end on.
Region place(size_t* end, int64_t rows, int64_t cols, NVTEDType dtype, size_t bytes) {
  Region r;
  r.offset = *end;
  r.rows = rows;
  r.cols = cols;
  r.dtype = dtype;
  r.used = true;
  *end += aligned_bytes(bytes);
  return r;
}

uintptr_t at(uintptr_t arena, const Region& r) { return r.used ? arena + r.offset : 0; }

// fp32 elements of nvte_cast_transpose_dbias's workspace for dy [rows, cols]. The size query
// checks the descriptors but reads no memory: an aligned dummy address stands in for buffers
// that are not allocated yet (their size is the answer).
int64_t dbias_workspace_elems(const LinearFp8Params& p) {
  const uintptr_t dummy = kRegionAlign;
  NVTETensor dy = matrix(dummy, p.tokens, p.out_features, p.dtype);
  NVTETensor q = matrix(dummy, p.tokens, p.out_features, p.fp8_bwd, 0, dummy, dummy);
  NVTETensor q_t = matrix(dummy, p.out_features, p.tokens, p.fp8_bwd);
  NVTETensor db = vector(dummy, p.out_features, p.dbias_dtype);
  NVTETensor ws{};
  check_status(nvte_cast_transpose_dbias(&dy, &q, &q_t, &db, &ws, nullptr));
  int64_t n = 1;
  for (int i = 0; i < ws.ndim; ++i) n *= ws.shape[i];
  return ws.ndim ? n : 0;
}

// y [tokens, out] = x [tokens, in] @ W [out, in]^T (+ bias) (+ residual) in FP8. x of p.dtype;
// w: the high-precision W when p.fresh_w (cast here, its transpose kept when the backward makes
// dx), else W's FP8 data with its scale_inv w_sinv. bias (0: none): [out] of p.dtype. residual
// (0: none): [tokens, out] of p.dtype, added by the GEMM (its C operand, beta 1).
void linear_fp8_forward(const LinearFp8Params& p, uintptr_t x, uintptr_t w, uintptr_t w_sinv,
                        uintptr_t kept, uintptr_t scratch, uintptr_t y, uintptr_t bias,
                        uintptr_t residual, const py::tuple& env) {
  require(x && w && kept && scratch && y, "forward needs x, w, kept, scratch and y");
  require(p.fresh_w || w_sinv, "forward of an FP8 weight needs its scale_inv (w_sinv)");
  const CallEnv e = env_from(env);
  const NVTEStream stream = e.stream;
  const Scaling& s = p.fwd;
  const int64_t tokens = p.tokens, in_features = p.in_features, out_features = p.out_features;
  const uintptr_t xq = at(scratch, p.xq), xq_t = at(kept, p.x_t), x_sinv = at(kept, p.x_sinv);
  const NVTETensor xd = matrix(x, tokens, in_features, p.dtype);
  uintptr_t wq = w, w_sinv_ptr = w_sinv;
  if (p.fresh_w) {
    wq = at(scratch, p.wq);
    w_sinv_ptr = at(kept, p.w_sinv);
    const uintptr_t wq_t = at(kept, p.w_t);
    const NVTETensor wd = matrix(w, out_features, in_features, p.w_dtype);
    const NVTETensor* inputs[2] = {&xd, &wd};
    if (xq_t && wq_t && p.dtype == p.w_dtype) {
      // both with transposes (a training step): one launch for the two casts, current
      // scaling's scales included where the grid fits on the device at once
      NVTETensor outs[2] = {cast_output(xd, s, 0, p.fp8_fwd, xq, x_sinv),
                            cast_output(wd, s, 1, p.fp8_fwd, wq, w_sinv_ptr)};
      NVTETensor outs_t[2] = {matrix(xq_t, in_features, tokens, p.fp8_fwd),
                              matrix(wq_t, in_features, out_features, p.fp8_fwd)};
      NVTETensor* o[2] = {&outs[0], &outs[1]};
      NVTETensor* ot[2] = {&outs_t[0], &outs_t[1]};
      multi_cast_transpose(s, 2, inputs, o, ot, stream);
    } else {
      current_scales(s, inputs, 2, stream);
      cast(xd, s, 0, p.fp8_fwd, xq, xq_t, x_sinv, stream);
      cast(wd, s, 1, p.fp8_fwd, wq, wq_t, w_sinv_ptr, stream);
    }
  } else {
    const NVTETensor* inputs[1] = {&xd};
    current_scales(s, inputs, 1, stream);
    cast(xd, s, 0, p.fp8_fwd, xq, xq_t, x_sinv, stream);
  }
  NVTETensor a = matrix(wq, out_features, in_features, p.wq_dtype, 0, 0, w_sinv_ptr);
  NVTETensor b = matrix(xq, tokens, in_features, p.fp8_fwd, 0, 0, x_sinv);
  NVTETensor d = matrix(y, tokens, out_features, p.dtype);
  NVTETensor bd = vector(bias, out_features, p.dtype);
  forward_gemm(a, b, residual, d, bd, bias != 0, e);
}

// The step's delayed-scaling update as the backward calls receive it: None, or (groups, algo,
// margin) as delayed_scaling_update takes them.
struct StepUpdate {
  bool present = false;
  py::list groups;
  int algo = 0;
  float margin = 0.0f;
};

StepUpdate update_from(const py::object& update) {
  StepUpdate u;
  if (update.is_none()) return u;
  const py::tuple t = update.cast<py::tuple>();
  require(t.size() == 3, "update must be (groups, algo, margin)");
  u.present = true;
  u.groups = t[0].cast<py::list>();
  u.algo = t[1].cast<int>();
  u.margin = t[2].cast<float>();
  return u;
}

// The backward's GEMMs on dy's FP8 data dyq [tokens, out] (its transpose dyq_t [out, tokens]
// for dw) and scale_inv dy_sinv: dgrad dx = dy @ W when dx != 0, then wgrad dW (+)= dy^T @ x
// when dw != 0 (the order the tensor-parallel callers rely on; see the backward entries).
void backward_gemms(const LinearFp8Params& p, uintptr_t dyq, uintptr_t dyq_t, uintptr_t dy_sinv,
                    uintptr_t x_t, uintptr_t x_sinv, uintptr_t w_t, uintptr_t w_sinv, uintptr_t dx,
                    uintptr_t dw, int dw_dtype, float dw_beta, const CallEnv& e) {
  const int64_t tokens = p.tokens, in_features = p.in_features, out_features = p.out_features;
  if (dx) {
    NVTETensor a = matrix(w_t, in_features, out_features, p.wq_dtype, 0, 0, w_sinv);
    NVTETensor b = matrix(dyq, tokens, out_features, p.fp8_bwd, 0, 0, dy_sinv);
    NVTETensor d = matrix(dx, tokens, in_features, p.dtype);
    check_status(nvte_gemm(&a, true, &b, false, &d, nullptr, nullptr, kNVTEGemmEpilogueNone,
                           1.0f, 0.0f, true, e.workspace, e.workspace_size, e.stream));
  }
  if (dw) {
    require(dyq_t != 0, "dw needs the output gradient's transpose (a plan made with need_wgrad)");
    NVTETensor a = matrix(x_t, in_features, tokens, p.fp8_fwd, 0, 0, x_sinv);
    NVTETensor b = matrix(dyq_t, out_features, tokens, p.fp8_bwd, 0, 0, dy_sinv);
    NVTETensor d = matrix(dw, out_features, in_features, dw_dtype);
    check_status(nvte_gemm(&a, true, &b, false, &d, nullptr, nullptr, kNVTEGemmEpilogueNone,
                           1.0f, dw_beta, false, e.workspace, e.workspace_size, e.stream));
  }
}

void require_operands(const LinearFp8Params& p, uintptr_t dx, uintptr_t dw, uintptr_t x_t,
                      uintptr_t x_sinv, uintptr_t w_t, uintptr_t w_sinv) {
  require(!dx || (p.need_dgrad && w_t && w_sinv),
          "dx needs a plan made with need_dgrad and the weight's transpose and scale_inv");
  require(!dw || (p.need_wgrad && x_t && x_sinv),
          "dw needs a plan made with need_wgrad and the input's transpose and scale_inv");
}

// dx [tokens, in] = dy @ W and dW [out, in] (+)= dy^T @ x in FP8 (backward slot 0: dy).
// The forward's operands: from the kept arena when kept != 0 (x^T and x's scale_inv; W's too when
// the forward cast W), else x_t, x_sinv, w_t, w_sinv as given (a forward that did not run this
// plan). dx == 0: no dgrad; dw == 0: no wgrad; dw_beta 1 accumulates into dw (of dw_dtype: an
// fp32 main_grad). dbias (p.dbias_in_cast only, else 0): the bias gradient, summed by the cast of
// dy. update (None or (groups, algo, margin) as delayed_scaling_update takes them): the
// delayed-scaling update of the step this backward finishes, launched with the step's last
// kernels instead of a call of its own.
void linear_fp8_backward(const LinearFp8Params& p, uintptr_t dy, uintptr_t kept, uintptr_t x_t,
                         uintptr_t x_sinv, uintptr_t w_t, uintptr_t w_sinv, uintptr_t scratch,
                         uintptr_t dx, uintptr_t dw, int dw_dtype, float dw_beta, uintptr_t dbias,
                         const py::tuple& env, const py::object& update) {
  if (kept) {
    x_t = at(kept, p.x_t);
    x_sinv = at(kept, p.x_sinv);
    if (p.fresh_w) {
      w_t = at(kept, p.w_t);
      w_sinv = at(kept, p.w_sinv);
    }
  }
  require(dy && scratch, "backward needs dy and scratch");
  require_operands(p, dx, dw, x_t, x_sinv, w_t, w_sinv);
  require(!dbias || p.dbias_in_cast, "dbias needs a plan made with dbias_dtype");
  const CallEnv e = env_from(env);
  const NVTEStream stream = e.stream;
  const Scaling& s = p.bwd;
  const int64_t tokens = p.tokens, out_features = p.out_features;
  const uintptr_t dyq = at(scratch, p.dyq), dyq_t = at(scratch, p.dyq_t);
  const uintptr_t dy_sinv = at(scratch, p.dy_sinv);
  const NVTETensor dyd = matrix(dy, tokens, out_features, p.dtype);
  const NVTETensor* inputs[1] = {&dyd};
  const StepUpdate u = update_from(update);
  bool updated = false;  // the step's update already queued
  if (dbias) {
    // the step's scaling rides the cast where it can: current scaling's scale, or the step's
    // delayed update (see transpose.h)
    NVTETensor q = cast_output(dyd, s, 0, p.fp8_bwd, dyq, dy_sinv);
    NVTETensor q_t = matrix(dyq_t, out_features, tokens, p.fp8_bwd);
    NVTETensor db = vector(dbias, out_features, p.dbias_dtype);
    NVTETensor ws = vector(at(scratch, p.dbias_ws), p.dbias_ws_elems, kNVTEFloat32);
    if (!s.delayed) {
      check_status(nvte_cast_transpose_dbias_current_scaling(
          &dyd, &q, &q_t, &db, &ws, reinterpret_cast<float*>(s.history),
          reinterpret_cast<int*>(s.counter), reinterpret_cast<float*>(s.scale),
          reinterpret_cast<float*>(s.scale_inv), s.skipped_ptr(), s.fp8_max, stream));
    } else if (u.present) {
      const std::vector<NVTEScalingGroup> g = scaling_groups_from_list(u.groups);
      check_status(nvte_cast_transpose_dbias_update(
          &dyd, &q, &q_t, &db, &ws, g.data(), static_cast<int64_t>(g.size()),
          static_cast<NVTEAmaxAlgo>(u.algo), u.margin, reinterpret_cast<int*>(s.counter), stream));
      updated = true;
    } else {
      check_status(nvte_cast_transpose_dbias(&dyd, &q, &q_t, &db, &ws, stream));
    }
  } else if (dyq_t) {
    NVTETensor q = cast_output(dyd, s, 0, p.fp8_bwd, dyq, dy_sinv);
    NVTETensor q_t = matrix(dyq_t, out_features, tokens, p.fp8_bwd);
    NVTETensor* o[1] = {&q};
    NVTETensor* ot[1] = {&q_t};
    multi_cast_transpose(s, 1, inputs, o, ot, stream);
  } else {
    current_scales(s, inputs, 1, stream);
    cast(dyd, s, 0, p.fp8_bwd, dyq, 0, dy_sinv, stream);
  }
  backward_gemms(p, dyq, dyq_t, dy_sinv, x_t, x_sinv, w_t, w_sinv, dx, dw, dw_dtype, dw_beta, e);
  if (u.present && !updated) delayed_scaling_update_from_list(u.groups, u.algo, u.margin, stream);
}

// The backward of a step whose output gradient comes already in FP8, cast by the kernel that
// made it (LayerNormMLP's FC1: the activation's backward casts dh, with its own slot and bias
// gradient): dyq [tokens, out], its transpose dyq_t [out, tokens] (needed for dw) and its
// scale_inv dy_sinv, of p.fp8_bwd. The forward's operands are given (x_t, x_sinv, w_t, w_sinv);
// dx, dw, dw_dtype, dw_beta and update as in linear_fp8_backward. The plan's backward scratch and
// dbias_dtype are not used: a plan made with dbias_dtype is refused (no cast here sums dy).
void linear_fp8_backward_fp8_grad(const LinearFp8Params& p, uintptr_t dyq, uintptr_t dyq_t,
                                  uintptr_t dy_sinv, uintptr_t x_t, uintptr_t x_sinv,
                                  uintptr_t w_t, uintptr_t w_sinv, uintptr_t dx, uintptr_t dw,
                                  int dw_dtype, float dw_beta, const py::tuple& env,
                                  const py::object& update) {
  require(dyq && dy_sinv, "backward_fp8_grad needs dyq and dy_sinv");
  require(!dw || dyq_t, "backward_fp8_grad: dw needs dyq_t");
  require(!p.dbias_in_cast, "backward_fp8_grad needs a plan made without dbias_dtype");
  require_operands(p, dx, dw, x_t, x_sinv, w_t, w_sinv);
  const CallEnv e = env_from(env);
  const StepUpdate u = update_from(update);
  backward_gemms(p, dyq, dyq_t, dy_sinv, x_t, x_sinv, w_t, w_sinv, dx, dw, dw_dtype, dw_beta, e);
  if (u.present) delayed_scaling_update_from_list(u.groups, u.algo, u.margin, e.stream);
}

// (arena, offset, shape, dtype code) of each used region, by name: the tensor views the caller
// needs (the checked backward reads the kept operands as tensors).
py::dict region_table(const LinearFp8Params& p) {
  py::dict t;
  const auto add = [&t](const char* name, const char* arena, const Region& r) {
    if (!r.used) return;
    const py::tuple shape =
        r.cols ? py::tuple(py::make_tuple(r.rows, r.cols)) : py::tuple(py::make_tuple(r.rows));
    t[name] = py::make_tuple(arena, r.offset, shape, static_cast<int>(r.dtype));
  };
  add("x_sinv", "kept", p.x_sinv);
  add("w_sinv", "kept", p.w_sinv);
  add("x_t", "kept", p.x_t);
  add("w_t", "kept", p.w_t);
  add("xq", "forward_scratch", p.xq);
  add("wq", "forward_scratch", p.wq);
  add("dyq", "backward_scratch", p.dyq);
  add("dyq_t", "backward_scratch", p.dyq_t);
  add("dy_sinv", "backward_scratch", p.dy_sinv);
  add("dbias_ws", "backward_scratch", p.dbias_ws);
  return t;
}

}  // namespace

void lay_out_linear_fp8(LinearFp8Params& p) {
  require(p.tokens > 0 && p.in_features > 0 && p.out_features > 0,
          "tokens, in_features and out_features must be positive, got " +
              std::to_string(p.tokens) + ", " + std::to_string(p.in_features) + ", " +
              std::to_string(p.out_features));
  require(is_high_precision(p.dtype), "dtype must be float32, float16 or bfloat16");
  require(!p.fresh_w || is_high_precision(p.w_dtype),
          "w_dtype (a weight cast by the forward) must be float32, float16 or bfloat16");
  require(is_fp8(p.fp8_fwd) && is_fp8(p.fp8_bwd) && is_fp8(p.wq_dtype),
          "fp8_fwd, fp8_bwd and wq_dtype must be FP8 dtypes");
  require(!p.dbias_in_cast || p.need_wgrad,
          "dbias_dtype (the bias gradient summed by dy's cast) needs need_wgrad (the cast with "
          "the transpose)");
  require(!p.dbias_in_cast || is_high_precision(p.dbias_dtype),
          "dbias_dtype must be float32, float16 or bfloat16");
  const int64_t tokens = p.tokens, in = p.in_features, out = p.out_features;
  const size_t nx = size_t(tokens) * size_t(in), nw = size_t(out) * size_t(in);
  size_t end = 0;
  p.x_sinv = place(&end, 1, 0, kNVTEFloat32, 4);
  p.w_sinv = place(&end, 1, 0, kNVTEFloat32, 4);
  p.x_t = p.need_wgrad ? place(&end, in, tokens, p.fp8_fwd, nx) : Region{};
  p.w_t = p.fresh_w && p.need_dgrad ? place(&end, in, out, p.fp8_fwd, nw) : Region{};
  p.kept_bytes = end;
  end = 0;
  p.xq = place(&end, tokens, in, p.fp8_fwd, nx);
  p.wq = p.fresh_w ? place(&end, out, in, p.fp8_fwd, nw) : Region{};
  p.forward_scratch_bytes = end;
  const size_t ny = size_t(tokens) * size_t(out);
  end = 0;
  p.dyq = place(&end, tokens, out, p.fp8_bwd, ny);
  p.dyq_t = p.need_wgrad ? place(&end, out, tokens, p.fp8_bwd, ny) : Region{};
  p.dy_sinv = place(&end, 1, 0, kNVTEFloat32, 4);
  p.dbias_ws_elems = p.dbias_in_cast ? dbias_workspace_elems(p) : 0;
  p.dbias_ws = p.dbias_in_cast ? place(&end, p.dbias_ws_elems, 0, kNVTEFloat32,
                                       4 * size_t(p.dbias_ws_elems))
                               : Region{};
  p.backward_scratch_bytes = end;
}

void register_linear_step(py::module_& m) {
  // The parameters of an FP8 Linear step (linear_step.h), made once per problem: dims, NVTEDType
  // codes (dbias_dtype -1: the backward makes no bias gradient in its cast), flags, and the
  // recipe state's scaling of each direction as (history, scale, scale_inv, fp8_max, counter
  // [, skipped]). kept_bytes / forward_scratch_bytes / backward_scratch_bytes: the arenas the
  // caller allocates; regions: where each operand lies in them.
  py::class_<LinearFp8Params>(m, "LinearFp8Plan")
      .def(py::init([](int64_t tokens, int64_t in_features, int64_t out_features, int dtype,
                       int w_dtype, int wq_dtype, int fp8_fwd, int fp8_bwd, bool fresh_w,
                       bool need_dgrad, bool need_wgrad, int dbias_dtype, bool delayed,
                       const py::tuple& scaling_fwd, const py::tuple& scaling_bwd) {
             LinearFp8Params p;
             p.tokens = tokens;
             p.in_features = in_features;
             p.out_features = out_features;
             p.dtype = static_cast<NVTEDType>(dtype);
             p.w_dtype = static_cast<NVTEDType>(w_dtype);
             p.wq_dtype = static_cast<NVTEDType>(wq_dtype);
             p.fp8_fwd = static_cast<NVTEDType>(fp8_fwd);
             p.fp8_bwd = static_cast<NVTEDType>(fp8_bwd);
             p.dbias_dtype = static_cast<NVTEDType>(dbias_dtype < 0 ? 0 : dbias_dtype);
             p.fresh_w = fresh_w;
             p.need_dgrad = need_dgrad;
             p.need_wgrad = need_wgrad;
             p.dbias_in_cast = dbias_dtype >= 0;
             p.fwd = scaling_from(scaling_fwd, delayed);
             p.bwd = scaling_from(scaling_bwd, delayed);
             lay_out_linear_fp8(p);
             return p;
           }),
           py::arg("tokens"), py::arg("in_features"), py::arg("out_features"), py::arg("dtype"),
           py::arg("w_dtype"), py::arg("wq_dtype"), py::arg("fp8_fwd"), py::arg("fp8_bwd"),
           py::arg("fresh_w"), py::arg("need_dgrad"), py::arg("need_wgrad"),
           py::arg("dbias_dtype"), py::arg("delayed"), py::arg("scaling_fwd"),
           py::arg("scaling_bwd"))
      .def_readonly("tokens", &LinearFp8Params::tokens)
      .def_readonly("in_features", &LinearFp8Params::in_features)
      .def_readonly("out_features", &LinearFp8Params::out_features)
      .def_readonly("fresh_w", &LinearFp8Params::fresh_w)
      .def_readonly("need_dgrad", &LinearFp8Params::need_dgrad)
      .def_readonly("need_wgrad", &LinearFp8Params::need_wgrad)
      .def_readonly("dbias_in_cast", &LinearFp8Params::dbias_in_cast)
      .def_readonly("kept_bytes", &LinearFp8Params::kept_bytes)
      .def_readonly("forward_scratch_bytes", &LinearFp8Params::forward_scratch_bytes)
      .def_readonly("backward_scratch_bytes", &LinearFp8Params::backward_scratch_bytes)
      .def_property_readonly("regions", &region_table)
      .def("forward", &linear_fp8_forward, py::arg("x"), py::arg("w"), py::arg("w_sinv"),
           py::arg("kept"), py::arg("scratch"), py::arg("y"), py::arg("bias"),
           py::arg("residual"), py::arg("env"))
      .def("backward", &linear_fp8_backward, py::arg("dy"), py::arg("kept"), py::arg("x_t"),
           py::arg("x_sinv"), py::arg("w_t"), py::arg("w_sinv"), py::arg("scratch"),
           py::arg("dx"), py::arg("dw"), py::arg("dw_dtype"), py::arg("dw_beta"),
           py::arg("dbias"), py::arg("env"), py::arg("update"))
      .def("backward_fp8_grad", &linear_fp8_backward_fp8_grad, py::arg("dyq"), py::arg("dyq_t"),
           py::arg("dy_sinv"), py::arg("x_t"), py::arg("x_sinv"), py::arg("w_t"),
           py::arg("w_sinv"), py::arg("dx"), py::arg("dw"), py::arg("dw_dtype"),
           py::arg("dw_beta"), py::arg("env"), py::arg("update"));

  // High precision (x, W, dy, y, dx, dW all of dtype; bias and its gradient of bias_dtype): the
  // same GEMMs as kernels/gemm.py's unchecked gemm call makes, in one call per direction.
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
