#include "linear/linear_quant.h"

#include "common/checks.h"
#include "linear/quant_layout.h"

namespace llmk {

namespace {

// weight_q: [panels, K / block, block_bytes] uint8 of the layout, on x's device.
void check_quant_weight(const TensorView& w, int64_t layout, int64_t panels, int64_t in_features) {
  LLMK_CHECK(qlayout::valid_id(layout), ValueError, "layout: expected 0 (4-bit, block 32), 1 (8-bit, block 32) "
             "or 2 (8-bit, block 16), got ", layout);
  const qlayout::Layout L = qlayout::layout_of(int(layout));
  LLMK_CHECK(in_features % qlayout::kXBlock == 0, ValueError, "in_features: a quantised weight needs a multiple of ",
             qlayout::kXBlock, ", got ", in_features);
  check_dtype(w, "weight_q", DType::U8);
  check_ndim(w, "weight_q", 3, "[panels, in_features / block, block_bytes]");
  check_shape(w, "weight_q", {panels, in_features / L.block, L.block_bytes()},
              "[panels, in_features / block, block_bytes]");
  check_contiguous(w, "weight_q");
}

void check_io(const TensorView& x, const TensorView& w, const TensorView& out, int64_t out_features) {
  LLMK_CHECK(out_features > 0, ValueError, "out_features: must be positive, got ", out_features);
  check_ndim(x, "x", 2, "[rows, in_features]");
  LLMK_CHECK(x.dtype == DType::F32 || x.dtype == DType::BF16, TypeError,
             "x: expected float32 or bfloat16, got ", dtype_name(x.dtype));
  check_last_dim_contiguous(x, "x");
  check_shape(out, "out", {x.size(0), out_features}, "[rows, out_features]");
  check_dtype(out, "out", x.dtype);
  check_contiguous(out, "out");
  check_same_device(x, "x", w, "weight_q");
  check_same_device(x, "x", out, "out");
}

}  // namespace

void linear_quant(TensorView x, TensorView weight_q, int64_t out_features, int64_t layout,
                  std::optional<TensorView> bias, TensorView out, int64_t stream) {
  check_io(x, weight_q, out, out_features);
  check_quant_weight(weight_q, layout, (out_features + 15) / 16, x.size(1));
  if (bias) {
    check_shape(*bias, "bias", {out_features}, "[out_features]");
    check_dtype(*bias, "bias", x.dtype);
    check_same_device(x, "x", *bias, "bias");
    check_contiguous(*bias, "bias");
  }
  if (out.numel() == 0) return;
  LLMK_RUN(x, linear_quant, x, weight_q, out_features, layout, bias ? &*bias : nullptr, false, out, stream);
}

void linear_quant_silu_mul(TensorView x, TensorView weight_q, int64_t out_features, int64_t layout,
                           TensorView out, int64_t stream) {
  check_io(x, weight_q, out, out_features);
  check_quant_weight(weight_q, layout, 2 * ((out_features + 15) / 16), x.size(1));
  if (out.numel() == 0) return;
  LLMK_RUN(x, linear_quant, x, weight_q, out_features, layout, nullptr, true, out, stream);
}

void quant_weight_rows(TensorView weight_q, int64_t out_features, int64_t layout, TensorView indices,
                       TensorView out, int64_t stream) {
  LLMK_CHECK(out_features > 0, ValueError, "out_features: must be positive, got ", out_features);
  check_ndim(out, "out", 2, "[num_rows, in_features]");
  check_quant_weight(weight_q, layout, (out_features + 15) / 16, out.size(1));
  check_ndim(indices, "indices", 1, "[num_rows]");
  check_index(indices, "indices");
  check_contiguous(indices, "indices");
  check_same_device(weight_q, "weight_q", indices, "indices");
  check_same_device(weight_q, "weight_q", out, "out");
  if (!indices.is_cuda()) check_index_range(indices, "indices", 0, out_features, "rows of the weight (out_features)");
  check_dim(out, "out", 0, indices.size(0), "num_rows, from indices");
  LLMK_CHECK(out.dtype == DType::F32 || out.dtype == DType::BF16, TypeError,
             "out: expected float32 or bfloat16, got ", dtype_name(out.dtype));
  check_contiguous(out, "out");
  if (out.numel() == 0) return;
  LLMK_RUN(weight_q, quant_weight_rows, weight_q, layout, indices, out, stream);
}

}  // namespace llmk
