// The activation functions and their derivatives in fp32, one functor per activation.
//
// Every functor has value(x) = act(x) and deriv(x) = act'(x); the kernels in
// activation_kernels.cuh are templates over these, so an activation is five lines here plus a
// one-line instantiation file. Gelu (tanh form), qgelu and silu are all x * sigmoid(k(x)):
// 0.5 (1 + tanh(u)) == sigmoid(2u), so gelu needs one exp and one division like the others
// instead of a tanh. The fast exp / division intrinsics keep these kernels memory-bound at HBM3e
// bandwidth; their error (a few fp32 ulp) is far below the bf16/fp16 rounding of the outputs and
// within the fp32 tolerance of the tests.
#pragma once

#include "transformer_engine/activation.h"
#include "util/arch.h"

namespace te {
namespace act {

__device__ __forceinline__ float sigmoid(float z) {
  // z -> -inf: exp overflows to inf and the quotient is 0; z -> +inf: 1 / 1.
  return __fdividef(1.f, 1.f + __expf(-z));
}

// x * sigmoid(k(x)) with k'(x) given: the derivative is s + x s (1 - s) k'(x).
struct GeluTanh {
  static constexpr float kSqrt2OverPi = 0.7978845608028654f;
  static constexpr float kCubic = 0.044715f;
  __device__ static float value(float x) {
    const float u = kSqrt2OverPi * x * (1.f + kCubic * x * x);
    return x * sigmoid(2.f * u);
  }
  __device__ static float deriv(float x) {
    const float x2 = x * x;
    const float u = kSqrt2OverPi * x * (1.f + kCubic * x2);
    const float s = sigmoid(2.f * u);
    const float du = 2.f * kSqrt2OverPi * (1.f + 3.f * kCubic * x2);
    return s + x * s * (1.f - s) * du;
  }
};

struct Relu {
  __device__ static float value(float x) { return x > 0.f ? x : 0.f; }
  __device__ static float deriv(float x) { return x > 0.f ? 1.f : 0.f; }
};

struct QuickGelu {
  static constexpr float kAlpha = 1.702f;
  __device__ static float value(float x) { return x * sigmoid(kAlpha * x); }
  __device__ static float deriv(float x) {
    const float s = sigmoid(kAlpha * x);
    return s + kAlpha * x * s * (1.f - s);
  }
};

struct SquaredRelu {
  __device__ static float value(float x) { return x > 0.f ? x * x : 0.f; }
  __device__ static float deriv(float x) { return x > 0.f ? 2.f * x : 0.f; }
};

struct Silu {
  __device__ static float value(float x) { return x * sigmoid(x); }
  __device__ static float deriv(float x) {
    const float s = sigmoid(x);
    return s + x * s * (1.f - s);
  }
};

// Its gated form is glu: sigmoid(a) * b.
struct Sigmoid {
  __device__ static float value(float x) { return sigmoid(x); }
  __device__ static float deriv(float x) {
    const float s = sigmoid(x);
    return s * (1.f - s);
  }
};

// Maps the public enum to its functor at compile time.
template <NVTEActivation A> struct OpOf;
template <> struct OpOf<kNVTEGelu> { using type = GeluTanh; };
template <> struct OpOf<kNVTERelu> { using type = Relu; };
template <> struct OpOf<kNVTEQGelu> { using type = QuickGelu; };
template <> struct OpOf<kNVTESRelu> { using type = SquaredRelu; };
template <> struct OpOf<kNVTESilu> { using type = Silu; };
template <> struct OpOf<kNVTESigmoid> { using type = Sigmoid; };

}  // namespace act
}  // namespace te
