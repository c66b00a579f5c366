// Scalar kernels, the dispatch table and the public entry points of kernels/host.
#include "kernels/host/reduce.hpp"

#include <atomic>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "common/logging.hpp"
#include "common/params.hpp"
#include "kernels/arith/elementwise.hpp"
#include "kernels/host/kernel_table.hpp"

namespace c4 {
C4_PARAM_STR(KernelsIsa, "C4_KERNELS_ISA", nullptr, "auto", "auto|avx512|avx2|scalar", kParamNone,
             "Host reduction kernels' instruction set: auto, avx512, avx2 or scalar")
C4_PARAM_STR(KernelsIsaMax, "C4_KERNELS_ISA_MAX", nullptr, "auto", "auto|avx512|avx2|scalar", kParamNone,
             "Highest instruction set the host kernels take the CPU to have (auto: what it reports); avx2 or "
             "scalar runs a CPU with AVX-512 as one without it, as the tests of docs/testing.md do")
// Default measured on the development machine (docs/kernels-performance.md): streaming stores only
// pay off once the copy is far larger than the last-level cache.
C4_PARAM_INT(CopyNtThreshold, "C4_COPY_NT_THRESHOLD", nullptr, 64 << 20, -1, INT64_MAX, kParamNone,
             "Bytes at and above which the host copy kernel uses non-temporal stores (-1: never)")
}  // namespace c4

namespace c4::kernels {
namespace {

using detail::KernelTable;

// ---- scalar families (same semantics as reduce_simd.inc) ----

// Buffers need not be aligned to their element size (a collective may reduce at any byte offset),
// so every access goes through memcpy, which compiles to a plain load or store.
template <class T>
T loadAny(const T* p) {
  T v;
  std::memcpy(&v, p, sizeof(T));
  return v;
}

template <class T>
void storeAny(T* p, T v) {
  std::memcpy(p, &v, sizeof(T));
}

// The element arithmetic is kernels/arith's, shared with the CUDA kernels; these add unaligned
// loads and stores.
template <class A>
struct Scalar : A {
  using Elem = typename A::Elem;
  using Value = typename A::Value;
  static Value load(const Elem* p) { return A::decode(loadAny(p)); }
  static void store(Elem* p, Value v) { storeAny(p, A::encode(v)); }
};

template <class T>
using IntScalar = Scalar<arith::Int<T>>;
template <class T>
using FloatScalar = Scalar<arith::Float<T>>;
using HalfScalar = Scalar<arith::Half>;
using Bf16Scalar = Scalar<arith::Bf16>;
using E4m3Scalar = Scalar<arith::E4m3>;
using E5m2Scalar = Scalar<arith::E5m2>;

using Sop = arith::Op;
using arith::combine;

template <class F, Sop kOp>
void reduceScalar(void* dst, const void* a, const void* b, size_t n) {
  using E = typename F::Elem;
  E* d = static_cast<E*>(dst);
  const E* pa = static_cast<const E*>(a);
  const E* pb = static_cast<const E*>(b);
  for (size_t i = 0; i < n; ++i) F::store(d + i, combine<F, kOp>(F::load(pa + i), F::load(pb + i)));
}

template <class F>
void scaleScalar(void* dst, const void* src, const void* scalar, size_t n) {
  using E = typename F::Elem;
  E s;
  std::memcpy(&s, scalar, sizeof(s));
  const typename F::Value sv = F::load(&s);
  E* d = static_cast<E*>(dst);
  const E* p = static_cast<const E*>(src);
  for (size_t i = 0; i < n; ++i) F::store(d + i, F::mul(F::load(p + i), sv));
}

template <class F>
void divideFloatScalar(void* dst, const void* src, size_t n, int divisor) {
  using E = typename F::Elem;
  using V = typename F::Value;
  const V dv = static_cast<V>(divisor);
  E* d = static_cast<E*>(dst);
  const E* p = static_cast<const E*>(src);
  for (size_t i = 0; i < n; ++i) F::store(d + i, F::load(p + i) / dv);
}

template <class T>
void divideIntScalar(void* dst, const void* src, size_t n, int divisor) {
  T* d = static_cast<T*>(dst);
  const T* p = static_cast<const T*>(src);
  if (divisor == 0) {
    // No trap on a bad divisor: report it and leave the values undivided.
    C4_WARN(kLogColl, "integer divide by zero in kernels::divide (%zu elements left undivided)", n);
    if (d != p) std::memmove(d, p, n * sizeof(T));
    return;
  }
  for (size_t i = 0; i < n; ++i) storeAny(d + i, arith::divideElem<arith::Int<T>>(loadAny(p + i), divisor));
}

template <class F>
void setScalarFamily(KernelTable* t, DataType dt) {
  const int i = static_cast<int>(dt);
  t->reduce[i][0] = reduceScalar<F, Sop::kSum>;
  t->reduce[i][1] = reduceScalar<F, Sop::kProd>;
  t->reduce[i][2] = reduceScalar<F, Sop::kMax>;
  t->reduce[i][3] = reduceScalar<F, Sop::kMin>;
  t->scale[i] = scaleScalar<F>;
}

// ---- dispatch ----

bool cpuHasAvx2() {
#if defined(__x86_64__)
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c");
#else
  return false;
#endif
}

bool cpuHasAvx512() {
#if defined(__x86_64__)
  __builtin_cpu_init();
  return cpuHasAvx2() && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
         __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl");
#else
  return false;
#endif
}

// The ISA levels in order; C4_KERNELS_ISA_MAX caps what the dispatch takes the CPU to have.
enum class Level { kScalar = 0, kAvx2 = 1, kAvx512 = 2 };

Level capLevel() {
  const std::string cap = paramKernelsIsaMax();
  if (cap == "scalar") return Level::kScalar;
  if (cap == "avx2") return Level::kAvx2;
  return Level::kAvx512;  // auto, avx512 (the registry refuses other values)
}

struct Tables {
  KernelTable scalar{};
  KernelTable avx2{};
  KernelTable avx512{};
  KernelTable avx512NoVbmi{};  // tests: the AVX-512 table as a CPU without AVX512-VBMI gets it
  bool haveAvx2 = false;
  bool haveAvx512 = false;
  bool cpuAvx2 = false;  // what the CPU reports, before the cap
  bool cpuAvx512 = false;
  Level capped = Level::kAvx512;
};

const Tables& tables() {
  static const Tables t = [] {
    Tables r;
    detail::fillScalarTable(&r.scalar);
    r.avx2 = r.scalar;
    const Level cap = capLevel();
    r.cpuAvx2 = cpuHasAvx2();
    r.cpuAvx512 = cpuHasAvx512();
    r.capped = cap;
    r.haveAvx2 = cap >= Level::kAvx2 && r.cpuAvx2 && detail::fillAvx2Table(&r.avx2);
    // AVX-512 starts from the AVX2 table so that anything it leaves out still runs vectorized.
    r.avx512 = r.haveAvx2 ? r.avx2 : r.scalar;
    r.avx512NoVbmi = r.avx512;
    r.haveAvx512 = r.haveAvx2 && cap >= Level::kAvx512 && r.cpuAvx512 && detail::fillAvx512Table(&r.avx512, true) &&
                   detail::fillAvx512Table(&r.avx512NoVbmi, false);
    r.avx512NoVbmi.name = "avx512novbmi";
    return r;
  }();
  return t;
}

// Returns null when `isa` is unknown or cannot run here.
const KernelTable* tableFor(const char* isa) {
  const Tables& t = tables();
  if (std::strcmp(isa, "auto") == 0) return t.haveAvx512 ? &t.avx512 : t.haveAvx2 ? &t.avx2 : &t.scalar;
  if (std::strcmp(isa, "scalar") == 0) return &t.scalar;
  if (std::strcmp(isa, "avx2") == 0) return t.haveAvx2 ? &t.avx2 : nullptr;
  if (std::strcmp(isa, "avx512") == 0) return t.haveAvx512 ? &t.avx512 : nullptr;
  if (std::strcmp(isa, "avx512novbmi") == 0) return t.haveAvx512 ? &t.avx512NoVbmi : nullptr;
  return nullptr;
}

std::atomic<const KernelTable*> gActive{nullptr};
constexpr size_t kThresholdUnset = 0;
std::atomic<size_t> gNtThreshold{kThresholdUnset};

const KernelTable* initActive() {
  const std::string want = paramKernelsIsa();
  const KernelTable* t = tableFor(want.c_str());
  if (t == nullptr) {
    t = tableFor("auto");
    const char* why = isaUnavailableReason(want.c_str());
    C4_WARN(kLogInit, "C4_KERNELS_ISA=%s cannot run here (%s); using %s", want.c_str(), why ? why : "?", t->name);
  }
  const KernelTable* expected = nullptr;
  if (gActive.compare_exchange_strong(expected, t, std::memory_order_acq_rel)) {
    C4_INFO(kLogInit, "host reduction kernels: %s", t->name);
    return t;
  }
  return expected;
}

inline const KernelTable& active() {
  const KernelTable* t = gActive.load(std::memory_order_acquire);
  return t != nullptr ? *t : *initActive();
}

}  // namespace

namespace detail {

void fillScalarTable(KernelTable* t) {
  t->name = "scalar";
  setScalarFamily<IntScalar<int8_t>>(t, DataType::kInt8);
  setScalarFamily<IntScalar<uint8_t>>(t, DataType::kUint8);
  setScalarFamily<IntScalar<int32_t>>(t, DataType::kInt32);
  setScalarFamily<IntScalar<uint32_t>>(t, DataType::kUint32);
  setScalarFamily<IntScalar<int64_t>>(t, DataType::kInt64);
  setScalarFamily<IntScalar<uint64_t>>(t, DataType::kUint64);
  setScalarFamily<HalfScalar>(t, DataType::kFloat16);
  setScalarFamily<FloatScalar<float>>(t, DataType::kFloat32);
  setScalarFamily<FloatScalar<double>>(t, DataType::kFloat64);
  setScalarFamily<Bf16Scalar>(t, DataType::kBfloat16);
  setScalarFamily<E4m3Scalar>(t, DataType::kFloat8e4m3);
  setScalarFamily<E5m2Scalar>(t, DataType::kFloat8e5m2);
  t->divide[static_cast<int>(DataType::kInt8)] = divideIntScalar<int8_t>;
  t->divide[static_cast<int>(DataType::kUint8)] = divideIntScalar<uint8_t>;
  t->divide[static_cast<int>(DataType::kInt32)] = divideIntScalar<int32_t>;
  t->divide[static_cast<int>(DataType::kUint32)] = divideIntScalar<uint32_t>;
  t->divide[static_cast<int>(DataType::kInt64)] = divideIntScalar<int64_t>;
  t->divide[static_cast<int>(DataType::kUint64)] = divideIntScalar<uint64_t>;
  t->divide[static_cast<int>(DataType::kFloat16)] = divideFloatScalar<HalfScalar>;
  t->divide[static_cast<int>(DataType::kFloat32)] = divideFloatScalar<FloatScalar<float>>;
  t->divide[static_cast<int>(DataType::kFloat64)] = divideFloatScalar<FloatScalar<double>>;
  t->divide[static_cast<int>(DataType::kBfloat16)] = divideFloatScalar<Bf16Scalar>;
  t->divide[static_cast<int>(DataType::kFloat8e4m3)] = divideFloatScalar<E4m3Scalar>;
  t->divide[static_cast<int>(DataType::kFloat8e5m2)] = divideFloatScalar<E5m2Scalar>;
  t->copyNonTemporal = nullptr;
}

}  // namespace detail

namespace {

bool validType(DataType dt, const char* what) {
  if (isValidDataType(static_cast<int>(dt))) return true;
  C4_WARN(kLogColl, "kernels::%s: invalid data type %d (expected 0..%d); nothing done", what, static_cast<int>(dt),
          kNumDataTypes - 1);
  return false;
}

}  // namespace

void reduce(void* dst, const void* a, const void* b, size_t count, DataType dt, KOp op) {
  if (count == 0 || !validType(dt, "reduce")) return;
  const int o = static_cast<int>(op);
  if (o < 0 || o >= detail::kNumKOps) {
    C4_WARN(kLogColl, "kernels::reduce: invalid op %d (expected 0..3); nothing done", o);
    return;
  }
  active().reduce[static_cast<int>(dt)][o](dst, a, b, count);
}

void scale(void* dst, const void* src, const void* scalar, size_t count, DataType dt) {
  if (count == 0 || !validType(dt, "scale")) return;
  active().scale[static_cast<int>(dt)](dst, src, scalar, count);
}

void divide(void* dst, const void* src, size_t count, DataType dt, int divisor) {
  if (count == 0 || !validType(dt, "divide")) return;
  const int i = static_cast<int>(dt);
  // Vector paths assume divisor > 0 (exactness argument, no INT_MIN / -1); the scalar path does all.
  if (divisor <= 0 && !isFloatType(dt)) {
    tables().scalar.divide[i](dst, src, count, divisor);
    return;
  }
  active().divide[i](dst, src, count, divisor);
}

size_t copyNonTemporalThreshold() {
  size_t t = gNtThreshold.load(std::memory_order_relaxed);
  if (t == kThresholdUnset) {
    const int64_t v = paramCopyNtThreshold();
    t = v < 0 ? SIZE_MAX : static_cast<size_t>(v) == kThresholdUnset ? 1 : static_cast<size_t>(v);
    gNtThreshold.store(t, std::memory_order_relaxed);
  }
  return t;
}

void setCopyNonTemporalThresholdForTesting(size_t bytes) {
  gNtThreshold.store(bytes == kThresholdUnset ? 1 : bytes, std::memory_order_relaxed);
}

void copy(void* dst, const void* src, size_t bytes) {
  if (bytes == 0) return;
  const KernelTable& t = active();
  if (t.copyNonTemporal != nullptr && bytes >= copyNonTemporalThreshold()) {
    t.copyNonTemporal(dst, src, bytes);
  } else {
    std::memcpy(dst, src, bytes);
  }
}

void copyStreaming(void* dst, const void* src, size_t bytes) {
  if (bytes == 0) return;
  const KernelTable& t = active();
  if (t.copyNonTemporal != nullptr) {
    t.copyNonTemporal(dst, src, bytes);
  } else {
    std::memcpy(dst, src, bytes);
  }
}

const char* isaName() { return active().name; }

const char* isaUnavailableReason(const char* isa) {
  if (isa == nullptr) return "no instruction set named";
  if (tableFor(isa) != nullptr) return nullptr;
  const Tables& t = tables();
  const bool wants512 = std::strcmp(isa, "avx512") == 0 || std::strcmp(isa, "avx512novbmi") == 0;
  const bool wants2 = std::strcmp(isa, "avx2") == 0;
  if (!wants512 && !wants2) return "unknown instruction set (scalar, avx2, avx512, avx512novbmi or auto)";
#if !defined(__x86_64__)
  return "the AVX kernels are built for x86-64 only";
#else
  if (wants2 || !t.cpuAvx2) {
    if (!t.cpuAvx2) return "the CPU lacks AVX2 (avx2, fma, f16c)";
    return "C4_KERNELS_ISA_MAX=scalar caps the kernels below AVX2 (the CPU has AVX2)";
  }
  if (!t.cpuAvx512) return "the CPU lacks AVX-512 (avx512f, avx512bw, avx512dq, avx512vl)";
  if (t.capped < Level::kAvx512)
    return t.capped == Level::kAvx2 ? "C4_KERNELS_ISA_MAX=avx2 caps the kernels below AVX-512 (the CPU has AVX-512)"
                                    : "C4_KERNELS_ISA_MAX=scalar caps the kernels below AVX-512 (the CPU has AVX-512)";
  return "the AVX-512 kernels failed to build their table";
#endif
}

bool setIsaForTesting(const char* isa) {
  const KernelTable* t = isa != nullptr ? tableFor(isa) : nullptr;
  if (t == nullptr) return false;
  gActive.store(t, std::memory_order_release);
  return true;
}

float halfToFloat(unsigned short h) { return arith::halfToFloat(h); }
unsigned short floatToHalf(float f) { return arith::floatToHalf(f); }
float bf16ToFloat(unsigned short b) { return arith::bf16ToFloat(b); }
unsigned short floatToBf16(float f) { return arith::floatToBf16(f); }
float fp8e4m3ToFloat(unsigned char v) { return arith::fp8e4m3ToFloat(v); }
unsigned char floatToFp8e4m3(float f) { return arith::floatToFp8e4m3(f); }
float fp8e5m2ToFloat(unsigned char v) { return arith::fp8e5m2ToFloat(v); }
unsigned char floatToFp8e5m2(float f) { return arith::floatToFp8e5m2(f); }

}  // namespace c4::kernels
