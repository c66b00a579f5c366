// The zero-copy path's edges (the collective matrix on it is ZeroCopyMatrix in coll_test.cc):
// the allocator's bad input, buffers freed and allocated again between calls (the peers' mapping
// cache), and ranks that disagree or die while the others wait on the path: a clear error naming
// them, never a hang.
#include <gtest/gtest.h>
#include <stdlib.h>
#include <sys/resource.h>
#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "c4comm/trace.hpp"
#include "tests/coll/harness.hpp"

namespace c4test {
namespace {

/// Zero-copy AllReduce calls recorded on `comm`'s trace.
size_t zeroCopyOps(c4::Comm* comm) {
  std::vector<c4::trace::Event> ev;
  if (!c4::trace::readEvents(comm, &ev).isOk()) return 0;
  size_t n = 0;
  for (const c4::trace::Event& e : ev) n += e.type == c4::trace::EventType::kOp && e.algo == c4::trace::kAlgoZeroCopy;
  return n;
}

TEST(ZeroCopy, AllocatorRejectsBadInput) {
  void* p = nullptr;
  EXPECT_EQ(c4::memAlloc(nullptr, 64).code(), c4::Code::kInvalidArgument);
  EXPECT_EQ(c4::memAlloc(&p, 0).code(), c4::Code::kInvalidArgument);
  EXPECT_EQ(c4::memAlloc(&p, SIZE_MAX).code(), c4::Code::kInvalidArgument);
  EXPECT_EQ(p, nullptr);
  ASSERT_TRUE(c4::memAlloc(&p, 10000).isOk());
  EXPECT_EQ(reinterpret_cast<uintptr_t>(p) % 4096, 0u);
  std::vector<unsigned char> zeros(10000, 0);
  EXPECT_EQ(memcmp(p, zeros.data(), zeros.size()), 0) << "memAlloc must return zeroed memory";
  int local = 0;
  c4::Status st = c4::memFree(&local);
  EXPECT_EQ(st.code(), c4::Code::kInvalidArgument);
  EXPECT_NE(st.message().find("not returned by memAlloc"), std::string::npos) << st.toString();
  EXPECT_EQ(c4::memFree(static_cast<char*>(p) + 64).code(), c4::Code::kInvalidArgument);
  EXPECT_TRUE(c4::memFree(p).isOk());
  EXPECT_EQ(c4::memFree(p).code(), c4::Code::kInvalidArgument) << "double free must be refused";
  EXPECT_EQ(c4::memFree(nullptr).code(), c4::Code::kInvalidArgument);
}

// Each allocation holds a file descriptor: past the soft limit memAlloc raises it to the hard one;
// past the hard one it fails with a clear error, and what was allocated stays usable.
TEST(ZeroCopy, AllocationsPastTheOpenFileLimit) {
  auto outs = runForked(1, [](int, int, const c4::UniqueId&) -> Failures {
    const rlim_t kSoft = 64, kHard = 160;
    rlimit lim{kSoft, kHard};
    if (setrlimit(RLIMIT_NOFILE, &lim) != 0) return {"setrlimit failed"};
    std::vector<void*> ptrs;
    c4::Status st;
    for (int i = 0; i < 400; ++i) {
      void* p = nullptr;
      st = c4::memAlloc(&p, 4096);
      if (!st.isOk()) break;
      static_cast<char*>(p)[0] = static_cast<char>(i);
      ptrs.push_back(p);
    }
    Failures f;
    if (ptrs.size() <= kSoft) f.push_back("the soft limit was not raised: " + std::to_string(ptrs.size()));
    if (ptrs.size() >= kHard)
      f.push_back("more allocations than the hard limit allows: " + std::to_string(ptrs.size()));
    if (st.isOk() || st.code() != c4::Code::kSystemError || st.message().find("file descriptor") == std::string::npos)
      f.push_back("expected a clear error past the hard limit, got: " + st.toString());
    for (size_t i = 0; i < ptrs.size(); ++i) {
      if (static_cast<char*>(ptrs[i])[0] != static_cast<char>(i)) f.push_back("allocation " + std::to_string(i));
      if (!c4::memFree(ptrs[i]).isOk()) f.push_back("memFree " + std::to_string(i));
    }
    return f;
  });
  std::string s = summarize(outs);
  EXPECT_TRUE(s.empty()) << s;
}

// More allocations than the peer-mapping cache holds (32), each freed after use, so file
// descriptor numbers are reused under new allocation ids and old mappings are evicted: every
// call must still read the peer's current buffer.
TEST(ZeroCopy, FreedAndReallocatedBuffersAreRemapped) {
  auto outs = runForked(3, [](int rank, int n, const c4::UniqueId& id) -> Failures {
    setenv("C4_TRACE", "op", 1);
    c4::Comm* comm = nullptr;
    c4::Status st = c4::commInitRank(&comm, n, id, rank);
    if (!st.isOk()) return {"init: " + st.toString()};
    Failures f;
    const int kRounds = 40;
    for (int round = 0; round < kRounds && f.empty(); ++round) {
      const size_t count = 5000 + static_cast<size_t>(round) * 97;  // above one-shot, sizes vary
      void* p = nullptr;
      if (!c4::memAlloc(&p, count * sizeof(int32_t)).isOk()) return {"memAlloc failed"};
      auto* v = static_cast<int32_t*>(p);
      for (size_t i = 0; i < count; ++i) v[i] = static_cast<int32_t>(i) * (rank + 1) + round;
      st = c4::allReduce(v, v, count, c4::DataType::kInt32, c4::RedOp::kSum, comm);
      if (!st.isOk()) f.push_back("round " + std::to_string(round) + ": " + st.toString());
      for (size_t i = 0; i < count && st.isOk(); ++i) {
        const int32_t want = static_cast<int32_t>(i) * (n * (n + 1) / 2) + n * round;
        if (v[i] != want) {
          f.push_back("round " + std::to_string(round) + " element " + std::to_string(i) + ": " + std::to_string(v[i]) +
                      " != " + std::to_string(want));
          break;
        }
      }
      (void)c4::memFree(p);
    }
    if (f.empty() && zeroCopyOps(comm) != static_cast<size_t>(kRounds))
      f.push_back("only " + std::to_string(zeroCopyOps(comm)) + " of " + std::to_string(kRounds) +
                  " calls ran zero-copy");
    (void)c4::commDestroy(comm);
    return f;
  });
  std::string s = summarize(outs);
  EXPECT_TRUE(s.empty()) << s;
}

// One thread drives every rank through a group, two collectives per communicator: each rank's
// zero-copy wait must let the others progress in the same loop.
TEST(ZeroCopy, OneThreadDrivesAllRanksInAGroup) {
  ScopedEnv trace("C4_TRACE", "op");
  const int n = 3;
  const size_t count = 100000;
  c4::Comm* comms[n];
  ASSERT_TRUE(c4::commInitAll(comms, n).isOk());
  int32_t* bufs[n];
  float* gathered[n];
  for (int r = 0; r < n; ++r) {
    void* p = nullptr;
    ASSERT_TRUE(c4::memAlloc(&p, count * sizeof(int32_t)).isOk());
    bufs[r] = static_cast<int32_t*>(p);
    ASSERT_TRUE(c4::memAlloc(&p, n * count * sizeof(float)).isOk());
    gathered[r] = static_cast<float*>(p);
    for (size_t i = 0; i < count; ++i) {
      bufs[r][i] = static_cast<int32_t>(i % 100) * (r + 1);
      gathered[r][static_cast<size_t>(r) * count + i] = static_cast<float>(r * 1000) + static_cast<float>(i % 977);
    }
  }
  ASSERT_TRUE(c4::groupStart().isOk());
  for (int r = 0; r < n; ++r) {
    ASSERT_TRUE(c4::allReduce(bufs[r], bufs[r], count, c4::DataType::kInt32, c4::RedOp::kSum, comms[r]).isOk());
    ASSERT_TRUE(c4::allGather(gathered[r] + static_cast<size_t>(r) * count, gathered[r], count, c4::DataType::kFloat32,
                              comms[r])
                    .isOk());
  }
  ASSERT_TRUE(c4::groupEnd().isOk());
  for (int r = 0; r < n; ++r) {
    for (size_t i = 0; i < count; i += 997) ASSERT_EQ(bufs[r][i], static_cast<int32_t>(i % 100) * 6);
    for (int s = 0; s < n; ++s)
      for (size_t i = 0; i < count; i += 991)
        ASSERT_EQ(gathered[r][static_cast<size_t>(s) * count + i],
                  static_cast<float>(s * 1000) + static_cast<float>(i % 977));
    EXPECT_EQ(zeroCopyOps(comms[r]), 2u) << "rank " << r;
  }
  for (int r = 0; r < n; ++r) {
    ASSERT_TRUE(c4::commDestroy(comms[r]).isOk());
    EXPECT_TRUE(c4::memFree(bufs[r]).isOk());
    EXPECT_TRUE(c4::memFree(gathered[r]).isOk());
  }
}

// C4_ZEROCOPY=0 on one rank turns the path off on every rank (its probe says so), and calls on
// shareable buffers still give the right result through messages.
TEST(ZeroCopy, OffOnOneRankIsOffEverywhere) {
  auto outs = runForked(3, [](int rank, int n, const c4::UniqueId& id) -> Failures {
    setenv("C4_TRACE", "op", 1);
    if (rank == 1) setenv("C4_ZEROCOPY", "0", 1);
    c4::Comm* comm = nullptr;
    c4::Status st = c4::commInitRank(&comm, n, id, rank);
    if (!st.isOk()) return {"init: " + st.toString()};
    const size_t count = 50000;
    void* p = nullptr;
    if (!c4::memAlloc(&p, count * sizeof(int64_t)).isOk()) return {"memAlloc failed"};
    auto* v = static_cast<int64_t*>(p);
    for (size_t i = 0; i < count; ++i) v[i] = static_cast<int64_t>(i) + rank;
    Failures f;
    for (int k = 0; k < 3 && f.empty(); ++k) {
      st = c4::allReduce(v, v, count, c4::DataType::kInt64, c4::RedOp::kMax, comm);
      if (!st.isOk()) f.push_back(st.toString());
      for (size_t i = 0; i < count && f.empty(); i += 101)
        if (v[i] != static_cast<int64_t>(i) + n - 1) f.push_back("element " + std::to_string(i) + " wrong");
    }
    if (f.empty() && zeroCopyOps(comm) != 0)
      f.push_back(std::to_string(zeroCopyOps(comm)) + " calls ran zero-copy with the path off on rank 1");
    (void)c4::commDestroy(comm);
    (void)c4::memFree(p);
    return f;
  });
  std::string s = summarize(outs);
  EXPECT_TRUE(s.empty()) << s;
}

/// Both ranks offer the zero-copy path; their calls differ. Each must fail fast with the
/// difference named.
TEST(ZeroCopy, MismatchIsNamed) {
  ScopedEnv timeout("C4_TIMEOUT", "20");
  int64_t t0 = monoMs();
  auto outs = runForked(
      2,
      [](int rank, int n, const c4::UniqueId& id) -> Failures {
        c4::Comm* comm = nullptr;
        c4::Status st = c4::commInitRank(&comm, n, id, rank);
        if (!st.isOk()) return {"init: " + st.toString()};
        void* p = nullptr;
        if (!c4::memAlloc(&p, 1 << 20).isOk()) return {"memAlloc failed"};
        st = c4::allReduce(p, p, rank == 0 ? 16384 : 32768, c4::DataType::kFloat32, c4::RedOp::kSum, comm);
        Failures f{st.isOk() ? std::string("UNEXPECTED-OK") : st.message()};
        (void)c4::commAbort(comm);
        (void)c4::memFree(p);
        return f;
      },
      60);
  EXPECT_LT(monoMs() - t0, 20000) << "waited for the timeout instead of failing fast";
  std::string all = outs[0].detail + outs[1].detail;
  EXPECT_EQ(all.find("UNEXPECTED-OK"), std::string::npos) << all;
  EXPECT_EQ(all.find("hung"), std::string::npos) << all;
  EXPECT_TRUE(all.find("count 16384 vs 32768") != std::string::npos ||
              all.find("count 32768 vs 16384") != std::string::npos)
      << "nobody named the mismatch:\n"
      << all;
}

/// A rank dies before its call; the others wait for it on the zero-copy path (deciding) and
/// must fail naming it, well before C4_TIMEOUT.
TEST(ZeroCopy, DeadPeerIsNamedNotAHang) {
  ScopedEnv timeout("C4_TIMEOUT", "30");
  int64_t t0 = monoMs();
  auto outs = runForked(
      3,
      [](int rank, int n, const c4::UniqueId& id) -> Failures {
        c4::Comm* comm = nullptr;
        c4::Status st = c4::commInitRank(&comm, n, id, rank);
        if (!st.isOk()) return {"init: " + st.toString()};
        void* p = nullptr;
        if (!c4::memAlloc(&p, 1 << 20).isOk()) return {"memAlloc failed"};
        // One call that runs zero-copy on all ranks, then rank 2 dies without a word.
        st = c4::allReduce(p, p, 1 << 18, c4::DataType::kFloat32, c4::RedOp::kSum, comm);
        if (!st.isOk()) return {"first call: " + st.toString()};
        if (rank == 2) _exit(0);
        st = c4::allReduce(p, p, 1 << 18, c4::DataType::kFloat32, c4::RedOp::kSum, comm);
        Failures f{st.isOk() ? std::string("UNEXPECTED-OK") : st.message()};
        (void)c4::commAbort(comm);
        (void)c4::memFree(p);
        return f;
      },
      90);
  EXPECT_LT(monoMs() - t0, 20000) << "waited for the timeout instead of noticing the death";
  for (int r = 0; r < 2; ++r) {
    const std::string& d = outs[static_cast<size_t>(r)].detail;
    EXPECT_EQ(d.find("UNEXPECTED-OK"), std::string::npos) << d;
    EXPECT_EQ(d.find("hung"), std::string::npos) << d;
    EXPECT_NE(d.find("rank 2"), std::string::npos) << "rank " << r << " did not name the dead rank: " << d;
  }
}

}  // namespace
}  // namespace c4test
