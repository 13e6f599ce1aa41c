#include "kvcache/kv_quant_front.h"

#include <cmath>

#include "common/checks.h"
#include "common/errors.h"

namespace llmk {

KvQuant parse_kv_cache_dtype(const std::string& s) {
  if (s == "auto") return KvQuant::None;
  if (s == "fp8" || s == "fp8_e4m3") return KvQuant::E4M3;
  if (s == "fp8_e5m2") return KvQuant::E5M2;
  if (s == "int8") return KvQuant::Int8;
  throw ValueError(str_cat("kv_cache_dtype: expected one of 'auto', 'fp8', 'fp8_e4m3', 'fp8_e5m2', "
                           "'int8', got '", s, "'"));
}

DType kv_quant_storage(KvQuant q) { return q == KvQuant::Int8 ? DType::I8 : DType::U8; }

namespace {

void check_scale(const std::optional<TensorView>& s, const char* name, const std::string& kind,
                 const TensorView& cache, const char* cname, int64_t heads, const float*& ptr,
                 int& stride) {
  LLMK_CHECK(s.has_value(), ValueError, name, ": required (float32, [1] or [num_kv_heads]) when "
             "kv_cache_dtype is '", kind, "'");
  check_dtype(*s, name, DType::F32);
  check_same_device(cache, cname, *s, name);
  const int64_t n = s->numel();
  LLMK_CHECK(s->ndim <= 1 && (n == 1 || n == heads), ValueError, name,
             ": expected a per-tensor scale (0-d or [1]) or one per kv head ([", heads, "]), got shape ",
             shape_str(*s));
  check_contiguous(*s, name);
  ptr = s->ptr<const float>();
  stride = n == 1 ? 0 : 1;
  if (!host_readable(*s)) return;
  for (int64_t i = 0; i < n; ++i)
    LLMK_CHECK(std::isfinite(ptr[i]) && ptr[i] > 0.f, ValueError, name, ": entry ", i,
               " must be a positive finite number, got ", ptr[i]);
}

}  // namespace

void set_kv_quant(KvGeom& g, KvQuant q, const std::string& kind, const TensorView& kc,
                  const char* kname, const TensorView& vc, const char* vname,
                  const std::optional<TensorView>& k_scale, const std::optional<TensorView>& v_scale,
                  int64_t heads) {
  if (q == KvQuant::None) return;
  const DType want = kv_quant_storage(q);
  for (const TensorView* c : {&kc, &vc})
    LLMK_CHECK(c->dtype == want, TypeError, c == &kc ? kname : vname, ": kv_cache_dtype '", kind,
               "' stores ", dtype_name(want), " codes, got a ", dtype_name(c->dtype), " cache");
  g.kv_quant = q;
  check_scale(k_scale, "k_scale", kind, kc, kname, heads, g.k_scale, g.k_scale_stride);
  check_scale(v_scale, "v_scale", kind, vc, vname, heads, g.v_scale, g.v_scale_stride);
}

}  // namespace llmk
