// How calls on device buffers are staged through pinned host memory and cut into pipelined pieces
// (libc4comm/core/staging.hpp), checked on the host: "device" buffers are host arrays, the stream's
// copies (rows included) are done as CUDA would, and each piece's collective runs on the ranks'
// staging slots. Every rank's output must equal the whole call's, in place and out of place, with
// the guard bytes around every buffer untouched. The GPU tests (CudaPipeline.*) run the same code
// on a GPU.
#include "core/staging.hpp"

#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <string>
#include <tuple>
#include <vector>

#include "sched/schedule.hpp"

namespace {

using c4::Coll;
using c4::OpDesc;
using c4::gpu::StreamGate;

constexpr size_t kGuard = 64;  // bytes before and after every buffer
constexpr unsigned char kGuardByte = 0xA5;

/// One rank's "device" memory: its send and receive buffers (one buffer in place), with guards.
struct RankMem {
  std::vector<unsigned char> a, b;  // a: send (or the one buffer in place), b: receive
  const void* send = nullptr;
  void* recv = nullptr;
};

size_t blocks(Coll c, int n, bool input) {
  if (c == Coll::kAllGather || c == Coll::kGather) return input ? 1 : static_cast<size_t>(n);
  if (c == Coll::kReduceScatter || c == Coll::kScatter) return input ? static_cast<size_t>(n) : 1;
  if (c == Coll::kAlltoAll) return static_cast<size_t>(n);
  return 1;
}

void copyIn(const StreamGate::Copy& c, unsigned char* slot) {
  for (size_t r = 0; r < c.rows; ++r)
    memcpy(slot + c.offset + r * c.bytes, static_cast<const unsigned char*>(c.device) + r * c.pitch, c.bytes);
}
void copyOut(const StreamGate::Copy& c, const unsigned char* slot) {
  for (size_t r = 0; r < c.rows; ++r)
    memcpy(static_cast<unsigned char*>(c.device) + r * c.pitch, slot + c.offset + r * c.bytes, c.bytes);
}

/// The collective (sum of int32) over every rank's staged buffers, as the host path computes it.
void runCollective(Coll coll, int n, int root, size_t count, const std::vector<const int32_t*>& in,
                   const std::vector<int32_t*>& out) {
  std::vector<std::vector<int32_t>> res(static_cast<size_t>(n));  // first all results, then the writes (in place)
  for (int r = 0; r < n; ++r) {
    auto& v = res[static_cast<size_t>(r)];
    switch (coll) {
      case Coll::kAllReduce:
      case Coll::kReduce:
        if (coll == Coll::kReduce && r != root) break;
        v.assign(count, 0);
        for (int q = 0; q < n; ++q)
          for (size_t j = 0; j < count; ++j) v[j] += in[static_cast<size_t>(q)][j];
        break;
      case Coll::kBroadcast:
        v.assign(in[static_cast<size_t>(root)], in[static_cast<size_t>(root)] + count);
        break;
      case Coll::kAllGather:
        for (int q = 0; q < n; ++q) v.insert(v.end(), in[static_cast<size_t>(q)], in[static_cast<size_t>(q)] + count);
        break;
      case Coll::kReduceScatter:
        v.assign(count, 0);
        for (int q = 0; q < n; ++q)
          for (size_t j = 0; j < count; ++j) v[j] += in[static_cast<size_t>(q)][static_cast<size_t>(r) * count + j];
        break;
      case Coll::kGather:
        if (r != root) break;
        for (int q = 0; q < n; ++q) v.insert(v.end(), in[static_cast<size_t>(q)], in[static_cast<size_t>(q)] + count);
        break;
      case Coll::kScatter:
        v.assign(in[static_cast<size_t>(root)] + static_cast<size_t>(r) * count,
                 in[static_cast<size_t>(root)] + static_cast<size_t>(r + 1) * count);
        break;
      case Coll::kAlltoAll:
        for (int q = 0; q < n; ++q)
          v.insert(v.end(), in[static_cast<size_t>(q)] + static_cast<size_t>(r) * count,
                   in[static_cast<size_t>(q)] + static_cast<size_t>(r + 1) * count);
        break;
      default:
        FAIL() << "not a pipelined collective";
    }
  }
  for (int r = 0; r < n; ++r)
    if (!res[static_cast<size_t>(r)].empty())
      memcpy(out[static_cast<size_t>(r)], res[static_cast<size_t>(r)].data(), res[static_cast<size_t>(r)].size() * 4);
}

struct Case {
  Coll coll;
  int nranks;
  size_t count;
  bool inPlace;
};

std::string caseName(const Case& c) {
  static const char* names[] = {"AllReduce", "AllGather", "Broadcast", "ReduceScatter",
                                "Reduce",    "AlltoAll",  "Gather",    "Scatter"};
  return std::string(names[static_cast<int>(c.coll)]) + "_" + std::to_string(c.nranks) + "ranks_" +
         std::to_string(c.count) + (c.inPlace ? "_inPlace" : "_outOfPlace");
}

class Staging : public ::testing::TestWithParam<Case> {};

// The whole call through its pieces equals the whole call, on every rank (Gather and Scatter: the
// root is the last rank).
TEST_P(Staging, PiecesEqualTheWholeCall) {
  const Case k = GetParam();
  const int n = k.nranks, root = n - 1;
  constexpr size_t kPiece = 4096;
  const size_t inElems = k.count * blocks(k.coll, n, true), outElems = k.count * blocks(k.coll, n, false);
  std::vector<RankMem> mem(static_cast<size_t>(n));
  std::vector<std::vector<int32_t>> inputs(static_cast<size_t>(n));
  for (int r = 0; r < n; ++r) {
    RankMem& m = mem[static_cast<size_t>(r)];
    auto& input = inputs[static_cast<size_t>(r)];
    for (size_t j = 0; j < inElems; ++j) input.push_back(static_cast<int32_t>(r * 1000003 + j * 7 + 1));
    if (k.inPlace) {
      // NCCL's in place: AllGather's input is the rank's block of the output, ReduceScatter's output
      // the rank's block of the input, the others one buffer.
      const size_t elems = std::max(inElems, outElems);
      m.a.assign(elems * 4 + 2 * kGuard, kGuardByte);
      auto* base = reinterpret_cast<int32_t*>(m.a.data() + kGuard);
      m.recv = base;
      m.send = base;
      if (k.coll == Coll::kAllGather || k.coll == Coll::kGather) m.send = base + static_cast<size_t>(r) * k.count;
      if (k.coll == Coll::kReduceScatter || k.coll == Coll::kScatter) m.recv = base + static_cast<size_t>(r) * k.count;
    } else {
      m.a.assign(inElems * 4 + 2 * kGuard, kGuardByte);
      m.b.assign(outElems * 4 + 2 * kGuard, kGuardByte);
      m.send = m.a.data() + kGuard;
      m.recv = m.b.data() + kGuard;
    }
    memcpy(const_cast<void*>(m.send), input.data(), inElems * 4);
  }
  // The reference: the whole call at once.
  std::vector<std::vector<int32_t>> want(static_cast<size_t>(n), std::vector<int32_t>(outElems));
  {
    std::vector<const int32_t*> in;
    std::vector<int32_t*> out;
    for (int r = 0; r < n; ++r) {
      in.push_back(inputs[static_cast<size_t>(r)].data());
      out.push_back(want[static_cast<size_t>(r)].data());
    }
    runCollective(k.coll, n, root, k.count, in, out);
  }

  OpDesc whole;
  whole.coll = k.coll;
  whole.count = k.count;
  whole.dtype = c4::DataType::kInt32;
  whole.root = root;
  const size_t pieces = c4::pipelinePieces(whole, n, kPiece, false);
  const size_t callBytes = k.count * 4 * std::max(blocks(k.coll, n, true), blocks(k.coll, n, false));
  if (callBytes >= 2 * kPiece) {
    EXPECT_GT(pieces, 1u) << "a call of " << callBytes << " bytes is not cut";
  } else {
    EXPECT_EQ(pieces, 1u);
  }
  EXPECT_LE(pieces, 16u);
  EXPECT_EQ(c4::pipelinePieces(whole, n, kPiece, true), 1u) << "a deferrable call is cut";
  EXPECT_EQ(c4::pipelinePieces(whole, n, 0, false), 1u) << "C4_CUDA_PIPELINE_BYTES=0 cuts";

  size_t covered = 0;
  for (size_t i = 0; i < pieces; ++i) {
    std::vector<std::vector<unsigned char>> slots(static_cast<size_t>(n));
    std::vector<c4::StagingPlan> plans;
    std::vector<const int32_t*> in;
    std::vector<int32_t*> out;
    size_t pieceCount = 0;
    for (int r = 0; r < n; ++r) {
      OpDesc op = whole;
      op.sendbuff = mem[static_cast<size_t>(r)].send;
      op.recvbuff = mem[static_cast<size_t>(r)].recv;
      const OpDesc p = c4::pieceOf(op, i, pieces);
      pieceCount = p.count;
      EXPECT_GT(p.count, 0u) << "piece " << i << " is empty";
      if (i + 1 < pieces) {
        EXPECT_EQ(p.count * 4 % 256, 0u) << "piece " << i << " is not cut at 256 bytes";
      }
      c4::sched::CollArgs a;
      a.coll = p.coll;
      a.rank = r;
      a.nranks = n;
      a.count = p.count;
      a.dtype = p.dtype;
      a.root = p.root;
      const size_t ib = c4::sched::inputBytes(a), ob = c4::sched::outputBytes(a);
      plans.push_back(
          c4::planStaging(p, r, n, {ib ? p.sendbuff : nullptr, ib, true}, {ob ? p.recvbuff : nullptr, ob, true}));
      const c4::StagingPlan& plan = plans.back();
      auto& slot = slots[static_cast<size_t>(r)];
      slot.assign(plan.bytes, 0xEE);
      for (const auto& c : plan.in) copyIn(c, slot.data());
      in.push_back(reinterpret_cast<const int32_t*>(slot.data() + plan.inOff));
      out.push_back(reinterpret_cast<int32_t*>(slot.data() + plan.outOff));
      if (ib) {
        EXPECT_TRUE(plan.inStaged);
        EXPECT_LE(plan.inOff + ib, plan.bytes);
      }
      if (ob) {
        EXPECT_TRUE(plan.outStaged);
        EXPECT_LE(plan.outOff + ob, plan.bytes);
      }
      // The staged call is in place exactly where the call is (the host path tells them apart so);
      // out of place, its staged buffers do not overlap.
      if (ib && ob) {
        const size_t row = p.count * 4, rr = static_cast<size_t>(r);
        if (k.inPlace && (k.coll == Coll::kAllGather || k.coll == Coll::kGather)) {
          EXPECT_EQ(plan.inOff, plan.outOff + rr * row) << "rank " << r << ": the staged call is not in place";
        } else if (k.inPlace && (k.coll == Coll::kReduceScatter || k.coll == Coll::kScatter)) {
          EXPECT_EQ(plan.outOff, plan.inOff + rr * row) << "rank " << r << ": the staged call is not in place";
        } else if (k.inPlace) {
          EXPECT_EQ(plan.inOff, plan.outOff) << "rank " << r << ": the staged call is not in place";
        } else {
          EXPECT_TRUE(plan.inOff + ib <= plan.outOff || plan.outOff + ob <= plan.inOff)
              << "rank " << r << ": staged buffers overlap out of place";
        }
      }
    }
    runCollective(k.coll, n, root, pieceCount, in, out);
    for (int r = 0; r < n; ++r)
      for (const auto& c : plans[static_cast<size_t>(r)].out) copyOut(c, slots[static_cast<size_t>(r)].data());
    covered += pieceCount;
  }
  EXPECT_EQ(covered, k.count) << "the pieces do not cover the call";

  for (int r = 0; r < n; ++r) {
    const RankMem& m = mem[static_cast<size_t>(r)];
    if ((k.coll == Coll::kReduce || k.coll == Coll::kGather) && r != root) continue;  // its output is not written
    const auto* got = static_cast<const int32_t*>(m.recv);
    for (size_t j = 0; j < outElems; ++j)
      if (got[j] != want[static_cast<size_t>(r)][j]) {
        ADD_FAILURE() << "rank " << r << " element " << j << ": " << got[j] << ", expected "
                      << want[static_cast<size_t>(r)][j];
        break;
      }
    for (const auto* buf : {&m.a, &m.b}) {
      if (buf->empty()) continue;
      for (size_t g = 0; g < kGuard; ++g) {
        ASSERT_EQ((*buf)[g], kGuardByte) << "rank " << r << ": a guard byte before a buffer was written";
        ASSERT_EQ((*buf)[buf->size() - 1 - g], kGuardByte)
            << "rank " << r << ": a guard byte after a buffer was written";
      }
    }
  }
}

std::vector<Case> cases() {
  std::vector<Case> out;
  for (Coll c : {Coll::kAllReduce, Coll::kBroadcast, Coll::kReduce, Coll::kAllGather, Coll::kReduceScatter,
                 Coll::kAlltoAll, Coll::kGather, Coll::kScatter})
    for (int n : {1, 2, 3, 4})
      for (size_t count : {size_t{1}, size_t{64}, size_t{1000}, size_t{2048}, size_t{5000}, size_t{65537}})
        for (bool inPlace : {false, true}) out.push_back({c, n, count, inPlace});
  return out;
}

INSTANTIATE_TEST_SUITE_P(All, Staging, ::testing::ValuesIn(cases()),
                         [](const ::testing::TestParamInfo<Case>& i) { return caseName(i.param); });

// Pinned host memory is read and written where it is, except the rows of an AllGather's output or
// a ReduceScatter's input in a piece (the host path would take them as contiguous).
TEST(StagingPinned, PinnedSidesStayWhereTheyAreExceptRows) {
  std::vector<int32_t> send(4096), recv(4096 * 3);
  OpDesc op;
  op.coll = Coll::kAllGather;
  op.count = 4096;
  op.dtype = c4::DataType::kInt32;
  op.sendbuff = send.data();
  op.recvbuff = recv.data();
  const size_t pieces = c4::pipelinePieces(op, 3, 4096, false);
  ASSERT_GT(pieces, 1u);
  const OpDesc p = c4::pieceOf(op, 1, pieces);
  EXPECT_EQ(p.devicePitch, 4096u * 4);
  const c4::StagingPlan plan =
      c4::planStaging(p, 0, 3, {p.sendbuff, p.count * 4, false}, {p.recvbuff, 3 * p.count * 4, false});
  EXPECT_FALSE(plan.inStaged);
  EXPECT_TRUE(plan.outStaged);
  ASSERT_EQ(plan.out.size(), 1u);
  EXPECT_EQ(plan.out[0].rows, 3u);
  EXPECT_EQ(plan.out[0].pitch, 4096u * 4);
  // A whole call (no pitch) on pinned memory stages nothing.
  const c4::StagingPlan whole =
      c4::planStaging(op, 0, 3, {op.sendbuff, 4096 * 4, false}, {op.recvbuff, 3 * 4096 * 4, false});
  EXPECT_FALSE(whole.inStaged);
  EXPECT_FALSE(whole.outStaged);
  EXPECT_TRUE(whole.in.empty() && whole.out.empty());
}

// Send/recv are staged whole; an elementwise piece of any type is cut at 256 bytes.
TEST(StagingPieces, WhatIsCutAndWhere) {
  OpDesc op;
  op.count = 1 << 20;
  op.dtype = c4::DataType::kInt8;
  for (Coll c : {Coll::kSend, Coll::kRecv, Coll::kBarrier}) {
    op.coll = c;
    EXPECT_EQ(c4::pipelinePieces(op, 4, 4096, false), 1u) << static_cast<int>(c);
  }
  for (c4::DataType dt : {c4::DataType::kInt8, c4::DataType::kFloat16, c4::DataType::kFloat64}) {
    op.coll = Coll::kAllReduce;
    op.dtype = dt;
    op.count = 100003;
    const size_t es = c4::dataTypeSize(dt);
    const size_t n = c4::pipelinePieces(op, 2, 4096, false);
    EXPECT_EQ(n, 16u);
    size_t next = 0;
    for (size_t i = 0; i < n; ++i) {
      const OpDesc p = c4::pieceOf(op, i, n);
      EXPECT_EQ(p.devicePitch, 0u);
      if (i + 1 < n) {
        EXPECT_EQ(p.count * es % 256, 0u);
      }
      next += p.count;
    }
    EXPECT_EQ(next, op.count);
  }
}

}  // namespace
