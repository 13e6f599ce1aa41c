#include "linear/linear.h"

#include "common/checks.h"

namespace llmk {

constexpr int64_t kMaxRows = 16;  // beyond this a blocked GEMM (torch's) reuses W better

void linear_small_m(TensorView x, TensorView weight, std::optional<TensorView> bias, TensorView out,
                    int64_t stream) {
  check_ndim(x, "x", 2, "[rows, in_features]");
  check_ndim(weight, "weight", 2, "[out_features, in_features]");
  check_ndim(out, "out", 2, "[rows, out_features]");
  check_float(x, "x");
  check_same_dtype(x, "x", weight, "weight");
  check_same_dtype(x, "x", out, "out");
  check_same_device(x, "x", weight, "weight");
  check_same_device(x, "x", out, "out");
  LLMK_CHECK(x.size(0) <= kMaxRows, ValueError, "x: at most ", kMaxRows, " rows (a decode step), got ",
             x.size(0), "; use a GEMM for more");
  check_dim(weight, "weight", 1, x.size(1), "in_features, from x");
  check_shape(out, "out", {x.size(0), weight.size(0)}, "[rows, out_features]");
  check_last_dim_contiguous(x, "x");
  check_last_dim_contiguous(weight, "weight");
  check_contiguous(out, "out");
  if (bias) {
    check_shape(*bias, "bias", {weight.size(0)}, "[out_features]");
    check_same_dtype(x, "x", *bias, "bias");
    check_same_device(x, "x", *bias, "bias");
    check_contiguous(*bias, "bias");
  }
  if (out.numel() == 0) return;
  LLMK_RUN_CPU(x, linear_small_m, x, weight, bias ? &*bias : nullptr, out, stream);
}

namespace {

// weight_packed: pack_linear_weight's fp32 CPU panels [ceil(out_features / 16), in_features, 16] of a
// [out_features, in_features] weight, or pack_linear_weight_bf16's bf16 k pairs
// [ceil(out_features / 16), ceil(in_features / 2), 16, 2]. `panels` is ceil(out_features / 16), or
// twice that for gate/up pairs.
void check_packed_weight(const TensorView& w, const char* name, int64_t panels, int64_t out_features,
                         int64_t in_features) {
  LLMK_CHECK(out_features > 0, ValueError, "out_features: must be positive, got ", out_features);
  check_on_cpu(w, name);
  if (w.dtype == DType::BF16) {
    check_ndim(w, name, 4, "bf16 pairs [panels, ceil(in_features / 2), 16, 2]");
    check_shape(w, name, {panels, (in_features + 1) / 2, 16, 2}, "bf16 pairs [panels, ceil(in_features / 2), 16, 2]");
  } else {
    check_ndim(w, name, 3, "[panels, in_features, 16]");
    check_dtype(w, name, DType::F32);
    check_shape(w, name, {panels, in_features, 16}, "[panels, in_features, 16]");
  }
  check_contiguous(w, name);
}

// x, out (and bias) in the GEMM's element type: fp32 panels take fp32, bf16 pairs take bf16.
// f32_out: a bf16 x may also write fp32 out (its bf16 results, widened).
void check_activations(const TensorView& x, const TensorView& w, const char* wname, const TensorView& out,
                       bool f32_out = false) {
  check_ndim(x, "x", 2, "[rows, in_features]");
  check_ndim(out, "out", 2, "[rows, out_features]");
  LLMK_CHECK(w.dtype == DType::F32 || w.dtype == DType::BF16, TypeError, wname,
             ": expected float32 panels or bfloat16 pairs, got ", dtype_name(w.dtype));
  const DType dt = w.dtype;
  LLMK_CHECK(x.dtype == dt, TypeError, "x: expected ", dtype_name(dt), " to match ", wname, " (",
             dtype_name(w.dtype), "), got ", dtype_name(x.dtype));
  if (!(f32_out && dt == DType::BF16 && out.dtype == DType::F32)) check_dtype(out, "out", dt);
  check_on_cpu(x, "x");
  check_on_cpu(out, "out");
  check_last_dim_contiguous(x, "x");
  check_last_dim_contiguous(out, "out");
}

}  // namespace

void linear_packed(TensorView x, TensorView weight_packed, int64_t out_features, std::optional<TensorView> bias,
                   TensorView out, int64_t stream) {
  check_activations(x, weight_packed, "weight_packed", out, true);
  check_packed_weight(weight_packed, "weight_packed", (out_features + 15) / 16, out_features, x.size(1));
  check_shape(out, "out", {x.size(0), out_features}, "[rows, out_features]");
  if (bias) {
    check_shape(*bias, "bias", {out_features}, "[out_features]");
    check_dtype(*bias, "bias", x.dtype);
    check_on_cpu(*bias, "bias");
    check_contiguous(*bias, "bias");
  }
  if (out.numel() == 0) return;
  LLMK_RUN_CPU(x, linear_packed, x, weight_packed, out_features, bias ? &*bias : nullptr, out, stream);
}

void linear_packed_silu_mul(TensorView x, TensorView weight_pairs, int64_t out_features, TensorView out,
                            int64_t stream) {
  check_activations(x, weight_pairs, "weight_pairs", out);
  check_packed_weight(weight_pairs, "weight_pairs", 2 * ((out_features + 15) / 16), out_features, x.size(1));
  check_shape(out, "out", {x.size(0), out_features}, "[rows, out_features]");
  if (out.numel() == 0) return;
  LLMK_RUN_CPU(x, linear_packed_silu_mul, x, weight_pairs, out_features, out, stream);
}

void packed_weight_rows(TensorView weight_packed, int64_t out_features, TensorView indices, TensorView out,
                        int64_t stream) {
  check_ndim(out, "out", 2, "[num_rows, in_features]");
  check_packed_weight(weight_packed, "weight_packed", (out_features + 15) / 16, out_features, out.size(1));
  check_ndim(indices, "indices", 1, "[num_rows]");
  check_index(indices, "indices");
  check_on_cpu(indices, "indices");
  check_contiguous(indices, "indices");
  check_index_range(indices, "indices", 0, out_features, "rows of the weight (out_features)");
  check_dim(out, "out", 0, indices.size(0), "num_rows, from indices");
  check_dtype(out, "out", weight_packed.dtype == DType::BF16 ? DType::BF16 : DType::F32);
  check_on_cpu(out, "out");
  check_contiguous(out, "out");
  if (out.numel() == 0) return;
  LLMK_RUN_CPU(out, packed_weight_rows, weight_packed, indices, out, stream);
}

}  // namespace llmk
