// Simulator tests: hand-built schedules that break the contract must be rejected with a message
// naming the rank, step and problem.
#include "sched/simulate.hpp"

#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "sched/schedule.hpp"
#include "sim_harness.hpp"

namespace c4::sched::test {
namespace {

Span sp(BufId b, size_t off, size_t bytes) {
  Span s;
  s.buf = b;
  s.offset = off;
  s.bytes = bytes;
  return s;
}

Step send(int peer, Span src, std::vector<int32_t> deps = {}) {
  Step s;
  s.kind = StepKind::kSend;
  s.peer = peer;
  s.src = src;
  s.deps = std::move(deps);
  return s;
}

Step recv(int peer, Span dst, std::vector<int32_t> deps = {}) {
  Step s;
  s.kind = StepKind::kRecv;
  s.peer = peer;
  s.dst = dst;
  s.deps = std::move(deps);
  return s;
}

struct World {
  explicit World(int n) : scheds(n), bufs(n), mem(n) {
    for (int r = 0; r < n; ++r) {
      mem[r].assign(64, static_cast<uint8_t>(r + 1));
      bufs[r].input = mem[r].data();
      bufs[r].inputBytes = 32;
      bufs[r].output = mem[r].data() + 32;
      bufs[r].outputBytes = 32;
    }
  }
  Status run(uint64_t seed = 0) {
    SimOptions o;
    o.seed = seed;
    return simulate(scheds, bufs, makeReduce(DataType::kInt32, RedOp::kSum), o);
  }
  std::vector<Schedule> scheds;
  std::vector<SimBuffers> bufs;
  std::vector<std::vector<uint8_t>> mem;
};

::testing::AssertionResult failsWith(const Status& st, const std::vector<std::string>& parts) {
  if (st.isOk()) return ::testing::AssertionFailure() << "simulation succeeded";
  if (st.code() != Code::kInvalidUsage) return ::testing::AssertionFailure() << "wrong code: " << st.toString();
  for (const std::string& p : parts) {
    if (st.message().find(p) == std::string::npos) {
      return ::testing::AssertionFailure() << "'" << p << "' missing from: " << st.message();
    }
  }
  return ::testing::AssertionSuccess();
}

TEST(SimulateTest, ExchangeWorks) {
  World w(2);
  for (int r = 0; r < 2; ++r) {
    w.scheds[r].steps = {send(1 - r, sp(BufId::kInput, 0, 16)), recv(1 - r, sp(BufId::kOutput, 0, 16))};
  }
  SimStats st;
  ASSERT_TRUE(simulate(w.scheds, w.bufs, ReduceFn(), SimOptions(), &st).isOk());
  EXPECT_EQ(st.messages, 2u);
  EXPECT_EQ(st.bytes, 32u);
  EXPECT_EQ(st.hops, 1);
  EXPECT_EQ(w.mem[0][32], 2);
  EXPECT_EQ(w.mem[1][32], 1);
}

TEST(SimulateTest, DetectsDeadlock) {
  // Each rank waits to receive before it sends.
  World w(2);
  for (int r = 0; r < 2; ++r) {
    w.scheds[r].steps = {recv(1 - r, sp(BufId::kOutput, 0, 8)), send(1 - r, sp(BufId::kInput, 0, 8), {0})};
  }
  EXPECT_TRUE(failsWith(w.run(), {"deadlock", "rank 0 step 0", "rank 1 step 0", "posted"}));
}

TEST(SimulateTest, DetectsHeadOfLineDeadlock) {
  // Rank 0 posts to rank 1 in step order: its send (which needs rank 2's data) holds back its
  // receive from rank 1, and rank 1 only sends to rank 2 after that receive... a cycle.
  World w(3);
  w.scheds[0].steps = {recv(2, sp(BufId::kOutput, 0, 8)), send(1, sp(BufId::kOutput, 0, 8), {0}),
                       recv(1, sp(BufId::kOutput, 8, 8))};
  w.scheds[1].steps = {send(0, sp(BufId::kInput, 0, 8)), recv(0, sp(BufId::kOutput, 0, 8)),
                       send(2, sp(BufId::kInput, 8, 8), {0})};
  w.scheds[2].steps = {recv(1, sp(BufId::kOutput, 0, 8)), send(0, sp(BufId::kInput, 0, 8), {0})};
  EXPECT_TRUE(failsWith(w.run(), {"deadlock"}));
}

TEST(SimulateTest, DetectsSizeMismatch) {
  World w(2);
  w.scheds[0].steps = {send(1, sp(BufId::kInput, 0, 8))};
  w.scheds[1].steps = {recv(0, sp(BufId::kOutput, 0, 4))};
  EXPECT_TRUE(failsWith(w.run(), {"size mismatch", "rank 0 step 0", "rank 1 step 0", "8 bytes", "4 bytes"}));
}

TEST(SimulateTest, DetectsUnmatchedMessage) {
  World w(2);
  w.scheds[0].steps = {send(1, sp(BufId::kInput, 0, 8)), send(1, sp(BufId::kInput, 8, 8))};
  w.scheds[1].steps = {recv(0, sp(BufId::kOutput, 0, 8))};
  EXPECT_TRUE(failsWith(w.run(), {"unmatched", "rank 0 step 1"}));
}

TEST(SimulateTest, DetectsBadSteps) {
  {
    World w(2);
    w.scheds[0].steps = {send(1, sp(BufId::kInput, 0, 8), {0})};
    w.scheds[1].steps = {recv(0, sp(BufId::kOutput, 0, 8))};
    EXPECT_TRUE(failsWith(w.run(), {"rank 0 step 0", "not a lower step index"}));
  }
  {
    World w(2);
    w.scheds[0].steps = {send(1, sp(BufId::kInput, 0, 0))};
    w.scheds[1].steps = {recv(0, sp(BufId::kOutput, 0, 0))};
    EXPECT_TRUE(failsWith(w.run(), {"rank 0 step 0", "zero-byte"}));
  }
  {
    World w(2);
    w.scheds[0].steps = {send(0, sp(BufId::kInput, 0, 8))};
    EXPECT_TRUE(failsWith(w.run(), {"rank 0 step 0", "peer 0 invalid"}));
  }
  {
    World w(2);
    w.bufs[1].output = nullptr;
    w.bufs[1].outputBytes = 0;
    w.scheds[0].steps = {send(1, sp(BufId::kInput, 0, 8))};
    w.scheds[1].steps = {recv(0, sp(BufId::kOutput, 0, 8))};
    EXPECT_TRUE(failsWith(w.run(), {"rank 1 step 0", "null output"}));
  }
  {
    World w(2);
    w.scheds[0].steps = {send(1, sp(BufId::kInput, 28, 8))};
    w.scheds[1].steps = {recv(0, sp(BufId::kOutput, 0, 8))};
    EXPECT_TRUE(failsWith(w.run(), {"rank 0 step 0", "ends past"}));
  }
  {
    World w(1);
    Step c;
    c.kind = StepKind::kCopy;
    c.src = sp(BufId::kOutput, 0, 8);
    c.dst = sp(BufId::kOutput, 4, 8);
    w.scheds[0].steps = {c};
    EXPECT_TRUE(failsWith(w.run(), {"rank 0 step 0", "partially overlaps"}));
  }
}

TEST(SimulateTest, DetectsDataRace) {
  // Rank 1 receives into a region it is still sending from, with no dependency between the two.
  World w(2);
  w.scheds[0].steps = {recv(1, sp(BufId::kOutput, 0, 8)), send(1, sp(BufId::kInput, 0, 8))};
  w.scheds[1].steps = {send(0, sp(BufId::kOutput, 0, 8)), recv(0, sp(BufId::kOutput, 4, 8))};
  EXPECT_TRUE(failsWith(w.run(), {"data race", "rank 1", "step 1 does not depend on step 0"}));
  // With the dependency it is fine.
  w.scheds[1].steps[1].deps = {0};
  EXPECT_TRUE(w.run().isOk());
}

TEST(SimulateTest, DetectsAliasedRace) {
  // In-place aliasing: input and output are the same bytes, so a receive into the output races
  // with a send of the input unless ordered.
  World w(2);
  w.bufs[1].output = w.bufs[1].input;
  w.scheds[0].steps = {recv(1, sp(BufId::kOutput, 0, 8)), send(1, sp(BufId::kInput, 0, 8))};
  w.scheds[1].steps = {send(0, sp(BufId::kInput, 0, 8)), recv(0, sp(BufId::kOutput, 0, 8))};
  EXPECT_TRUE(failsWith(w.run(), {"data race", "rank 1"}));
}

// CollArgs::aliased = false drops the write-after-read dependencies between input and output: right
// for disjoint buffers, a data race in place (which is why the communicator uses such a plan only
// for buffers that do not overlap). The conservative plan is right for both.
TEST(SimulateTest, PlanForDisjointBuffersRacesInPlace) {
  for (Algo algo : {Algo::kRing, Algo::kRhd}) {
    CaseSpec c;
    c.coll = Coll::kAllReduce;
    c.algo = algo;
    c.nranks = 4;
    c.count = 4096;
    c.chunkBytes = 1024;
    c.inPlace = true;
    c.planAliased = 0;
    ::testing::AssertionResult r = runCase(c);
    EXPECT_FALSE(r) << algoName(algo) << ": a plan for disjoint buffers ran in place without a race";
    if (!r) {
      EXPECT_NE(std::string(r.message()).find("data race"), std::string::npos) << r.message();
    }
    c.inPlace = false;
    EXPECT_TRUE(runCase(c));
    c.planAliased = 1;
    EXPECT_TRUE(runCase(c));
  }
}

TEST(SimulateTest, DetectsUninitializedScratchRead) {
  World w(2);
  w.scheds[0].scratchBytes = 16;
  w.scheds[0].steps = {send(1, sp(BufId::kScratch, 0, 8))};
  w.scheds[1].steps = {recv(0, sp(BufId::kOutput, 0, 8))};
  EXPECT_TRUE(failsWith(w.run(), {"rank 0 step 0", "scratch"}));
  // Scratch past scratchBytes is rejected even when the buffer is larger.
  w.scheds[0].steps = {send(1, sp(BufId::kScratch, 12, 8))};
  EXPECT_TRUE(failsWith(w.run(), {"rank 0 step 0", "scratchBytes"}));
}

TEST(SimulateTest, RecvReduceAndLocalSteps) {
  World w(2);
  int32_t v0[2] = {5, 7}, v1[2] = {10, 20};
  std::memcpy(w.mem[0].data(), v0, 8);
  std::memcpy(w.mem[1].data(), v1, 8);
  Step rr;
  rr.kind = StepKind::kRecvReduce;
  rr.peer = 0;
  rr.src = sp(BufId::kInput, 0, 8);
  rr.dst = sp(BufId::kOutput, 0, 8);
  Step red;
  red.kind = StepKind::kReduce;
  red.src = sp(BufId::kOutput, 0, 8);
  red.src2 = sp(BufId::kOutput, 0, 8);
  red.dst = sp(BufId::kOutput, 8, 8);
  red.deps = {0};
  w.scheds[0].steps = {send(1, sp(BufId::kInput, 0, 8))};
  w.scheds[1].steps = {rr, red};
  // The send must say its receiver reduces (transports choose their protocol by it).
  Status st = w.run(3);
  ASSERT_FALSE(st.isOk());
  EXPECT_NE(st.message().find("protocol hint wrong"), std::string::npos) << st.message();
  w.scheds[0].steps[0].peerReduces = true;
  std::memcpy(w.mem[0].data(), v0, 8);
  std::memcpy(w.mem[1].data(), v1, 8);
  ASSERT_TRUE(w.run(3).isOk());
  int32_t out[4];
  std::memcpy(out, w.mem[1].data() + 32, 16);
  EXPECT_EQ(out[0], 15);
  EXPECT_EQ(out[1], 27);
  EXPECT_EQ(out[2], 30);
  EXPECT_EQ(out[3], 54);
}

}  // namespace
}  // namespace c4::sched::test
