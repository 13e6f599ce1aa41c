#include "decoder/decode_step.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <string>

#include "attention/flash_attn.h"
#include "common/checks.h"
#include "common/errors.h"
#include "common/overlap.h"
#include "kvcache/kv_quant_front.h"
#include "layernorm/layernorm.h"
#include "linear/linear.h"
#include "linear/linear_quant.h"

namespace llmk {

namespace {

TensorView view_of(void* data, DType dtype, std::initializer_list<int64_t> shape,
                   std::initializer_list<int64_t> strides) {
  TensorView v;
  v.data = data;
  v.dtype = dtype;
  v.ndim = static_cast<int>(shape.size());
  std::copy(shape.begin(), shape.end(), v.shape);
  std::copy(strides.begin(), strides.end(), v.strides);
  return v;
}

// [rows, n] contiguous rows of `dtype` at `data`.
TensorView rows_of(void* data, DType dtype, int64_t rows, int64_t n) {
  return view_of(data, dtype, {rows, n}, {n, 1});
}

void check_projection(const Projection& p, const char* name, DType dtype, int64_t in_features,
                      int64_t out_features) {
  const std::string w = std::string(name) + ".weight";
  switch (p.kind) {
    case ProjKind::Packed:
    case ProjKind::PackedSiluMul:  // the layout is the kernel's to check (every call)
    case ProjKind::Quant:
    case ProjKind::QuantSiluMul:
      LLMK_CHECK(p.kind == ProjKind::Packed || p.kind == ProjKind::Quant || (!p.bias && !p.silu_after), ValueError,
                 name, ": the gate/up epilogue kind takes no bias and applies the SiLU itself");
      break;
    case ProjKind::SmallM:
      check_shape(p.weight, w.c_str(), {p.out_features, p.in_features}, "[out_features, in_features]");
      check_dtype(p.weight, w.c_str(), dtype);
      break;
    default:
      throw ValueError(str_cat(name, ": unknown projection kind ", static_cast<int>(p.kind)));
  }
  check_on_cpu(p.weight, w.c_str());
  LLMK_CHECK(p.in_features == in_features, ValueError, name, ": expected ", in_features, " input features, got ",
             p.in_features);
  LLMK_CHECK(!p.silu_after || p.out_features % 2 == 0, ValueError, name,
             ": silu_and_mul needs an even width, got ", p.out_features);
  LLMK_CHECK(p.width() == out_features, ValueError, name, ": expected ", out_features,
             " output features, got ", p.width());
  if (p.bias) {
    const std::string b = std::string(name) + ".bias";
    check_shape(*p.bias, b.c_str(), {p.out_features}, "[out_features]");
    check_dtype(*p.bias, b.c_str(), dtype);
  }
}

// out = x W^T (+ bias), and the gated SiLU where the kind or the layer asks for it; `tmp` holds the
// [rows, 2 * inter] product when silu_and_mul follows (out is then [rows, inter]).
void run_projection(const Projection& p, const TensorView& x, const TensorView& out, const TensorView& tmp) {
  const TensorView& y = p.silu_after ? tmp : out;
  switch (p.kind) {
    case ProjKind::Packed: linear_packed(x, p.weight, p.out_features, p.bias, y, 0); break;
    case ProjKind::PackedSiluMul: linear_packed_silu_mul(x, p.weight, p.out_features, y, 0); break;
    case ProjKind::SmallM: linear_small_m(x, p.weight, p.bias, y, 0); break;
    case ProjKind::Quant: linear_quant(x, p.weight, p.out_features, p.layout, p.bias, y, 0); break;
    case ProjKind::QuantSiluMul: linear_quant_silu_mul(x, p.weight, p.out_features, p.layout, y, 0); break;
  }
  if (p.silu_after) silu_and_mul(out, tmp, 0);
}

size_t round_up(size_t n) { return (n + 63) / 64 * 64; }

// Adds the time since the last lap to a phase's total; does nothing without totals (not profiling).
class Laps {
 public:
  explicit Laps(double* totals) : totals_(totals) {
    if (totals_) last_ = Clock::now();
  }
  void lap(StepPhase phase) {
    if (!totals_) return;
    const Clock::time_point now = Clock::now();
    totals_[static_cast<int>(phase)] += std::chrono::duration<double>(now - last_).count();
    last_ = now;
  }

 private:
  using Clock = std::chrono::steady_clock;
  double* totals_;
  Clock::time_point last_;
};

// An error from a kernel inside layer i, as the same Python exception with the layer named.
template <typename Fn>
void in_layer(size_t i, Fn&& fn) {
  const auto where = [i](const std::exception& e) { return str_cat("decode step, layer ", i, ": ", e.what()); };
  try {
    fn();
  } catch (const IndexOutOfRangeError& e) {
    throw IndexOutOfRangeError(where(e));
  } catch (const ValueError& e) {
    throw ValueError(where(e));
  } catch (const TypeError& e) {
    throw TypeError(where(e));
  } catch (const NotImplementedError& e) {
    throw NotImplementedError(where(e));
  } catch (const RuntimeError& e) {
    throw RuntimeError(where(e));
  }
}

}  // namespace

DecodeStepCpu::DecodeStepCpu(int64_t num_heads, int64_t num_kv_heads, int64_t head_dim, int64_t hidden_size,
                             TensorView rotary_cos, TensorView rotary_sin, double softmax_scale,
                             int64_t window_left, int64_t window_right)
    : hq_(num_heads), hkv_(num_kv_heads), d_(head_dim), hidden_(hidden_size), cos_(rotary_cos),
      sin_(rotary_sin), scale_(softmax_scale), window_left_(window_left), window_right_(window_right),
      dtype_(rotary_cos.dtype) {
  LLMK_CHECK(hq_ > 0 && hkv_ > 0 && hq_ % hkv_ == 0, ValueError, "num_heads: expected a positive multiple of ",
             "num_kv_heads, got ", hq_, " and ", hkv_);
  LLMK_CHECK(d_ > 0 && d_ % 8 == 0, ValueError, "head_dim: expected a positive multiple of 8, got ", d_);
  LLMK_CHECK(hidden_ > 0, ValueError, "hidden_size: must be positive, got ", hidden_);
  check_float(rotary_cos, "rotary_cos");
  check_on_cpu(rotary_cos, "rotary_cos");
  check_on_cpu(rotary_sin, "rotary_sin");
  check_same_dtype(rotary_cos, "rotary_cos", rotary_sin, "rotary_sin");
}

void DecodeStepCpu::add_layer(const DecoderLayer& L) {
  const std::string at = str_cat("layers[", layers_.size(), "]");
  const auto norm = [&](const Norm& n, const char* what, int64_t width) {
    const std::string name = at + "." + what;
    check_shape(n.weight, name.c_str(), {width}, "[width]");
    check_dtype(n.weight, name.c_str(), dtype_);
    check_on_cpu(n.weight, name.c_str());
  };
  norm(L.input_norm, "input_norm", hidden_);
  norm(L.post_norm, "post_norm", hidden_);
  LLMK_CHECK(L.q_norm.has_value() == L.k_norm.has_value(), ValueError, at, ": q_norm and k_norm come together");
  if (L.q_norm) {
    norm(*L.q_norm, "q_norm", d_);
    norm(*L.k_norm, "k_norm", d_);
  }
  check_projection(L.qkv, (at + ".qkv").c_str(), dtype_, hidden_, (hq_ + 2 * hkv_) * d_);
  check_projection(L.o, (at + ".o").c_str(), dtype_, hq_ * d_, hidden_);
  const int64_t inter = L.gate_up.width();
  check_projection(L.gate_up, (at + ".gate_up").c_str(), dtype_, hidden_, inter);
  check_projection(L.down, (at + ".down").c_str(), dtype_, inter, hidden_);
  std::lock_guard<std::mutex> lock(mutex_);
  layers_.push_back(L);
  scratch_rows_ = 0;  // widths may have grown
}

void DecodeStepCpu::set_kv_caches(const std::vector<TensorView>& caches, const std::string& kv_cache_dtype,
                                  const std::vector<TensorView>& scales) {
  LLMK_CHECK(caches.size() == 2 * layers_.size(), ValueError, "kv_caches: expected ", layers_.size(),
             " (key_cache, value_cache) pairs, one per layer, got ", caches.size() / 2.0);
  const KvQuant quant = parse_kv_cache_dtype(kv_cache_dtype);
  // The attention front checks each layer's scales at every call; here only their count.
  LLMK_CHECK(scales.size() == (quant == KvQuant::None ? 0 : caches.size()), ValueError,
             "kv_scales: expected a (k_scale, v_scale) pair per layer for kv_cache_dtype '", kv_cache_dtype,
             "' (none for 'auto'), got ", scales.size(), " scales");
  for (size_t i = 0; i < caches.size(); ++i) {
    const std::string name = str_cat("kv_caches[", i / 2, "][", i % 2, "]");
    const TensorView& c = caches[i];
    check_shape(c, name.c_str(), {-1, -1, hkv_, d_}, "[num_blocks, block_size, num_kv_heads, head_dim]");
    check_dtype(c, name.c_str(), quant == KvQuant::None ? dtype_ : kv_quant_storage(quant));
    check_on_cpu(c, name.c_str());
    if (i % 2) {
      const TensorView& k = caches[i - 1];
      LLMK_CHECK(c.size(0) == k.size(0) && c.size(1) == k.size(1), ValueError, name,
                 ": expected the shape of its key cache ", shape_str(k), ", got ", shape_str(c));
    }
  }
  std::lock_guard<std::mutex> lock(mutex_);
  caches_ = caches;
  kv_cache_dtype_ = kv_cache_dtype;
  scales_ = scales;
}

void DecodeStepCpu::ensure_scratch(int64_t rows) {
  if (rows <= scratch_rows_) return;
  int64_t gu = 0, act = 0;
  for (const DecoderLayer& L : layers_) {
    gu = std::max(gu, L.gate_up.out_features);
    act = std::max(act, L.gate_up.width());
  }
  const size_t es = dtype_size(dtype_), r = static_cast<size_t>(rows);
  size_t at = 0;
  const auto take = [&](int64_t width) {
    const size_t off = at;
    at += round_up(r * static_cast<size_t>(width) * es);
    return off;
  };
  off_qkv_ = take((hq_ + 2 * hkv_) * d_);
  off_attn_ = take(hq_ * d_);
  off_qrot_ = take(hq_ * d_);
  off_qn_ = take(hq_ * d_);
  off_kn_ = take(hkv_ * d_);
  off_o_ = take(hidden_);
  off_gu_ = take(gu);
  off_act_ = take(act);
  scratch_.reset(new char[at + 64]);
  const auto addr = reinterpret_cast<uintptr_t>(scratch_.get());
  scratch_base_ = scratch_.get() + (64 - addr % 64) % 64;  // 64-byte aligned, as torch's buffers
  scratch_rows_ = rows;
}

void DecodeStepCpu::step(TensorView hidden, TensorView residual, TensorView positions, TensorView block_table) {
  std::lock_guard<std::mutex> lock(mutex_);
  check_shape(residual, "residual", {-1, hidden_}, "[batch, hidden_size]");
  check_dtype(residual, "residual", dtype_);
  check_on_cpu(residual, "residual");
  check_contiguous(residual, "residual");
  const int64_t rows = residual.size(0);
  check_shape(hidden, "hidden", {rows, hidden_}, "[batch, hidden_size], as residual");
  check_dtype(hidden, "hidden", dtype_);
  check_on_cpu(hidden, "hidden");
  check_contiguous(hidden, "hidden");
  check_no_overlap(residual, "residual", hidden, "hidden");
  check_shape(positions, "decode_positions", {rows}, "[batch]");
  check_dtype(positions, "decode_positions", DType::I32);
  check_on_cpu(positions, "decode_positions");
  check_ndim(block_table, "decode_block_table", 2, "[batch, max_blocks]");
  check_dim(block_table, "decode_block_table", 0, rows, "batch, from residual");
  check_dtype(block_table, "decode_block_table", DType::I32);
  check_on_cpu(block_table, "decode_block_table");
  LLMK_CHECK(caches_.size() == 2 * layers_.size(), ValueError,
             "kv_caches: not set for this model's layers (set_kv_caches)");
  if (rows == 0 || layers_.empty()) return;
  ensure_scratch(rows);
  if (profiling_) ++prof_steps_, prof_rows_ += rows;
  Laps laps(profiling_ ? phase_s_ : nullptr);
  in_layer(0, [&] { rms_norm(hidden, residual, layers_[0].input_norm.weight, layers_[0].input_norm.eps, 0); });
  laps.lap(StepPhase::Norms);
  for (size_t i = 0; i < layers_.size(); ++i)
    in_layer(i, [&] { run_layer(i, hidden, residual, positions, block_table, rows); });
}

void DecodeStepCpu::set_profiling(bool on) {
  std::lock_guard<std::mutex> lock(mutex_);
  profiling_ = on;
  if (on) {
    std::fill(std::begin(phase_s_), std::end(phase_s_), 0.0);
    prof_steps_ = prof_rows_ = 0;
  }
}

DecodeStepCpu::Profile DecodeStepCpu::profile() {
  std::lock_guard<std::mutex> lock(mutex_);
  return Profile{prof_steps_, prof_rows_, std::vector<double>(std::begin(phase_s_), std::end(phase_s_))};
}

namespace {
std::optional<TensorView> scale_at(const std::vector<TensorView>& scales, size_t i) {
  if (i < scales.size()) return scales[i];
  return std::nullopt;
}
}  // namespace

// One layer, call for call as LlamaForCausalLM.forward's loop body on a decode-only batch (after
// layer 0's input norm, which step() runs).
void DecodeStepCpu::run_layer(size_t i, const TensorView& hidden, const TensorView& residual,
                              const TensorView& positions, const TensorView& block_table, int64_t rows) {
  const DecoderLayer& L = layers_[i];
  const DType dt = dtype_;
  const int64_t es = static_cast<int64_t>(dtype_size(dt));
  Laps laps(profiling_ ? phase_s_ : nullptr);
  if (i > 0) fused_add_rms_norm(hidden, residual, L.input_norm.weight, L.input_norm.eps, 0);
  laps.lap(StepPhase::Norms);

  const int64_t qkv_w = (hq_ + 2 * hkv_) * d_;
  char* qkv = scratch_at(off_qkv_);
  run_projection(L.qkv, hidden, rows_of(qkv, dt, rows, qkv_w), TensorView{});
  laps.lap(StepPhase::Qkv);
  // q / k / v: the heads of the fused rows as [rows, 1, heads, D] (attention.py: _as_batch).
  TensorView q = view_of(qkv, dt, {rows, 1, hq_, d_}, {qkv_w, qkv_w, d_, 1});
  TensorView k = view_of(qkv + hq_ * d_ * es, dt, {rows, 1, hkv_, d_}, {qkv_w, qkv_w, d_, 1});
  const TensorView v = view_of(qkv + (hq_ + hkv_) * d_ * es, dt, {rows, 1, hkv_, d_}, {qkv_w, qkv_w, d_, 1});
  if (L.q_norm) {  // per-head norms on contiguous copies, as the Python loop
    char* qn = scratch_at(off_qn_);
    char* kn = scratch_at(off_kn_);
    for (int64_t r = 0; r < rows; ++r) {
      std::memcpy(qn + r * hq_ * d_ * es, qkv + r * qkv_w * es, hq_ * d_ * es);
      std::memcpy(kn + r * hkv_ * d_ * es, qkv + (r * qkv_w + hq_ * d_) * es, hkv_ * d_ * es);
    }
    const TensorView qr = rows_of(qn, dt, rows * hq_, d_), kr = rows_of(kn, dt, rows * hkv_, d_);
    rms_norm(qr, qr, L.q_norm->weight, L.q_norm->eps, 0);
    rms_norm(kr, kr, L.k_norm->weight, L.k_norm->eps, 0);
    q = view_of(qn, dt, {rows, 1, hq_, d_}, {hq_ * d_, hq_ * d_, d_, 1});
    k = view_of(kn, dt, {rows, 1, hkv_, d_}, {hkv_ * d_, hkv_ * d_, d_, 1});
  }
  char* attn = scratch_at(off_attn_);
  const TensorView out = view_of(attn, dt, {rows, 1, hq_, d_}, {hq_ * d_, hq_ * d_, d_, 1});
  const TensorView q_rot = view_of(scratch_at(off_qrot_), dt, {rows, 1, hq_, d_}, {hq_ * d_, hq_ * d_, d_, 1});
  // ops/attention.py: decode_append_paged
  flash_attn_kvcache_fwd_ext(q, caches_[2 * i], caches_[2 * i + 1], k, v, cos_, sin_, positions, std::nullopt,
                             std::nullopt, block_table, scale_, true, window_left_, window_right_, 0.0, false,
                             std::nullopt, 0, out, std::nullopt, std::nullopt, q_rot, kv_cache_dtype_,
                             scale_at(scales_, 2 * i), scale_at(scales_, 2 * i + 1), 0);

  laps.lap(StepPhase::Attention);  // q/k norms (Qwen3) count here too

  const TensorView o = rows_of(scratch_at(off_o_), dt, rows, hidden_);
  run_projection(L.o, rows_of(attn, dt, rows, hq_ * d_), o, TensorView{});
  laps.lap(StepPhase::O);
  fused_add_rms_norm(o, residual, L.post_norm.weight, L.post_norm.eps, 0);
  laps.lap(StepPhase::Norms);
  const TensorView act = rows_of(scratch_at(off_act_), dt, rows, L.gate_up.width());
  run_projection(L.gate_up, o, act, rows_of(scratch_at(off_gu_), dt, rows, L.gate_up.out_features));
  laps.lap(StepPhase::GateUp);
  run_projection(L.down, act, hidden, TensorView{});
  laps.lap(StepPhase::Down);
}

}  // namespace llmk
