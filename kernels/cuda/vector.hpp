// 16-byte packs of elements and the element-wise operations on them, as the CUDA kernels apply
// them to each 16-byte access. __host__ __device__, so tests run the very same code on the host
// and compare it bit for bit with the host kernels (tests/kernels/cuda_vector_test.cc).
#pragma once

#include <cstdint>

#include "kernels/arith/elementwise.hpp"

namespace c4::kernels::cuda {

/// 16 bytes, the width of one vector load or store (LDG.128 / STG.128).
struct alignas(16) Bytes16 {
  uint32_t w[4];
};

/// A Bytes16 seen as elements of type E.
template <class E>
union Pack {
  static constexpr int kCount = 16 / static_cast<int>(sizeof(E));
  Bytes16 raw;
  E e[kCount];
};

/// a op b for each element of a 16-byte pack.
template <class F, arith::Op kOp>
C4_HD Bytes16 reducePack(Bytes16 a, Bytes16 b) {
  using E = typename F::Elem;
  Pack<E> pa, pb, r;
  pa.raw = a;
  pb.raw = b;
  C4_UNROLL
  for (int i = 0; i < Pack<E>::kCount; ++i) r.e[i] = arith::reduceElem<F, kOp>(pa.e[i], pb.e[i]);
  return r.raw;
}

/// x * s for each element (PreMulSum), s decoded.
template <class F>
C4_HD Bytes16 scalePack(Bytes16 x, typename F::Value s) {
  using E = typename F::Elem;
  Pack<E> p, r;
  p.raw = x;
  C4_UNROLL
  for (int i = 0; i < Pack<E>::kCount; ++i) r.e[i] = arith::scaleElem<F>(p.e[i], s);
  return r.raw;
}

/// x / divisor for each element (ncclAvg), divisor != 0.
template <class F>
C4_HD Bytes16 dividePack(Bytes16 x, int divisor) {
  using E = typename F::Elem;
  Pack<E> p, r;
  p.raw = x;
  C4_UNROLL
  for (int i = 0; i < Pack<E>::kCount; ++i) r.e[i] = arith::divideElem<F>(p.e[i], divisor);
  return r.raw;
}

}  // namespace c4::kernels::cuda
