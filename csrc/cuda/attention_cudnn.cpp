// NVIDIA build of the vendor attention interface: cuDNN's fused flash attention through the
// cudnn-frontend graph API. Optional at build time (NVTE_WITH_CUDNN, set by CMake when cudnn.h
// and the frontend headers were found); libcudnn is opened at run time, so a machine without it
// still imports the library and reports why this backend is unavailable.
//
// Graphs are built once per (device, configuration) and cached per thread; a call then only
// fills the variant pack and executes. The caller's workspace holds the sequence lengths and
// ragged offsets this file derives from cu_seqlens, then cuDNN's own workspace.
#include "attention/attention_backend.h"
#include "util/error.h"

#if !NVTE_WITH_CUDNN

namespace te {
namespace attention {

void vendor_check(const AttnArgs&, int) {
  TE_UNSUPPORTED("not built: cuDNN headers not found at build time (pip install "
                 "nvidia-cudnn-cu13 nvidia-cudnn-frontend, then rebuild)");
}
size_t vendor_workspace_size(const AttnArgs& a, bool, int device) {
  vendor_check(a, device);
  return 0;
}
void vendor_forward(const AttnArgs& a) { vendor_check(a, 0); }
void vendor_backward(const AttnArgs& a) { vendor_check(a, 0); }

}  // namespace attention
}  // namespace te

#else  // NVTE_WITH_CUDNN

#include <cuda_runtime.h>
#include <dlfcn.h>

#include <array>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>

#include <cudnn_frontend.h>

#include "attention_cudnn_aux.h"

// The frontend, built with NV_CUDNN_FRONTEND_USE_DYNAMIC_LOADING, resolves cuDNN through this.
namespace cudnn_frontend {
void* cudnn_dlhandle = nullptr;
}

namespace te {
namespace attention {
namespace {

namespace fe = cudnn_frontend;

#ifndef NVTE_CUDNN_LIBDIR
#define NVTE_CUDNN_LIBDIR ""
#endif

// Opens libcudnn once: the copy torch already loaded (same soname) or the build-time one.
const std::string& cudnn_load_error() {
  static std::string error = [] {
    void* h = dlopen("libcudnn.so.9", RTLD_NOW | RTLD_GLOBAL);
    if (h == nullptr && NVTE_CUDNN_LIBDIR[0] != '\0')
      h = dlopen((std::string(NVTE_CUDNN_LIBDIR) + "/libcudnn.so.9").c_str(),
                 RTLD_NOW | RTLD_GLOBAL);
    if (h == nullptr) return std::string("cuDNN library libcudnn.so.9 not loadable at run time (") +
                             dlerror() + "); pip install nvidia-cudnn-cu13";
    cudnn_frontend::cudnn_dlhandle = h;
    return std::string();
  }();
  return error;
}

enum Uid : int64_t {
  kQ = 1, kK, kV, kO, kStats, kDO, kDQ, kDK, kDV, kSeqQ, kSeqKV, kOffQ, kOffK, kOffV, kOffO
};

constexpr size_t kAuxAlign = 256;

size_t aux_bytes(const AttnArgs& a) {
  if (!a.uses_lengths) return 0;
  const size_t b = size_t(a.p.batch);
  size_t bytes = 2 * b * sizeof(int32_t);                                      // seqlens
  if (a.p.qkv_format == kNVTEQKVFormatTHD) bytes += 4 * (b + 1) * sizeof(int32_t);  // offsets
  return (bytes + kAuxAlign - 1) / kAuxAlign * kAuxAlign;
}

struct GraphKey {
  std::array<int64_t, 29> v;
  bool operator==(const GraphKey& o) const { return v == o.v; }
};
struct GraphKeyHash {
  size_t operator()(const GraphKey& k) const {
    uint64_t h = 1469598103934665603ull;
    for (int64_t x : k.v) {
      h ^= static_cast<uint64_t>(x);
      h *= 1099511628211ull;
    }
    return static_cast<size_t>(h);
  }
};

GraphKey key_of(const AttnArgs& a, bool bwd, int device) {
  const NVTEAttnParams& p = a.p;
  uint32_t scale_bits;
  static_assert(sizeof(scale_bits) == sizeof(p.softmax_scale), "float is 32-bit");
  std::memcpy(&scale_bits, &p.softmax_scale, sizeof(scale_bits));
  // the graphs are built for the tensors' strides (packed projections differ from dense ones)
  const LayoutStrides* st[4] = {&a.stride_q, &a.stride_k, &a.stride_v, &a.stride_o};
  GraphKey key{{device, bwd ? 1 : 0, p.batch, p.num_heads_q, p.num_heads_kv, p.max_seqlen_q,
                p.max_seqlen_kv, p.head_dim_qk, p.head_dim_v, p.dtype, p.qkv_format,
                p.mask_type, a.window_left, a.window_right, scale_bits,
                p.deterministic ? 1 : 0, 0}};
  for (int t = 0; t < 4; ++t)
    for (int i = 0; i < 3; ++i) key.v[17 + 3 * t + i] = st[t]->v[i];
  return key;
}

// Strides of the [b, h, s, d] view cuDNN takes of a tensor with layout strides `s` (seqlen =
// the padded extent; THD's batch stride is a placeholder: its ragged offsets place sequences).
std::vector<int64_t> strides_of(const AttnArgs& a, const LayoutStrides& s, int64_t seqlen) {
  switch (a.p.qkv_format) {
    case kNVTEQKVFormatBSHD: return {s.v[0], s.v[2], s.v[1], 1};
    case kNVTEQKVFormatSBHD: return {s.v[1], s.v[2], s.v[0], 1};
    default: return {seqlen * s.v[0], s.v[1], s.v[0], 1};  // THD (ragged)
  }
}

struct CachedGraph {
  std::shared_ptr<fe::graph::Graph> graph;
  int64_t workspace = 0;
  std::string error;  // non-empty: cuDNN refused this configuration
};

cudnnHandle_t handle_for(int device) {
  thread_local std::unordered_map<int, cudnnHandle_t> handles;
  auto it = handles.find(device);
  if (it != handles.end()) return it->second;
  int previous = 0;
  cudaGetDevice(&previous);
  cudaSetDevice(device);
  cudnnHandle_t h = nullptr;
  const cudnnStatus_t st = fe::detail::create_handle(&h);
  cudaSetDevice(previous);
  if (st != CUDNN_STATUS_SUCCESS)
    throw Error(kNVTEDeviceError, concat("cudnnCreate failed with status ", int(st)));
  handles.emplace(device, h);
  return h;
}

fe::DataType_t fe_dtype(NVTEDType t) {
  return t == kNVTEFloat16 ? fe::DataType_t::HALF : fe::DataType_t::BFLOAT16;
}

using TensorPtr = std::shared_ptr<fe::graph::Tensor_attributes>;

struct GraphInputs {
  TensorPtr q, k, v, seq_q, seq_kv, off_q, off_k, off_v, off_o;
};

TensorPtr make_tensor(fe::graph::Graph& g, const char* name, int64_t uid,
                      std::vector<int64_t> dims, std::vector<int64_t> strides) {
  return g.tensor(fe::graph::Tensor_attributes().set_name(name).set_uid(uid).set_dim(dims)
                      .set_stride(strides));
}

TensorPtr make_int_tensor(fe::graph::Graph& g, const char* name, int64_t uid, int64_t n) {
  return g.tensor(fe::graph::Tensor_attributes().set_name(name).set_uid(uid)
                      .set_dim({n, 1, 1, 1}).set_stride({1, 1, 1, 1})
                      .set_data_type(fe::DataType_t::INT32));
}

GraphInputs declare_inputs(fe::graph::Graph& g, const AttnArgs& a) {
  const NVTEAttnParams& p = a.p;
  GraphInputs in;
  in.q = make_tensor(g, "Q", kQ, {p.batch, p.num_heads_q, p.max_seqlen_q, p.head_dim_qk},
                     strides_of(a, a.stride_q, p.max_seqlen_q));
  in.k = make_tensor(g, "K", kK, {p.batch, p.num_heads_kv, p.max_seqlen_kv, p.head_dim_qk},
                     strides_of(a, a.stride_k, p.max_seqlen_kv));
  in.v = make_tensor(g, "V", kV, {p.batch, p.num_heads_kv, p.max_seqlen_kv, p.head_dim_v},
                     strides_of(a, a.stride_v, p.max_seqlen_kv));
  if (a.uses_lengths) {
    in.seq_q = make_int_tensor(g, "seq_q", kSeqQ, p.batch);
    in.seq_kv = make_int_tensor(g, "seq_kv", kSeqKV, p.batch);
  }
  if (p.qkv_format == kNVTEQKVFormatTHD) {
    in.off_q = make_int_tensor(g, "off_q", kOffQ, p.batch + 1);
    in.off_k = make_int_tensor(g, "off_k", kOffK, p.batch + 1);
    in.off_v = make_int_tensor(g, "off_v", kOffV, p.batch + 1);
    in.off_o = make_int_tensor(g, "off_o", kOffO, p.batch + 1);
    in.q->set_ragged_offset(in.off_q);
    in.k->set_ragged_offset(in.off_k);
    in.v->set_ragged_offset(in.off_v);
  }
  return in;
}

// Mask options shared by the forward and backward attributes.
template <typename Attrs>
void set_mask(Attrs& attrs, const AttnArgs& a, const GraphInputs& in) {
  attrs.set_attn_scale(a.p.softmax_scale);
  if (a.uses_lengths)
    attrs.set_padding_mask(true).set_seq_len_q(in.seq_q).set_seq_len_kv(in.seq_kv);
  const bool causal = mask_is_causal(a.p.mask_type);
  const bool windowed = a.window_left >= 0 || (!causal && a.window_right >= 0);
  if (!causal && !windowed) return;
  attrs.set_diagonal_alignment(a.bottom_right ? fe::DiagonalAlignment_t::BOTTOM_RIGHT
                                              : fe::DiagonalAlignment_t::TOP_LEFT);
  // cuDNN's left bound counts the diagonal: key j is kept when j > i + off - left_bound
  if (a.window_left >= 0) attrs.set_diagonal_band_left_bound(static_cast<int>(a.window_left + 1));
  if (a.window_right >= 0) attrs.set_diagonal_band_right_bound(static_cast<int>(a.window_right));
}

void build(CachedGraph& c, cudnnHandle_t handle) {
  auto status = c.graph->build(handle, {fe::HeurMode_t::A});
  if (!status.is_good()) {
    c.error = status.get_message();
    return;
  }
  status = c.graph->get_workspace_size(c.workspace);
  if (!status.is_good()) c.error = status.get_message();
}

std::shared_ptr<CachedGraph> build_forward(const AttnArgs& a, cudnnHandle_t handle) {
  const NVTEAttnParams& p = a.p;
  auto c = std::make_shared<CachedGraph>();
  c->graph = std::make_shared<fe::graph::Graph>();
  fe::graph::Graph& g = *c->graph;
  g.set_io_data_type(fe_dtype(p.dtype)).set_intermediate_data_type(fe::DataType_t::FLOAT)
      .set_compute_data_type(fe::DataType_t::FLOAT);
  GraphInputs in = declare_inputs(g, a);
  auto attrs = fe::graph::SDPA_attributes().set_name("fwd").set_generate_stats(true);
  set_mask(attrs, a, in);
  auto [o, stats] = g.sdpa(in.q, in.k, in.v, attrs);
  o->set_output(true).set_uid(kO)
      .set_dim({p.batch, p.num_heads_q, p.max_seqlen_q, p.head_dim_v})
      .set_stride(strides_of(a, a.stride_o, p.max_seqlen_q));
  if (p.qkv_format == kNVTEQKVFormatTHD) o->set_ragged_offset(in.off_o);
  stats->set_output(true).set_uid(kStats).set_data_type(fe::DataType_t::FLOAT)
      .set_dim({p.batch, p.num_heads_q, p.max_seqlen_q, 1})
      .set_stride({p.num_heads_q * p.max_seqlen_q, p.max_seqlen_q, 1, 1});
  build(*c, handle);
  return c;
}

std::shared_ptr<CachedGraph> build_backward(const AttnArgs& a, cudnnHandle_t handle) {
  const NVTEAttnParams& p = a.p;
  auto c = std::make_shared<CachedGraph>();
  c->graph = std::make_shared<fe::graph::Graph>();
  fe::graph::Graph& g = *c->graph;
  g.set_io_data_type(fe_dtype(p.dtype)).set_intermediate_data_type(fe::DataType_t::FLOAT)
      .set_compute_data_type(fe::DataType_t::FLOAT);
  GraphInputs in = declare_inputs(g, a);
  const auto o_strides = strides_of(a, a.stride_o, p.max_seqlen_q);
  const std::vector<int64_t> o_dims{p.batch, p.num_heads_q, p.max_seqlen_q, p.head_dim_v};
  auto o = make_tensor(g, "O", kO, o_dims, o_strides);
  auto d_o = make_tensor(g, "dO", kDO, o_dims, o_strides);
  auto stats = g.tensor(fe::graph::Tensor_attributes().set_name("stats").set_uid(kStats)
                            .set_dim({p.batch, p.num_heads_q, p.max_seqlen_q, 1})
                            .set_stride({p.num_heads_q * p.max_seqlen_q, p.max_seqlen_q, 1, 1})
                            .set_data_type(fe::DataType_t::FLOAT));
  if (p.qkv_format == kNVTEQKVFormatTHD) {
    o->set_ragged_offset(in.off_o);
    d_o->set_ragged_offset(in.off_o);
  }
  auto attrs = fe::graph::SDPA_backward_attributes().set_name("bwd");
  set_mask(attrs, a, in);
  if (p.deterministic) attrs.set_deterministic_algorithm(true);
  auto [dq, dk, dv] = g.sdpa_backward(in.q, in.k, in.v, o, d_o, stats, attrs);
  dq->set_output(true).set_uid(kDQ)
      .set_dim({p.batch, p.num_heads_q, p.max_seqlen_q, p.head_dim_qk})
      .set_stride(strides_of(a, a.stride_q, p.max_seqlen_q));
  dk->set_output(true).set_uid(kDK)
      .set_dim({p.batch, p.num_heads_kv, p.max_seqlen_kv, p.head_dim_qk})
      .set_stride(strides_of(a, a.stride_k, p.max_seqlen_kv));
  dv->set_output(true).set_uid(kDV)
      .set_dim({p.batch, p.num_heads_kv, p.max_seqlen_kv, p.head_dim_v})
      .set_stride(strides_of(a, a.stride_v, p.max_seqlen_kv));
  if (p.qkv_format == kNVTEQKVFormatTHD) {
    dq->set_ragged_offset(in.off_q);
    dk->set_ragged_offset(in.off_k);
    dv->set_ragged_offset(in.off_v);
  }
  build(*c, handle);
  return c;
}

// The cached graph of a configuration (built on first use). Throws kNVTEUnsupported when cuDNN
// is unavailable or refuses the configuration.
std::shared_ptr<CachedGraph> graph_for(const AttnArgs& a, bool bwd, int device) {
  const std::string& load_error = cudnn_load_error();
  if (!load_error.empty()) TE_UNSUPPORTED(load_error);
  if (a.p.batch == 0 || a.p.max_seqlen_q == 0 || a.p.max_seqlen_kv == 0)
    TE_UNSUPPORTED("cuDNN attention needs non-empty batch and sequences");
  thread_local std::unordered_map<GraphKey, std::shared_ptr<CachedGraph>, GraphKeyHash> cache;
  const GraphKey key = key_of(a, bwd, device);
  auto it = cache.find(key);
  if (it == cache.end()) {
    cudnnHandle_t handle = handle_for(device);
    int previous = 0;
    cudaGetDevice(&previous);
    cudaSetDevice(device);
    std::shared_ptr<CachedGraph> c;
    try {
      c = bwd ? build_backward(a, handle) : build_forward(a, handle);
    } catch (const std::exception& e) {
      c = std::make_shared<CachedGraph>();
      c->error = e.what();
    }
    cudaSetDevice(previous);
    it = cache.emplace(key, c).first;
  }
  if (!it->second->error.empty())
    TE_UNSUPPORTED("cuDNN has no ", bwd ? "backward" : "forward",
                   " kernel for this configuration: ", it->second->error);
  return it->second;
}

int current_device() {
  int device = 0;
  cudaGetDevice(&device);
  return device;
}

// Fills seqlens / offsets into the front of the workspace and the variant pack entries for them.
void prepare_lengths(const AttnArgs& a, std::unordered_map<int64_t, void*>& pack) {
  if (!a.uses_lengths) return;
  const NVTEAttnParams& p = a.p;
  int32_t* base = static_cast<int32_t*>(a.workspace);
  int32_t* seq_q = base;
  int32_t* seq_kv = base + p.batch;
  pack[kSeqQ] = seq_q;
  pack[kSeqKV] = seq_kv;
  int32_t *off_q = nullptr, *off_k = nullptr, *off_v = nullptr, *off_o = nullptr;
  if (p.qkv_format == kNVTEQKVFormatTHD) {
    off_q = base + 2 * p.batch;
    off_k = off_q + p.batch + 1;
    off_v = off_k + p.batch + 1;
    off_o = off_v + p.batch + 1;
    pack[kOffQ] = off_q;
    pack[kOffK] = off_k;
    pack[kOffV] = off_v;
    pack[kOffO] = off_o;
  }
  // THD: a sequence starts cu[i] tokens into each tensor (token strides; LayoutStrides v[0])
  CudnnRaggedStrides strides{a.stride_q.v[0], a.stride_k.v[0], a.stride_v.v[0], a.stride_o.v[0]};
  launch_seqlens_and_offsets(a.cu_q, a.cu_kv, static_cast<int>(p.batch), strides, seq_q, seq_kv,
                             off_q, off_k, off_v, off_o, a.stream);
  const cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess)
    throw Error(kNVTEDeviceError, concat("launch of seqlens_and_offsets_kernel failed: ",
                                         cudaGetErrorString(err)));
}

void execute(const AttnArgs& a, bool bwd, std::unordered_map<int64_t, void*>& pack) {
  const int device = current_device();
  auto c = graph_for(a, bwd, device);
  cudnnHandle_t handle = handle_for(device);
  prepare_lengths(a, pack);
  const cudnnStatus_t st = fe::detail::set_stream(handle, static_cast<cudaStream_t>(a.stream));
  if (st != CUDNN_STATUS_SUCCESS)
    throw Error(kNVTEDeviceError, concat("cudnnSetStream failed with status ", int(st)));
  void* ws = static_cast<char*>(a.workspace) + aux_bytes(a);
  auto status = c->graph->execute(handle, pack, c->workspace > 0 ? ws : nullptr);
  if (!status.is_good())
    throw Error(kNVTEDeviceError, concat("cuDNN attention ", bwd ? "backward" : "forward",
                                         " failed: ", status.get_message()));
}

}  // namespace

void vendor_check(const AttnArgs& a, int device) {
  if (a.p.dtype != kNVTEFloat16 && a.p.dtype != kNVTEBFloat16)
    TE_UNSUPPORTED("cuDNN attention takes float16 or bfloat16");
  graph_for(a, false, device);
  graph_for(a, true, device);
}

size_t vendor_workspace_size(const AttnArgs& a, bool is_backward, int device) {
  auto c = graph_for(a, is_backward, device);
  return aux_bytes(a) + static_cast<size_t>(c->workspace);
}

void vendor_forward(const AttnArgs& a) {
  std::unordered_map<int64_t, void*> pack{
      {kQ, const_cast<void*>(a.q)}, {kK, const_cast<void*>(a.k)},
      {kV, const_cast<void*>(a.v)}, {kO, a.o}, {kStats, a.lse}};
  execute(a, false, pack);
}

void vendor_backward(const AttnArgs& a) {
  std::unordered_map<int64_t, void*> pack{
      {kQ, const_cast<void*>(a.q)}, {kK, const_cast<void*>(a.k)},
      {kV, const_cast<void*>(a.v)}, {kO, a.o},
      {kDO, const_cast<void*>(a.d_o)}, {kStats, a.lse},
      {kDQ, a.dq}, {kDK, a.dk}, {kDV, a.dv}};
  execute(a, true, pack);
}

}  // namespace attention
}  // namespace te

#endif  // NVTE_WITH_CUDNN
