// AMD build of the vendor attention interface: there is no vendor-fused backend on ROCm yet, so
// the public enum's cuDNN entry reports "unsupported" and the portable kernel serves AMD.
#include "attention/attention_backend.h"
#include "util/error.h"

namespace te {
namespace attention {

void vendor_check(const AttnArgs&, int) {
  TE_UNSUPPORTED("the cudnn backend is NVIDIA-only; this is a ROCm build (use the portable "
                 "backend)");
}
size_t vendor_workspace_size(const AttnArgs& a, bool, int device) {
  vendor_check(a, device);
  return 0;
}
void vendor_forward(const AttnArgs& a) { vendor_check(a, 0); }
void vendor_backward(const AttnArgs& a) { vendor_check(a, 0); }

}  // namespace attention
}  // namespace te
