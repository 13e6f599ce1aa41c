// Argument checks and param setters shared by the attention front ends: defined in flash_attn.cpp
// (with the varlen front), used there and by the kvcache fronts (flash_attn_kvcache.cpp).
#pragma once
#include <cstdint>
#include <initializer_list>
#include <optional>

#include "attention/flash_attn.h"

namespace llmk {
namespace attn_front {

void check_head_dim(int64_t d, const char* name);
void check_int32_index(const TensorView& t, const char* name, int ndim, const char* layout);
void check_scalars(double softmax_scale, double softcap, int64_t wl, int64_t wr);

// The params both fronts fill alike, once their argument checks passed: sizes, dtype, K/V data,
// score options and ALiBi (whose checks run here, before the caller's paging ones). The caller
// adds the K/V layout (set_paged or its dense strides), q/out, lengths, window and lse.
AttnParams front_params(const TensorView& q, const TensorView& k, const TensorView& v, int64_t batch,
                        int64_t hq, int64_t hkv, int64_t D, double softmax_scale, double softcap,
                        const std::optional<TensorView>& alibi_slopes);

void set_window(AttnParams& p, bool causal, int64_t wl, int64_t wr, int64_t max_seqlen_k);
void check_out(const TensorView& out, const TensorView& q);

struct Arg {
  const TensorView* t;  // null = not given
  const char* name;
};
inline Arg arg(const TensorView& t, const char* n) { return {&t, n}; }
inline Arg arg(const std::optional<TensorView>& t, const char* n) { return {t ? &*t : nullptr, n}; }

// A written tensor may share no byte with any other argument: the kernels read inputs tile by
// tile while writing, so an alias gives results that depend on the schedule.
void check_written(Arg written, std::initializer_list<Arg> others);

void check_lse(const std::optional<TensorView>& lse, const TensorView& q,
               std::initializer_list<int64_t> dims, const char* layout);

// Paged cache [num_blocks, block_size, Hkv, D] + block_table [b, max_blocks]: checks and sets
// the params' paging fields. Returns the cache capacity per sequence.
int64_t set_paged(AttnParams& p, const TensorView& kc, const TensorView& vc, const TensorView& bt,
                  int64_t batch, const TensorView& q, const char* kname, const char* vname);

// Block ids used by sequence b (ceil(len / block_size) entries) must be valid cache blocks.
void check_blocks_used(const TensorView& bt, int b, int64_t len, int64_t block_size,
                       int64_t num_blocks);

// quantised: k / v are 1-byte code caches (their dtype is checked by set_kv_quant).
void check_kv_pair(const TensorView& k, const char* kn, const TensorView& v, const char* vn,
                   const TensorView& q, bool quantised = false);
void check_heads(int64_t hq, int64_t hkv, const char* kname);

}  // namespace attn_front
}  // namespace llmk
