// The CUDA kernels: one template family (element-wise map over up to two inputs into up to two
// outputs), instantiated for every (dtype, op) from the same list as the host kernels. Memory
// bound, so the design is about bytes in flight: 16-byte accesses coalesced across the warp, each
// thread issuing kUnroll independent loads per input before the first use, a grid-stride loop over
// a grid sized to fill the GPU (kBlocksPerSm blocks per multiprocessor) and no larger.
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/cuda/launch.hpp"
#include "kernels/cuda/vector.hpp"

namespace c4::kernels::cuda::detail {
namespace {

constexpr int kThreads = 256;
constexpr int kUnroll = 4;
constexpr int kBlocksPerSm = 8;

/// What a kernel does with one 16-byte pack, and with one element (head and tail).
template <class F, arith::Op kOp>
struct ReduceFn {
  using E = typename F::Elem;
  static __device__ __forceinline__ Bytes16 pack(Bytes16 a, Bytes16 b, const ReduceFn&) {
    return reducePack<F, kOp>(a, b);
  }
  static __device__ __forceinline__ E elem(E a, E b, const ReduceFn&) { return arith::reduceElem<F, kOp>(a, b); }
};

template <class F>
struct ScaleFn {
  using E = typename F::Elem;
  typename F::Value s;
  static __device__ __forceinline__ Bytes16 pack(Bytes16 a, Bytes16, const ScaleFn& f) { return scalePack<F>(a, f.s); }
  static __device__ __forceinline__ E elem(E a, E, const ScaleFn& f) { return arith::scaleElem<F>(a, f.s); }
};

template <class F>
struct DivideFn {
  using E = typename F::Elem;
  int divisor;
  static __device__ __forceinline__ Bytes16 pack(Bytes16 a, Bytes16, const DivideFn& f) {
    return dividePack<F>(a, f.divisor);
  }
  static __device__ __forceinline__ E elem(E a, E, const DivideFn& f) { return arith::divideElem<F>(a, f.divisor); }
};

struct CopyFn {
  using E = uint8_t;
  static __device__ __forceinline__ Bytes16 pack(Bytes16 a, Bytes16, const CopyFn&) { return a; }
  static __device__ __forceinline__ E elem(E a, E, const CopyFn&) { return a; }
};

__device__ __forceinline__ Bytes16 load16(const Bytes16* p) {
  const uint4 v = *reinterpret_cast<const uint4*>(p);
  return Bytes16{{v.x, v.y, v.z, v.w}};
}

__device__ __forceinline__ void store16(Bytes16* p, Bytes16 v) {
  *reinterpret_cast<uint4*>(p) = make_uint4(v.w[0], v.w[1], v.w[2], v.w[3]);
}

/// out0[i] (and out1[i]) = Fn(a[i], b[i]) for i < n. Elements [0, head) and those after the last
/// whole pack go one by one; the packs in between in 16-byte accesses (every pointer + head is
/// 16-byte aligned there). kInputs: 1 (b unused) or 2; kOutputs: 1 (out1 unused) or 2.
template <class Fn, int kInputs, int kOutputs>
__global__ void __launch_bounds__(kThreads)
    mapKernel(typename Fn::E* out0, typename Fn::E* out1, const typename Fn::E* a, const typename Fn::E* b, size_t n,
              size_t head, Fn fn) {
  using E = typename Fn::E;
  constexpr int kPer = 16 / static_cast<int>(sizeof(E));
  const size_t tid = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  const size_t packs = (n - head) / kPer;
  const size_t tail = head + packs * kPer;

  auto one = [&](size_t i) {
    const E r = Fn::elem(a[i], kInputs == 2 ? b[i] : E{}, fn);
    out0[i] = r;
    if (kOutputs == 2) out1[i] = r;
  };
  for (size_t i = tid; i < head; i += stride) one(i);
  for (size_t i = tail + tid; i < n; i += stride) one(i);

  const Bytes16* pa = reinterpret_cast<const Bytes16*>(a + head);
  const Bytes16* pb = reinterpret_cast<const Bytes16*>(b + head);
  Bytes16* p0 = reinterpret_cast<Bytes16*>(out0 + head);
  Bytes16* p1 = reinterpret_cast<Bytes16*>(out1 + head);
  size_t i = tid;
  for (; i + (kUnroll - 1) * stride < packs; i += kUnroll * stride) {
    Bytes16 va[kUnroll], vb[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      va[u] = load16(pa + i + u * stride);
      if (kInputs == 2) vb[u] = load16(pb + i + u * stride);
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const Bytes16 r = Fn::pack(va[u], kInputs == 2 ? vb[u] : Bytes16{}, fn);
      store16(p0 + i + u * stride, r);
      if (kOutputs == 2) store16(p1 + i + u * stride, r);
    }
  }
  for (; i < packs; i += stride) {
    const Bytes16 r = Fn::pack(load16(pa + i), kInputs == 2 ? load16(pb + i) : Bytes16{}, fn);
    store16(p0 + i, r);
    if (kOutputs == 2) store16(p1 + i, r);
  }
}

/// Multiprocessors of the current device, read once per device.
int smCount() {
  constexpr int kMaxDevices = 64;
  static int counts[kMaxDevices] = {};
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess || dev < 0 || dev >= kMaxDevices) return 1;
  if (counts[dev] == 0) {
    int sms = 0;
    if (cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess || sms <= 0) sms = 1;
    counts[dev] = sms;  // a benign race: every writer stores the same value
  }
  return counts[dev];
}

/// Elements before the first 16-byte boundary when every pointer shares its offset from one (and
/// that offset is a whole number of elements); n (no packs) otherwise.
size_t headOf(size_t elemSize, size_t n, const void* const* ptrs, int count) {
  const uintptr_t off = reinterpret_cast<uintptr_t>(ptrs[0]) & 15;
  for (int k = 1; k < count; ++k)
    if ((reinterpret_cast<uintptr_t>(ptrs[k]) & 15) != off) return n;
  if (off % elemSize != 0) return n;
  const size_t head = off == 0 ? 0 : (16 - off) / elemSize;
  return head < n ? head : n;
}

template <class Fn, int kInputs, int kOutputs>
cudaError_t launchMap(void* out0, void* out1, const void* a, const void* b, size_t n, const Fn& fn,
                      cudaStream_t stream) {
  using E = typename Fn::E;
  constexpr size_t kPer = 16 / sizeof(E);
  const void* ptrs[4] = {out0, a, kOutputs == 2 ? out1 : out0, kInputs == 2 ? b : a};
  const size_t head = headOf(sizeof(E), n, ptrs, 4);
  const size_t packs = (n - head) / kPer;
  const size_t singles = n - packs * kPer;
  const size_t work = (packs + kUnroll - 1) / kUnroll > singles ? (packs + kUnroll - 1) / kUnroll : singles;
  const size_t maxBlocks = static_cast<size_t>(smCount()) * kBlocksPerSm;
  size_t blocks = (work + kThreads - 1) / kThreads;
  if (blocks > maxBlocks) blocks = maxBlocks;
  if (blocks == 0) blocks = 1;
  mapKernel<Fn, kInputs, kOutputs><<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(
      static_cast<E*>(out0), static_cast<E*>(out1), static_cast<const E*>(a), static_cast<const E*>(b), n, head, fn);
  return cudaGetLastError();
}

// ---- the (dtype, op) tables, in DataType order (include/c4comm/types.hpp) ----

#define C4_FOR_EACH_FAMILY(X) \
  X(arith::Int<int8_t>)       \
  X(arith::Int<uint8_t>)      \
  X(arith::Int<int32_t>)      \
  X(arith::Int<uint32_t>)     \
  X(arith::Int<int64_t>)      \
  X(arith::Int<uint64_t>)     \
  X(arith::Half)              \
  X(arith::Float<float>)      \
  X(arith::Float<double>)     \
  X(arith::Bf16)              \
  X(arith::E4m3)              \
  X(arith::E5m2)

using ReduceLauncher = cudaError_t (*)(void*, void*, const void*, const void*, size_t, cudaStream_t);
using ScaleLauncher = cudaError_t (*)(void*, const void*, const void*, size_t, cudaStream_t);
using DivideLauncher = cudaError_t (*)(void*, const void*, size_t, int, cudaStream_t);

template <class F, arith::Op kOp>
cudaError_t reduceOne(void* d0, void* d1, const void* a, const void* b, size_t n, cudaStream_t s) {
  return d1 != nullptr ? launchMap<ReduceFn<F, kOp>, 2, 2>(d0, d1, a, b, n, ReduceFn<F, kOp>{}, s)
                       : launchMap<ReduceFn<F, kOp>, 2, 1>(d0, nullptr, a, b, n, ReduceFn<F, kOp>{}, s);
}

template <class F>
cudaError_t scaleOne(void* d, const void* src, const void* scalar, size_t n, cudaStream_t s) {
  typename F::Elem e;
  memcpy(&e, scalar, sizeof(e));
  return launchMap<ScaleFn<F>, 1, 1>(d, nullptr, src, nullptr, n, ScaleFn<F>{F::decode(e)}, s);
}

template <class F>
cudaError_t divideOne(void* d, const void* src, size_t n, int divisor, cudaStream_t s) {
  return launchMap<DivideFn<F>, 1, 1>(d, nullptr, src, nullptr, n, DivideFn<F>{divisor}, s);
}

#define C4_REDUCE_ROW(F)                                                                         \
  {reduceOne<F, arith::Op::kSum>, reduceOne<F, arith::Op::kProd>, reduceOne<F, arith::Op::kMax>, \
   reduceOne<F, arith::Op::kMin>},
constexpr ReduceLauncher kReduce[][4] = {C4_FOR_EACH_FAMILY(C4_REDUCE_ROW)};
#define C4_SCALE_ROW(F) scaleOne<F>,
constexpr ScaleLauncher kScale[] = {C4_FOR_EACH_FAMILY(C4_SCALE_ROW)};
#define C4_DIVIDE_ROW(F) divideOne<F>,
constexpr DivideLauncher kDivide[] = {C4_FOR_EACH_FAMILY(C4_DIVIDE_ROW)};
#undef C4_REDUCE_ROW
#undef C4_SCALE_ROW
#undef C4_DIVIDE_ROW
#undef C4_FOR_EACH_FAMILY

static_assert(sizeof(kReduce) / sizeof(kReduce[0]) == 12, "one row per DataType");
static_assert(sizeof(kScale) / sizeof(kScale[0]) == 12, "one entry per DataType");

__global__ void waitFlagKernel(const volatile unsigned* flag, unsigned value) {
  unsigned ns = 32;
  while (static_cast<int>(*flag - value) < 0) {
    __nanosleep(ns);
    if (ns < 4096) ns *= 2;
  }
  __threadfence_system();  // what the host wrote before the flag is seen by the work after this
}

}  // namespace

cudaError_t launchWaitFlag(const volatile unsigned* flag, unsigned value, cudaStream_t stream) {
  waitFlagKernel<<<1, 1, 0, stream>>>(flag, value);
  return cudaGetLastError();
}

cudaError_t launchReduce(void* dst0, void* dst1, const void* a, const void* b, size_t count, int dt, int op,
                         cudaStream_t stream) {
  return kReduce[dt][op](dst0, dst1, a, b, count, stream);
}

cudaError_t launchScale(void* dst, const void* src, const void* scalar, size_t count, int dt, cudaStream_t stream) {
  return kScale[dt](dst, src, scalar, count, stream);
}

cudaError_t launchDivide(void* dst, const void* src, size_t count, int dt, int divisor, cudaStream_t stream) {
  return kDivide[dt](dst, src, count, divisor, stream);
}

cudaError_t launchCopy(void* dst, const void* src, size_t bytes, cudaStream_t stream) {
  const void* ptrs[2] = {dst, src};
  if (headOf(1, bytes, ptrs, 2) == bytes && bytes >= 16)
    return cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, stream);
  return launchMap<CopyFn, 1, 1>(dst, nullptr, src, nullptr, bytes, CopyFn{}, stream);
}

}  // namespace c4::kernels::cuda::detail
