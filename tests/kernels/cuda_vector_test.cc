// The CUDA kernels' 16-byte pack operations (kernels/cuda/vector.hpp), run on the host: every dtype
// x op against the host kernels bit for bit, on random bit patterns (NaNs, infinities, subnormals
// and the narrow formats' every code included). The device runs the same functions, so this checks
// the device arithmetic without a GPU; cuda_kernels_test.cc checks it on a GPU.
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <string>
#include <type_traits>

#include "c4comm/types.hpp"
#include "kernels/cuda/vector.hpp"
#include "kernels/host/reduce.hpp"
#include "tests/common/not_applicable.hpp"

namespace c4::kernels::cuda {
namespace {

using arith::Op;

// Equal bits element by element, or both NaN: which NaN comes out of an operation on NaNs differs
// between compilers and processors (x86 keeps a payload, a GPU returns its canonical NaN).
template <class F>
::testing::AssertionResult samePacks(const Bytes16& want, const Bytes16& got) {
  using E = typename F::Elem;
  Pack<E> w, g;
  w.raw = want;
  g.raw = got;
  for (int i = 0; i < Pack<E>::kCount; ++i) {
    if (w.e[i] == g.e[i]) continue;
    if constexpr (std::is_floating_point_v<typename F::Value>) {
      const auto dw = F::decode(w.e[i]), dg = F::decode(g.e[i]);
      if (dw != dw && dg != dg) continue;
    }
    return ::testing::AssertionFailure() << "element " << i << ": want bits 0x" << std::hex
                                         << static_cast<uint64_t>(w.e[i]) << ", got 0x"
                                         << static_cast<uint64_t>(g.e[i]);
  }
  return ::testing::AssertionSuccess();
}

template <class F>
void checkFamily(DataType dt, std::mt19937_64& rng) {
  Bytes16 a, b;
  for (int round = 0; round < 2000; ++round) {
    for (int w = 0; w < 4; ++w) {
      a.w[w] = static_cast<uint32_t>(rng());
      b.w[w] = static_cast<uint32_t>(rng());
    }
    if (round % 4 == 1) b = a;  // equal operands: max/min tie-breaks, x*x
    const size_t n = 16 / dataTypeSize(dt);
    const Bytes16 got[4] = {reducePack<F, Op::kSum>(a, b), reducePack<F, Op::kProd>(a, b),
                            reducePack<F, Op::kMax>(a, b), reducePack<F, Op::kMin>(a, b)};
    for (int op = 0; op < 4; ++op) {
      Bytes16 want;
      kernels::reduce(&want, &a, &b, n, dt, static_cast<KOp>(op));
      ASSERT_TRUE(samePacks<F>(want, got[op])) << "dtype " << static_cast<int>(dt) << " op " << op;
    }
    Bytes16 want;
    kernels::scale(&want, &a, &b, n, dt);  // the scalar is b's first element
    typename F::Elem s;
    std::memcpy(&s, &b, sizeof(s));
    const Bytes16 scaled = scalePack<F>(a, F::decode(s));
    ASSERT_TRUE(samePacks<F>(want, scaled)) << "scale, dtype " << static_cast<int>(dt);
    for (int divisor : {1, 2, 3, 7, -1, -5, 1000}) {
      kernels::divide(&want, &a, n, dt, divisor);
      const Bytes16 divided = dividePack<F>(a, divisor);
      ASSERT_TRUE(samePacks<F>(want, divided)) << "divide by " << divisor << ", dtype " << static_cast<int>(dt);
    }
  }
}

class CudaVectorPacks : public ::testing::TestWithParam<const char*> {};

TEST_P(CudaVectorPacks, MatchTheHostKernelsBitForBit) {
  if (!setIsaForTesting(GetParam()))
    C4_NOT_APPLICABLE("cpu-lacks-avx512", GetParam() << ": " << isaUnavailableReason(GetParam()));
  std::mt19937_64 rng(0xc4c0de);
  checkFamily<arith::Int<int8_t>>(DataType::kInt8, rng);
  checkFamily<arith::Int<uint8_t>>(DataType::kUint8, rng);
  checkFamily<arith::Int<int32_t>>(DataType::kInt32, rng);
  checkFamily<arith::Int<uint32_t>>(DataType::kUint32, rng);
  checkFamily<arith::Int<int64_t>>(DataType::kInt64, rng);
  checkFamily<arith::Int<uint64_t>>(DataType::kUint64, rng);
  checkFamily<arith::Half>(DataType::kFloat16, rng);
  checkFamily<arith::Float<float>>(DataType::kFloat32, rng);
  checkFamily<arith::Float<double>>(DataType::kFloat64, rng);
  checkFamily<arith::Bf16>(DataType::kBfloat16, rng);
  checkFamily<arith::E4m3>(DataType::kFloat8e4m3, rng);
  checkFamily<arith::E5m2>(DataType::kFloat8e5m2, rng);
  setIsaForTesting("auto");
}

// The scalar table is the arithmetic itself; the vector ISAs are compared to it bit for bit, so the
// device's packs must match each of them too.
INSTANTIATE_TEST_SUITE_P(Isa, CudaVectorPacks, ::testing::Values("scalar", "auto"),
                         [](const ::testing::TestParamInfo<const char*>& info) { return std::string(info.param); });

}  // namespace
}  // namespace c4::kernels::cuda
