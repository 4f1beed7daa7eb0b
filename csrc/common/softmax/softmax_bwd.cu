// C entry points of the softmax backward family (see transformer_engine/softmax.h).
#include "softmax/softmax_checks.h"
#include "softmax/softmax_kernels.cuh"
#include "transformer_engine/softmax.h"

namespace te {
namespace softmax {
namespace {

template <bool kIsCausal>
void backward(const NVTETensor* grad_output, const NVTETensor* softmax_output,
              NVTETensor* grad_input, float scale, NVTEStream stream) {
  const Rows r = check_softmax_input(softmax_output, "softmax_output", kIsCausal ? 2 : 1);
  check_same(grad_output, "grad_output", *softmax_output, "softmax_output");
  check_same(grad_input, "grad_input", *softmax_output, "softmax_output");
  int64_t sq = 1;
  if (kIsCausal) {
    sq = check_causal_shape(*softmax_output, "softmax_output");
    if (sq == 0) sq = 1;
  }
  // grad_input may alias grad_output (in-place backward): every element is read before the
  // thread that owns it writes it.
  const bool aligned = aligned16(grad_output->data) && aligned16(softmax_output->data) &&
                       aligned16(grad_input->data);
  auto run = [&](auto tag) {
    using T = decltype(tag);
    BwdArgs<T> a{static_cast<const T*>(grad_output->data),
                 static_cast<const T*>(softmax_output->data), static_cast<T*>(grad_input->data),
                 r.rows, static_cast<int>(r.cols), 0, scale, sq};
    launch_bwd<T, kIsCausal>(a, aligned, to_stream(stream));
  };
  if (softmax_output->dtype == kNVTEFloat16)
    run(fp16{});
  else
    run(bf16{});
}

}  // namespace
}  // namespace softmax
}  // namespace te

using namespace te;
using namespace te::softmax;

extern "C" NVTEStatus nvte_scaled_softmax_backward(const NVTETensor* grad_output,
                                                   const NVTETensor* softmax_output,
                                                   NVTETensor* grad_input, float scale,
                                                   NVTEStream stream) {
  return guard("nvte_scaled_softmax_backward", [&] {
    backward<false>(grad_output, softmax_output, grad_input, scale, stream);
  });
}

extern "C" NVTEStatus nvte_scaled_masked_softmax_backward(const NVTETensor* grad_output,
                                                          const NVTETensor* softmax_output,
                                                          NVTETensor* grad_input, float scale,
                                                          NVTEStream stream) {
  // Masked elements have y == 0, so the unmasked formula gives them a zero gradient.
  return guard("nvte_scaled_masked_softmax_backward", [&] {
    backward<false>(grad_output, softmax_output, grad_input, scale, stream);
  });
}

extern "C" NVTEStatus nvte_scaled_upper_triang_masked_softmax_backward(
    const NVTETensor* grad_output, const NVTETensor* softmax_output, NVTETensor* grad_input,
    float scale, NVTEStream stream) {
  return guard("nvte_scaled_upper_triang_masked_softmax_backward", [&] {
    backward<true>(grad_output, softmax_output, grad_input, scale, stream);
  });
}
