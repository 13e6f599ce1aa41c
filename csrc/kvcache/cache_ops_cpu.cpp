// CPU kernels for the KV-cache ops: pure data movement, parallel over tokens / block pairs.
#include <cstring>

#include "common/kv_quant.h"
#include "common/parallel.h"
#include "common/vec_cpu.h"
#include "kvcache/cache_ops.h"

LLMK_NS_BEGIN

namespace {

// Quantised write of one token's [heads, head_dim] row (key dtype DT -> 1-byte codes).
template <DType DT>
void quantize_token(const TensorView& src, const TensorView& dst, int64_t t, int64_t blk,
                    int64_t off, const float* scales, int scale_stride, KvQuant q) {
  using E = vec::elem_t<DT>;
  const int64_t heads = dst.size(2), d = dst.size(3);
  for (int64_t h = 0; h < heads; ++h) {
    const E* s = src.ptr<const E>() + t * src.stride(0) + h * src.stride(1);
    uint8_t* o = reinterpret_cast<uint8_t*>(dst.bytes()) + blk * dst.stride(0) +
                 off * dst.stride(1) + h * dst.stride(2);
    const float sc = kvq::head_scale(scales, scale_stride, int(h));
    for (int64_t i = 0; i < d; ++i) o[i] = kvq::quantize(vec::to_f32<DT>(s[i]), sc, q);
  }
}

}  // namespace

void reshape_and_cache_flash(const TensorView& key, const TensorView& value,
                             const TensorView& key_cache, const TensorView& value_cache,
                             const TensorView& slot_mapping, const KvGeom& quant,
                             int64_t /*stream*/) {
  const int64_t n = slot_mapping.size(0), heads = key_cache.size(2);
  const int64_t block_size = key_cache.size(1);
  const size_t es = key.elem_size();
  const size_t row = static_cast<size_t>(key_cache.size(3)) * es;
  const bool i64 = slot_mapping.dtype == DType::I64;
  // Whole [heads, head_dim] rows move with one memcpy when both sides are packed.
  auto copy_token = [&](const TensorView& src, const TensorView& dst, int64_t t, int64_t blk,
                        int64_t off) {
    const char* s = src.bytes() + t * src.stride(0) * es;
    char* d = dst.bytes() + (blk * dst.stride(0) + off * dst.stride(1)) * es;
    if (src.stride(1) * es == row && dst.stride(2) * es == row) {
      std::memcpy(d, s, row * heads);
    } else {
      for (int64_t h = 0; h < heads; ++h)
        std::memcpy(d + h * dst.stride(2) * es, s + h * src.stride(1) * es, row);
    }
  };
  parallel_for(n, 64, [&](int64_t b, int64_t e) {
    for (int64_t t = b; t < e; ++t) {
      const int64_t slot = i64 ? slot_mapping.ptr<const int64_t>()[t] : slot_mapping.ptr<const int32_t>()[t];
      if (slot < 0) continue;  // padding token
      const int64_t blk = slot / block_size, off = slot % block_size;
      if (quant.kv_quant != KvQuant::None) {
        vec::dispatch_elem(key.dtype, [&](auto tag) {
          constexpr DType DT = decltype(tag)::value;
          quantize_token<DT>(key, key_cache, t, blk, off, quant.k_scale, quant.k_scale_stride,
                             quant.kv_quant);
          quantize_token<DT>(value, value_cache, t, blk, off, quant.v_scale, quant.v_scale_stride,
                             quant.kv_quant);
        });
        continue;
      }
      copy_token(key, key_cache, t, blk, off);
      copy_token(value, value_cache, t, blk, off);
    }
  });
}

void copy_blocks(const std::vector<TensorView>& key_caches,
                 const std::vector<TensorView>& value_caches, const TensorView& block_mapping,
                 const TensorView* /*layer_ptrs*/, int64_t /*stream*/) {
  const int64_t layers = static_cast<int64_t>(key_caches.size()), pairs = block_mapping.size(0);
  const TensorView& k0 = key_caches[0];
  const size_t es = k0.elem_size();
  const size_t block_bytes = static_cast<size_t>(k0.numel() / k0.size(0)) * es;
  const bool i64 = block_mapping.dtype == DType::I64;
  auto at = [&](int64_t i) {
    return i64 ? block_mapping.ptr<const int64_t>()[i] : block_mapping.ptr<const int32_t>()[i];
  };
  // One work item = one (layer, K|V, pair) block copy.
  parallel_for(layers * 2 * pairs, 16, [&](int64_t b, int64_t e) {
    for (int64_t w = b; w < e; ++w) {
      const int64_t p = w % pairs, lk = w / pairs;
      const TensorView& c = (lk & 1) ? value_caches[lk / 2] : key_caches[lk / 2];
      const int64_t bs = c.stride(0) * static_cast<int64_t>(es);
      std::memmove(c.bytes() + at(2 * p + 1) * bs, c.bytes() + at(2 * p) * bs, block_bytes);
    }
  });
}

LLMK_NS_END
