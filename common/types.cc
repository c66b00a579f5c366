#include "c4comm/types.hpp"

namespace c4 {

const char* dataTypeName(DataType dt) {
  switch (dt) {
    case DataType::kInt8:
      return "int8";
    case DataType::kUint8:
      return "uint8";
    case DataType::kInt32:
      return "int32";
    case DataType::kUint32:
      return "uint32";
    case DataType::kInt64:
      return "int64";
    case DataType::kUint64:
      return "uint64";
    case DataType::kFloat16:
      return "half";
    case DataType::kFloat32:
      return "float";
    case DataType::kFloat64:
      return "double";
    case DataType::kBfloat16:
      return "bfloat16";
    case DataType::kFloat8e4m3:
      return "f8e4m3";
    case DataType::kFloat8e5m2:
      return "f8e5m2";
  }
  return "unknown-type";
}

const char* redOpName(RedOp op) {
  switch (op) {
    case RedOp::kSum:
      return "sum";
    case RedOp::kProd:
      return "prod";
    case RedOp::kMax:
      return "max";
    case RedOp::kMin:
      return "min";
    case RedOp::kAvg:
      return "avg";
  }
  return static_cast<int>(op) >= kNumBuiltinOps ? "premulsum" : "unknown-op";
}

const char* collName(Coll c) {
  switch (c) {
    case Coll::kAllReduce:
      return "AllReduce";
    case Coll::kAllGather:
      return "AllGather";
    case Coll::kBroadcast:
      return "Broadcast";
    case Coll::kReduceScatter:
      return "ReduceScatter";
    case Coll::kReduce:
      return "Reduce";
    case Coll::kAlltoAll:
      return "AlltoAll";
    case Coll::kGather:
      return "Gather";
    case Coll::kScatter:
      return "Scatter";
    case Coll::kSend:
      return "Send";
    case Coll::kRecv:
      return "Recv";
    case Coll::kBarrier:
      return "Barrier";
  }
  return "UnknownColl";
}

}  // namespace c4
