#include "layernorm/layernorm.h"

#include "common/checks.h"
#include "common/overlap.h"

namespace llmk {

namespace {

// A [rows, n] operand of the family: floating point, like `ref`, on its device, rows of n
// contiguous elements.
void check_rows(const TensorView& t, const char* name, const TensorView& ref, const char* ref_name,
                int64_t n, const char* what) {
  check_ndim(t, name, 2, "[rows, hidden]");
  check_float(t, name);
  check_same_dtype(t, name, ref, ref_name);
  check_same_device(t, name, ref, ref_name);
  check_dim(t, name, 0, ref.size(0), "rows, from input");
  check_dim(t, name, 1, n, what);
  check_last_dim_contiguous(t, name);
}

// The operands of both norms: input and a second [rows, hidden] tensor like it (out or residual),
// the weight, epsilon.
void check_norm(const TensorView& input, const TensorView& other, const char* other_name, const TensorView& weight,
                double eps) {
  check_rows(input, "input", input, "input", input.size(1), "hidden");
  check_rows(other, other_name, input, "input", input.size(1), "hidden, from input");
  check_shape(weight, "weight", {input.size(1)}, "[hidden]");
  check_same_dtype(weight, "weight", input, "input");
  check_same_device(weight, "weight", input, "input");
  check_contiguous(weight, "weight");
  LLMK_CHECK(eps >= 0.0 && eps < 1.0, ValueError, "epsilon: expected a small non-negative number, got ", eps);
}

}  // namespace

void rms_norm(TensorView out, TensorView input, TensorView weight, double eps, int64_t stream) {
  check_norm(input, out, "out", weight, eps);
  check_no_overlap(input, "input", out, "out", /*allow_same=*/true);  // in place is documented
  check_no_overlap(weight, "weight", out, "out");
  if (input.numel() == 0) return;
  LLMK_RUN(input, rms_norm, out, input, weight, static_cast<float>(eps), stream);
}

void fused_add_rms_norm(TensorView input, TensorView residual, TensorView weight, double eps, int64_t stream) {
  check_norm(input, residual, "residual", weight, eps);
  check_no_overlap(input, "input", residual, "residual");
  check_no_overlap(weight, "weight", input, "input");
  check_no_overlap(weight, "weight", residual, "residual");
  if (input.numel() == 0) return;
  LLMK_RUN(input, fused_add_rms_norm, input, residual, weight, static_cast<float>(eps), stream);
}

void silu_and_mul(TensorView out, TensorView input, int64_t stream) {
  check_ndim(input, "input", 2, "[rows, 2 * d]");
  LLMK_CHECK(input.size(1) % 2 == 0, ValueError, "input: the last dimension (", input.size(1),
             ") must be even: [gate | up]");
  check_rows(input, "input", input, "input", input.size(1), "2 * d");
  check_rows(out, "out", input, "input", input.size(1) / 2, "d = input.shape[-1] / 2");
  check_no_overlap(input, "input", out, "out");
  if (input.numel() == 0) return;
  LLMK_RUN(input, silu_and_mul, out, input, stream);
}

}  // namespace llmk
