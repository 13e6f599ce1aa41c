#include "kvcache/cache_ops.h"

#include <algorithm>
#include <cstring>
#include <vector>

#include "common/checks.h"
#include "common/device_memory.h"
#include "common/overlap.h"
#include "kvcache/kv_quant_front.h"

namespace llmk {

static const char* kCacheLayout = "[num_blocks, block_size, num_kv_heads, head_dim]";

void reshape_and_cache_flash(TensorView key, TensorView value, TensorView key_cache,
                             TensorView value_cache, TensorView slot_mapping,
                             const std::string& kv_cache_dtype, std::optional<TensorView> k_scale,
                             std::optional<TensorView> v_scale, int64_t stream) {
  const KvQuant quant = parse_kv_cache_dtype(kv_cache_dtype);
  check_ndim(key, "key", 3, "[num_tokens, num_kv_heads, head_dim]");
  check_ndim(value, "value", 3, "[num_tokens, num_kv_heads, head_dim]");
  check_ndim(key_cache, "key_cache", 4, kCacheLayout);
  check_ndim(value_cache, "value_cache", 4, kCacheLayout);
  check_ndim(slot_mapping, "slot_mapping", 1, "[num_tokens]");
  check_float(key, "key");
  check_same_dtype(key, "key", value, "value");
  if (quant == KvQuant::None) {
    check_same_dtype(key, "key", key_cache, "key_cache");
    check_same_dtype(key, "key", value_cache, "value_cache");
  }
  check_index(slot_mapping, "slot_mapping");
  for (const TensorView* t : {&value, &key_cache, &value_cache, &slot_mapping})
    check_same_device(key, "key", *t, t == &value ? "value" : t == &key_cache ? "key_cache"
                                                    : t == &value_cache      ? "value_cache"
                                                                             : "slot_mapping");
  const int64_t heads = key_cache.size(2), head_dim = key_cache.size(3);
  for (int i = 0; i < 4; ++i)
    LLMK_CHECK(value_cache.size(i) == key_cache.size(i), ValueError, "value_cache: shape ",
               shape_str(value_cache), " does not match key_cache ", shape_str(key_cache));
  check_dim(key, "key", 1, heads, "num_kv_heads, from key_cache");
  check_dim(key, "key", 2, head_dim, "head_dim, from key_cache");
  check_dim(value, "value", 1, heads, "num_kv_heads, from key_cache");
  check_dim(value, "value", 2, head_dim, "head_dim, from key_cache");
  const int64_t n = slot_mapping.size(0);
  LLMK_CHECK(key.size(0) >= n && value.size(0) >= n, ValueError,
             "slot_mapping: has ", n, " entries but key/value hold only ",
             std::min(key.size(0), value.size(0)), " tokens");
  check_last_dim_contiguous(key, "key");
  check_last_dim_contiguous(value, "value");
  check_last_dim_contiguous(key_cache, "key_cache");
  check_last_dim_contiguous(value_cache, "value_cache");
  check_contiguous(slot_mapping, "slot_mapping");
  check_no_overlap(key_cache, "key_cache", value_cache, "value_cache");
  for (const TensorView* c : {&key_cache, &value_cache}) {
    const char* cn = c == &key_cache ? "key_cache" : "value_cache";
    check_no_overlap(key, "key", *c, cn);
    check_no_overlap(value, "value", *c, cn);
    check_no_overlap(slot_mapping, "slot_mapping", *c, cn);
  }
  KvGeom q;  // scales are read only for quantised caches (ignored for "auto", as in vLLM)
  set_kv_quant(q, quant, kv_cache_dtype, key_cache, "key_cache", value_cache, "value_cache", k_scale,
               v_scale, heads);
  if (n == 0 || heads == 0 || head_dim == 0) return;
  check_index_range(slot_mapping, "slot_mapping", 0, key_cache.size(0) * key_cache.size(1),
                    "num_blocks * block_size slots (-1 = skip)", /*allow_minus_one=*/true);
  LLMK_RUN(key, reshape_and_cache_flash, key, value, key_cache, value_cache, slot_mapping, q,
           stream);
}

// independent_pairs (copy_blocks, whose pairs run in parallel): each destination at most once and
// never also a source, so the result does not depend on the order the pairs run in.
static void check_block_mapping(const TensorView& m, int64_t num_blocks_src, int64_t num_blocks_dst,
                                bool independent_pairs = false) {
  check_ndim(m, "block_mapping", 2, "[num_pairs, 2] of (src, dst) block ids");
  check_dim(m, "block_mapping", 1, 2, "(src, dst)");
  check_index(m, "block_mapping");
  check_contiguous(m, "block_mapping");
  const int64_t pairs = m.size(0);
  if (pairs == 0 || !(host_readable(m) || debug_checks_enabled())) return;
  std::vector<int64_t> ids(static_cast<size_t>(2 * pairs));  // (src, dst) pairs, host copy
  if (host_readable(m)) {
    for (int64_t i = 0; i < 2 * pairs; ++i) ids[i] = index_at(m, i);
  } else {  // debug mode on a device tensor
    std::vector<char> raw(2 * pairs * m.elem_size());
    copy_device_to_host(raw.data(), m.data, raw.size());
    TensorView h = m;
    h.data = raw.data();
    h.device = DeviceType::CPU;
    for (int64_t i = 0; i < 2 * pairs; ++i) ids[i] = index_at(h, i);
  }
  // Columns have different bounds when src and dst pools differ in size.
  for (int64_t i = 0; i < pairs; ++i) {
    const int64_t s = ids[2 * i], d = ids[2 * i + 1];
    LLMK_CHECK(s >= 0 && s < num_blocks_src, ValueError, "block_mapping: source block ", s,
               " (pair ", i, ") is out of range [0, ", num_blocks_src, ")");
    LLMK_CHECK(d >= 0 && d < num_blocks_dst, ValueError, "block_mapping: destination block ", d,
               " (pair ", i, ") is out of range [0, ", num_blocks_dst, ")");
  }
  if (!independent_pairs) return;
  std::vector<std::pair<int64_t, int64_t>> dst(static_cast<size_t>(pairs));  // (block, pair)
  for (int64_t i = 0; i < pairs; ++i) dst[i] = {ids[2 * i + 1], i};
  std::sort(dst.begin(), dst.end());
  for (int64_t i = 1; i < pairs; ++i)
    LLMK_CHECK(dst[i].first != dst[i - 1].first, ValueError, "block_mapping: destination block ",
               dst[i].first, " appears in pairs ", dst[i - 1].second, " and ", dst[i].second,
               "; pairs run in parallel, so each destination may be written once");
  for (int64_t i = 0; i < pairs; ++i) {
    const int64_t s = ids[2 * i];
    auto it = std::lower_bound(dst.begin(), dst.end(), std::make_pair(s, int64_t{-1}));
    LLMK_CHECK(it == dst.end() || it->first != s || it->second == i, ValueError,
               "block_mapping: block ", s, " is the source of pair ", i,
               " and the destination of pair ", it == dst.end() ? 0 : it->second,
               "; pairs run in parallel, so a chain (a->b, b->c) has no defined result: "
               "split it over two calls");
  }
}

void copy_blocks(std::vector<TensorView> key_caches, std::vector<TensorView> value_caches,
                 TensorView block_mapping, std::optional<TensorView> layer_ptrs, int64_t stream) {
  LLMK_CHECK(key_caches.size() == value_caches.size(), ValueError, "value_caches: has ",
             value_caches.size(), " layers but key_caches has ", key_caches.size());
  if (key_caches.empty()) return;
  const TensorView& k0 = key_caches[0];
  // Float caches, or the 1-byte codes of quantised ones (kv_cache_dtype fp8 / int8).
  if (k0.dtype != DType::U8 && k0.dtype != DType::I8) check_float(k0, "key_caches[0]");
  for (size_t l = 0; l < key_caches.size(); ++l) {
    for (int kv = 0; kv < 2; ++kv) {
      const TensorView& c = kv ? value_caches[l] : key_caches[l];
      const std::string name = str_cat(kv ? "value_caches[" : "key_caches[", l, "]");
      // Any layout with a leading block dim (vLLM's flash [num_blocks, block_size, H, D] or its
      // older [num_blocks, H, D/x, block_size, x] keys): whole blocks are copied.
      LLMK_CHECK(c.ndim >= 2, ValueError, name, ": expected a cache with a leading block dim (",
                 kCacheLayout, "), got shape ", shape_str(c));
      check_same_dtype(k0, "key_caches[0]", c, name.c_str());
      check_same_device(k0, "key_caches[0]", c, name.c_str());
      LLMK_CHECK(c.size(0) == k0.size(0) && c.numel() == k0.numel(), ValueError, name, ": shape ",
                 shape_str(c), " does not match key_caches[0] ", shape_str(k0),
                 " (same number of blocks and elements per block)");
      check_contiguous(c, name.c_str(), 1);
      LLMK_CHECK(c.stride(0) == k0.stride(0), ValueError, name, ": block stride ", c.stride(0),
                 " differs from key_caches[0] (", k0.stride(0), ")");
    }
  }
  if (block_mapping.is_cuda() || k0.is_cuda()) check_same_device(k0, "key_caches[0]", block_mapping, "block_mapping");
  check_block_mapping(block_mapping, k0.size(0), k0.size(0), /*independent_pairs=*/true);
  if (block_mapping.size(0) == 0 || k0.numel() == 0) return;
  const TensorView* ptrs = nullptr;
  if (k0.is_cuda()) {
    LLMK_CHECK(layer_ptrs.has_value(), ValueError,
               "layer_ptrs: required for CUDA caches (int64 [2 * num_layers] table of base pointers)");
    check_shape(*layer_ptrs, "layer_ptrs", {static_cast<int64_t>(2 * key_caches.size())},
                "[2 * num_layers]");
    check_dtype(*layer_ptrs, "layer_ptrs", DType::I64);
    check_same_device(k0, "key_caches[0]", *layer_ptrs, "layer_ptrs");
  }
  if (layer_ptrs.has_value()) ptrs = &*layer_ptrs;
  LLMK_RUN(k0, copy_blocks, key_caches, value_caches, block_mapping, ptrs, stream);
}

void swap_blocks(TensorView src, TensorView dst, TensorView block_mapping, int64_t stream) {
  LLMK_CHECK(src.ndim >= 1, ValueError, "src: expected a cache tensor with a leading block dim, got a 0-D tensor");
  check_ndim(dst, "dst", src.ndim, "(same rank as src)");
  check_same_dtype(src, "src", dst, "dst");
  for (int i = 1; i < src.ndim; ++i)
    LLMK_CHECK(src.size(i) == dst.size(i), ValueError, "dst: block shape ", shape_str(dst),
               " does not match src ", shape_str(src), " beyond the block dim");
  check_contiguous(src, "src", 1);
  check_contiguous(dst, "dst", 1);
  check_on_cpu(block_mapping, "block_mapping");
  check_no_overlap(src, "src", dst, "dst");
  check_block_mapping(block_mapping, src.size(0), dst.size(0));
  const int64_t pairs = block_mapping.size(0);
  if (pairs == 0 || src.numel() == 0) return;
  const size_t block_bytes = static_cast<size_t>(src.numel() / src.size(0)) * src.elem_size();
  const int64_t ss = src.stride(0) * static_cast<int64_t>(src.elem_size());
  const int64_t ds = dst.stride(0) * static_cast<int64_t>(dst.elem_size());
  if (!src.is_cuda() && !dst.is_cuda()) {
    for (int64_t i = 0; i < pairs; ++i)
      std::memmove(dst.bytes() + index_at(block_mapping, 2 * i + 1) * ds,
                   src.bytes() + index_at(block_mapping, 2 * i) * ss, block_bytes);
    return;
  }
  LLMK_CHECK(cuda_compiled(), RuntimeError, "swap_blocks: llmkern was built without CUDA");
  // cudaMemcpyDefault infers the direction (device<->device, pinned host<->device) from the
  // pointers; every copy is queued on the caller's stream and nothing synchronises.
  for (int64_t i = 0; i < pairs; ++i)
    copy_async(dst.bytes() + index_at(block_mapping, 2 * i + 1) * ds,
               src.bytes() + index_at(block_mapping, 2 * i) * ss, block_bytes, stream);
}

}  // namespace llmk
