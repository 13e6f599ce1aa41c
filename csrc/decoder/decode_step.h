// A CPU decode step of a Llama-family decoder in one call: every decoder layer of a batch whose
// rows are all decode rows (one new token per sequence), through the same kernel front ends and
// with the same arguments as the Python layer loop (models/llama.py), so the results are
// bit-identical to it. At batch 1 the ~450 Python-level operations of that loop cost about a third
// of a token's time; here they are a loop over plain structs.
//
// The object holds views of the model's weights and KV caches; the Python side keeps the tensors
// alive (models/decode_step.py).
#pragma once
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "common/tensor.h"

namespace llmk {

// How a projection runs: the kernel front end it calls. Adding a kind: a value here, its case in
// run_projection and check_projection (decode_step.cpp), the same value in ops/decoder.py and its
// classification in models/decode_step.py (projection_of). The packed kinds take any weight layout
// their kernel takes (fp32 panels; other packings the kernel dispatches on); the kernel checks it.
enum class ProjKind : int {
  Packed = 0,         // linear_packed: a weight packed at load time (+ bias)
  PackedSiluMul = 1,  // linear_packed_silu_mul: packed gate/up panel pairs, the gated SiLU as epilogue
  SmallM = 2,         // linear_small_m: weight [N, K] as it is (+ bias), a few rows
  Quant = 3,          // linear_quant: GGUF-quantised panels of `layout` (+ bias)
  QuantSiluMul = 4,   // linear_quant_silu_mul: quantised gate/up panel pairs, the gated SiLU as epilogue
};

struct Projection {
  ProjKind kind = ProjKind::Packed;
  TensorView weight;
  std::optional<TensorView> bias;
  int64_t in_features = 0;
  int64_t out_features = 0;  // columns the kernel writes
  bool silu_after = false;   // gate/up: silu_and_mul on the kernel's [rows, 2 * inter] output
  int64_t layout = 0;        // the quantised kinds' panel layout (linear/quant_layout.h)
  int64_t width() const { return silu_after ? out_features / 2 : out_features; }  // what follows sees
};

struct Norm {
  TensorView weight;
  double eps = 0.0;
};

struct DecoderLayer {
  Norm input_norm, post_norm;
  std::optional<Norm> q_norm, k_norm;  // Qwen3: RMSNorm over each query / key head
  Projection qkv, o, gate_up, down;
};

// The phases of a layer whose time a profiled step adds up (set_profiling): the two RMSNorms, the
// four projections, and the attention call (rotary, the KV append and the paged attention).
enum class StepPhase : int { Norms = 0, Qkv, Attention, O, GateUp, Down, Count };

class DecodeStepCpu {
 public:
  DecodeStepCpu(int64_t num_heads, int64_t num_kv_heads, int64_t head_dim, int64_t hidden_size,
                TensorView rotary_cos, TensorView rotary_sin, double softmax_scale, int64_t window_left,
                int64_t window_right);

  void add_layer(const DecoderLayer& layer);
  // caches: [k_0, v_0, k_1, v_1, ...], each [num_blocks, block_size, num_kv_heads, head_dim].
  // kv_cache_dtype "auto": caches of the model dtype; a quantised kind (fp8 / int8 codes, as the
  // attention ops take it) comes with scales [k_scale_0, v_scale_0, k_scale_1, ...] per layer.
  void set_kv_caches(const std::vector<TensorView>& caches, const std::string& kv_cache_dtype,
                     const std::vector<TensorView>& scales);
  // All layers for `hidden`/`residual` [B, hidden_size] (residual: the embeddings; hidden: any
  // values, overwritten): leaves them as the Python loop leaves them before the final norm.
  // positions: int32 [B] tokens in cache before the new one; block_table: int32 [B, max_blocks].
  void step(TensorView hidden, TensorView residual, TensorView positions, TensorView block_table);

  int64_t num_layers() const { return static_cast<int64_t>(layers_.size()); }

  // Profiling: with it on, every step adds each phase's wall time (all layers) to a total, and
  // counts its steps and rows. set_profiling(true) clears the totals; profile() reads them together
  // (seconds indexed by StepPhase). Off (the default), a phase costs one predictable branch.
  struct Profile {
    int64_t steps = 0, rows = 0;
    std::vector<double> seconds;
  };
  void set_profiling(bool on);
  Profile profile();

 private:
  void run_layer(size_t i, const TensorView& hidden, const TensorView& residual, const TensorView& positions,
                 const TensorView& block_table, int64_t rows);
  void ensure_scratch(int64_t rows);
  char* scratch_at(size_t offset) const { return scratch_base_ + offset; }

  int64_t hq_, hkv_, d_, hidden_;
  TensorView cos_, sin_;
  double scale_;
  int64_t window_left_, window_right_;
  DType dtype_;
  std::vector<DecoderLayer> layers_;
  std::vector<TensorView> caches_;
  std::string kv_cache_dtype_ = "auto";
  std::vector<TensorView> scales_;  // quantised caches: k, v scale per layer

  // Scratch for one batch size at a time (grown, never shrunk): byte offsets of each buffer.
  std::unique_ptr<char[]> scratch_;
  char* scratch_base_ = nullptr;
  int64_t scratch_rows_ = 0;
  size_t off_qkv_ = 0, off_attn_ = 0, off_qrot_ = 0, off_qn_ = 0, off_kn_ = 0, off_o_ = 0, off_gu_ = 0,
         off_act_ = 0;
  bool profiling_ = false;
  double phase_s_[static_cast<int>(StepPhase::Count)] = {};
  int64_t prof_steps_ = 0, prof_rows_ = 0;
  std::mutex mutex_;  // one step at a time: the scratch and the profile are shared
};

}  // namespace llmk
