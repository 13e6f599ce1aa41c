// Where K/V cache rows live, and the one paged-addressing rule every kernel uses (CPU, CUDA,
// SIMT): logical row j of a sequence whose block-table row is `table` sits in cache block
// table[j / block_size], slot j % block_size. Kept in one place so that the append (which writes
// rows) and every attention kernel (which read them) cannot disagree.
#pragma once
#include <stdint.h>

#include "common/kv_quant.h"
#include "common/macros.h"

namespace llmk {

// K/V cache geometry. Dense (block_table null): batch entry, row and head strides. Paged
// (block_table set): caches [num_blocks, block_size, Hkv, D], a block stride plus the same row
// and head strides; sequence b's block-table row starts at block_table + b * block_table_stride.
// Strides are in the holder's unit: elements in AttnParams / AppendKvParams (both carry this as
// their base, so the attention reads exactly the layout the append wrote), bytes in
// append_kv.cu's launch copy.
struct KvGeom {
  int64_t k_row_stride = 0, k_head_stride = 0, k_block_stride = 0, k_batch_stride = 0;
  int64_t v_row_stride = 0, v_head_stride = 0, v_block_stride = 0, v_batch_stride = 0;
  const int32_t* block_table = nullptr;
  int64_t block_table_stride = 0;
  int block_size = 0;
  // Quantised caches (kv_cache_dtype fp8 / int8): 1-byte codes, value = code * scale (strides
  // then count bytes = elements). Scales are float32 [1] (stride 0) or [Hkv] (stride 1).
  KvQuant kv_quant = KvQuant::None;
  const float* k_scale = nullptr;
  const float* v_scale = nullptr;
  int k_scale_stride = 0, v_scale_stride = 0;
};

}  // namespace llmk

// Per-ISA namespace for the CPU kernels (macros.h): these inline functions are compiled once per
// SIMD level and must not be merged across them.
LLMK_NS_BEGIN

// Division by block_size as written (CPU kernels, the append); the CUDA attention kernels pass
// their FastDiv instead, which has the same div().
struct PageDiv {
  int block_size;
  template <typename I>
  LLMK_HD I div(I n) const { return n / block_size; }
};

// Cache block and slot of logical row j (j >= 0; I is int or int64_t).
template <typename I>
struct PagedRow {
  int64_t block;
  I slot;
};

// The paged addressing rule. table: the sequence's block-table row, anything indexable by page
// (a global row, or a kernel's shared-memory copy); div: divides by block_size.
template <typename Table, typename Div, typename I>
LLMK_HD PagedRow<I> paged_row(const Table& table, const Div& div, int block_size, I j) {
  const I page = div.div(j);
  return {int64_t(table[page]), I(j - page * block_size)};
}

// Offsets of row j's K and V rows (kv head 0) in g's unit.
struct KvOffsets {
  int64_t k, v;
};

template <typename Table, typename Div, typename I>
LLMK_HD KvOffsets paged_kv_offsets(const KvGeom& g, const Table& table, const Div& div, I j) {
  const PagedRow<I> r = paged_row(table, div, g.block_size, j);
  return {r.block * g.k_block_stride + int64_t(r.slot) * g.k_row_stride,
          r.block * g.v_block_stride + int64_t(r.slot) * g.v_row_stride};
}

LLMK_NS_END
