// Front-end handling of vLLM's kv_cache_dtype / k_scale / v_scale, shared by the cache write
// (reshape_and_cache_flash) and the attention ops that read the paged cache.
#pragma once
#include <cstdint>
#include <optional>
#include <string>

#include "attention/paged_kv.h"
#include "common/tensor.h"

namespace llmk {

// "auto" -> None; "fp8" / "fp8_e4m3" -> E4M3; "fp8_e5m2" -> E5M2; "int8" -> Int8. Anything else
// raises ValueError naming kv_cache_dtype.
KvQuant parse_kv_cache_dtype(const std::string& kv_cache_dtype);

// The cache dtype a quantised kind needs: uint8 for fp8 (as vLLM), int8 for int8.
DType kv_quant_storage(KvQuant q);

// For a quantised kind: checks both caches' dtype and the scales (float32, on the caches'
// device, [1] / 0-d or [num_kv_heads], contiguous; positive and finite where readable on the
// host) and records them in g. For None it does nothing (the caller checks the dtype as before).
void set_kv_quant(KvGeom& g, KvQuant q, const std::string& kv_cache_dtype,
                  const TensorView& key_cache, const char* kname, const TensorView& value_cache,
                  const char* vname, const std::optional<TensorView>& k_scale,
                  const std::optional<TensorView>& v_scale, int64_t num_kv_heads);

}  // namespace llmk
