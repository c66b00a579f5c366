// Generator tests: every collective x every supported algorithm x rank counts x counts x in/out of
// place x roots x seeds, run on the simulator and checked against a reference.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "sched/schedule.hpp"
#include "sched/simulate.hpp"
#include "sim_harness.hpp"

namespace c4::sched::test {
namespace {

constexpr Coll kColls[] = {Coll::kAllReduce, Coll::kAllGather, Coll::kBroadcast, Coll::kReduceScatter,
                           Coll::kReduce,    Coll::kAlltoAll,  Coll::kGather,    Coll::kScatter};
constexpr Algo kAlgos[] = {Algo::kRing, Algo::kTree, Algo::kRhd, Algo::kDirect, Algo::kHier};
constexpr int kRankCounts[] = {1, 2, 3, 4, 5, 7, 8, 9, 16};

struct CountCase {
  size_t count;
  size_t chunkBytes;
};
// 0, 1, 2, a prime, and counts that pipeline into several pieces (chunk sizes that are and are not
// multiples of the element size).
constexpr CountCase kCounts[] = {{0, 1 << 20}, {1, 1 << 20}, {2, 1 << 20}, {1009, 1 << 20}, {1000, 64}, {1009, 100}};

struct DtypeOp {
  DataType dtype;
  RedOp op;
};
constexpr DtypeOp kReduceCombos[] = {
    {DataType::kInt32, RedOp::kSum},  {DataType::kFloat32, RedOp::kSum},  {DataType::kInt64, RedOp::kMax},
    {DataType::kInt32, RedOp::kProd}, {DataType::kFloat32, RedOp::kMin},  {DataType::kInt64, RedOp::kSum},
    {DataType::kInt32, RedOp::kMax},  {DataType::kFloat32, RedOp::kProd}, {DataType::kInt64, RedOp::kMin},
    {DataType::kInt32, RedOp::kMin},  {DataType::kFloat32, RedOp::kMax},  {DataType::kInt64, RedOp::kProd},
};
constexpr DataType kCopyTypes[] = {DataType::kInt32, DataType::kInt8, DataType::kFloat16, DataType::kInt64,
                                   DataType::kFloat32};
constexpr int kSeedsPerCase = 3;
// C4_TEST_QUICK=1 (the sanitizer pass of scripts/test.sh): one seed per case, since that pass hunts
// memory errors and the full run checked the values with every seed.
int seedsPerCase() {
  static const int seeds = getenv("C4_TEST_QUICK") != nullptr ? 1 : kSeedsPerCase;
  return seeds;
}

struct Pair {
  Coll coll;
  Algo algo;
};

std::vector<Pair> supportedPairs() {
  std::vector<Pair> out;
  for (Coll c : kColls) {
    for (Algo a : kAlgos) {
      if (supports(a, c, 2)) out.push_back(Pair{c, a});
    }
  }
  return out;
}

class CollAlgoTest : public ::testing::TestWithParam<Pair> {};

TEST_P(CollAlgoTest, MatchesReference) {
  const Pair p = GetParam();
  size_t rotation = static_cast<size_t>(p.coll) * 7 + static_cast<size_t>(p.algo) * 3;
  int cases = 0;
  for (int n : kRankCounts) {
    if (!supports(p.algo, p.coll, n)) continue;
    std::vector<int> roots = {0};
    if (isRooted(p.coll)) roots = {0, n - 1, n / 2};
    std::sort(roots.begin(), roots.end());
    roots.erase(std::unique(roots.begin(), roots.end()), roots.end());
    for (const CountCase& cc : kCounts) {
      for (int inPlace = 0; inPlace < (hasInPlace(p.coll) ? 2 : 1); ++inPlace) {
        for (int root : roots) {
          for (int s = 0; s < seedsPerCase(); ++s) {
            CaseSpec c;
            c.coll = p.coll;
            c.algo = p.algo;
            c.nranks = n;
            c.count = cc.count;
            c.chunkBytes = cc.chunkBytes;
            c.inPlace = inPlace != 0;
            c.root = root;
            c.seed = 1000 * static_cast<uint64_t>(n) + 10 * static_cast<uint64_t>(s) + rotation;
            if (isReducing(p.coll)) {
              const DtypeOp& d = kReduceCombos[rotation % (sizeof(kReduceCombos) / sizeof(kReduceCombos[0]))];
              c.dtype = d.dtype;
              c.op = d.op;
            } else {
              c.dtype = kCopyTypes[rotation % (sizeof(kCopyTypes) / sizeof(kCopyTypes[0]))];
            }
            ++rotation;
            ++cases;
            ASSERT_TRUE(runCase(c));
          }
        }
      }
    }
  }
  EXPECT_GT(cases, 0);
}

std::string pairName(const ::testing::TestParamInfo<Pair>& info) {
  return std::string(collName(info.param.coll)) + "_" + algoName(info.param.algo);
}

INSTANTIATE_TEST_SUITE_P(All, CollAlgoTest, ::testing::ValuesIn(supportedPairs()), pairName);

// Random real-valued floats: sums depend on order, so this checks that every AllReduce algorithm
// reduces each element in one order (bitwise identical on all ranks).
TEST(AllReduceTest, FloatResultsBitwiseIdenticalOnAllRanks) {
  for (Algo a : kAlgos) {
    for (int n : {2, 3, 5, 6, 8, 13, 16}) {
      for (const CountCase& cc : {CountCase{1009, 1 << 20}, CountCase{777, 64}}) {
        for (bool inPlace : {false, true}) {
          CaseSpec c;
          c.coll = Coll::kAllReduce;
          c.algo = a;
          c.nranks = n;
          c.count = cc.count;
          c.chunkBytes = cc.chunkBytes;
          c.inPlace = inPlace;
          c.dtype = DataType::kFloat32;
          c.op = RedOp::kSum;
          c.exactValues = false;
          c.seed = static_cast<uint64_t>(n) * 31 + static_cast<uint64_t>(a);
          ASSERT_TRUE(runCase(c));
        }
      }
    }
  }
}

// The hierarchical AllReduce over host layouts: equal hosts (the 2D scheme, ranks contiguous or
// interleaved across hosts), hosts of different sizes (leaders), one rank per host, one host.
TEST(HierTest, AllReduceOverHostLayouts) {
  const std::vector<std::vector<int32_t>> layouts = {
      {0, 0, 1, 1},       {0, 1, 0, 1},          {0, 0, 0, 1, 1, 1},
      {7, 7, 3, 3, 9, 9}, {0, 1, 2, 3},          {0, 0, 0, 1},
      {0, 1, 1, 2, 2, 2}, {5, 5, 5, 5},          {0, 0, 1, 1, 2, 2, 3, 3},
      {0, 1, 0, 1, 0, 1}, {0, 0, 1, 1, 1, 2, 3}, {0, 1}};
  int cases = 0;
  for (const auto& hosts : layouts) {
    for (const CountCase& cc : kCounts) {
      for (bool inPlace : {false, true}) {
        for (bool exact : {true, false}) {
          CaseSpec c;
          c.coll = Coll::kAllReduce;
          c.algo = Algo::kHier;
          c.nranks = static_cast<int>(hosts.size());
          c.hostOf = hosts;
          c.count = cc.count;
          c.chunkBytes = cc.chunkBytes;
          c.inPlace = inPlace;
          c.dtype = exact ? DataType::kInt32 : DataType::kFloat32;
          c.op = RedOp::kSum;
          c.exactValues = exact;  // floats: also checks bitwise identical results on all ranks
          c.seed = static_cast<uint64_t>(cases) * 77 + 5;
          ++cases;
          ASSERT_TRUE(runCase(c)) << "hosts of size " << hosts.size();
        }
      }
    }
  }
}

// Network hops: on 2 hosts x 4 ranks the hierarchical AllReduce crosses hosts with 1/4 of the
// vector per rank, a flat ring with (n-1)/n of it through the rank at each host boundary.
TEST(HierTest, CrossesHostsWithLessData) {
  const std::vector<int32_t> hosts = {0, 0, 0, 0, 1, 1, 1, 1};
  CollArgs a;
  a.coll = Coll::kAllReduce;
  a.nranks = 8;
  a.count = 8000;
  a.dtype = DataType::kFloat32;
  a.reduces = true;
  a.chunkBytes = 0;
  a.hostOf = hosts;
  auto crossBytes = [&](Algo algo) {
    size_t most = 0;
    for (int r = 0; r < 8; ++r) {
      a.rank = r;
      Result<Schedule> s = generate(algo, a);
      EXPECT_TRUE(s.isOk());
      size_t bytes = 0;
      for (const Step& st : s.value().steps)
        if (st.kind == StepKind::kSend && hosts[static_cast<size_t>(st.peer)] != hosts[static_cast<size_t>(r)])
          bytes += st.src.bytes;
      most = std::max(most, bytes);
    }
    return most;
  };
  const size_t vec = a.count * 4;
  EXPECT_EQ(crossBytes(Algo::kHier), vec / 4);          // 2 (H-1)/H of a quarter
  EXPECT_EQ(crossBytes(Algo::kRing), 2 * vec * 7 / 8);  // the flat ring's boundary ranks
  a.hostOf = {0, 0, 0, 0, 1, 1, 1};                     // a bad host map is an error
  a.rank = 0;
  EXPECT_FALSE(generate(Algo::kHier, a).isOk());
}

// Pieces never exceed chunkBytes rounded down to whole elements.
TEST(ScheduleTest, MessagesRespectChunkSize) {
  for (const Pair& p : supportedPairs()) {
    for (size_t chunk : {size_t{64}, size_t{70}}) {
      CollArgs a;
      a.coll = p.coll;
      a.nranks = 7;
      a.count = 1000;
      a.dtype = DataType::kInt32;
      a.root = 3;
      a.chunkBytes = chunk;
      const size_t limit = chunk / 4 * 4;
      for (int r = 0; r < a.nranks; ++r) {
        a.rank = r;
        Result<Schedule> s = generate(p.algo, a);
        ASSERT_TRUE(s.isOk()) << s.status().toString();
        for (const Step& st : s.value().steps) {
          const size_t bytes = st.kind == StepKind::kSend ? st.src.bytes : st.dst.bytes;
          if (st.kind == StepKind::kSend || st.kind == StepKind::kRecv || st.kind == StepKind::kRecvReduce) {
            EXPECT_LE(bytes, limit) << collName(p.coll) << "/" << algoName(p.algo) << " " << describeStep(st);
            EXPECT_EQ(bytes % 4, 0u);
          }
        }
      }
    }
  }
}

TEST(ScheduleTest, TrivialCases) {
  for (const Pair& p : supportedPairs()) {
    CollArgs a;
    a.coll = p.coll;
    a.nranks = 1;
    a.count = 10;
    Result<Schedule> one = generate(p.algo, a);
    ASSERT_TRUE(one.isOk());
    ASSERT_EQ(one.value().steps.size(), 1u);
    EXPECT_EQ(one.value().steps[0].kind, StepKind::kCopy);
    EXPECT_EQ(one.value().steps[0].src.bytes, 40u);
    EXPECT_EQ(one.value().algo, p.algo);
    a.nranks = 4;
    a.rank = 2;
    a.count = 0;
    Result<Schedule> none = generate(p.algo, a);
    ASSERT_TRUE(none.isOk());
    EXPECT_TRUE(none.value().steps.empty());
    EXPECT_EQ(none.value().scratchBytes, 0u);
  }
}

TEST(ScheduleTest, RejectsBadArguments) {
  CollArgs a;
  a.coll = Coll::kAlltoAll;
  a.nranks = 4;
  a.count = 8;
  EXPECT_FALSE(supports(Algo::kRing, Coll::kAlltoAll, 4));
  EXPECT_FALSE(supports(Algo::kTree, Coll::kAllGather, 4));
  EXPECT_FALSE(supports(Algo::kRing, Coll::kSend, 2));
  EXPECT_FALSE(supports(Algo::kRing, Coll::kAllReduce, 0));
  Result<Schedule> r = generate(Algo::kRing, a);
  ASSERT_FALSE(r.isOk());
  EXPECT_EQ(r.status().code(), Code::kInvalidArgument);
  a.coll = Coll::kAllReduce;
  a.rank = 4;
  EXPECT_EQ(generate(Algo::kRing, a).status().code(), Code::kInvalidArgument);
  a.rank = 0;
  a.coll = Coll::kBroadcast;
  a.root = 4;
  EXPECT_EQ(generate(Algo::kRing, a).status().code(), Code::kInvalidArgument);
  a.root = 0;
  a.dtype = static_cast<DataType>(99);
  EXPECT_EQ(generate(Algo::kRing, a).status().code(), Code::kInvalidArgument);
}

TEST(ScheduleTest, AlgoNames) {
  Algo a;
  for (Algo x : kAlgos) {
    ASSERT_TRUE(parseAlgo(algoName(x), &a));
    EXPECT_EQ(a, x);
  }
  ASSERT_TRUE(parseAlgo("RING", &a));
  EXPECT_EQ(a, Algo::kRing);
  ASSERT_TRUE(parseAlgo("Tree", &a));
  EXPECT_EQ(a, Algo::kTree);
  ASSERT_TRUE(parseAlgo("HalvingDoubling", &a));
  EXPECT_EQ(a, Algo::kRhd);
  ASSERT_TRUE(parseAlgo("PAT", &a));
  EXPECT_EQ(a, Algo::kDirect);
  ASSERT_TRUE(parseAlgo("Hierarchical", &a));
  EXPECT_EQ(a, Algo::kHier);
  EXPECT_FALSE(parseAlgo("nvls", &a));
  EXPECT_FALSE(parseAlgo("", &a));
}

TEST(ScheduleTest, BufferSizes) {
  CollArgs a;
  a.nranks = 4;
  a.rank = 1;
  a.root = 2;
  a.count = 10;
  a.dtype = DataType::kInt64;
  struct Want {
    Coll c;
    size_t in, out;
  };
  for (const Want& w : {Want{Coll::kAllReduce, 80, 80}, Want{Coll::kAllGather, 80, 320}, Want{Coll::kBroadcast, 0, 80},
                        Want{Coll::kReduceScatter, 320, 80}, Want{Coll::kReduce, 80, 0},
                        Want{Coll::kAlltoAll, 320, 320}, Want{Coll::kGather, 80, 0}, Want{Coll::kScatter, 0, 80}}) {
    a.coll = w.c;
    EXPECT_EQ(inputBytes(a), w.in) << collName(w.c);
    EXPECT_EQ(outputBytes(a), w.out) << collName(w.c);
  }
  a.rank = 2;
  a.coll = Coll::kGather;
  EXPECT_EQ(outputBytes(a), 320u);
  a.coll = Coll::kScatter;
  EXPECT_EQ(inputBytes(a), 320u);
}

// Latency (message hops on the critical path) of each algorithm with one piece per transfer, and
// pipelining overlap with many pieces. Also prints the table used in docs.
TEST(ScheduleTest, HopCounts) {
  auto hops = [](Coll c, Algo a, int n, size_t count, size_t chunk, SimStats* st) {
    CaseSpec cs;
    cs.coll = c;
    cs.algo = a;
    cs.nranks = n;
    cs.count = count;
    cs.chunkBytes = chunk;
    cs.root = 0;
    EXPECT_TRUE(runCase(cs, st));
    return st->hops;
  };
  SimStats st;
  for (int n : {8, 16}) {
    int lg = 0;
    while ((1 << lg) < n) ++lg;
    EXPECT_EQ(hops(Coll::kAllReduce, Algo::kRing, n, 4096, 0, &st), 2 * (n - 1));
    EXPECT_EQ(hops(Coll::kAllReduce, Algo::kRhd, n, 4096, 0, &st), 2 * lg);
    EXPECT_EQ(hops(Coll::kAllReduce, Algo::kDirect, n, 4096, 0, &st), 1);
    EXPECT_LE(hops(Coll::kAllReduce, Algo::kTree, n, 4096, 0, &st), 2 * lg);
    EXPECT_EQ(hops(Coll::kAllGather, Algo::kRing, n, 512, 0, &st), n - 1);
    EXPECT_EQ(hops(Coll::kAllGather, Algo::kRhd, n, 512, 0, &st), lg);
    EXPECT_EQ(hops(Coll::kBroadcast, Algo::kTree, n, 512, 0, &st), lg);
    EXPECT_EQ(hops(Coll::kReduce, Algo::kTree, n, 512, 0, &st), lg);
    EXPECT_EQ(hops(Coll::kReduceScatter, Algo::kRhd, n, 512, 0, &st), lg);
  }
  // Non-power-of-two: the fold adds one hop at each end.
  EXPECT_EQ(hops(Coll::kAllReduce, Algo::kRhd, 12, 4096, 0, &st), 2 * 3 + 2);
  // Pipelining: 32 pieces through an 8-rank chain take about 32 + 7 hops, not 32 * 7.
  EXPECT_LE(hops(Coll::kBroadcast, Algo::kRing, 8, 32 * 16, 64, &st), 32 + 7);
  EXPECT_LE(hops(Coll::kReduce, Algo::kRing, 8, 32 * 16, 64, &st), 32 + 7);
  // A link carries one piece per hop: ring AllReduce moves 2*(n-1) pieces per segment piece.
  EXPECT_EQ(hops(Coll::kAllReduce, Algo::kRing, 8, 8 * 32 * 16, 64, &st), 2 * 7 * 32);
  // Tree AllReduce: 64 pieces up and down at once, plus the tree's height each way (+1 margin).
  for (int n : {3, 4, 8, 9, 16}) {
    int lg = 0;
    while ((1 << lg) < n) ++lg;
    EXPECT_LE(hops(Coll::kAllReduce, Algo::kTree, n, 64 * 16, 64, &st), 64 + 2 * lg + 2) << n;
  }

  std::printf("%-14s %-7s %5s %6s %9s %9s %6s\n", "coll", "algo", "ranks", "steps", "msgs/rank", "msgs", "hops");
  for (Coll c : kColls) {
    for (Algo a : kAlgos) {
      if (!supports(a, c, 8)) continue;
      for (int n : {8, 12}) {
        hops(c, a, n, 4096, 0, &st);
        std::printf("%-14s %-7s %5d %6zu %9zu %9zu %6lld\n", collName(c), algoName(a), n, st.steps, st.maxRankMessages,
                    st.messages, static_cast<long long>(st.hops));
      }
    }
  }
  // Pipelined: 64 pieces per rank's share of data.
  std::printf("pipelined (64 pieces of 64 bytes per block):\n");
  for (Coll c : kColls) {
    for (Algo a : kAlgos) {
      if (!supports(a, c, 8)) continue;
      const size_t count = (c == Coll::kAllReduce ? 8 : 1) * 64 * 16;
      hops(c, a, 8, count, 64, &st);
      std::printf("%-14s %-7s %5d %6zu %9zu %9zu %6lld\n", collName(c), algoName(a), 8, st.steps, st.maxRankMessages,
                  st.messages, static_cast<long long>(st.hops));
    }
  }
}

}  // namespace
}  // namespace c4::sched::test
