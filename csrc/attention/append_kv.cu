// CUDA side of flash_attn_with_kvcache's in-place append (append_kv, declared in flash_attn.h):
// new rows k/v [b, s_new, Hkv, D] are written into the dense or paged cache at rows
// cache_seqlens[b] + i. One CTA per (sequence, new row) copies all kv heads of K and V, with
// 16-byte vectors whenever every pointer and stride allows it. With rotary (flash-attn's
// rotary_cos/sin) the new keys are rotated as they are written, element by element, and a second
// kernel writes the rotated queries to q_rot.
#include <cstdint>
#include <type_traits>

#include "attention/flash_attn.h"
#include "attention/paged_kv.h"
#include "common/device_memory.h"
#include "common/elem_device.cuh"
#include "common/kv_quant.h"
#include "common/simt.h"
#include "rotary/rotary_math.h"

namespace llmk {
namespace gpu {

namespace {

// Byte strides of the copy (converted once on the host).
struct AppendGeom {
  const char* kn;
  const char* vn;
  char* kc;
  char* vc;
  int64_t kn_b, kn_r, kn_h, vn_b, vn_r, vn_h;  // new rows
  KvGeom cache;                                // the caches, strides in bytes
  const int32_t* cache_seqlens;
  const int32_t* cache_batch_idx;  // dense: cache batch of sequence b (null = b)
  int seqlen_new, heads, units;  // units of U per row
};

LLMK_DEVICE int64_t cache_batch(const AppendGeom& g, int b) {
  return g.cache_batch_idx ? g.cache_batch_idx[b] : b;
}

// Byte offsets of cache row j of sequence b in the K and V caches (kv head 0).
LLMK_DEVICE KvOffsets cache_rows(const AppendGeom& g, int b, int64_t j) {
  const KvGeom& c = g.cache;
  if (c.block_table)
    return paged_kv_offsets(c, c.block_table + b * c.block_table_stride, PageDiv{c.block_size}, j);
  return {cache_batch(g, b) * c.k_batch_stride + j * c.k_row_stride,
          cache_batch(g, b) * c.v_batch_stride + j * c.v_row_stride};
}

// Rotary tables and the query rotation (see AppendKvParams).
struct RotaryGeom {
  const char* cos;
  const char* sin;
  int64_t cos_r, sin_r;  // byte strides of a table row
  int rotary_dim, seqlen_ro, head_dim;
  bool interleaved;
  const char* q;
  char* q_rot;
  int64_t q_r, q_h;  // byte strides of q rows (b * s_q + i) and heads
  int seqlen_q, heads_q;
  bool pos_per_row;
};

// Feature d of a head row at position pos, rotated (d < rotary_dim and pos in the tables) or
// copied; each thread reads its feature's pair partner, so src and dst must not alias.
template <typename T>
LLMK_DEVICE T rotated(const RotaryGeom& r, const T* src, int d, int64_t pos) {
  if (d >= r.rotary_dim || pos < 0 || pos >= r.seqlen_ro) return src[d];
  const int half = r.rotary_dim / 2;
  const int i = r.interleaved ? d / 2 : (d < half ? d : d - half);
  int a, b;
  rope_pair(i, r.rotary_dim, !r.interleaved, a, b);
  float x = ld(src[a]), y = ld(src[b]);
  rope_rotate(x, y, ld(reinterpret_cast<const T*>(r.cos + pos * r.cos_r)[i]),
              ld(reinterpret_cast<const T*>(r.sin + pos * r.sin_r)[i]));
  return st<T>(d == a ? x : y);
}

template <typename U>
__global__ void append_kv_kernel(const AppendGeom g) {
  const int b = blockIdx.x / g.seqlen_new, i = blockIdx.x % g.seqlen_new;
  const int64_t j = int64_t(g.cache_seqlens[b]) + i;
  const KvOffsets rows = cache_rows(g, b, j);
  const int64_t kc_row = rows.k, vc_row = rows.v;
  const int64_t kn_row = b * g.kn_b + i * g.kn_r, vn_row = b * g.vn_b + i * g.vn_r;
  for (int e = threadIdx.x; e < g.heads * g.units; e += blockDim.x) {
    const int h = e / g.units, u = e % g.units;
    const int64_t ub = int64_t(u) * int64_t(sizeof(U));
    *reinterpret_cast<U*>(g.kc + kc_row + h * g.cache.k_head_stride + ub) =
        *reinterpret_cast<const U*>(g.kn + kn_row + h * g.kn_h + ub);
    *reinterpret_cast<U*>(g.vc + vc_row + h * g.cache.v_head_stride + ub) =
        *reinterpret_cast<const U*>(g.vn + vn_row + h * g.vn_h + ub);
  }
}

// One CTA per (sequence, new row), one thread per feature: K rotated, V copied.
template <typename T>
__global__ void append_kv_rotary_kernel(const AppendGeom g, const RotaryGeom r) {
  const int b = blockIdx.x / g.seqlen_new, i = blockIdx.x % g.seqlen_new;
  const int64_t j = int64_t(g.cache_seqlens[b]) + i;
  const KvOffsets rows = cache_rows(g, b, j);
  const int64_t kc_row = rows.k, vc_row = rows.v;
  const int64_t kn_row = b * g.kn_b + i * g.kn_r, vn_row = b * g.vn_b + i * g.vn_r;
  for (int e = threadIdx.x; e < g.heads * r.head_dim; e += blockDim.x) {
    const int h = e / r.head_dim, d = e % r.head_dim;
    const T* kn = reinterpret_cast<const T*>(g.kn + kn_row + h * g.kn_h);
    reinterpret_cast<T*>(g.kc + kc_row + h * g.cache.k_head_stride)[d] = rotated(r, kn, d, j);
    reinterpret_cast<T*>(g.vc + vc_row + h * g.cache.v_head_stride)[d] =
        reinterpret_cast<const T*>(g.vn + vn_row + h * g.vn_h)[d];
  }
}

// Quantised caches: one CTA per (sequence, new row), one thread per feature; K rotated (when
// rotary_dim > 0) and rounded to T as the unquantised path stores it, then both encoded.
template <typename T>
__global__ void append_kv_quant_kernel(const AppendGeom g, const RotaryGeom r) {
  const int b = blockIdx.x / g.seqlen_new, i = blockIdx.x % g.seqlen_new;
  const int64_t j = int64_t(g.cache_seqlens[b]) + i;
  const KvOffsets rows = cache_rows(g, b, j);
  const int64_t kn_row = b * g.kn_b + i * g.kn_r, vn_row = b * g.vn_b + i * g.vn_r;
  const KvGeom& c = g.cache;
  for (int e = threadIdx.x; e < g.heads * r.head_dim; e += blockDim.x) {
    const int h = e / r.head_dim, d = e % r.head_dim;
    const T* kn = reinterpret_cast<const T*>(g.kn + kn_row + h * g.kn_h);
    const float kx = ld(rotated(r, kn, d, j));
    const float vx = ld(reinterpret_cast<const T*>(g.vn + vn_row + h * g.vn_h)[d]);
    g.kc[rows.k + h * c.k_head_stride + d] =
        char(kvq::quantize(kx, kvq::head_scale(c.k_scale, c.k_scale_stride, h), c.kv_quant));
    g.vc[rows.v + h * c.v_head_stride + d] =
        char(kvq::quantize(vx, kvq::head_scale(c.v_scale, c.v_scale_stride, h), c.kv_quant));
  }
}

// One CTA per query row b * s_q + i: all its heads rotated into q_rot (contiguous).
template <typename T>
__global__ void rotate_q_kernel(const RotaryGeom r, const int32_t* cache_seqlens) {
  const int64_t row = blockIdx.x;
  const int b = int(row / r.seqlen_q), i = int(row % r.seqlen_q);
  const int64_t pos = int64_t(cache_seqlens[b]) + (r.pos_per_row ? i : 0);
  T* dst = reinterpret_cast<T*>(r.q_rot) + row * int64_t(r.heads_q) * r.head_dim;
  for (int e = threadIdx.x; e < r.heads_q * r.head_dim; e += blockDim.x) {
    const int h = e / r.head_dim, d = e % r.head_dim;
    dst[e] = rotated(r, reinterpret_cast<const T*>(r.q + row * r.q_r + h * r.q_h), d, pos);
  }
}

// The cache geometry with byte strides (es: element size); block_size >= 1 even for a dense
// cache, whose rows never divide by it.
KvGeom in_bytes(const KvGeom& e, int64_t es) {
  KvGeom g = e;
  g.k_row_stride *= es, g.k_head_stride *= es, g.k_block_stride *= es, g.k_batch_stride *= es;
  g.v_row_stride *= es, g.v_head_stride *= es, g.v_block_stride *= es, g.v_batch_stride *= es;
  g.block_size = e.block_size > 0 ? e.block_size : 1;
  return g;
}

}  // namespace

void append_kv(const AppendKvParams& p, int64_t stream) {
  if (p.batch == 0 || p.num_kv_heads == 0 || p.head_dim == 0) return;
  const int64_t es = int64_t(dtype_size(p.dtype));
  AppendGeom g;
  g.kn = static_cast<const char*>(p.k_new);
  g.vn = static_cast<const char*>(p.v_new);
  g.kc = static_cast<char*>(p.k_cache);
  g.vc = static_cast<char*>(p.v_cache);
  g.kn_b = p.kn_batch_stride * es, g.kn_r = p.kn_row_stride * es, g.kn_h = p.kn_head_stride * es;
  g.vn_b = p.vn_batch_stride * es, g.vn_r = p.vn_row_stride * es, g.vn_h = p.vn_head_stride * es;
  const bool quant = p.kv_quant != KvQuant::None;
  g.cache = in_bytes(p, quant ? 1 : es);  // quantised caches hold 1-byte codes
  g.cache_seqlens = p.cache_seqlens;
  g.cache_batch_idx = p.cache_batch_idx;
  g.seqlen_new = p.seqlen_new;
  g.heads = p.num_kv_heads;
  if (p.rotary_dim > 0 || quant) {
    RotaryGeom r;
    r.cos = static_cast<const char*>(p.rotary_cos);
    r.sin = static_cast<const char*>(p.rotary_sin);
    r.cos_r = p.cos_row_stride * es, r.sin_r = p.sin_row_stride * es;
    r.rotary_dim = p.rotary_dim, r.seqlen_ro = p.seqlen_ro, r.head_dim = p.head_dim;
    r.interleaved = p.rotary_interleaved;
    r.q = static_cast<const char*>(p.q);
    r.q_rot = static_cast<char*>(p.q_rot);
    r.q_r = p.q_row_stride * es, r.q_h = p.q_head_stride * es;
    r.seqlen_q = p.seqlen_q, r.heads_q = p.num_heads;
    r.pos_per_row = p.q_pos_per_row;
    by_dtype(p.dtype, [&](auto* tag) {
      using T = std::remove_pointer_t<decltype(tag)>;
      if (p.seqlen_new > 0 && quant) {
        auto append_kv_quant = &append_kv_quant_kernel<T>;
        LLMK_LAUNCH(append_kv_quant, unsigned(int64_t(p.batch) * p.seqlen_new), 128, 0, stream)(g, r);
      } else if (p.seqlen_new > 0) {
        auto append_kv_rotary = &append_kv_rotary_kernel<T>;
        LLMK_LAUNCH(append_kv_rotary, unsigned(int64_t(p.batch) * p.seqlen_new), 128, 0, stream)(g, r);
      }
      if (p.rotary_dim > 0 && r.q_rot && r.seqlen_q > 0 && r.heads_q > 0) {
        auto rotate_q = &rotate_q_kernel<T>;
        LLMK_LAUNCH(rotate_q, unsigned(int64_t(p.batch) * r.seqlen_q), 128, 0, stream)(r, p.cache_seqlens);
      }
    });
    check_launch("flash_attn_with_kvcache (rotary k/v append)");
    return;
  }
  if (p.seqlen_new == 0) return;
  const int64_t row_bytes = p.head_dim * es;
  bool vec = row_bytes % 16 == 0;
  for (const void* ptr : {static_cast<const void*>(g.kn), static_cast<const void*>(g.vn),
                          static_cast<const void*>(g.kc), static_cast<const void*>(g.vc)})
    vec = vec && (reinterpret_cast<uintptr_t>(ptr) & 15) == 0;
  const KvGeom& c = g.cache;
  for (int64_t st : {g.kn_b, g.kn_r, g.kn_h, g.vn_b, g.vn_r, g.vn_h, c.k_batch_stride, c.k_row_stride,
                     c.k_head_stride, c.k_block_stride, c.v_batch_stride, c.v_row_stride, c.v_head_stride,
                     c.v_block_stride})
    vec = vec && st % 16 == 0;
  const unsigned grid = unsigned(int64_t(p.batch) * p.seqlen_new);
  if (vec) {
    g.units = int(row_bytes / 16);
    const int total = g.heads * g.units;
    const int threads = total < 256 ? ((total + 31) / 32) * 32 : 256;
    auto append_kv_vec16 = &append_kv_kernel<uint4>;
    LLMK_LAUNCH(append_kv_vec16, grid, threads, 0, stream)(g);
  } else if (es == 4) {
    g.units = int(row_bytes / 4);
    auto append_kv_f32 = &append_kv_kernel<uint32_t>;
    LLMK_LAUNCH(append_kv_f32, grid, 128, 0, stream)(g);
  } else {
    g.units = int(row_bytes / 2);
    auto append_kv_f16 = &append_kv_kernel<uint16_t>;
    LLMK_LAUNCH(append_kv_f16, grid, 128, 0, stream)(g);
  }
  check_launch("flash_attn_with_kvcache (k/v append)");
}

}  // namespace gpu
}  // namespace llmk
