// The rotation of one feature pair, shared by the CPU and CUDA kernels (fp32 math, one rounding).
#pragma once
#include "common/macros.h"

LLMK_NS_BEGIN

// Indices of pair i (0 <= i < rot_dim / 2) within a head.
LLMK_HD void rope_pair(int i, int rot_dim, bool is_neox, int& a, int& b) {
  if (is_neox) {
    a = i;
    b = i + rot_dim / 2;
  } else {
    a = 2 * i;
    b = 2 * i + 1;
  }
}

// (x, y) -> (x cos - y sin, y cos + x sin)
LLMK_HD void rope_rotate(float& x, float& y, float c, float s) {
  const float nx = x * c - y * s, ny = y * c + x * s;
  x = nx;
  y = ny;
}

LLMK_NS_END
