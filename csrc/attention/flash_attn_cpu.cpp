// CPU attention entry points (one build per SIMD level): flash_attn cuts the batch into tasks of
// (sequence, kv head, query block[, key split]), runs them largest-first on the thread pool, and
// writes the outputs (or the split partials, merged by the log-sum-exp combine); append_kv
// writes flash_attn_with_kvcache's new k/v rows into the cache.
#include <string.h>

#include <algorithm>
#include <cmath>
#include <type_traits>
#include <vector>

#include "attention/attn_vec_cpu.h"
#include "attention/flash_attn_cpu.h"
#include "attention/paged_kv.h"
#include "common/kv_quant.h"
#include "common/vec_cpu.h"
#include "common/parallel.h"
#include "rotary/rotary_head_cpu.h"

LLMK_NS_BEGIN
namespace attn {

Scratch& thread_scratch() {
  static thread_local Scratch s;
  return s;
}

namespace {

constexpr int kGemmRows = 128;     // target rows (query positions x group heads) per GEMM task
constexpr int kGemmRowsAmx = 256;  // the same on AMX tiles (measured faster than 128 and 512 on a Xeon)
constexpr int kMinSplitKeys = 256; // a split below this many keys costs more than it balances
constexpr int kSplitTasks = 16;    // fewer tasks than this get split (keys permitting)
constexpr int kMaxSplits = 128;    // splits of one sequence (flash-attn's num_splits bound)

// Writes rows of a finished task: final output (normalised, in the output dtype) + lse, or the
// split partial (fp32, normalised by the split's own sum) + the split's lse.
template <DType T>
void store_task(const AttnParams& p, const Task& t, const Scratch& sc, int64_t rows_total,
                float* part_o, float* part_lse) {
  using E = typename Elem<T>::type;
  const int D = p.head_dim, G = p.num_heads / p.num_kv_heads, dp = sc.dp;
  const int M = t.nh * G * t.nq;
  const float* O = sc.o.p;
  for (int r = 0; r < M; ++r) {
    const int g = r / t.nq, i = t.i0 + r % t.nq, h = t.kvh * G + g;
    const float l = sc.l.p[r], mx = sc.m.p[r];
    const float inv = l > 0.f ? 1.f / l : 0.f;
    const float* src = O + int64_t(r) * dp;
    const int64_t row = attn_q_start(p, t.b) + i;
    if (t.nsplit > 1) {
      const int64_t at = (int64_t(t.split) * rows_total + row) * p.num_heads + h;
      float* dst = part_o + at * D;
      for (int d = 0; d < D; ++d) dst[d] = src[d] * inv;
      part_lse[at] = l > 0.f ? mx + logf(l) : -INFINITY;
    } else {
      E* dst = static_cast<E*>(p.out) + row * p.o_row_stride + int64_t(h) * p.o_head_stride;
      for (int d = 0; d < D; ++d) dst[d] = from_f32<T>(src[d] * inv);
      if (p.lse) p.lse[attn_lse_offset(p, t.b, h, i)] = attn_lse(SoftmaxState{mx, l});
    }
  }
}

// Merges the split partials of the sequences cut into seq_splits[b] > 1 splits (layout [ns][rows][H]).
template <DType T>
void combine_splits(const AttnParams& p, const std::vector<int>& seq_splits, int64_t rows_total,
                    const float* part_o, const float* part_lse) {
  using E = typename Elem<T>::type;
  const int D = p.head_dim, H = p.num_heads;
  parallel_for(int64_t(p.batch) * H, 4, [&](int64_t lo, int64_t hi) {
    std::vector<float> w(kMaxSplits), acc(D);
    for (int64_t bh = lo; bh < hi; ++bh) {
      const int b = int(bh / H), h = int(bh % H);
      const int ns = seq_splits[b];
      if (ns <= 1) continue;  // written by its task
      const int sq = attn_seqlen_q(p, b);
      for (int i = 0; i < sq; ++i) {
        const int64_t row = attn_q_start(p, b) + i, at = row * H + h;
        const float lse = attn_combine_weights(part_lse + at, rows_total * H, ns, w.data());
        std::fill(acc.begin(), acc.end(), 0.f);
        for (int s = 0; s < ns; ++s) {
          if (w[s] == 0.f) continue;
          const float* src = part_o + (int64_t(s) * rows_total * H + at) * D;
          for (int d = 0; d < D; ++d) acc[d] += w[s] * src[d];
        }
        E* dst = static_cast<E*>(p.out) + row * p.o_row_stride + int64_t(h) * p.o_head_stride;
        for (int d = 0; d < D; ++d) dst[d] = from_f32<T>(acc[d]);
        if (p.lse) p.lse[attn_lse_offset(p, b, h, i)] = lse;
      }
    }
  });
}

template <DType T>
void run(const AttnParams& p) {
  const int G = p.num_heads / p.num_kv_heads;
  std::vector<Task> tasks;
  const bool amx = amx_attention(p);
  for (int b = 0; b < p.batch; ++b) {
    const int sq = attn_seqlen_q(p, b), sk = attn_seqlen_k(p, b);
    if (sq <= 0) continue;
    const bool small = G * sq < kSmallRows;
    const int bq = small ? sq : std::max(1, (amx ? kGemmRowsAmx : kGemmRows) / G);
    for (int i0 = 0; i0 < sq; i0 += bq) {
      const int nq = std::min(bq, sq - i0);
      // Cost ~ rows x visible keys (+ a fixed part for rows that see none).
      const KeyRange a = attn_key_range(i0, sq, sk, p.window_left, p.window_right);
      const KeyRange z = attn_key_range(i0 + nq - 1, sq, sk, p.window_left, p.window_right);
      const double keys = std::max(0, std::min(z.hi, sk) - std::max(a.lo, 0));
      const double cost = double(G) * nq * (keys + 16);
      if (small)
        tasks.push_back(Task{b, 0, p.num_kv_heads, true, i0, nq, 0, 1, 0, sk, sq, sk, cost * p.num_kv_heads});
      else
        for (int h = 0; h < p.num_kv_heads; ++h)
          tasks.push_back(Task{b, h, 1, false, i0, nq, 0, 1, 0, sk, sq, sk, cost});
    }
  }
  if (tasks.empty()) return;
  int64_t rows_total = 0;
  for (int b = 0; b < p.batch; ++b)
    rows_total = std::max<int64_t>(rows_total, attn_q_start(p, b) + attn_seqlen_q(p, b));

  // Split-KV (flash-decoding): a sequence with too few tasks to keep threads busy has its tasks'
  // key ranges cut. Its split count depends on that sequence alone (its own task count and keys),
  // never on the rest of the batch or on the thread count: a row's sums run in the same order
  // whatever it is batched with and on any number of threads (the engine's greedy tokens do not
  // change with the batch). An explicit num_splits applies to every sequence.
  std::vector<int> seq_splits(p.batch, 1);
  int ns = 1;
  if (p.num_splits > 0) {
    ns = std::min(p.num_splits, kMaxSplits);
    std::fill(seq_splits.begin(), seq_splits.end(), ns);
  } else {
    std::vector<int> seq_tasks(p.batch, 0);
    for (const Task& t : tasks) ++seq_tasks[t.b];
    for (int b = 0; b < p.batch; ++b) {
      const int n = seq_tasks[b];
      if (n == 0 || n >= kSplitTasks) continue;
      const int want = (kSplitTasks + n - 1) / n;
      seq_splits[b] = std::max(1, std::min({want, attn_seqlen_k(p, b) / kMinSplitKeys, kMaxSplits}));
      ns = std::max(ns, seq_splits[b]);
    }
  }
  // Bound the partial-output workspace (fp32 [ns, rows, Hq, D]) to 256 MiB (only a batch of many
  // long rows reaches it: there the counts do depend on the batch).
  const int64_t per_split = rows_total * p.num_heads * p.head_dim;
  while (ns > 1 && ns * per_split > (int64_t(64) << 20)) --ns;
  for (int& n : seq_splits) n = std::min(n, ns);
  if (ns > 1) {
    std::vector<Task> split;
    split.reserve(tasks.size() * ns);
    for (const Task& t : tasks) {
      const int n = seq_splits[t.b];
      const int chunk = std::max(1, (t.sk + n - 1) / n);
      for (int s = 0; s < n; ++s) {
        Task u = t;
        u.split = s;
        u.nsplit = n;
        u.k0 = std::min(t.sk, s * chunk);
        u.k1 = std::min(t.sk, (s + 1) * chunk);
        u.cost = t.cost / n;
        split.push_back(u);
      }
    }
    tasks.swap(split);
  }
  std::stable_sort(tasks.begin(), tasks.end(),
                   [](const Task& a, const Task& b) { return a.cost > b.cost; });

  std::vector<float> own_o, own_lse;
  float* part_o = nullptr;
  float* part_lse = nullptr;
  if (ns > 1) {
    part_o = p.split_out;
    part_lse = p.split_lse;
    if (!part_o) {
      own_o.resize(size_t(ns) * per_split);
      own_lse.resize(size_t(ns) * rows_total * p.num_heads);
      part_o = own_o.data();
      part_lse = own_lse.data();
    }
  }
  PackedKv packed;
  if (amx) {
    std::vector<int> per_pair(size_t(p.batch) * p.num_kv_heads, 0);
    for (const Task& t : tasks)
      if (!t.small) ++per_pair[size_t(t.b) * p.num_kv_heads + t.kvh];
    packed = pack_kv_amx(p, per_pair);
  }
  parallel_for_dynamic(int64_t(tasks.size()), [&](int64_t k) {
    const Task& t = tasks[k];
    Scratch& sc = thread_scratch();
    sc.kv = packed.at.empty() ? nullptr : &packed;
    if (t.small) attend_small(p, t, sc);
    else attend_gemm(p, t, sc);
    sc.kv = nullptr;  // `packed` ends with this call; the thread's scratch outlives it
    store_task<T>(p, t, sc, rows_total, part_o, part_lse);
  });
  if (ns > 1) combine_splits<T>(p, seq_splits, rows_total, part_o, part_lse);
}

}  // namespace
}  // namespace attn

void flash_attn(const AttnParams& p, int64_t /*stream*/) {
  switch (p.dtype) {
    case DType::F16: attn::run<DType::F16>(p); break;
    case DType::BF16: attn::run<DType::BF16>(p); break;
    default: attn::run<DType::F32>(p); break;
  }
}

namespace {

// One head row rotated (flash-attn's rotary_cos/sin rows at position pos) from src into dst;
// features past rotary_dim are copied. fp32 math, one rounding.
template <DType DT, typename E = vec::elem_t<DT>>
void rotate_row(const AppendKvParams& p, const E* src, E* dst, int64_t pos) {
  if (dst != src) memcpy(dst, src, size_t(p.head_dim) * sizeof(E));
  if (pos < 0 || pos >= p.seqlen_ro) return;
  const E* cs = static_cast<const E*>(p.rotary_cos) + pos * p.cos_row_stride;
  const E* sn = static_cast<const E*>(p.rotary_sin) + pos * p.sin_row_stride;
  if (p.rotary_interleaved) rotate_head<DT, false>(dst, cs, sn, p.rotary_dim / 2);
  else rotate_head<DT, true>(dst, cs, sn, p.rotary_dim / 2);
}

// Quantised caches: a new K/V head row (K rotated and rounded to the attention dtype first, as
// the unquantised cache would hold it) encoded with the head's scale.
template <DType DT, typename E = vec::elem_t<DT>>
void append_quant_head(const AppendKvParams& p, const E* kn, const E* vn, uint8_t* kc, uint8_t* vc,
                       int64_t j, int h) {
  E rot[256];  // head_dim <= 256 (checked by the front)
  if (p.rotary_dim > 0) {
    rotate_row<DT>(p, kn, rot, j);
    kn = rot;
  }
  const float ks = kvq::head_scale(p.k_scale, p.k_scale_stride, h);
  const float vs = kvq::head_scale(p.v_scale, p.v_scale_stride, h);
  for (int d = 0; d < p.head_dim; ++d) {
    kc[d] = kvq::quantize(vec::to_f32<DT>(kn[d]), ks, p.kv_quant);
    vc[d] = kvq::quantize(vec::to_f32<DT>(vn[d]), vs, p.kv_quant);
  }
}

template <DType DT, typename E = vec::elem_t<DT>>
void append_rows(const AppendKvParams& p) {
  const int64_t rows = int64_t(p.batch) * p.seqlen_new;
  const size_t row_bytes = size_t(p.head_dim) * sizeof(E);
  parallel_for(rows, 64, [&](int64_t lo, int64_t hi) {
    for (int64_t r = lo; r < hi; ++r) {
      const int b = int(r / p.seqlen_new), i = int(r % p.seqlen_new);
      const int64_t j = int64_t(p.cache_seqlens[b]) + i;
      int64_t kbase, vbase;
      if (p.block_table) {
        const KvOffsets o =
            paged_kv_offsets(p, p.block_table + b * p.block_table_stride, PageDiv{p.block_size}, j);
        kbase = o.k;
        vbase = o.v;
      } else {
        const int64_t cb = p.cache_batch_idx ? p.cache_batch_idx[b] : b;
        kbase = cb * p.k_batch_stride + j * p.k_row_stride;
        vbase = cb * p.v_batch_stride + j * p.v_row_stride;
      }
      const E* kn = static_cast<const E*>(p.k_new) + b * p.kn_batch_stride + i * p.kn_row_stride;
      const E* vn = static_cast<const E*>(p.v_new) + b * p.vn_batch_stride + i * p.vn_row_stride;
      if (p.kv_quant != KvQuant::None) {
        for (int h = 0; h < p.num_kv_heads; ++h)
          append_quant_head<DT>(p, kn + h * p.kn_head_stride, vn + h * p.vn_head_stride,
                                static_cast<uint8_t*>(p.k_cache) + kbase + h * p.k_head_stride,
                                static_cast<uint8_t*>(p.v_cache) + vbase + h * p.v_head_stride, j, h);
        continue;
      }
      E* kc = static_cast<E*>(p.k_cache) + kbase;
      E* vc = static_cast<E*>(p.v_cache) + vbase;
      for (int h = 0; h < p.num_kv_heads; ++h) {
        if (p.rotary_dim > 0) rotate_row<DT>(p, kn + h * p.kn_head_stride, kc + h * p.k_head_stride, j);
        else memcpy(kc + h * p.k_head_stride, kn + h * p.kn_head_stride, row_bytes);
        memcpy(vc + h * p.v_head_stride, vn + h * p.vn_head_stride, row_bytes);
      }
    }
  });
}

template <DType DT, typename E = vec::elem_t<DT>>
void rotate_q(const AppendKvParams& p) {
  const int64_t rows = int64_t(p.batch) * p.seqlen_q;
  parallel_for(rows, 64, [&](int64_t lo, int64_t hi) {
    for (int64_t r = lo; r < hi; ++r) {
      const int b = int(r / p.seqlen_q), i = int(r % p.seqlen_q);
      const int64_t pos = int64_t(p.cache_seqlens[b]) + (p.q_pos_per_row ? i : 0);
      const E* src = static_cast<const E*>(p.q) + r * p.q_row_stride;
      E* dst = static_cast<E*>(p.q_rot) + r * int64_t(p.num_heads) * p.head_dim;
      for (int h = 0; h < p.num_heads; ++h)
        rotate_row<DT>(p, src + h * p.q_head_stride, dst + int64_t(h) * p.head_dim, pos);
    }
  });
}

}  // namespace

void append_kv(const AppendKvParams& p, int64_t /*stream*/) {
  vec::dispatch_elem(p.dtype, [&](auto tag) {
    constexpr DType DT = decltype(tag)::value;
    if (p.seqlen_new > 0) append_rows<DT>(p);
    if (p.q_rot && p.rotary_dim > 0) rotate_q<DT>(p);
  });
}

LLMK_NS_END
