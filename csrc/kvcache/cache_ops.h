// KV-cache ops (vLLM signatures): reshape_and_cache_flash, copy_blocks, swap_blocks.
// Cache layout per layer: [num_blocks, block_size, num_kv_heads, head_dim] (NHD).
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "attention/paged_kv.h"
#include "common/dispatch.h"
#include "common/tensor.h"

// Kernel entry points (arguments already validated by the front end below). quant: only its
// kv_quant / scale fields are used (KvQuant::None = copy the rows as they are).
LLMK_DECLARE_KERNEL(reshape_and_cache_flash,
                    (const TensorView& key, const TensorView& value, const TensorView& key_cache,
                     const TensorView& value_cache, const TensorView& slot_mapping,
                     const KvGeom& quant, int64_t stream))
// layer_ptrs: int64 [2 * num_layers] device table of cache base pointers (K0, V0, K1, V1, ...),
// used by the CUDA kernel so that one launch covers all layers; the CPU kernel reads the views.
LLMK_DECLARE_KERNEL(copy_blocks,
                    (const std::vector<TensorView>& key_caches,
                     const std::vector<TensorView>& value_caches, const TensorView& block_mapping,
                     const TensorView* layer_ptrs, int64_t stream))

namespace llmk {

// Front ends: check every argument, then dispatch by device and SIMD level.
// kv_cache_dtype "auto": caches of key's dtype; "fp8" / "fp8_e4m3" / "fp8_e5m2": uint8 caches of
// fp8 codes, "int8": int8 caches; code = saturate(round_nearest_even(x / scale)) with k_scale /
// v_scale float32 [1] or [num_kv_heads].
void reshape_and_cache_flash(TensorView key, TensorView value, TensorView key_cache,
                             TensorView value_cache, TensorView slot_mapping,
                             const std::string& kv_cache_dtype, std::optional<TensorView> k_scale,
                             std::optional<TensorView> v_scale, int64_t stream);
void copy_blocks(std::vector<TensorView> key_caches, std::vector<TensorView> value_caches,
                 TensorView block_mapping, std::optional<TensorView> layer_ptrs, int64_t stream);
void swap_blocks(TensorView src, TensorView dst, TensorView block_mapping, int64_t stream);

}  // namespace llmk
