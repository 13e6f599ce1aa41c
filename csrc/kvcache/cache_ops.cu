// CUDA kernels for the KV-cache ops. Data movement only: 16-byte vector copies when every
// pointer and stride allows it, element-sized copies otherwise.
#include <cstdint>
#include <vector>

#include <type_traits>

#include "common/device_memory.h"
#include "common/elem_device.cuh"
#include "common/grid.h"
#include "common/kv_quant.h"
#include "common/simt.h"
#include "kvcache/cache_ops.h"

namespace llmk {
namespace gpu {

namespace {

struct RowCopy {  // byte strides of one side of a [token|slot] -> [heads, head_dim] copy
  char* base;
  int64_t s0, s1, s2;  // token/block, (slot in block), head
};

LLMK_DEVICE int64_t slot_at(const void* slots, bool slots64, int64_t t) {
  return slots64 ? static_cast<const int64_t*>(slots)[t] : static_cast<const int32_t*>(slots)[t];
}

template <typename U>
__global__ void reshape_and_cache_kernel(RowCopy key, RowCopy value, RowCopy kc, RowCopy vc,
                                         const void* slots, bool slots64, int heads, int row_units,
                                         int block_size) {
  const int64_t t = blockIdx.x;
  const int64_t slot = slot_at(slots, slots64, t);
  if (slot < 0) return;  // padding token
  const int64_t blk = slot / block_size, off = slot % block_size;
  for (int i = threadIdx.x; i < heads * row_units; i += blockDim.x) {
    const int h = i / row_units, u = i % row_units;
    const int64_t src = t * key.s0 + h * key.s1 + u * int64_t(sizeof(U));
    const int64_t vsrc = t * value.s0 + h * value.s1 + u * int64_t(sizeof(U));
    *reinterpret_cast<U*>(kc.base + blk * kc.s0 + off * kc.s1 + h * kc.s2 + u * int64_t(sizeof(U))) =
        *reinterpret_cast<const U*>(key.base + src);
    *reinterpret_cast<U*>(vc.base + blk * vc.s0 + off * vc.s1 + h * vc.s2 + u * int64_t(sizeof(U))) =
        *reinterpret_cast<const U*>(value.base + vsrc);
  }
}

// Quantised write: element by element, x in T -> 1-byte code with the kv head's scale.
template <typename T>
__global__ void reshape_and_cache_quant_kernel(RowCopy key, RowCopy value, RowCopy kc, RowCopy vc,
                                               const void* slots, bool slots64, int heads, int d,
                                               int block_size, KvGeom q) {
  const int64_t t = blockIdx.x;
  const int64_t slot = slot_at(slots, slots64, t);
  if (slot < 0) return;  // padding token
  const int64_t blk = slot / block_size, off = slot % block_size;
  char* kd = kc.base + blk * kc.s0 + off * kc.s1;
  char* vd = vc.base + blk * vc.s0 + off * vc.s1;
  for (int h = 0; h < heads; ++h) {  // one head row at a time, a feature per thread
    const T* ks = reinterpret_cast<const T*>(key.base + t * key.s0 + h * key.s1);
    const T* vs = reinterpret_cast<const T*>(value.base + t * value.s0 + h * value.s1);
    const float ksc = kvq::head_scale(q.k_scale, q.k_scale_stride, h);
    const float vsc = kvq::head_scale(q.v_scale, q.v_scale_stride, h);
    for (int e = threadIdx.x; e < d; e += blockDim.x) {
      kd[h * kc.s2 + e] = static_cast<char>(kvq::quantize(ld(ks[e]), ksc, q.kv_quant));
      vd[h * vc.s2 + e] = static_cast<char>(kvq::quantize(ld(vs[e]), vsc, q.kv_quant));
    }
  }
}

template <typename U>
__global__ void copy_blocks_kernel(const int64_t* layer_ptrs, const void* mapping, bool mapping64,
                                   int64_t block_stride, int64_t block_units, int64_t pair0) {
  char* base = reinterpret_cast<char*>(layer_ptrs[blockIdx.x]);  // K0, V0, K1, V1, ...
  const int64_t p = pair0 + blockIdx.y;
  const int64_t src = mapping64 ? static_cast<const int64_t*>(mapping)[2 * p]
                                : static_cast<const int32_t*>(mapping)[2 * p];
  const int64_t dst = mapping64 ? static_cast<const int64_t*>(mapping)[2 * p + 1]
                                : static_cast<const int32_t*>(mapping)[2 * p + 1];
  const U* s = reinterpret_cast<const U*>(base + src * block_stride);
  U* d = reinterpret_cast<U*>(base + dst * block_stride);
  for (int64_t i = threadIdx.x; i < block_units; i += blockDim.x) d[i] = s[i];
}

bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15) == 0; }

RowCopy row_copy(const TensorView& t, bool cache) {
  const int64_t es = static_cast<int64_t>(t.elem_size());
  if (cache) return {t.bytes(), t.stride(0) * es, t.stride(1) * es, t.stride(2) * es};
  return {t.bytes(), t.stride(0) * es, t.stride(1) * es, 0};
}

bool all16(std::initializer_list<RowCopy> rs) {
  for (const RowCopy& r : rs)
    if (!aligned16(r.base) || r.s0 % 16 || r.s1 % 16 || r.s2 % 16) return false;
  return true;
}

}  // namespace

void reshape_and_cache_flash(const TensorView& key, const TensorView& value,
                             const TensorView& key_cache, const TensorView& value_cache,
                             const TensorView& slot_mapping, const KvGeom& quant,
                             int64_t stream) {
  const RowCopy k = row_copy(key, false), v = row_copy(value, false);
  const RowCopy kc = row_copy(key_cache, true), vc = row_copy(value_cache, true);
  const int64_t row_bytes = key_cache.size(3) * static_cast<int64_t>(key.elem_size());
  const int heads = static_cast<int>(key_cache.size(2));
  const int block_size = static_cast<int>(key_cache.size(1));
  const unsigned grid = static_cast<unsigned>(slot_mapping.size(0));
  const bool s64 = slot_mapping.dtype == DType::I64;
  if (quant.kv_quant != KvQuant::None) {
    const int d = static_cast<int>(key_cache.size(3));
    by_dtype(key.dtype, [&](auto* tag) {
      using T = std::remove_pointer_t<decltype(tag)>;
      auto quant_kernel = &reshape_and_cache_quant_kernel<T>;
      LLMK_LAUNCH(quant_kernel, grid, 128, 0, stream)(k, v, kc, vc, slot_mapping.data, s64, heads, d,
                                                      block_size, quant);
    });
  } else if (row_bytes % 16 == 0 && all16({k, v, kc, vc})) {
    const int units = static_cast<int>(row_bytes / 16);
    const int threads = heads * units < 256 ? ((heads * units + 31) / 32) * 32 : 256;
    LLMK_LAUNCH(reshape_and_cache_kernel<uint4>, grid, threads, 0, stream)(
        k, v, kc, vc, slot_mapping.data, s64, heads, units, block_size);
  } else if (key.elem_size() == 4) {
    const int units = static_cast<int>(row_bytes / 4);
    LLMK_LAUNCH(reshape_and_cache_kernel<uint32_t>, grid, 128, 0, stream)(
        k, v, kc, vc, slot_mapping.data, s64, heads, units, block_size);
  } else {
    const int units = static_cast<int>(row_bytes / 2);
    LLMK_LAUNCH(reshape_and_cache_kernel<uint16_t>, grid, 128, 0, stream)(
        k, v, kc, vc, slot_mapping.data, s64, heads, units, block_size);
  }
  check_launch("reshape_and_cache_flash");
}

void copy_blocks(const std::vector<TensorView>& key_caches,
                 const std::vector<TensorView>& value_caches, const TensorView& block_mapping,
                 const TensorView* layer_ptrs, int64_t stream) {
  const TensorView& k0 = key_caches[0];
  const int64_t es = static_cast<int64_t>(k0.elem_size());
  const int64_t block_bytes = k0.numel() / k0.size(0) * es;
  const int64_t block_stride = k0.stride(0) * es;
  bool vec = block_bytes % 16 == 0 && block_stride % 16 == 0;
  for (size_t l = 0; l < key_caches.size() && vec; ++l)
    vec = aligned16(key_caches[l].data) && aligned16(value_caches[l].data);
  const bool m64 = block_mapping.dtype == DType::I64;
  // CUDA caches come with a device table of base pointers (checked by the front). Host-memory
  // caches (the SIMT emulator) can use a table on the host.
  std::vector<int64_t> host_table;
  const int64_t* table = layer_ptrs ? layer_ptrs->ptr<const int64_t>() : nullptr;
  if (!table) {
    for (size_t l = 0; l < key_caches.size(); ++l) {
      host_table.push_back(reinterpret_cast<int64_t>(key_caches[l].data));
      host_table.push_back(reinterpret_cast<int64_t>(value_caches[l].data));
    }
    table = host_table.data();
  }
  // Pairs go on grid y (at most 65,535 per launch).
  for_each_grid_chunk(block_mapping.size(0), [&](int64_t first, unsigned count) {
    const dim3 grid(static_cast<unsigned>(2 * key_caches.size()), count);
    if (vec) {
      LLMK_LAUNCH(copy_blocks_kernel<uint4>, grid, 256, 0, stream)(
          table, block_mapping.data, m64, block_stride, block_bytes / 16, first);
    } else if (es == 4) {
      LLMK_LAUNCH(copy_blocks_kernel<uint32_t>, grid, 256, 0, stream)(
          table, block_mapping.data, m64, block_stride, block_bytes / 4, first);
    } else if (es == 1) {  // quantised caches (fp8 / int8 codes)
      LLMK_LAUNCH(copy_blocks_kernel<uint8_t>, grid, 256, 0, stream)(
          table, block_mapping.data, m64, block_stride, block_bytes, first);
    } else {
      LLMK_LAUNCH(copy_blocks_kernel<uint16_t>, grid, 256, 0, stream)(
          table, block_mapping.data, m64, block_stride, block_bytes / 2, first);
    }
  });
  check_launch("copy_blocks");
}

}  // namespace gpu
}  // namespace llmk
