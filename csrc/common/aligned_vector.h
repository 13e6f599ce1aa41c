#pragma once
// std::vector whose storage starts on a cache line. Scratch rows that SIMD loops read and write
// whole vectors of must not start mid-line: from malloc (16-byte aligned) every other 32-byte
// store splits a line, which cost sampling's exponential pass ~11% on Zen 2.
#include <cstddef>
#include <new>
#include <vector>

namespace llmk {

constexpr std::size_t kCacheLine = 64;

template <class T>
struct CacheLineAllocator {
  using value_type = T;
  CacheLineAllocator() = default;
  template <class U>
  CacheLineAllocator(const CacheLineAllocator<U>&) noexcept {}
  T* allocate(std::size_t n) {
    return static_cast<T*>(::operator new(n * sizeof(T), std::align_val_t(kCacheLine)));
  }
  void deallocate(T* p, std::size_t) noexcept { ::operator delete(p, std::align_val_t(kCacheLine)); }
  template <class U>
  bool operator==(const CacheLineAllocator<U>&) const noexcept { return true; }
  template <class U>
  bool operator!=(const CacheLineAllocator<U>&) const noexcept { return false; }
};

template <class T>
using aligned_vector = std::vector<T, CacheLineAllocator<T>>;

}  // namespace llmk
