// Do two strided tensors share any byte? Each tensor is reduced to contiguous runs of bytes laid
// out by its outer dims; two runs sets are intersected exactly, first by bounding ranges, then
// (one outer dim each) in O(1) for equal strides or O(min count) otherwise, enumerating further
// outer dims only where bounding ranges still meet. Views of one buffer that interleave without
// sharing bytes (fused-qkv slices, the K and V halves of one cache) are therefore accepted.
#include "common/overlap.h"

#include <algorithm>
#include <vector>

namespace llmk {
namespace {

struct Dim {
  int64_t size, stride;  // stride in bytes, > 0
};

// A tensor's bytes: runs of `run` bytes at base + sum(i_d * stride_d), dims outermost first.
struct Span {
  int64_t base = 0, run = 0;
  std::vector<Dim> dims;
  int64_t extent(size_t from = 0) const {
    int64_t e = run;
    for (size_t i = from; i < dims.size(); ++i) e += (dims[i].size - 1) * dims[i].stride;
    return e;
  }
};

Span make_span(const TensorView& t) {
  Span s;
  const int64_t es = static_cast<int64_t>(t.elem_size());
  s.base = reinterpret_cast<int64_t>(t.data);
  std::vector<Dim> d;
  for (int i = 0; i < t.ndim; ++i) {
    int64_t st = t.stride(i) * es;
    if (t.size(i) <= 1 || st == 0) continue;  // broadcast dims repeat the same bytes
    if (st < 0) s.base += (t.size(i) - 1) * st, st = -st;
    d.push_back({t.size(i), st});
  }
  std::sort(d.begin(), d.end(), [](const Dim& a, const Dim& b) { return a.stride < b.stride; });
  s.run = es;
  size_t i = 0;
  for (; i < d.size() && d[i].stride == s.run; ++i) s.run *= d[i].size;  // contiguous inner dims
  std::vector<Dim> outer;
  for (; i < d.size(); ++i) {
    if (!outer.empty() && d[i].stride == outer.back().size * outer.back().stride)
      outer.back().size *= d[i].size;  // merges with the dim inside it
    else
      outer.push_back(d[i]);
  }
  s.dims.assign(outer.rbegin(), outer.rend());
  return s;
}

int64_t floor_div(int64_t a, int64_t b) { return a / b - ((a % b != 0) && ((a < 0) != (b < 0))); }
int64_t ceil_div(int64_t a, int64_t b) { return -floor_div(-a, b); }

// Does [x, x + len) meet any run [b + j * stride, + blen), 0 <= j < count?
bool interval_meets(int64_t x, int64_t len, int64_t b, int64_t stride, int64_t count, int64_t blen) {
  // x - blen < b + j * stride < x + len
  if (count == 1) return b > x - blen && b < x + len;
  const int64_t jlo = std::max<int64_t>(0, floor_div(x - blen - b, stride) + 1);
  const int64_t jhi = std::min<int64_t>(count - 1, ceil_div(x + len - b, stride) - 1);
  return jlo <= jhi;
}

struct Intersector {
  const Span& a;
  const Span& b;
  int64_t budget = 1 << 16;  // enumeration steps before answering "may overlap"
  bool gave_up = false;

  // Sub-spans: base plus dims[from..] of the span.
  bool meet(int64_t abase, size_t af, int64_t bbase, size_t bf) {
    if (--budget < 0) return gave_up = true;
    const int64_t ahi = abase + a.extent(af), bhi = bbase + b.extent(bf);
    if (ahi <= bbase || bhi <= abase) return false;
    const size_t an = a.dims.size() - af, bn = b.dims.size() - bf;
    if (an <= 1 && bn <= 1) return leaf(abase, af, bbase, bf);
    // Enumerate the outermost dim of the span with more dims left.
    const bool split_a = an >= bn;
    const Dim& d = split_a ? a.dims[af] : b.dims[bf];
    for (int64_t i = 0; i < d.size; ++i) {
      const bool hit = split_a ? meet(abase + i * d.stride, af + 1, bbase, bf)
                               : meet(abase, af, bbase + i * d.stride, bf + 1);
      if (hit) return true;
    }
    return false;
  }

  bool leaf(int64_t abase, size_t af, int64_t bbase, size_t bf) {
    const Dim da = af < a.dims.size() ? a.dims[af] : Dim{1, 1};
    const Dim db = bf < b.dims.size() ? b.dims[bf] : Dim{1, 1};
    if (da.size == 1) return interval_meets(abase, a.run, bbase, db.stride, db.size, b.run);
    if (db.size == 1) return interval_meets(bbase, b.run, abase, da.stride, da.size, a.run);
    if (da.stride == db.stride) {
      // Run i of a meets run j of b iff -a.run < d + (i - j) * stride < b.run.
      const int64_t d = abase - bbase, s = da.stride;
      const int64_t klo = std::max<int64_t>(-(db.size - 1), floor_div(-a.run - d, s) + 1);
      const int64_t khi = std::min<int64_t>(da.size - 1, ceil_div(b.run - d, s) - 1);
      return klo <= khi;
    }
    const bool walk_a = da.size <= db.size;
    const Dim& w = walk_a ? da : db;
    for (int64_t i = 0; i < w.size; ++i) {
      if (--budget < 0) return gave_up = true;
      const bool hit = walk_a ? interval_meets(abase + i * w.stride, a.run, bbase, db.stride, db.size, b.run)
                              : interval_meets(bbase + i * w.stride, b.run, abase, da.stride, da.size, a.run);
      if (hit) return true;
    }
    return false;
  }
};

// Cheap bounding byte ranges, [lo, hi).
void byte_bounds(const TensorView& t, int64_t& lo, int64_t& hi) {
  const int64_t es = static_cast<int64_t>(t.elem_size());
  lo = hi = reinterpret_cast<int64_t>(t.data);
  for (int i = 0; i < t.ndim; ++i) {
    const int64_t span = (t.size(i) - 1) * t.stride(i) * es;
    (span < 0 ? lo : hi) += span;
  }
  hi += es;
}

bool same_view(const TensorView& a, const TensorView& b) {
  if (a.data != b.data || a.elem_size() != b.elem_size() || a.ndim != b.ndim) return false;
  for (int i = 0; i < a.ndim; ++i)
    if (a.size(i) != b.size(i) || (a.size(i) > 1 && a.stride(i) != b.stride(i))) return false;
  return true;
}

}  // namespace

Overlap memory_overlap(const TensorView& a, const TensorView& b) {
  if (a.numel() == 0 || b.numel() == 0) return Overlap::None;
  if (a.device != b.device || a.device_id != b.device_id) return Overlap::None;
  int64_t alo, ahi, blo, bhi;
  byte_bounds(a, alo, ahi);
  byte_bounds(b, blo, bhi);
  if (ahi <= blo || bhi <= alo) return Overlap::None;
  if (same_view(a, b)) return Overlap::Same;
  const Span sa = make_span(a), sb = make_span(b);
  Intersector x{sa, sb};
  return x.meet(sa.base, 0, sb.base, 0) ? Overlap::Partial : Overlap::None;
}

void check_no_overlap(const TensorView& a, const char* an, const TensorView& b, const char* bn,
                      bool allow_same) {
  const Overlap o = memory_overlap(a, b);
  if (o == Overlap::None || (o == Overlap::Same && allow_same)) return;
  throw ValueError(str_cat(bn, ": shares memory with ", an,
                           o == Overlap::Same ? " (the same tensor)" : " (overlapping views)",
                           allow_same ? "; it may be exactly the same tensor (in place) but must not "
                                        "partially overlap it"
                                      : "; pass tensors that do not overlap"));
}

}  // namespace llmk
