// Producers of the tile engine (tile_transpose.cuh) for the activation fusions: act(x),
// act(a) * b, dact and dgated-act, with the activation maths of activation_math.cuh (one
// definition of every activation and derivative in the library). Each computes its element with
// the same fp32 expression as the activation family's own kernels, so a fused result is
// bit-identical to the activation kernel followed by a cast+transpose.
#pragma once

#include "activation/activation_math.cuh"
#include "transpose/fused_launch.h"
#include "transpose/tile_transpose.cuh"

namespace te {
namespace tile_transpose {

// y = act(x), x [rows, cols]: the copy producer's loads, the activation applied to each value.
template <class Op, typename T>
struct ActProducer : CopyProducer<T> {
  using CopyProducer<T>::kInputs;
  template <int N> __device__ float value(const Vec<T, N> (&v)[kInputs], int k, int64_t) const {
    return Op::value(to_float(v[0].v[k]));
  }
};

// y = act(a) * b with a = x[r, c], b = x[r, n + c]; x [rows, 2n], y [rows, n].
template <class Op, typename T>
struct GatedActProducer {
  using InT = T;
  static constexpr int kInputs = 2;
  const T* x;
  int64_t n;
  template <int N> __device__ void load_seg(Vec<T, N> (&v)[kInputs], int64_t r, int64_t c) const {
    const T* row = x + r * 2 * n;
    v[0].load(row + c);
    v[1].load(row + n + c);
  }
  template <int N>
  __device__ void load_one(Vec<T, N> (&v)[kInputs], int k, int64_t r, int64_t c) const {
    const T* row = x + r * 2 * n;
    v[0].v[k] = row[c];
    v[1].v[k] = row[n + c];
  }
  template <int N> __device__ float value(const Vec<T, N> (&v)[kInputs], int k, int64_t) const {
    return Op::value(to_float(v[0].v[k])) * to_float(v[1].v[k]);
  }
  // the gate half starts n elements into a row: whole 16-byte pieces need n * sizeof(T) % 16 == 0
  bool vector_ok(int) const { return aligned16(x) && (n * int64_t(sizeof(T))) % 16 == 0; }
};

// g = dy * act'(x); dy, x [rows, cols].
template <class Op, typename T>
struct DActProducer {
  using InT = T;
  static constexpr int kInputs = 2;
  const T* grad;
  const T* x;
  int64_t cols;
  template <int N> __device__ void load_seg(Vec<T, N> (&v)[kInputs], int64_t r, int64_t c) const {
    v[0].load(grad + r * cols + c);
    v[1].load(x + r * cols + c);
  }
  template <int N>
  __device__ void load_one(Vec<T, N> (&v)[kInputs], int k, int64_t r, int64_t c) const {
    v[0].v[k] = grad[r * cols + c];
    v[1].v[k] = x[r * cols + c];
  }
  template <int N> __device__ float value(const Vec<T, N> (&v)[kInputs], int k, int64_t) const {
    return to_float(v[0].v[k]) * Op::deriv(to_float(v[1].v[k]));
  }
  bool vector_ok(int) const { return aligned16(grad) && aligned16(x); }
};

// Backward of the gated form, result [rows, 2n] from dy [rows, n] and x [rows, 2n]:
//   g[r, c]     = dy[r, c] * b * act'(a)      (c < n)
//   g[r, n + c] = dy[r, c] * act(a)
// with a = x[r, c], b = x[r, n + c]. A tile lies in one half or, when n is not a multiple of the
// segment (the scalar path), decides per element; the blocks of the two halves of one row of
// tiles run close together, so the second read of dy and a mostly hits L2.
template <class Op, typename T>
struct DGatedActProducer {
  using InT = T;
  static constexpr int kInputs = 3;
  const T* grad;
  const T* x;
  int64_t n;
  template <int N> __device__ void load_seg(Vec<T, N> (&v)[kInputs], int64_t r, int64_t c) const {
    const T* row = x + r * 2 * n;
    const int64_t cc = c < n ? c : c - n;
    v[0].load(grad + r * n + cc);
    v[1].load(row + cc);
    if (c < n) v[2].load(row + n + cc);
  }
  template <int N>
  __device__ void load_one(Vec<T, N> (&v)[kInputs], int k, int64_t r, int64_t c) const {
    const T* row = x + r * 2 * n;
    const int64_t cc = c < n ? c : c - n;
    v[0].v[k] = grad[r * n + cc];
    v[1].v[k] = row[cc];
    if (c < n) v[2].v[k] = row[n + cc];
  }
  template <int N> __device__ float value(const Vec<T, N> (&v)[kInputs], int k, int64_t c) const {
    const float dy = to_float(v[0].v[k]), a = to_float(v[1].v[k]);
    return c < n ? dy * to_float(v[2].v[k]) * Op::deriv(a) : dy * Op::value(a);
  }
  // a segment must not straddle the two halves
  bool vector_ok(int seg) const {
    return aligned16(grad) && aligned16(x) && n % seg == 0 && (n * int64_t(sizeof(T))) % 16 == 0;
  }
};

// Dispatch on the input dtype, the FP8 output dtype and the kind.
template <class Op, typename InT, typename OutT>
void launch_act_typed(const ActTransposeArgs& a) {
  auto in = static_cast<const InT*>(a.input);
  auto grad = static_cast<const InT*>(a.grad);
  auto out = static_cast<OutT*>(a.output);
  auto out_t = static_cast<OutT*>(a.output_t);
  cudaStream_t s = to_stream(a.stream);
  switch (a.kind) {
    case ActKind::kForward:
      launch_tiles<ActProducer<Op, InT>, OutT, true, false>(
          {{in, a.cols}}, out, out_t, a.rows, a.cols, a.scale, a.amax, a.scale_inv, nullptr, s);
      break;
    case ActKind::kGatedForward:
      launch_tiles<GatedActProducer<Op, InT>, OutT, true, false>(
          {in, a.cols}, out, out_t, a.rows, a.cols, a.scale, a.amax, a.scale_inv, nullptr, s);
      break;
    case ActKind::kBackward:
      launch_tiles<DActProducer<Op, InT>, OutT, true, true>(
          {grad, in, a.cols}, out, out_t, a.rows, a.cols, a.scale, a.amax, a.scale_inv,
          a.partial, s, a.dbias, a.dbias_dtype);
      break;
    case ActKind::kGatedBackward:
      launch_tiles<DGatedActProducer<Op, InT>, OutT, true, true>(
          {grad, in, a.cols / 2}, out, out_t, a.rows, a.cols, a.scale, a.amax, a.scale_inv,
          a.partial, s, a.dbias, a.dbias_dtype);
      break;
  }
}

template <NVTEActivation A>
void launch_act_cast_transpose(const ActTransposeArgs& a) {
  using Op = typename act::OpOf<A>::type;
  TE_SWITCH_HP(a.in_dtype, InT, "input",
    TE_SWITCH_FP8(a.out_dtype, OutT, "output", launch_act_typed<Op, InT, OutT>(a)));
}

}  // namespace tile_transpose
}  // namespace te

// One line per activation file: compiles every fused cast+transpose kernel of that activation.
#define TE_INSTANTIATE_ACT_CAST_TRANSPOSE(A)                                                 \
  namespace te {                                                                            \
  namespace tile_transpose {                                                                \
  template void launch_act_cast_transpose<A>(const ActTransposeArgs&);                      \
  }                                                                                         \
  }
