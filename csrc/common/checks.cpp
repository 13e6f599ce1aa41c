#include "common/checks.h"

#include <cstdlib>
#include <cstring>
#include <vector>

#include "common/device_memory.h"

namespace llmk {

std::string shape_str(const TensorView& t) {
  std::string s = "[";
  for (int i = 0; i < t.ndim; ++i) {
    if (i) s += ", ";
    s += std::to_string(t.shape[i]);
  }
  return s + "]";
}

const char* device_str(const TensorView& t) {
  return t.is_cuda() ? "cuda" : t.is_cpu() ? "cpu" : "an unsupported device";
}

void check_ndim(const TensorView& t, const char* name, int ndim, const char* layout) {
  LLMK_CHECK(t.ndim == ndim, ValueError, name, ": expected a ", ndim, "-D tensor ", layout,
             ", got a ", t.ndim, "-D tensor of shape ", shape_str(t));
}

void check_shape(const TensorView& t, const char* name, std::initializer_list<int64_t> dims,
                 const char* layout) {
  check_ndim(t, name, static_cast<int>(dims.size()), layout);
  int i = 0;
  for (int64_t d : dims) {
    if (d >= 0 && t.shape[i] != d) {
      std::string want = "[";
      int j = 0;
      for (int64_t e : dims) {
        if (j++) want += ", ";
        want += e < 0 ? std::string("*") : std::to_string(e);
      }
      want += "]";
      throw ValueError(str_cat(name, ": expected shape ", want, " ", layout, ", got ", shape_str(t)));
    }
    ++i;
  }
}

void check_dim(const TensorView& t, const char* name, int dim, int64_t expected, const char* what) {
  LLMK_CHECK(t.size(dim) == expected, ValueError, name, ": dim ", dim, " (", what, ") must be ",
             expected, ", got ", t.size(dim), " (shape ", shape_str(t), ")");
}

void check_float(const TensorView& t, const char* name) {
  LLMK_CHECK(t.dtype == DType::F32 || t.dtype == DType::F16 || t.dtype == DType::BF16, TypeError,
             name, ": expected float32, float16 or bfloat16, got ", dtype_name(t.dtype));
}

void check_dtype(const TensorView& t, const char* name, DType dtype) {
  LLMK_CHECK(t.dtype == dtype, TypeError, name, ": expected ", dtype_name(dtype), ", got ",
             dtype_name(t.dtype));
}

void check_index(const TensorView& t, const char* name) {
  LLMK_CHECK(t.dtype == DType::I32 || t.dtype == DType::I64, TypeError, name,
             ": expected an int32 or int64 tensor, got ", dtype_name(t.dtype));
}

void check_same_dtype(const TensorView& a, const char* an, const TensorView& b, const char* bn) {
  LLMK_CHECK(a.dtype == b.dtype, TypeError, bn, ": dtype ", dtype_name(b.dtype), " does not match ",
             an, " (", dtype_name(a.dtype), ")");
}

void check_same_device(const TensorView& a, const char* an, const TensorView& b, const char* bn) {
  LLMK_CHECK(a.device == b.device && (a.device != DeviceType::CUDA || a.device_id == b.device_id),
             ValueError, bn, ": is on ", device_str(b), ":", b.device_id, " but ", an, " is on ",
             device_str(a), ":", a.device_id, "; all tensors must be on the same device");
}

void check_on_cpu(const TensorView& t, const char* name) {
  LLMK_CHECK(t.is_cpu(), ValueError, name, ": must be a CPU tensor, got one on ", device_str(t));
}

void check_contiguous(const TensorView& t, const char* name, int from_dim) {
  LLMK_CHECK(t.is_contiguous(from_dim), ValueError, name,
             from_dim == 0 ? ": must be contiguous" : ": must be contiguous in its inner dims",
             " (shape ", shape_str(t), ")");
}

void check_last_dim_contiguous(const TensorView& t, const char* name) {
  LLMK_CHECK(t.ndim == 0 || t.size(-1) <= 1 || t.stride(-1) == 1, ValueError, name,
             ": the last dimension must be contiguous (stride 1), got stride ", t.stride(-1));
}

int64_t index_at(const TensorView& t, int64_t i) {
  return t.dtype == DType::I64 ? t.ptr<const int64_t>()[i] : t.ptr<const int32_t>()[i];
}

bool host_readable(const TensorView& t) {
#if defined(LLMK_SIMT)
  return true;
#else
  return t.is_cpu();
#endif
}

bool debug_checks_enabled() {
  static const bool on = [] {
    const char* v = std::getenv("LLMKERN_DEBUG_CHECKS");
    return v && *v && std::strcmp(v, "0") != 0;
  }();
  return on;
}

void check_index_range(const TensorView& t, const char* name, int64_t lo, int64_t hi,
                       const char* what, bool allow_minus_one) {
  const int64_t n = t.numel();
  if (n == 0) return;
  const bool direct = host_readable(t);
  if (!direct && !debug_checks_enabled()) return;
  LLMK_CHECK(t.is_contiguous(), ValueError, name, ": must be contiguous");
  std::vector<char> host;
  const char* base = t.bytes();
  if (!direct) {
    host.resize(n * t.elem_size());
    copy_device_to_host(host.data(), t.data, host.size());
    base = host.data();
  }
  for (int64_t i = 0; i < n; ++i) {
    const int64_t v = t.dtype == DType::I64 ? reinterpret_cast<const int64_t*>(base)[i]
                                            : reinterpret_cast<const int32_t*>(base)[i];
    if (allow_minus_one && v == -1) continue;
    LLMK_CHECK(v >= lo && v < hi, ValueError, name, ": entry ", i, " is ", v, ", out of range [",
               lo, ", ", hi, ") for ", what);
  }
}

}  // namespace llmk
