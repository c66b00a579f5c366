// The dispatch table shared by the scalar, AVX2 and AVX-512 translation units. Private to
// kernels/host. Kept free of inline code on purpose: the ISA translation units are compiled with
// -mavx2/-mavx512*, and an inline function they emitted could be picked by the linker for callers
// running on CPUs without those instructions.
#pragma once

#include <cstddef>

namespace c4::kernels::detail {

constexpr int kNumDtypes = 12;
constexpr int kNumKOps = 4;

using ReduceFn = void (*)(void* dst, const void* a, const void* b, size_t count);
using ScaleFn = void (*)(void* dst, const void* src, const void* scalar, size_t count);
// divisor > 0 on vector paths; the scalar path handles every non-zero divisor.
using DivideFn = void (*)(void* dst, const void* src, size_t count, int divisor);
using CopyFn = void (*)(void* dst, const void* src, size_t bytes);

/// One function per (dtype, op); indexes are DataType and KOp values.
struct KernelTable {
  const char* name;
  ReduceFn reduce[kNumDtypes][kNumKOps];
  ScaleFn scale[kNumDtypes];
  DivideFn divide[kNumDtypes];
  CopyFn copyNonTemporal;  // null when the ISA has no streaming-store copy
};

/// Fills every entry with the scalar implementation.
void fillScalarTable(KernelTable* table);
/// Overrides the entries this ISA implements; false (table untouched) if the build has no such code.
bool fillAvx2Table(KernelTable* table);
/// allowVbmi: use AVX512-VBMI where the CPU has it (false: as on a CPU without it, for tests).
bool fillAvx512Table(KernelTable* table, bool allowVbmi);

}  // namespace c4::kernels::detail
