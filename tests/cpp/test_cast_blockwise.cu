// C API tests of nvte_quantize_blockwise (1x128 and 128x128 blocks, with the transposed output)
// against a CPU model of the block scaling rules in cast.h.
#include <cfloat>
#include <cmath>
#include <cstring>

#include "test_common.h"
#include "transformer_engine/cast.h"

using namespace te_test;

namespace {

float model_scale(float amax, float fp8_max, bool pow2) {
  float s = (amax > 0.f && amax <= FLT_MAX) ? fp8_max / amax : 1.f;
  if (std::isinf(s)) s = FLT_MAX;
  if (pow2) {
    uint32_t b;
    std::memcpy(&b, &s, 4);
    b &= 0xFF800000u;
    std::memcpy(&s, &b, 4);
  }
  return s;
}

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }
int64_t round_up4(int64_t a) { return (a + 3) / 4 * 4; }

// Blocks of a [rows, cols] row-major tensor x: 1x128 (block_dim 1) or 128x128. Writes the model's
// bytes and the scale_inv array in the layout of cast.h.
void model_quantize(const std::vector<float>& x, int64_t rows, int64_t cols, int block_dim,
                    bool pow2, bool e4m3, std::vector<uint8_t>& q, std::vector<float>& sinv) {
  const float fmax = host_fp8_max(e4m3);
  const int64_t bh = block_dim == 2 ? 128 : 1;
  const int64_t ld = block_dim == 2 ? round_up4(ceil_div(cols, 128)) : round_up4(rows);
  q.assign(size_t(rows * cols), 0);
  sinv.assign(size_t(block_dim == 2 ? ceil_div(rows, 128) * ld : ceil_div(cols, 128) * ld), 0.f);
  for (int64_t r0 = 0; r0 < rows; r0 += bh)
    for (int64_t c0 = 0; c0 < cols; c0 += 128) {
      const int64_t r1 = std::min(r0 + bh, rows), c1 = std::min(c0 + 128, cols);
      float amax = 0.f;
      for (int64_t r = r0; r < r1; ++r)
        for (int64_t c = c0; c < c1; ++c) amax = std::fmax(amax, std::fabs(x[r * cols + c]));
      const float s = model_scale(amax, fmax, pow2);
      for (int64_t r = r0; r < r1; ++r)
        for (int64_t c = c0; c < c1; ++c) q[r * cols + c] = host_fp8(x[r * cols + c] * s, e4m3);
      const size_t at = block_dim == 2 ? size_t((r0 / 128) * ld + c0 / 128) : size_t((c0 / 128) * ld + r0);
      sinv[at] = 1.f / s;
    }
}

void check_blockwise(int64_t rows, int64_t cols, int block_dim, bool pow2, bool e4m3, unsigned seed) {
  const size_t n = size_t(rows * cols);
  std::vector<float> x = random_floats(n, seed, 30.f);
  std::vector<__nv_bfloat16> xb(n);
  for (size_t i = 0; i < n; ++i) {
    xb[i] = __float2bfloat16_rn(x[i]);
    x[i] = __bfloat162float(xb[i]);
  }
  std::vector<float> xt(n);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) xt[c * rows + r] = x[r * cols + c];
  std::vector<uint8_t> want, want_t;
  std::vector<float> want_s, want_st;
  model_quantize(x, rows, cols, block_dim, pow2, e4m3, want, want_s);
  model_quantize(xt, cols, rows, block_dim, pow2, e4m3, want_t, want_st);
  if (block_dim == 2) want_t.clear();  // 2-D: the transpose holds the same bytes, checked below
  DeviceBuffer<__nv_bfloat16> in(xb);
  DeviceBuffer<uint8_t> out(n), out_t(n);
  DeviceBuffer<float> s(std::vector<float>(want_s.size(), 0.f)), st(std::vector<float>(want_st.size(), 0.f));
  const NVTEDType t8 = e4m3 ? kNVTEFloat8E4M3 : kNVTEFloat8E5M2;
  NVTETensor i = desc(in.ptr, {rows, cols}, kNVTEBFloat16);
  NVTETensor o = desc(out.ptr, {rows, cols}, t8, nullptr, nullptr, s.ptr);
  NVTETensor ot = desc(out_t.ptr, {cols, rows}, t8, nullptr, nullptr, st.ptr);
  TE_EXPECT(nvte_blockwise_scale_elems(rows, cols, block_dim) == want_s.size(), "scale elems");
  TE_EXPECT(nvte_quantize_blockwise(&i, &o, &ot, block_dim, pow2, nullptr) == kNVTESuccess, "%s",
            nvte_last_error_message());
  TE_EXPECT(cuda_ok(), "sync");
  auto got = out.download(), got_t = out_t.download();
  auto got_s = s.download(), got_st = st.download();
  int bad = 0;
  for (size_t k = 0; k < n; ++k) bad += got[k] != want[k];
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c)
      bad += got_t[c * rows + r] != (block_dim == 2 ? want[r * cols + c] : want_t[c * rows + r]);
  for (size_t k = 0; k < want_s.size(); ++k) bad += got_s[k] != want_s[k];
  if (block_dim == 1)
    for (size_t k = 0; k < want_st.size(); ++k) bad += got_st[k] != want_st[k];
  TE_EXPECT(bad == 0, "%d mismatches at %lld x %lld, block_dim %d, pow2 %d, e4m3 %d", bad,
            (long long)rows, (long long)cols, block_dim, int(pow2), int(e4m3));
}

}  // namespace

TE_TEST(quantize_blockwise_matches_cpu) {
  const int64_t shapes[][2] = {{37, 23}, {128, 128}, {130, 300}, {256, 1024}, {1, 1}, {300, 129}};
  unsigned seed = 3;
  for (auto& sh : shapes)
    for (int dim = 1; dim <= 2; ++dim)
      for (int pow2 = 0; pow2 < 2; ++pow2)
        for (int e4m3 = 0; e4m3 < 2; ++e4m3) check_blockwise(sh[0], sh[1], dim, pow2, e4m3, seed++);
}

TE_TEST(quantize_blockwise_rejects_bad_arguments) {
  DeviceBuffer<float> in(std::vector<float>(64 * 32, 1.f)), s(std::vector<float>(64, 0.f));
  DeviceBuffer<uint8_t> out(64 * 32);
  NVTETensor i = desc(in.ptr, {64, 32}, kNVTEFloat32);
  NVTETensor o = desc(out.ptr, {64, 32}, kNVTEFloat8E4M3, nullptr, nullptr, s.ptr);
  TE_EXPECT(nvte_quantize_blockwise(&i, &o, nullptr, 3, true, nullptr) == kNVTEInvalidArgument,
            "block_dim 3 accepted");
  TE_EXPECT(std::strstr(nvte_last_error_message(), "block_dim") != nullptr, "%s",
            nvte_last_error_message());
  NVTETensor bad_t = desc(out.ptr, {64, 32}, kNVTEFloat8E4M3, nullptr, nullptr, s.ptr);
  TE_EXPECT(nvte_quantize_blockwise(&i, &o, &bad_t, 1, true, nullptr) == kNVTEInvalidArgument,
            "a non-transposed output_t accepted");
  NVTETensor no_sinv = desc(out.ptr, {64, 32}, kNVTEFloat8E4M3);
  TE_EXPECT(nvte_quantize_blockwise(&i, &no_sinv, nullptr, 1, true, nullptr) == kNVTEInvalidArgument,
            "a missing scale_inv accepted");
}
