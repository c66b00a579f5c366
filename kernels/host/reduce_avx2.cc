// AVX2 + FMA + F16C kernels; this file alone is compiled with those -m flags.
#include "kernels/host/kernel_table.hpp"

#if defined(__x86_64__) && defined(C4_KERNELS_BUILD_AVX2)
#include <immintrin.h>

#define C4_VBYTES 32
#define C4_ISA_NS avx2
#include "kernels/host/reduce_simd.inc"

namespace c4::kernels::detail {
bool fillAvx2Table(KernelTable* table) {
  avx2::fill(table, false);
  table->name = "avx2";
  return true;
}
}  // namespace c4::kernels::detail

#else

namespace c4::kernels::detail {
bool fillAvx2Table(KernelTable*) { return false; }
}  // namespace c4::kernels::detail

#endif
