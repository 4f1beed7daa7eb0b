// C entry points of the softmax forward family (see transformer_engine/softmax.h).
#include "softmax/softmax_checks.h"
#include "softmax/softmax_kernels.cuh"
#include "transformer_engine/softmax.h"

namespace te {
namespace softmax {
namespace {

template <int kMode>
void forward(const NVTETensor* input, const uint8_t* mask, const MaskGeometry& geo,
             NVTETensor* output, float scale, NVTEStream stream) {
  const int min_dims = kMode == kPlain ? 1 : (kMode == kMasked ? 4 : 2);
  const Rows r = check_softmax_input(input, "input", min_dims);
  check_same(output, "output", *input, "input");
  const bool aligned = aligned16(input->data) && aligned16(output->data) &&
                       (mask == nullptr || (reinterpret_cast<uintptr_t>(mask) & 7u) == 0);
  auto run = [&](auto tag) {
    using T = decltype(tag);
    FwdArgs<T> a{static_cast<const T*>(input->data), mask, static_cast<T*>(output->data),
                 r.rows, static_cast<int>(r.cols), 0, scale * kLog2e, geo};
    launch_fwd<T, kMode>(a, aligned, to_stream(stream));
  };
  if (input->dtype == kNVTEFloat16)
    run(fp16{});
  else
    run(bf16{});
}

MaskGeometry check_mask(const NVTETensor* input, const NVTETensor* mask) {
  check_tensor(mask, "mask");
  TE_CHECK_ARG(nvte_dtype_size(mask->dtype) == 1 && !is_fp8(mask->dtype), "mask has dtype ",
               nvte_dtype_name(mask->dtype), "; expected one-byte booleans (uint8 / bool)");
  const int64_t* s = input->shape;
  const int64_t* m = mask->shape;
  const bool ok = mask->ndim == 4 && (m[0] == 1 || m[0] == s[0]) && (m[1] == 1 || m[1] == s[1]) &&
                  m[2] == s[2] && m[3] == s[3];
  TE_CHECK_ARG(ok, "mask has shape ", shape_str(*mask), "; expected [", s[0], " or 1, ", s[1],
               " or 1, ", s[2], ", ", s[3], "] for input ", shape_str(*input));
  return MaskGeometry{s[2] > 0 ? s[2] : 1, s[1] > 0 ? s[1] : 1, m[0], m[1]};
}

}  // namespace
}  // namespace softmax
}  // namespace te

using namespace te;
using namespace te::softmax;

extern "C" NVTEStatus nvte_scaled_softmax_forward(const NVTETensor* input, NVTETensor* output,
                                                  float scale, NVTEStream stream) {
  return guard("nvte_scaled_softmax_forward", [&] {
    forward<kPlain>(input, nullptr, MaskGeometry{1, 1, 1, 1}, output, scale, stream);
  });
}

extern "C" NVTEStatus nvte_scaled_masked_softmax_forward(const NVTETensor* input,
                                                         const NVTETensor* mask,
                                                         NVTETensor* output, float scale,
                                                         NVTEStream stream) {
  return guard("nvte_scaled_masked_softmax_forward", [&] {
    check_softmax_input(input, "input", 4);
    TE_CHECK_ARG(input->ndim == 4, "input has shape ", shape_str(*input),
                 "; expected [b, h, sq, sk]");
    const MaskGeometry geo = check_mask(input, mask);
    forward<kMasked>(input, static_cast<const uint8_t*>(mask->data), geo, output, scale, stream);
  });
}

extern "C" NVTEStatus nvte_scaled_upper_triang_masked_softmax_forward(const NVTETensor* input,
                                                                      NVTETensor* output,
                                                                      float scale,
                                                                      NVTEStream stream) {
  return guard("nvte_scaled_upper_triang_masked_softmax_forward", [&] {
    check_softmax_input(input, "input", 2);
    const int64_t sq = check_causal_shape(*input, "input");
    forward<kCausal>(input, nullptr, MaskGeometry{sq > 0 ? sq : 1, 1, 1, 1}, output, scale,
                     stream);
  });
}
