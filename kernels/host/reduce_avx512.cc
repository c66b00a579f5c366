// AVX-512 (F, BW, DQ, VL) + F16C kernels; this file alone is compiled with those -m flags.
#include "kernels/host/kernel_table.hpp"

#if defined(__x86_64__) && defined(C4_KERNELS_BUILD_AVX512)
#include <immintrin.h>

#define C4_VBYTES 64
#define C4_ISA_NS avx512
#include "kernels/host/reduce_simd.inc"

namespace c4::kernels::detail {
bool fillAvx512Table(KernelTable* table, bool allowVbmi) {
  // Only e4m3 uses VBMI and BF16 (Zen 4, Sapphire Rapids); other AVX-512 CPUs keep the rest.
  avx512::fill(table, allowVbmi && __builtin_cpu_supports("avx512vbmi") && __builtin_cpu_supports("avx512bf16"));
  table->name = "avx512";
  return true;
}
}  // namespace c4::kernels::detail

#else

namespace c4::kernels::detail {
bool fillAvx512Table(KernelTable*, bool) { return false; }
}  // namespace c4::kernels::detail

#endif
