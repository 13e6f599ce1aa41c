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

// weight_packed: pack_linear_weight's fp32 CPU panels of a [out_features, in_features] weight.
void check_packed_weight(const TensorView& weight_packed, int64_t out_features, int64_t in_features) {
  check_ndim(weight_packed, "weight_packed", 3, "[ceil(out_features / 16), in_features, 16]");
  check_dtype(weight_packed, "weight_packed", DType::F32);
  check_on_cpu(weight_packed, "weight_packed");
  LLMK_CHECK(out_features > 0, ValueError, "out_features: must be positive, got ", out_features);
  check_shape(weight_packed, "weight_packed", {(out_features + 15) / 16, in_features, 16},
              "[ceil(out_features / 16), in_features, 16]");
  check_contiguous(weight_packed, "weight_packed");
}

}  // namespace

void linear_packed(TensorView x, TensorView weight_packed, int64_t out_features, std::optional<TensorView> bias,
                   TensorView out, int64_t stream) {
  check_ndim(x, "x", 2, "[rows, in_features]");
  check_ndim(out, "out", 2, "[rows, out_features]");
  check_dtype(x, "x", DType::F32);
  check_dtype(out, "out", DType::F32);
  check_on_cpu(x, "x");
  check_on_cpu(out, "out");
  check_packed_weight(weight_packed, out_features, x.size(1));
  check_shape(out, "out", {x.size(0), out_features}, "[rows, out_features]");
  check_last_dim_contiguous(x, "x");
  check_last_dim_contiguous(out, "out");
  if (bias) {
    check_shape(*bias, "bias", {out_features}, "[out_features]");
    check_dtype(*bias, "bias", DType::F32);
    check_on_cpu(*bias, "bias");
    check_contiguous(*bias, "bias");
  }
  if (out.numel() == 0) return;
  LLMK_RUN_CPU(x, linear_packed, x, weight_packed, out_features, bias ? &*bias : nullptr, out, stream);
}

void linear_packed_silu_mul(TensorView x, TensorView weight_pairs, int64_t out_features, TensorView out,
                            int64_t stream) {
  check_ndim(x, "x", 2, "[rows, in_features]");
  check_ndim(out, "out", 2, "[rows, out_features]");
  check_dtype(x, "x", DType::F32);
  check_dtype(out, "out", DType::F32);
  check_on_cpu(x, "x");
  check_on_cpu(out, "out");
  check_ndim(weight_pairs, "weight_pairs", 3, "[2 * ceil(out_features / 16), in_features, 16]");
  check_dtype(weight_pairs, "weight_pairs", DType::F32);
  check_on_cpu(weight_pairs, "weight_pairs");
  LLMK_CHECK(out_features > 0, ValueError, "out_features: must be positive, got ", out_features);
  check_shape(weight_pairs, "weight_pairs", {2 * ((out_features + 15) / 16), x.size(1), 16},
              "[2 * ceil(out_features / 16), in_features, 16]");
  check_contiguous(weight_pairs, "weight_pairs");
  check_shape(out, "out", {x.size(0), out_features}, "[rows, out_features]");
  check_last_dim_contiguous(x, "x");
  check_last_dim_contiguous(out, "out");
  if (out.numel() == 0) return;
  LLMK_RUN_CPU(x, linear_packed_silu_mul, x, weight_pairs, out_features, out, stream);
}

void packed_weight_rows(TensorView weight_packed, int64_t out_features, TensorView indices, TensorView out,
                        int64_t stream) {
  check_ndim(weight_packed, "weight_packed", 3, "[ceil(out_features / 16), in_features, 16]");
  check_packed_weight(weight_packed, out_features, weight_packed.size(1));
  check_ndim(indices, "indices", 1, "[num_rows]");
  check_index(indices, "indices");
  check_on_cpu(indices, "indices");
  check_contiguous(indices, "indices");
  check_index_range(indices, "indices", 0, out_features, "rows of the weight (out_features)");
  check_shape(out, "out", {indices.size(0), weight_packed.size(1)}, "[num_rows, in_features]");
  check_dtype(out, "out", DType::F32);
  check_contiguous(out, "out");
  if (out.numel() == 0) return;
  LLMK_RUN_CPU(out, packed_weight_rows, weight_packed, indices, out, stream);
}

}  // namespace llmk
