#include "core/staging.hpp"

#include <algorithm>
#include <cstdint>

#include "c4comm/c4comm.hpp"
#include "sched/schedule.hpp"

namespace c4 {

namespace {
size_t aligned(size_t b) { return (b + kStagingAlign - 1) / kStagingAlign * kStagingAlign; }

/// Whether a piece's input (output) holds a slice of every rank's block (pieceOf).
bool rowsIn(Coll c) { return c == Coll::kReduceScatter || c == Coll::kScatter || c == Coll::kAlltoAll; }
bool rowsOut(Coll c) { return c == Coll::kAllGather || c == Coll::kGather || c == Coll::kAlltoAll; }
}  // namespace

void callExtents(const OpDesc& op, int rank, int nranks, StagedSide* in, StagedSide* out) {
  sched::CollArgs a;
  a.coll = op.coll;
  a.rank = rank;
  a.nranks = nranks;
  a.count = op.count;
  a.dtype = op.dtype;
  a.root = op.root;
  const size_t inBytes = sched::inputBytes(a), outBytes = sched::outputBytes(a);
  *in = StagedSide{inBytes ? op.sendbuff : nullptr, inBytes, false};
  *out = StagedSide{outBytes ? op.recvbuff : nullptr, outBytes, false};
}

StagingPlan planStaging(const OpDesc& op, int rank, int nranks, const StagedSide& in, const StagedSide& out) {
  StagingPlan plan;
  const size_t pitch = op.devicePitch;
  const bool outRows = pitch != 0 && rowsOut(op.coll);
  const bool inRows = pitch != 0 && rowsIn(op.coll);
  plan.inStaged = in.bytes && (in.device || inRows);
  plan.outStaged = out.bytes && (out.device || outRows);
  const auto ib = reinterpret_cast<uintptr_t>(in.p), ob = reinterpret_cast<uintptr_t>(out.p);
  auto* inDev = const_cast<void*>(in.p);
  auto* outDev = const_cast<void*>(out.p);
  if (pitch != 0) {
    // The rows first, back to back. In place (NCCL's): AlltoAll, the same rows; otherwise the
    // contiguous side is the rank's own row of the other.
    const auto n = static_cast<size_t>(nranks), r = static_cast<size_t>(rank);
    const size_t row = op.count * dataTypeSize(op.dtype);
    if (inRows && plan.inStaged) {
      plan.bytes = n * row;  // the input's rows at 0
    } else if (outRows && plan.outStaged) {
      plan.bytes = n * row;  // the output's rows at 0
    }
    if (inRows && outRows) {
      if (plan.inStaged && plan.outStaged) {
        plan.outOff = ib == ob ? 0 : aligned(plan.bytes);
        plan.bytes = std::max(plan.bytes, plan.outOff + n * row);
      }
    } else if (outRows && plan.inStaged) {
      plan.inOff = plan.outStaged && ib == ob + r * pitch ? r * row : aligned(plan.bytes);
      plan.bytes = std::max(plan.bytes, plan.inOff + in.bytes);
    } else if (inRows && plan.outStaged) {
      plan.outOff = plan.inStaged && ob == ib + r * pitch ? r * row : aligned(plan.bytes);
      plan.bytes = std::max(plan.bytes, plan.outOff + out.bytes);
    }
    if (plan.inStaged)
      plan.in.push_back(inRows ? gpu::StreamGate::Copy{inDev, plan.inOff, row, n, pitch}
                               : gpu::StreamGate::Copy{inDev, plan.inOff, in.bytes});
    if (plan.outStaged)
      plan.out.push_back(outRows ? gpu::StreamGate::Copy{outDev, plan.outOff, row, n, pitch}
                                 : gpu::StreamGate::Copy{outDev, plan.outOff, out.bytes});
    return plan;
  }
  plan.overlap = plan.inStaged && plan.outStaged && ib < ob + out.bytes && ob < ib + in.bytes;
  if (plan.overlap) {
    const uintptr_t base = std::min(ib, ob);
    plan.inOff = ib - base;
    plan.outOff = ob - base;
    plan.bytes = std::max(ib + in.bytes, ob + out.bytes) - base;
  } else {
    if (plan.inStaged) plan.bytes = aligned(in.bytes);
    if (plan.outStaged) {
      plan.outOff = plan.bytes;
      plan.bytes += out.bytes;
    }
  }
  if (plan.inStaged) plan.in.push_back({inDev, plan.inOff, in.bytes});
  if (plan.outStaged) plan.out.push_back({outDev, plan.outOff, out.bytes});
  return plan;
}

StagingPlan stagingPlanOf(const OpDesc& op, int rank, int nranks, bool inDevice, bool outDevice) {
  StagedSide in, out;
  callExtents(op, rank, nranks, &in, &out);
  in.device = inDevice;
  out.device = outDevice;
  return planStaging(op, rank, nranks, in, out);
}

size_t pipelinePieces(const OpDesc& op, int nranks, size_t pieceBytes, bool deferrable) {
  if (pieceBytes == 0 || deferrable) return 1;
  size_t blocks = 1;  // the call's bytes are this many times count elements
  switch (op.coll) {
    case Coll::kAllReduce:
    case Coll::kBroadcast:
    case Coll::kReduce:
      break;
    case Coll::kAllGather:
    case Coll::kReduceScatter:
    case Coll::kAlltoAll:
    case Coll::kGather:
    case Coll::kScatter:
      blocks = static_cast<size_t>(nranks);  // the root's, for Gather and Scatter: every rank counts alike
      break;
    default:
      return 1;
  }
  const size_t blockBytes = op.count * dataTypeSize(op.dtype);
  const size_t bytes = blockBytes * blocks;
  if (bytes < 2 * pieceBytes) return 1;
  return std::min<size_t>({16, bytes / pieceBytes, (blockBytes + 255) / 256});
}

OpDesc pieceOf(const OpDesc& op, size_t i, size_t n) {
  const size_t es = dataTypeSize(op.dtype);
  const size_t unit = std::max<size_t>(1, 256 / es);
  const size_t units = (op.count + unit - 1) / unit;
  const size_t b = std::min(op.count, units * i / n * unit), e = std::min(op.count, units * (i + 1) / n * unit);
  OpDesc p = op;
  p.count = e - b;
  if (p.sendbuff) p.sendbuff = static_cast<const char*>(op.sendbuff) + b * es;
  if (p.recvbuff) p.recvbuff = static_cast<char*>(op.recvbuff) + b * es;
  if (rowsIn(op.coll) || rowsOut(op.coll)) p.devicePitch = op.count * es;
  return p;
}

}  // namespace c4
