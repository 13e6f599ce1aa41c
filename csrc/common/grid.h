// Grid dimensions y and z hold at most 65,535 blocks (x up to 2^31 - 1). Kernels that put a
// count which may exceed that (sequences, block-copy pairs) on y or z are launched once per
// chunk of it, with the chunk's first index as an argument: one launch in the usual case, and
// still no host synchronisation (graph capture records the launches in order).
#pragma once
#include <cstdint>

namespace llmk {

constexpr int64_t kMaxGridYZ = 65535;

// fn(first, count) for consecutive chunks [first, first + count) of [0, n), count <= 65,535.
template <typename Fn>
void for_each_grid_chunk(int64_t n, Fn fn) {
  for (int64_t first = 0; first < n; first += kMaxGridYZ)
    fn(first, static_cast<unsigned>(n - first < kMaxGridYZ ? n - first : kMaxGridYZ));
}

}  // namespace llmk
