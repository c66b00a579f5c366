// c4comm public API: data types, reduction operators, collective kinds.
#pragma once

#include <cstddef>
#include <cstdint>

#include "c4comm/export.hpp"

namespace c4 {

/// Element types. Values equal NCCL's ncclDataType_t.
enum class DataType : int {
  kInt8 = 0,
  kUint8 = 1,
  kInt32 = 2,
  kUint32 = 3,
  kInt64 = 4,
  kUint64 = 5,
  kFloat16 = 6,
  kFloat32 = 7,
  kFloat64 = 8,
  kBfloat16 = 9,
  kFloat8e4m3 = 10,
  kFloat8e5m2 = 11,
};
constexpr int kNumDataTypes = 12;

/// Reduction operators. Values equal NCCL's ncclRedOp_t; values >= kNumBuiltinOps are user ops
/// created by redOpCreatePreMulSum on a communicator.
enum class RedOp : int {
  kSum = 0,
  kProd = 1,
  kMax = 2,
  kMin = 3,
  kAvg = 4,
};
constexpr int kNumBuiltinOps = 5;

/// Where a PreMulSum scalar lives. Values equal NCCL's ncclScalarResidence_t.
enum class ScalarResidence : int { kDevice = 0, kHostImmediate = 1 };

/// Collective kinds (also used in traces, signatures and tuning).
enum class Coll : uint8_t {
  kAllReduce = 0,
  kAllGather,
  kBroadcast,
  kReduceScatter,
  kReduce,
  kAlltoAll,
  kGather,
  kScatter,
  kSend,
  kRecv,
  kBarrier,
};
constexpr int kNumColls = 11;

/// Size in bytes of one element; 0 for an invalid type.
constexpr size_t dataTypeSize(DataType dt) {
  switch (dt) {
    case DataType::kInt8:
    case DataType::kUint8:
    case DataType::kFloat8e4m3:
    case DataType::kFloat8e5m2:
      return 1;
    case DataType::kFloat16:
    case DataType::kBfloat16:
      return 2;
    case DataType::kInt32:
    case DataType::kUint32:
    case DataType::kFloat32:
      return 4;
    case DataType::kInt64:
    case DataType::kUint64:
    case DataType::kFloat64:
      return 8;
  }
  return 0;
}

constexpr bool isValidDataType(int dt) { return dt >= 0 && dt < kNumDataTypes; }
constexpr bool isFloatType(DataType dt) {
  return dt == DataType::kFloat16 || dt == DataType::kFloat32 || dt == DataType::kFloat64 ||
         dt == DataType::kBfloat16 || dt == DataType::kFloat8e4m3 || dt == DataType::kFloat8e5m2;
}

/// Lower-case names as nccl-tests prints them ("float", "half", "bfloat16", "int8", ..., "sum").
C4_API const char* dataTypeName(DataType dt);
C4_API const char* redOpName(RedOp op);
C4_API const char* collName(Coll c);

}  // namespace c4
