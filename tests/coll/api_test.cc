// Communicator life cycle, groups, split, and errors: bad input gets a clear error before
// anything is touched; ranks that disagree, die or abort make the others fail fast, never hang.
#include <gtest/gtest.h>
#include <sched.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/mman.h>

#include <atomic>
#include <climits>
#include <cstring>
#include <fstream>
#include <iterator>
#include <thread>

#include "c4comm/trace.hpp"
#include "tests/coll/coll_matrix.hpp"
#include "tests/common/not_applicable.hpp"
#include "tests/sched/schedule_file_gen.hpp"

namespace c4test {
namespace {

using c4::Code;

#define EXPECT_CODE(expr, want)                                     \
  do {                                                              \
    c4::Status s_ = (expr);                                         \
    EXPECT_EQ(s_.code(), want) << #expr << " -> " << s_.toString(); \
    if (!s_.isOk()) {                                               \
      EXPECT_STRNE(c4::lastError(nullptr), "") << #expr;            \
    }                                                               \
  } while (0)

TEST(Api, VersionAndErrorStrings) {
  EXPECT_EQ(c4::version(), 23203);
  EXPECT_STREQ(c4::codeName(Code::kInvalidArgument), "invalid argument");
}

TEST(Api, BadArgumentsAreRejectedBeforeAnythingIsTouched) {
  c4::Comm* comm = nullptr;
  c4::UniqueId id;
  ASSERT_TRUE(c4::getUniqueId(&id).isOk());
  ASSERT_TRUE(c4::commInitRank(&comm, 1, id, 0).isOk());
  float buf[4] = {1, 2, 3, 4};
  EXPECT_CODE(c4::allReduce(buf, buf, 4, c4::DataType::kFloat32, c4::RedOp::kSum, nullptr), Code::kInvalidArgument);
  EXPECT_CODE(c4::allReduce(nullptr, buf, 4, c4::DataType::kFloat32, c4::RedOp::kSum, comm), Code::kInvalidArgument);
  EXPECT_CODE(c4::allReduce(buf, nullptr, 4, c4::DataType::kFloat32, c4::RedOp::kSum, comm), Code::kInvalidArgument);
  EXPECT_CODE(c4::allReduce(buf, buf, 4, static_cast<c4::DataType>(12), c4::RedOp::kSum, comm), Code::kInvalidArgument);
  EXPECT_CODE(c4::allReduce(buf, buf, 4, static_cast<c4::DataType>(-1), c4::RedOp::kSum, comm), Code::kInvalidArgument);
  EXPECT_CODE(c4::allReduce(buf, buf, 4, c4::DataType::kFloat32, static_cast<c4::RedOp>(5), comm),
              Code::kInvalidArgument);
  EXPECT_CODE(c4::allReduce(buf, buf, 4, c4::DataType::kFloat32, static_cast<c4::RedOp>(-3), comm),
              Code::kInvalidArgument);
  EXPECT_CODE(c4::allReduce(buf, buf, SIZE_MAX / 2, c4::DataType::kFloat32, c4::RedOp::kSum, comm),
              Code::kInvalidArgument);
  EXPECT_CODE(c4::broadcast(buf, buf, 4, c4::DataType::kFloat32, 1, comm), Code::kInvalidArgument);
  EXPECT_CODE(c4::broadcast(buf, buf, 4, c4::DataType::kFloat32, -1, comm), Code::kInvalidArgument);
  EXPECT_CODE(c4::reduce(buf, buf, 4, c4::DataType::kFloat32, c4::RedOp::kSum, 3, comm), Code::kInvalidArgument);
  EXPECT_CODE(c4::send(buf, 4, c4::DataType::kFloat32, 1, comm), Code::kInvalidArgument);
  EXPECT_CODE(c4::recv(buf, 4, c4::DataType::kFloat32, -2, comm), Code::kInvalidArgument);
  EXPECT_CODE(c4::groupEnd(), Code::kInvalidUsage);
  // PreMulSum created for float cannot be used with double.
  c4::RedOp op;
  float two = 2;
  ASSERT_TRUE(
      c4::redOpCreatePreMulSum(&op, &two, c4::DataType::kFloat32, c4::ScalarResidence::kHostImmediate, comm).isOk());
  double d[2] = {1, 2};
  EXPECT_CODE(c4::allReduce(d, d, 2, c4::DataType::kFloat64, op, comm), Code::kInvalidArgument);
  EXPECT_TRUE(c4::allReduce(buf, buf, 4, c4::DataType::kFloat32, op, comm).isOk());
  EXPECT_EQ(buf[3], 8.0f);  // one rank: 4 * 2
  EXPECT_TRUE(c4::redOpDestroy(op, comm).isOk());
  EXPECT_CODE(c4::redOpDestroy(op, comm), Code::kInvalidArgument);
  // Nothing was touched by the rejected calls.
  EXPECT_EQ(buf[0], 2.0f);
  // A rejected call inside a group fails the group, which then runs nothing.
  ASSERT_TRUE(c4::groupStart().isOk());
  EXPECT_CODE(c4::allReduce(buf, buf, 4, static_cast<c4::DataType>(99), c4::RedOp::kSum, comm), Code::kInvalidArgument);
  EXPECT_CODE(c4::groupEnd(), Code::kInvalidArgument);
  // Count 0 is a no-op, even with NULL buffers.
  EXPECT_TRUE(c4::allReduce(nullptr, nullptr, 0, c4::DataType::kFloat32, c4::RedOp::kSum, comm).isOk());
  int v = 0;
  EXPECT_TRUE(c4::commCount(comm, &v).isOk());
  EXPECT_EQ(v, 1);
  EXPECT_TRUE(c4::commUserRank(comm, &v).isOk());
  EXPECT_EQ(v, 0);
  EXPECT_TRUE(c4::commCuDevice(comm, &v).isOk());
  EXPECT_EQ(v, -1);
  ASSERT_TRUE(c4::commDestroy(comm).isOk());
  // Use after destroy is an error, not a crash.
  EXPECT_CODE(c4::allReduce(buf, buf, 4, c4::DataType::kFloat32, c4::RedOp::kSum, comm), Code::kInvalidUsage);
  EXPECT_CODE(c4::commCount(comm, &v), Code::kInvalidUsage);
  EXPECT_CODE(c4::commInitRank(&comm, 2, id, 2), Code::kInvalidArgument);
  EXPECT_CODE(c4::commInitRank(&comm, 0, id, 0), Code::kInvalidArgument);
}

TEST(Api, FinalizedCommunicatorRejectsWork) {
  c4::Comm* comm = nullptr;
  c4::UniqueId id;
  ASSERT_TRUE(c4::getUniqueId(&id).isOk());
  ASSERT_TRUE(c4::commInitRank(&comm, 1, id, 0).isOk());
  ASSERT_TRUE(c4::commFinalize(comm).isOk());
  float x = 1;
  EXPECT_CODE(c4::allReduce(&x, &x, 1, c4::DataType::kFloat32, c4::RedOp::kSum, comm), Code::kInvalidUsage);
  EXPECT_TRUE(c4::commDestroy(comm).isOk());
}

/// "count 1024 vs 2048" -> "count 2048 vs 1024": which rank notices first decides the order.
std::string swapSides(const std::string& s) {
  size_t vs = s.find(" vs ");
  size_t start = s.rfind(' ', vs == std::string::npos ? 0 : vs - 1);
  if (vs == std::string::npos || start == std::string::npos) return s;
  std::string a = s.substr(start + 1, vs - start - 1), b = s.substr(vs + 4);
  return s.substr(0, start + 1) + b + " vs " + a;
}

/// Runs one mismatching call pair on 2 ranks; both must fail quickly, one naming the difference.
/// Runs twice: through the one-shot arena (small calls, the default) and through messages
/// (C4_ONESHOT_BYTES=0), since each path detects the mismatch on its own.
void expectMismatch(const std::function<c4::Status(int rank, c4::Comm*)>& call, const std::string& oneShotText,
                    const std::string& messageText) {
  ScopedEnv timeout("C4_TIMEOUT", "20");
  for (bool messages : {false, true}) {
    ScopedEnv path("C4_ONESHOT_BYTES", messages ? "0" : "8192");
    const std::string& mustMention = messages ? messageText : oneShotText;
    int64_t t0 = monoMs();
    auto outs = runForked(
        2,
        [&](int rank, int n, const c4::UniqueId& id) -> Failures {
          c4::Comm* comm = nullptr;
          c4::Status st = c4::commInitRank(&comm, n, id, rank);
          if (!st.isOk()) return {"init: " + st.toString()};
          st = call(rank, comm);
          Failures f;
          // Report the error text through the failure channel; "ok" would be a bug.
          f.push_back(st.isOk() ? std::string("UNEXPECTED-OK") : st.message());
          (void)c4::commAbort(comm);
          return f;
        },
        60);
    int64_t ms = monoMs() - t0;
    if (getenv("C4_TEST_VERBOSE")) printf("%s", summarize(outs).c_str());
    bool mentioned = false;
    for (auto& o : outs) {
      EXPECT_FALSE(o.detail.find("UNEXPECTED-OK") != std::string::npos) << "rank " << o.rank << " succeeded";
      EXPECT_FALSE(o.detail.find("hung") != std::string::npos) << o.detail;
      mentioned |=
          o.detail.find(mustMention) != std::string::npos || o.detail.find(swapSides(mustMention)) != std::string::npos;
    }
    EXPECT_TRUE(mentioned) << (messages ? "message path" : "one-shot path") << ": no rank named the mismatch '"
                           << mustMention << "':\n"
                           << summarize(outs);
    EXPECT_LT(ms, 20000) << "mismatch detection waited for the timeout instead of failing fast";
  }
}

TEST(Mismatch, Count) {
  expectMismatch(
      [](int rank, c4::Comm* c) {
        std::vector<float> b(4096, 1.0f);
        return c4::allReduce(b.data(), b.data(), rank == 0 ? 1024 : 2048, c4::DataType::kFloat32, c4::RedOp::kSum, c);
      },
      "count 1024 vs 2048", "count 1024 vs 2048");
}

TEST(Mismatch, Datatype) {
  expectMismatch(
      [](int rank, c4::Comm* c) {
        std::vector<float> b(4096, 1.0f);
        return c4::allReduce(b.data(), b.data(), 1024, rank == 0 ? c4::DataType::kFloat32 : c4::DataType::kInt32,
                             c4::RedOp::kSum, c);
      },
      "datatype", "datatype");
}

TEST(Mismatch, Op) {
  expectMismatch(
      [](int rank, c4::Comm* c) {
        std::vector<float> b(4096, 1.0f);
        return c4::allReduce(b.data(), b.data(), 1024, c4::DataType::kFloat32,
                             rank == 0 ? c4::RedOp::kSum : c4::RedOp::kMax, c);
      },
      "op sum vs max", "op sum vs max");
}

TEST(Mismatch, Root) {
  // Both ranks believe they are the root. The one-shot path sees it at once; on the message path
  // both only send and neither call can notice, so the stale message is caught by the next
  // operation between them, and the error names the root.
  expectMismatch(
      [](int rank, c4::Comm* c) {
        std::vector<float> b(4096, 1.0f);
        c4::Status st = c4::broadcast(b.data(), b.data(), 1024, c4::DataType::kFloat32, rank, c);
        if (!st.isOk()) return st;
        return c4::allReduce(b.data(), b.data(), 1024, c4::DataType::kFloat32, c4::RedOp::kSum, c);
      },
      "root 1 vs 0", "root 0 vs -1");
}

TEST(Mismatch, Collective) {
  expectMismatch(
      [](int rank, c4::Comm* c) {
        std::vector<float> b(8192, 1.0f);
        if (rank == 0) return c4::allReduce(b.data(), b.data(), 1024, c4::DataType::kFloat32, c4::RedOp::kSum, c);
        return c4::allGather(b.data(), b.data() + 2048, 512, c4::DataType::kFloat32, c);
      },
      "collective", "collective");
}

TEST(Mismatch, CountAcrossPathsAndDifferentThresholds) {
  // Rank 0's call is small enough for the one-shot arena, rank 1's is not.
  expectMismatch(
      [](int rank, c4::Comm* c) {
        std::vector<float> b(1 << 20, 1.0f);
        return c4::allReduce(b.data(), b.data(), rank == 0 ? 16 : (1 << 20), c4::DataType::kFloat32, c4::RedOp::kSum,
                             c);
      },
      "count 1048576 vs 16", "count");
  // Same call, but the ranks were configured with different one-shot limits.
  ScopedEnv timeout("C4_TIMEOUT", "20");
  auto outs = runForked(
      2,
      [](int rank, int n, const c4::UniqueId& id) -> Failures {
        setenv("C4_ONESHOT_BYTES", rank == 0 ? "8192" : "0", 1);
        c4::Comm* comm = nullptr;
        c4::Status st = c4::commInitRank(&comm, n, id, rank);
        if (!st.isOk()) return {"init: " + st.toString()};
        std::vector<float> b(64, 1.0f);
        st = c4::allReduce(b.data(), b.data(), b.size(), c4::DataType::kFloat32, c4::RedOp::kSum, comm);
        Failures f{st.isOk() ? std::string("UNEXPECTED-OK") : st.message()};
        (void)c4::commAbort(comm);
        return f;
      },
      60);
  std::string all = summarize(outs);
  EXPECT_EQ(all.find("UNEXPECTED-OK"), std::string::npos) << all;
  EXPECT_NE(all.find("C4_ONESHOT_BYTES"), std::string::npos) << all;
}

TEST(Api, BadConfigIsRejected) {
  c4::Comm* comm = nullptr;
  c4::UniqueId id;
  ASSERT_TRUE(c4::getUniqueId(&id).isOk());
  c4::Config bad;
  bad.timeoutMs = -1;
  EXPECT_CODE(c4::commInitRank(&comm, 1, id, 0, bad), Code::kInvalidArgument);
  bad = c4::Config{};
  bad.spinUs = -2;
  EXPECT_CODE(c4::commInitRank(&comm, 1, id, 0, bad), Code::kInvalidArgument);
  bad.spinUs = 60000001;
  EXPECT_CODE(c4::commInitRank(&comm, 1, id, 0, bad), Code::kInvalidArgument);
  c4::Comm* comms[2] = {nullptr, nullptr};
  EXPECT_CODE(c4::commInitAll(comms, 2, bad), Code::kInvalidArgument);
  EXPECT_EQ(comm, nullptr);
}

// Config::timeoutMs bounds a wait on a silent (alive) peer; C4_TIMEOUT, when set, wins over it.
// Config::spinUs changes only how the idle rank waits: the collective still completes.
TEST(Failure, ConfigTimeoutAppliesAndTheEnvironmentWins) {
  for (const char* env : {static_cast<const char*>(nullptr), "1"}) {
    if (env) setenv("C4_TIMEOUT", env, 1);
    auto outs = runForked(
        2,
        [](int rank, int n, const c4::UniqueId& id) -> Failures {
          c4::Config cfg;
          cfg.timeoutMs = getenv("C4_TIMEOUT") ? 60000 : 500;
          cfg.spinUs = 0;
          c4::Comm* comm = nullptr;
          c4::Status st = c4::commInitRank(&comm, n, id, rank, cfg);
          if (!st.isOk()) return {"init: " + st.toString()};
          std::vector<float> b(64, 1.0f);
          st = c4::allReduce(b.data(), b.data(), b.size(), c4::DataType::kFloat32, c4::RedOp::kSum, comm);
          Failures f;
          if (!st.isOk() || b[0] != 2.0f) f.push_back("first allreduce: " + st.toString());
          if (rank == 1) {
            usleep(3000 * 1000);  // silent, but alive: only the timeout can end rank 0's wait
          } else {
            const char* want = getenv("C4_TIMEOUT") ? "no progress for 1000 ms" : "no progress for 500 ms";
            int64_t t0 = monoMs();
            st = c4::allReduce(b.data(), b.data(), b.size(), c4::DataType::kFloat32, c4::RedOp::kSum, comm);
            if (st.isOk() || st.message().find(want) == std::string::npos ||
                st.message().find("rank 1") == std::string::npos)
              f.push_back(std::string("UNEXPECTED: want '") + want + "' naming rank 1, got " + st.toString());
            if (monoMs() - t0 > 2500) f.push_back("UNEXPECTED: took " + std::to_string(monoMs() - t0) + " ms");
          }
          (void)c4::commAbort(comm);
          return f;
        },
        60);
    if (env) unsetenv("C4_TIMEOUT");
    for (const auto& o : outs) EXPECT_TRUE(!o.crashed && o.detail.empty()) << "rank " << o.rank << ": " << o.detail;
  }
}

// Fresh ranks often start on one CPU until the scheduler spreads them (~8 ms here). Spinning, they
// took 250 us turns per call; now the waiting rank yields to a peer on its CPU, and the higher rank
// of the pair moves itself to a free CPU of its affinity mask after 0.2 ms, leaving a trace note.
// Rank 0 stays pinned to the shared CPU; only rank 1 may leave it. Where the ranks end up is not
// checked: with other tests loading the other CPU the scheduler may bring rank 1 back.
TEST(Idle, RanksSharingACpuAreSpread) {
  cpu_set_t all;
  ASSERT_EQ(sched_getaffinity(0, sizeof(all), &all), 0);
  if (CPU_COUNT(&all) < 2) C4_NOT_APPLICABLE("one-cpu", "the ranks need 2 CPUs to be spread over");
  int first = 0;
  while (!CPU_ISSET(first, &all)) ++first;
  ScopedEnv timeout("C4_TIMEOUT", "30");
  // The kernel may spread the pair itself before rank 1 has shared its CPU for 0.2 ms (1 run in
  // 12 here): then there is no note, and the test tries again (at most 3 times).
  std::string last;
  for (int attempt = 0; attempt < 3; ++attempt) {
    auto outs = runForked(
        2,
        [first](int rank, int n, const c4::UniqueId& id) -> Failures {
          c4::Comm* comm = nullptr;
          c4::Status st = c4::commInitRank(&comm, n, id, rank);
          if (!st.isOk()) return {"init: " + st.toString()};
          // Both onto one CPU (after init, which sizes the back-off from the affinity mask).
          cpu_set_t mask, one;
          sched_getaffinity(0, sizeof(mask), &mask);
          CPU_ZERO(&one);
          CPU_SET(first, &one);
          if (sched_setaffinity(0, sizeof(one), &one) != 0) return {"cannot pin to CPU " + std::to_string(first)};
          if (rank == 1) sched_setaffinity(0, sizeof(mask), &mask);
          Failures f;
          float x = 1.0f, y = 0.0f;
          for (int i = 0; i < 20000 && f.empty(); ++i) {
            st = c4::allReduce(&x, &y, 1, c4::DataType::kFloat32, c4::RedOp::kSum, comm);
            if (!st.isOk() || y != 2.0f) f.push_back("allreduce " + std::to_string(i) + ": " + st.toString());
          }
          if (rank == 1) {
            std::string path;
            st = c4::trace::flush(comm, &path);
            std::ifstream in(path, std::ios::binary);
            std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
            if (!st.isOk() || bytes.find("with rank 0 for 0.2 ms while waiting: moved to CPU") == std::string::npos)
              f.push_back("NO-NOTE: no 'moved to CPU' note in rank 1's trace " + path + " (" + st.toString() + ")");
          }
          (void)c4::commDestroy(comm);
          return f;
        },
        60);
    last = summarize(outs);
    bool clean = true, retry = false;
    for (const auto& o : outs) {
      clean = clean && !o.crashed && o.detail.empty();
      retry = retry || (!o.crashed && o.detail.rfind("NO-NOTE", 0) == 0);
    }
    if (clean) return;
    if (!retry) break;
  }
  ADD_FAILURE() << last;
}

TEST(Failure, DeadPeerIsNamedNotAHang) {
  ScopedEnv timeout("C4_TIMEOUT", "15");
  int64_t t0 = monoMs();
  auto outs = runForked(
      3,
      [](int rank, int n, const c4::UniqueId& id) -> Failures {
        c4::Comm* comm = nullptr;
        c4::Status st = c4::commInitRank(&comm, n, id, rank);
        if (!st.isOk()) return {"init: " + st.toString()};
        if (rank == 2) _exit(0);  // dies without a word
        std::vector<float> b(1 << 20, 1.0f);
        st = c4::allReduce(b.data(), b.data(), b.size(), c4::DataType::kFloat32, c4::RedOp::kSum, comm);
        Failures f{st.isOk() ? std::string("UNEXPECTED-OK") : st.message()};
        // Every later call on the failed communicator returns the recorded error at once.
        c4::Status again = c4::allReduce(b.data(), b.data(), 1, c4::DataType::kFloat32, c4::RedOp::kSum, comm);
        if (again.isOk() || again.message().find("failed earlier") == std::string::npos)
          f.push_back("UNEXPECTED-OK: later call on a failed communicator: " + again.toString());
        (void)c4::commAbort(comm);
        return f;
      },
      60);
  EXPECT_LT(monoMs() - t0, 40000);
  for (int r = 0; r < 2; ++r) {
    const std::string& d = outs[static_cast<size_t>(r)].detail;
    EXPECT_EQ(d.find("UNEXPECTED-OK"), std::string::npos) << d;
    EXPECT_EQ(d.find("hung"), std::string::npos) << d;
  }
  std::string all = outs[0].detail + outs[1].detail;
  EXPECT_NE(all.find("rank 2"), std::string::npos) << "nobody named the dead rank:\n" << all;
}

// A stopped peer (SIGSTOP: its sockets stay open, nothing is read) over tcp with two lanes: the
// send's lane stalls while the other lane sits idle and gets pinged every half stall period. The
// pings are written into a socket buffer nobody reads; they are not progress, so the watchdog fires
// within C4_TIMEOUT naming the peer (it once counted those bytes and waited forever).
TEST(Failure, StoppedPeerOverTcpIsNamedNotAHang) {
  ScopedEnv transport("C4_TRANSPORT", "tcp");
  ScopedEnv lanes("C4_LANES", "2");
  ScopedEnv stall("C4_TCP_LANE_STALL_MS", "300");
  ScopedEnv timeout("C4_TIMEOUT", "3");
  auto* peerPid = static_cast<std::atomic<pid_t>*>(
      mmap(nullptr, sizeof(std::atomic<pid_t>), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0));
  ASSERT_NE(peerPid, MAP_FAILED);
  new (peerPid) std::atomic<pid_t>(0);
  auto outs = runForked(
      2,
      [&](int rank, int n, const c4::UniqueId& id) -> Failures {
        c4::Comm* comm = nullptr;
        c4::Status st = c4::commInitRank(&comm, n, id, rank);
        if (!st.isOk()) return {"init: " + st.toString()};
        // Both lanes up: a striped AllReduce.
        std::vector<float> b(1 << 18, 1.0f);
        st = c4::allReduce(b.data(), b.data(), b.size(), c4::DataType::kFloat32, c4::RedOp::kSum, comm);
        if (!st.isOk()) return {"warm-up: " + st.toString()};
        if (rank == 1) {
          peerPid->store(getpid());
          raise(SIGSTOP);  // rank 0 kills this process
          return {"rank 1 ran on after SIGSTOP"};
        }
        while (peerPid->load() == 0) usleep(1000);
        usleep(100000);
        const int64_t t0 = monoMs();
        // 16 MiB: more than the socket buffers hold and than a send is detached with
        // (docs/tcp-transport.md), so it cannot complete without the peer.
        std::vector<float> big(size_t{1} << 22, 1.0f);
        st = c4::send(big.data(), big.size(), c4::DataType::kFloat32, 1, comm);
        const int64_t took = monoMs() - t0;
        kill(peerPid->load(), SIGKILL);
        Failures f;
        if (st.isOk()) f.push_back("UNEXPECTED-OK: the send to a stopped peer completed");
        if (st.message().find("rank 1") == std::string::npos) f.push_back("does not name rank 1: " + st.toString());
        if (took > 9000) f.push_back("took " + std::to_string(took) + " ms (C4_TIMEOUT is 3 s)");
        (void)c4::commAbort(comm);
        return f;
      },
      40);
  if (peerPid->load() > 0) kill(peerPid->load(), SIGKILL);
  munmap(peerPid, sizeof(std::atomic<pid_t>));
  EXPECT_FALSE(outs[0].crashed) << outs[0].detail;
  EXPECT_TRUE(outs[0].detail.empty()) << outs[0].detail;
}

TEST(Failure, AbortByOneRankFailsTheOthersFast) {
  ScopedEnv timeout("C4_TIMEOUT", "30");
  int64_t t0 = monoMs();
  auto outs = runForked(
      2,
      [](int rank, int n, const c4::UniqueId& id) -> Failures {
        c4::Comm* comm = nullptr;
        c4::Status st = c4::commInitRank(&comm, n, id, rank);
        if (!st.isOk()) return {"init: " + st.toString()};
        if (rank == 1) {
          (void)c4::commAbort(comm);
          sleep(2);  // stay alive: the peer must learn of the abort, not of a death
          return {};
        }
        std::vector<float> b(1 << 16, 1.0f);
        st = c4::allReduce(b.data(), b.data(), b.size(), c4::DataType::kFloat32, c4::RedOp::kSum, comm);
        Failures f;
        if (st.isOk()) f.push_back("UNEXPECTED-OK");
        (void)c4::commAbort(comm);
        return f;
      },
      60);
  EXPECT_LT(monoMs() - t0, 25000);
  EXPECT_TRUE(summarize(outs).empty()) << summarize(outs);
}

TEST(Lifecycle, SplitByColorAndKey) {
  auto outs = runForked(4, [](int rank, int n, const c4::UniqueId& id) -> Failures {
    Failures f;
    c4::Comm* comm = nullptr;
    c4::Status st = c4::commInitRank(&comm, n, id, rank);
    if (!st.isOk()) return {"init: " + st.toString()};
    c4::Comm* sub = nullptr;
    int color = rank == 3 ? -1 : rank % 2;
    st = c4::commSplit(comm, color, -rank, &sub);
    if (!st.isOk()) return {"split: " + st.toString()};
    if (rank == 3) {
      if (sub != nullptr) f.push_back("NOCOLOR rank got a communicator");
    } else {
      int sr = -1, sn = -1;
      (void)c4::commUserRank(sub, &sr);
      (void)c4::commCount(sub, &sn);
      int expN = rank % 2 == 0 ? 2 : 1;  // color 0: ranks 0, 2; color 1: rank 1 (3 opted out)
      int expR = rank == 0 ? 1 : 0;      // key -rank: rank 2 comes first
      if (sn != expN || sr != expR) f.push_back("split rank/size " + std::to_string(sr) + "/" + std::to_string(sn));
      float x = static_cast<float>(rank + 1);
      st = c4::allReduce(&x, &x, 1, c4::DataType::kFloat32, c4::RedOp::kSum, sub);
      float exp = rank % 2 == 0 ? 4.0f : 2.0f;
      if (!st.isOk() || x != exp) f.push_back("sub allreduce: " + st.toString() + " got " + std::to_string(x));
      (void)c4::commDestroy(sub);
    }
    // The parent still works.
    float y = 1;
    st = c4::allReduce(&y, &y, 1, c4::DataType::kFloat32, c4::RedOp::kSum, comm);
    if (!st.isOk() || y != 4.0f) f.push_back("parent allreduce after split: " + st.toString());
    (void)c4::commDestroy(comm);
    return f;
  });
  EXPECT_TRUE(summarize(outs).empty()) << summarize(outs);
}

// Sum over the ranks of a communicator of (parent rank + 1), and a check of its size and rank.
std::string checkShrunk(c4::Comm* c, int parentRank, const std::vector<int>& members) {
  int nr = -1, r = -1;
  (void)c4::commCount(c, &nr);
  (void)c4::commUserRank(c, &r);
  const int want = static_cast<int>(std::find(members.begin(), members.end(), parentRank) - members.begin());
  if (nr != static_cast<int>(members.size()) || r != want)
    return "rank/size " + std::to_string(r) + "/" + std::to_string(nr) + ", expected " + std::to_string(want) + "/" +
           std::to_string(members.size());
  std::vector<int32_t> v(5000, parentRank + 1);  // above the one-shot size: the transports carry it
  c4::Status st = c4::allReduce(v.data(), v.data(), v.size(), c4::DataType::kInt32, c4::RedOp::kSum, c);
  int32_t exp = 0;
  for (int m : members) exp += m + 1;
  if (!st.isOk() || v.front() != exp || v.back() != exp)
    return "allreduce: " + st.toString() + " got " + std::to_string(v.front()) + " want " + std::to_string(exp);
  return "";
}

TEST(Lifecycle, ShrinkKeepsTheParentAndCanRepeat) {
  auto outs = runForked(4, [](int rank, int n, const c4::UniqueId& id) -> Failures {
    Failures f;
    c4::Comm* comm = nullptr;
    c4::Status st = c4::commInitRank(&comm, n, id, rank);
    if (!st.isOk()) return {"init: " + st.toString()};
    // Bad input, checked before anything is sent.
    c4::Comm* sub = nullptr;
    const int outOfRange[] = {4}, twice[] = {1, 1}, self[] = {rank};
    struct Bad {
      const int* list;
      int count;
      Code want;
      const char* says;
    } bad[] = {{outOfRange, 1, Code::kInvalidArgument, "not in 0..3"},
               {twice, 2, Code::kInvalidArgument, "twice"},
               {self, 1, Code::kInvalidUsage, "its own exclude list"},
               {nullptr, 1, Code::kInvalidArgument, "NULL"},
               {twice, -1, Code::kInvalidArgument, "negative"}};
    for (const Bad& b : bad) {
      st = c4::commShrink(comm, b.list, b.count, &sub);
      if (st.code() != b.want || st.message().find(b.says) == std::string::npos || sub != nullptr)
        f.push_back(std::string("bad input (") + b.says + "): " + st.toString());
    }
    st = c4::commShrink(comm, nullptr, 0, nullptr);
    if (st.code() != Code::kInvalidArgument) f.push_back("null newcomm: " + st.toString());
    // Rank 1 stays out (it does not call); ranks 0, 2, 3 shrink twice: without 1, then without 1 and 3.
    if (rank != 1) {
      const int without1[] = {1};
      st = c4::commShrink(comm, without1, 1, &sub);
      if (!st.isOk()) return {"shrink: " + st.toString()};
      std::string e = checkShrunk(sub, rank, {0, 2, 3});
      if (!e.empty()) f.push_back("first shrink: " + e);
      (void)c4::commDestroy(sub);
      if (rank != 3) {
        const int without13[] = {3, 1};  // any order
        st = c4::commShrink(comm, without13, 2, &sub);
        if (!st.isOk()) return {"second shrink: " + st.toString()};
        e = checkShrunk(sub, rank, {0, 2});
        if (!e.empty()) f.push_back("second shrink: " + e);
        (void)c4::commDestroy(sub);
      }
    }
    // Without the abort flag the parent goes on, with every rank.
    std::string e = checkShrunk(comm, rank, {0, 1, 2, 3});
    if (!e.empty()) f.push_back("parent after shrink: " + e);
    (void)c4::commDestroy(comm);
    return f;
  });
  EXPECT_TRUE(summarize(outs).empty()) << summarize(outs);
}

class ShrinkAfterDeath : public ::testing::TestWithParam<const char*> {};

TEST_P(ShrinkAfterDeath, GoesOnWithTheRest) {
  // Rank 0 dies: the lowest rank left (1) leads the shrink. The parent failed, so the ranks agree
  // over the bootstrap's point-to-point links, which outlive the failure. Over shm (a pidfd sees
  // the death), over tcp (the sockets close) and over ucx (its shared memory: the transport
  // watches the peer's process).
  ScopedEnv timeout("C4_TIMEOUT", "15");
  ScopedEnv transport("C4_TRANSPORT", GetParam());
  int64_t t0 = monoMs();
  auto outs = runForked(
      4,
      [](int rank, int n, const c4::UniqueId& id) -> Failures {
        c4::Comm* comm = nullptr;
        c4::Status st = c4::commInitRank(&comm, n, id, rank);
        if (!st.isOk()) return {"init: " + st.toString()};
        if (rank == 0) _exit(0);
        Failures f;
        std::vector<float> b(1 << 18, 1.0f);
        st = c4::allReduce(b.data(), b.data(), b.size(), c4::DataType::kFloat32, c4::RedOp::kSum, comm);
        if (st.isOk()) f.push_back("UNEXPECTED-OK: allreduce with a dead rank");
        // Ranks 1 and 3 abort the parent as part of the shrink (NCCL_SHRINK_ABORT), rank 2 does not.
        const int dead[] = {0};
        c4::Comm* sub = nullptr;
        st = c4::commShrink(comm, dead, 1, &sub, nullptr, rank != 2);
        if (!st.isOk()) return {"shrink: " + st.toString()};
        std::string e = checkShrunk(sub, rank, {1, 2, 3});
        if (!e.empty()) f.push_back(e);
        (void)c4::commDestroy(sub);
        (void)c4::commAbort(comm);
        return f;
      },
      90);
  EXPECT_LT(monoMs() - t0, 60000);
  for (int r = 1; r < 4; ++r) EXPECT_EQ(outs[static_cast<size_t>(r)].detail, "") << "rank " << r;
}

/// The transports whose dead-peer detection the failure tests go through: ucx where it is built.
std::vector<const char*> deathTransports() {
  std::vector<const char*> out = {"shm", "tcp"};
#ifdef C4_TEST_UCX
  out.push_back("ucx");
#endif
  return out;
}

std::string transportName(const ::testing::TestParamInfo<const char*>& i) { return i.param; }

INSTANTIATE_TEST_SUITE_P(Failure, ShrinkAfterDeath, ::testing::ValuesIn(deathTransports()), transportName);

TEST(Failure, ShrinkWithDifferentExcludeListsFailsClearly) {
  // Rank 1 leaves rank 2 out, ranks 0 and 2 keep everyone: rank 1 is told the lists differ, the
  // others fail when rank 1 never joins the new communicator. Nobody hangs.
  ScopedEnv timeout("C4_TIMEOUT", "5");
  int64_t t0 = monoMs();
  auto outs = runForked(
      3,
      [](int rank, int n, const c4::UniqueId& id) -> Failures {
        c4::Comm* comm = nullptr;
        c4::Status st = c4::commInitRank(&comm, n, id, rank);
        if (!st.isOk()) return {"init: " + st.toString()};
        const int two[] = {2};
        c4::Comm* sub = nullptr;
        st = c4::commShrink(comm, two, rank == 1 ? 1 : 0, &sub);
        Failures f{st.isOk() ? std::string("UNEXPECTED-OK") : st.message()};
        if (sub) (void)c4::commDestroy(sub);
        (void)c4::commAbort(comm);
        return f;
      },
      60);
  EXPECT_LT(monoMs() - t0, 30000);
  EXPECT_NE(outs[1].detail.find("disagree on the exclude list"), std::string::npos) << outs[1].detail;
  for (int r : {0, 2}) {
    EXPECT_EQ(outs[static_cast<size_t>(r)].detail.find("UNEXPECTED-OK"), std::string::npos) << "rank " << r;
    EXPECT_EQ(outs[static_cast<size_t>(r)].detail.find("hung"), std::string::npos) << "rank " << r;
  }
}

// One-sided calls (NCCL 2.29's RMA) between processes: every rank puts a block into every rank's
// window and waits for the signals; a wait for a signal that never comes is kTimeout after the
// communicator's timeout and leaves it usable; a suspended communicator refuses them. `hosts`: each
// rank claims a host of its own (C4_HOSTID), so the puts go through the side channel, not the mapping.
Failures oneSidedRank(int rank, int n, const c4::UniqueId& id, bool hosts) {
  if (hosts) setenv("C4_HOSTID", std::to_string(100 + rank).c_str(), 1);
  {
    Failures f;
    c4::Config cfg;
    cfg.timeoutMs = 1500;
    c4::Comm* comm = nullptr;
    c4::Status st = c4::commInitRank(&comm, n, id, rank, cfg);
    if (!st.isOk()) return {"init: " + st.toString()};
    const size_t block = 3000;  // int32 each rank puts into each window
    int32_t* win = nullptr;
    int32_t* src = nullptr;
    if (!c4::memAlloc(reinterpret_cast<void**>(&win), block * 4 * static_cast<size_t>(n)).isOk() ||
        !c4::memAlloc(reinterpret_cast<void**>(&src), block * 4).isOk())
      return {"memAlloc failed"};
    // Before any window: nothing to signal through.
    st = c4::signalPeer((rank + 1) % n, comm);
    if (st.code() != Code::kInvalidUsage) f.push_back("signal before a window: " + st.toString());
    c4::Window* w = nullptr;
    st = c4::windowRegister(comm, win, block * 4 * static_cast<size_t>(n), 0, &w);
    if (!st.isOk()) return {"windowRegister: " + st.toString()};
    for (size_t i = 0; i < block; ++i) src[i] = rank * 1000000 + static_cast<int32_t>(i);
    for (int p = 0; p < n; ++p) {
      st = c4::putSignal(src, block * 4, p, w, static_cast<size_t>(rank) * block * 4, comm);
      if (!st.isOk()) f.push_back("putSignal to " + std::to_string(p) + ": " + st.toString());
    }
    // Which path carried them: once every rank's puts returned (the AllReduce), a put through the
    // mapping is in the window already, one through the side channel only after this rank waits.
    int x = 1;
    st = c4::allReduce(&x, &x, 1, c4::DataType::kInt32, c4::RedOp::kSum, comm);
    if (!st.isOk()) f.push_back("allreduce: " + st.toString());
    for (int p = 0; p < n; ++p) {
      if (p == rank) continue;
      const bool there = win[static_cast<size_t>(p) * block + 1] == p * 1000000 + 1;
      if (there == hosts)
        f.push_back(std::string("rank ") + std::to_string(p) + "'s put " + (there ? "is" : "is not") +
                    " in the window before the wait: it did not take the " + (hosts ? "side channel" : "mapping"));
    }
    std::vector<int> peers, counts;
    for (int p = 0; p < n; ++p) {
      peers.push_back(p);
      counts.push_back(1);
    }
    st = c4::waitSignal(n, peers.data(), counts.data(), comm);
    if (!st.isOk()) f.push_back("waitSignal: " + st.toString());
    for (int p = 0; p < n && f.empty(); ++p)
      for (size_t i = 0; i < block; ++i)
        if (win[static_cast<size_t>(p) * block + i] != p * 1000000 + static_cast<int32_t>(i)) {
          f.push_back("window block " + std::to_string(p) + "[" + std::to_string(i) +
                      "] = " + std::to_string(win[static_cast<size_t>(p) * block + i]));
          break;
        }
    // Out of the window: refused, nothing written.
    st = c4::putSignal(src, 8, (rank + 1) % n, w, block * 4 * static_cast<size_t>(n) - 4, comm);
    if (st.code() != Code::kInvalidArgument) f.push_back("put past the window: " + st.toString());
    // Nobody signals again: the wait times out, and the communicator still works.
    const int prev = (rank + n - 1) % n, one = 1;
    const int64_t t0 = monoMs();
    st = c4::waitSignal(1, &prev, &one, comm);
    const int64_t waited = monoMs() - t0;
    if (st.code() != Code::kTimeout || waited < 1400 || waited > 10000)
      f.push_back("wait without a signal: " + st.toString() + " after " + std::to_string(waited) + " ms");
    x = 1;
    st = c4::allReduce(&x, &x, 1, c4::DataType::kInt32, c4::RedOp::kSum, comm);
    if (!st.isOk() || x != n) f.push_back("allreduce after the timeout: " + st.toString());
    // Suspended: one-sided calls are refused too.
    if (!c4::commSuspend(comm, true).isOk()) f.push_back("suspend failed");
    st = c4::signalPeer(prev, comm);
    if (st.code() != Code::kInvalidUsage) f.push_back("signal while suspended: " + st.toString());
    c4::MemStats ms;
    if (!c4::commMemStats(comm, &ms).isOk() || !ms.suspended) f.push_back("memStats does not say suspended");
    if (!c4::commResume(comm).isOk()) f.push_back("resume failed");
    st = c4::windowDeregister(comm, w);
    if (!st.isOk()) f.push_back("windowDeregister: " + st.toString());
    void* ptr = nullptr;
    st = c4::windowUserPtr(comm, w, &ptr);
    if (st.code() != Code::kInvalidArgument) f.push_back("windowUserPtr after deregister: " + st.toString());
    (void)c4::memFree(win);
    (void)c4::memFree(src);
    (void)c4::commDestroy(comm);
    return f;
  }
}

TEST(OneSided, PutSignalWaitBetweenProcessesAndTimeout) {
  auto outs = runForked(3, [](int rank, int n, const c4::UniqueId& id) { return oneSidedRank(rank, n, id, false); });
  EXPECT_TRUE(summarize(outs).empty()) << summarize(outs);
}

TEST(OneSided, PutSignalWaitBetweenHosts) {
  auto outs = runForked(3, [](int rank, int n, const c4::UniqueId& id) { return oneSidedRank(rank, n, id, true); });
  EXPECT_TRUE(summarize(outs).empty()) << summarize(outs);
}

// Ranks that are threads of one process use each other's windows in place.
TEST(OneSided, RanksInOneProcess) {
  const int n = 4;
  c4::Comm* comms[n] = {};
  ASSERT_TRUE(c4::commInitAll(comms, n).isOk());
  std::vector<std::string> errors(n);
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      c4::Comm* comm = comms[r];
      double* win = nullptr;
      if (!c4::memAlloc(reinterpret_cast<void**>(&win), 8 * n).isOk()) {
        errors[r] = "memAlloc";
        return;
      }
      c4::Window* w = nullptr;
      c4::Status st = c4::windowRegister(comm, win, 8 * n, 0, &w);
      if (!st.isOk()) {
        errors[r] = "register: " + st.toString();
        return;
      }
      void* user = nullptr;
      if (!c4::windowUserPtr(comm, w, &user).isOk() || user != win) errors[r] += "windowUserPtr; ";
      const double v = 0.5 + r;
      for (int p = 0; p < n; ++p)
        if (!c4::putSignal(&v, 8, p, w, 8 * static_cast<size_t>(r), comm).isOk()) errors[r] += "put; ";
      std::vector<int> peers, counts(n, 1);
      for (int p = 0; p < n; ++p) peers.push_back(p);
      st = c4::waitSignal(n, peers.data(), counts.data(), comm);
      if (!st.isOk()) errors[r] += "wait: " + st.toString();
      for (int p = 0; p < n; ++p)
        if (win[p] != 0.5 + p) errors[r] += "win[" + std::to_string(p) + "] = " + std::to_string(win[p]) + "; ";
      if (!c4::windowDeregister(comm, w).isOk()) errors[r] += "deregister; ";
      (void)c4::memFree(win);
    });
  }
  for (auto& t : threads) t.join();
  for (int r = 0; r < n; ++r) EXPECT_EQ(errors[r], "") << "rank " << r;
  for (c4::Comm* c : comms) (void)c4::commDestroy(c);
}

// commGrow's mistakes fail every rank alike (no hang): two ranks passing ids, or none.
TEST(Lifecycle, GrowMistakesFailEveryRank) {
  auto outs = runForked(2, [](int rank, int n, const c4::UniqueId& id) -> Failures {
    Failures f;
    c4::Comm* comm = nullptr;
    c4::Status st = c4::commInitRank(&comm, n, id, rank);
    if (!st.isOk()) return {"init: " + st.toString()};
    c4::UniqueId gid;
    st = c4::commGrowId(comm, &gid);
    if (!st.isOk()) return {"commGrowId: " + st.toString()};
    c4::Comm* big = nullptr;
    st = c4::commGrow(comm, n + 1, &gid, -1, &big);  // both ranks pass an id
    if (st.code() != Code::kInvalidUsage || big != nullptr) f.push_back("two ids: " + st.toString());
    st = c4::commGrow(comm, n + 1, nullptr, -1, &big);  // nobody does
    if (st.code() != Code::kInvalidUsage) f.push_back("no id: " + st.toString());
    st = c4::commGrow(comm, n, nullptr, -1, &big);  // not a growth
    if (st.code() != Code::kInvalidArgument) f.push_back("same size: " + st.toString());
    c4::UniqueId other;
    st = c4::commGrowId(comm, &other);  // the first id was not consumed
    if (st.code() != Code::kInvalidUsage) f.push_back("second id: " + st.toString());
    int x = 1;
    st = c4::allReduce(&x, &x, 1, c4::DataType::kInt32, c4::RedOp::kSum, comm);
    if (!st.isOk() || x != n) f.push_back("allreduce after: " + st.toString());
    (void)c4::commDestroy(comm);
    return f;
  });
  EXPECT_TRUE(summarize(outs).empty()) << summarize(outs);
}

TEST(Lifecycle, GroupSimulateEndEstimatesAndRunsNothing) {
  auto outs = runThreads(2, [](int rank, int n, const c4::UniqueId& id) -> Failures {
    Failures f;
    c4::Comm* comm = nullptr;
    c4::Status st = c4::commInitRank(&comm, n, id, rank);
    if (!st.isOk()) return {"init: " + st.toString()};
    double us = -1;
    st = c4::groupSimulateEnd(&us);
    if (st.code() != Code::kInvalidUsage) f.push_back("simulate outside a group: " + st.toString());
    // Estimates grow with the size; the buffers are not touched.
    double prev = 0;
    for (size_t count : {size_t{256}, size_t{1} << 16, size_t{1} << 22}) {
      std::vector<float> in(count, 1.0f), out(count, -1.0f);
      (void)c4::groupStart();
      st = c4::allReduce(in.data(), out.data(), count, c4::DataType::kFloat32, c4::RedOp::kSum, comm);
      if (!st.isOk()) f.push_back("allreduce in a group: " + st.toString());
      st = c4::groupSimulateEnd(&us);
      if (!st.isOk() || !(us > prev))
        f.push_back("estimate for " + std::to_string(count) + ": " + st.toString() + " " + std::to_string(us) +
                    " us after " + std::to_string(prev));
      if (out.front() != -1.0f || out.back() != -1.0f) f.push_back("the simulated allreduce ran");
      prev = us;
    }
    // A group of two collectives and a send/recv pair estimates more than its AllReduce alone.
    std::vector<float> a(1 << 16, 1.0f), b(1 << 16, 0.0f);
    (void)c4::groupStart();
    (void)c4::allReduce(a.data(), b.data(), a.size(), c4::DataType::kFloat32, c4::RedOp::kSum, comm);
    (void)c4::groupSimulateEnd(&us);
    const double one = us;
    (void)c4::groupStart();
    (void)c4::allReduce(a.data(), b.data(), a.size(), c4::DataType::kFloat32, c4::RedOp::kSum, comm);
    (void)c4::broadcast(a.data(), b.data(), a.size(), c4::DataType::kFloat32, 0, comm);
    (void)c4::send(a.data(), a.size(), c4::DataType::kFloat32, 1 - rank, comm);
    (void)c4::recv(b.data(), b.size(), c4::DataType::kFloat32, 1 - rank, comm);
    st = c4::groupSimulateEnd(&us);
    if (!st.isOk() || !(us > one)) f.push_back("group of four: " + st.toString() + " " + std::to_string(us));
    // A rejected call makes the simulation fail like groupEnd would.
    (void)c4::groupStart();
    (void)c4::allReduce(nullptr, b.data(), b.size(), c4::DataType::kFloat32, c4::RedOp::kSum, comm);
    st = c4::groupSimulateEnd(&us);
    if (st.code() != Code::kInvalidArgument) f.push_back("group with a rejected call: " + st.toString());
    // Nothing was consumed: a real call matches on both ranks and is right.
    float x = static_cast<float>(rank + 1);
    st = c4::allReduce(&x, &x, 1, c4::DataType::kFloat32, c4::RedOp::kSum, comm);
    if (!st.isOk() || x != 3.0f) f.push_back("allreduce after simulations: " + st.toString());
    (void)c4::commDestroy(comm);
    return f;
  });
  EXPECT_TRUE(summarize(outs).empty()) << summarize(outs);
}

TEST(Lifecycle, InitAllAndGroupAcrossCommunicatorsOfOneThread) {
  const int n = 3;
  c4::Comm* comms[n];
  ASSERT_TRUE(c4::commInitAll(comms, n).isOk());
  std::vector<std::vector<int32_t>> bufs(n, std::vector<int32_t>(100000));
  for (int r = 0; r < n; ++r)
    for (size_t i = 0; i < bufs[r].size(); ++i) bufs[r][i] = static_cast<int32_t>(i % 100) * (r + 1);
  // One thread drives all ranks: only a group can complete this.
  ASSERT_TRUE(c4::groupStart().isOk());
  for (int r = 0; r < n; ++r)
    ASSERT_TRUE(
        c4::allReduce(bufs[r].data(), bufs[r].data(), bufs[r].size(), c4::DataType::kInt32, c4::RedOp::kSum, comms[r])
            .isOk());
  ASSERT_TRUE(c4::groupEnd().isOk());
  for (int r = 0; r < n; ++r)
    for (size_t i = 0; i < bufs[r].size(); i += 997) ASSERT_EQ(bufs[r][i], static_cast<int32_t>(i % 100) * 6);
  for (int r = 0; r < n; ++r) ASSERT_TRUE(c4::commDestroy(comms[r]).isOk());
}

TEST(Lifecycle, InitRankInsideAGroup) {
  c4::UniqueId id;
  ASSERT_TRUE(c4::getUniqueId(&id).isOk());
  c4::Comm* comms[2] = {nullptr, nullptr};
  ASSERT_TRUE(c4::groupStart().isOk());
  for (int r = 0; r < 2; ++r) ASSERT_TRUE(c4::commInitRank(&comms[r], 2, id, r).isOk());
  ASSERT_TRUE(c4::groupEnd().isOk());
  double a[3] = {1, 2, 3}, b[3] = {10, 20, 30};
  ASSERT_TRUE(c4::groupStart().isOk());
  ASSERT_TRUE(c4::allReduce(a, a, 3, c4::DataType::kFloat64, c4::RedOp::kMax, comms[0]).isOk());
  ASSERT_TRUE(c4::allReduce(b, b, 3, c4::DataType::kFloat64, c4::RedOp::kMax, comms[1]).isOk());
  ASSERT_TRUE(c4::groupEnd().isOk());
  EXPECT_EQ(a[2], 30);
  EXPECT_EQ(b[0], 10);
  for (auto* c : comms) ASSERT_TRUE(c4::commDestroy(c).isOk());
}

TEST(P2p, InPlaceRingExchangeAboveTheSingleCopyThreshold) {
  // Each rank sends its buffer to the next and receives into the same buffer from the previous
  // (nccl-tests' in-place sendrecv). A receive must never clobber data a peer still has to pull.
  for (size_t count : {size_t{1000}, size_t{70000}, size_t{1} << 20}) {
    auto outs = runForked(3, [count](int rank, int n, const c4::UniqueId& id) -> Failures {
      c4::Comm* comm = nullptr;
      c4::Status st = c4::commInitRank(&comm, n, id, rank);
      if (!st.isOk()) return {"init: " + st.toString()};
      std::vector<int32_t> buf(count);
      for (size_t i = 0; i < count; ++i) buf[i] = static_cast<int32_t>(i * 7 + static_cast<size_t>(rank) * 1000003);
      int prev = (rank + n - 1) % n;
      st = c4::groupStart();
      if (st.isOk()) st = c4::send(buf.data(), count, c4::DataType::kInt32, (rank + 1) % n, comm);
      if (st.isOk()) st = c4::recv(buf.data(), count, c4::DataType::kInt32, prev, comm);
      c4::Status end = c4::groupEnd();
      Failures f;
      if (!st.isOk() || !end.isOk()) f.push_back("exchange failed: " + st.toString() + " / " + end.toString());
      for (size_t i = 0; i < count && f.empty(); ++i)
        if (buf[i] != static_cast<int32_t>(i * 7 + static_cast<size_t>(prev) * 1000003))
          f.push_back("count " + std::to_string(count) + ": element " + std::to_string(i) + " wrong");
      (void)c4::commDestroy(comm);
      return f;
    });
    EXPECT_TRUE(summarize(outs).empty()) << summarize(outs);
  }
}

class AnySource : public ::testing::TestWithParam<const char*> {};

/// Value k of message `m` from rank `src` (so a receiver can tell who sent what, in which order).
int32_t anyValue(int src, int m, size_t k) { return src * 1000000 + m * 100000 + static_cast<int32_t>(k % 99991); }
constexpr size_t kSmall = 100, kLarge = 300000;  // elements of the small and the large messages

TEST_P(AnySource, ProbeAndReceiveFromWhoeverSendsFirst) {
  // Four ranks over shm or tcp. Ranks 0-2 each send rank 3 two messages of different sizes and
  // types (the second above the single-copy and tcp piece sizes); rank 3 learns each one's sender
  // and size by iprobe, then receives it with recv. Then two messages each, received by recvAny.
  // Every sender's messages arrive in its order, whole. (Over tcp rank 3 is the side that accepts
  // every connection: the senders open them as they send.)
  ScopedEnv timeout("C4_TIMEOUT", "30");
  ScopedEnv transport("C4_TRANSPORT", GetParam());
  auto outs = runForked(
      4,
      [](int rank, int n, const c4::UniqueId& id) -> Failures {
        c4::Comm* comm = nullptr;
        c4::Status st = c4::commInitRank(&comm, n, id, rank);
        if (!st.isOk()) return {"init: " + st.toString()};
        Failures f;
        auto fill = [](int src, int m, size_t count) {
          std::vector<int32_t> v(count);
          for (size_t k = 0; k < count; ++k) v[k] = anyValue(src, m, k);
          return v;
        };
        const int dst = n - 1;
        if (rank != dst) {
          std::vector<int32_t> a = fill(rank, 0, kSmall), b = fill(rank, 1, kLarge), c = fill(rank, 2, kSmall),
                               d = fill(rank, 3, kSmall);
          if (rank == 1) usleep(50000);  // not everyone at once
          st = c4::send(a.data(), a.size(), c4::DataType::kInt32, dst, comm);
          // The large one as float bits: the probe reports the sender's type.
          if (st.isOk()) st = c4::send(b.data(), b.size(), c4::DataType::kFloat32, dst, comm);
          if (st.isOk()) st = c4::send(c.data(), c.size(), c4::DataType::kInt32, dst, comm);
          if (st.isOk()) st = c4::send(d.data(), d.size(), c4::DataType::kInt32, dst, comm);
          if (!st.isOk()) f.push_back("send: " + st.toString());
        } else {
          std::vector<int> next(static_cast<size_t>(n), 0);  // next message expected per sender
          for (int i = 0; i < 2 * (n - 1) && f.empty(); ++i) {
            c4::ProbeResult pr;
            // A sender that already gave its first two is left for the recvAny phase: the probe
            // of any source goes round-robin, so it does not keep finding that one.
            int64_t t0 = monoMs();
            while ((st = c4::iprobe(c4::kAnySource, comm, &pr)).isOk() &&
                   (!pr.ready || next[static_cast<size_t>(pr.source)] >= 2) && monoMs() - t0 < 20000) {
            }
            if (!st.isOk() || !pr.ready || next[static_cast<size_t>(pr.source)] >= 2) {
              f.push_back("iprobe: " + st.toString() + (pr.ready ? "" : " (nothing in 20 s)"));
              break;
            }
            const int src = pr.source;
            const int m = next[static_cast<size_t>(src)]++;
            const size_t want = m == 0 ? kSmall : kLarge;
            const c4::DataType wantType = m == 0 ? c4::DataType::kInt32 : c4::DataType::kFloat32;
            if (src < 0 || src >= dst || pr.count != want || pr.dtype != wantType) {
              f.push_back("iprobe found source " + std::to_string(src) + ", count " + std::to_string(pr.count) +
                          ", type " + c4::dataTypeName(pr.dtype) + " for its message " + std::to_string(m));
              break;
            }
            // A second probe of that very sender finds the same message: probing consumes nothing.
            c4::ProbeResult again;
            st = c4::iprobe(src, comm, &again);
            if (!st.isOk() || !again.ready || again.count != pr.count)
              f.push_back("second iprobe of rank " + std::to_string(src) + ": " + st.toString());
            std::vector<int32_t> buf(pr.count, -1);
            st = c4::recv(buf.data(), pr.count, pr.dtype, src, comm);
            if (!st.isOk()) f.push_back("recv: " + st.toString());
            for (size_t k = 0; k < buf.size() && f.empty(); ++k)
              if (buf[k] != anyValue(src, m, k))
                f.push_back("message " + std::to_string(m) + " of rank " + std::to_string(src) + " wrong at " +
                            std::to_string(k));
          }
          for (int i = 0; i < 2 * (n - 1) && f.empty(); ++i) {
            std::vector<int32_t> buf(kSmall, -1);
            int src = -1;
            st = c4::recvAny(buf.data(), kSmall, c4::DataType::kInt32, &src, comm);
            if (!st.isOk() || src < 0 || src >= dst) {
              f.push_back("recvAny: " + st.toString() + " source " + std::to_string(src));
              break;
            }
            const int m = next[static_cast<size_t>(src)]++;
            for (size_t k = 0; k < kSmall && f.empty(); ++k)
              if (buf[k] != anyValue(src, m, k))
                f.push_back("recvAny: message " + std::to_string(m) + " of rank " + std::to_string(src) + " wrong at " +
                            std::to_string(k));
          }
          for (int r = 0; r < dst && f.empty(); ++r)
            if (next[static_cast<size_t>(r)] != 4) f.push_back("rank " + std::to_string(r) + ": not 4 messages");
          // Nothing is left: every peer's next message has been received.
          c4::ProbeResult none;
          st = c4::iprobe(c4::kAnySource, comm, &none);
          if (!st.isOk() || none.ready) f.push_back("a fifth message? " + st.toString());
        }
        // The communicator goes on as usual.
        std::vector<float> x(1 << 16, 1.0f);
        st = c4::allReduce(x.data(), x.data(), x.size(), c4::DataType::kFloat32, c4::RedOp::kSum, comm);
        if (!st.isOk() || x[12345] != static_cast<float>(n)) f.push_back("allreduce after: " + st.toString());
        (void)c4::commDestroy(comm);
        return f;
      },
      120);
  EXPECT_TRUE(summarize(outs).empty()) << summarize(outs);
}

TEST_P(AnySource, ACollectiveAheadIsNotTakenForASend) {
  // Rank 1 enters an AllReduce first: its first message to rank 0 belongs to that collective, and
  // probing must not report it as a send (receiving it would fail both ranks with a mismatch).
  ScopedEnv timeout("C4_TIMEOUT", "30");
  ScopedEnv transport("C4_TRANSPORT", GetParam());
  auto outs = runForked(
      2,
      [](int rank, int n, const c4::UniqueId& id) -> Failures {
        c4::Comm* comm = nullptr;
        c4::Status st = c4::commInitRank(&comm, n, id, rank);
        if (!st.isOk()) return {"init: " + st.toString()};
        Failures f;
        std::vector<float> x(1 << 20, 1.0f);  // above the one-shot size: messages
        if (rank == 0) {
          c4::ProbeResult pr;
          int64_t t0 = monoMs();
          while (monoMs() - t0 < 300 && (st = c4::iprobe(1, comm, &pr)).isOk() && !pr.ready) {
          }
          if (!st.isOk() || pr.ready) f.push_back("probe while rank 1 is in an allreduce: " + st.toString());
        }
        st = c4::allReduce(x.data(), x.data(), x.size(), c4::DataType::kFloat32, c4::RedOp::kSum, comm);
        if (!st.isOk() || x[777] != 2.0f) f.push_back("allreduce: " + st.toString());
        int32_t v = 7 + rank, got = 0;
        int src = -1;
        st = rank == 1 ? c4::send(&v, 1, c4::DataType::kInt32, 0, comm)
                       : c4::recvAny(&got, 1, c4::DataType::kInt32, &src, comm);
        if (!st.isOk() || (rank == 0 && (src != 1 || got != 8)))
          f.push_back("send/recvAny: " + st.toString() + " source " + std::to_string(src));
        // Rank 1's send completes once copied (eager): without this, rank 1 could leave (and
        // close its transport) before rank 0's any-source wait found the message, and a leaving
        // rank fails such a wait by design.
        st = c4::allReduce(x.data(), x.data(), 1, c4::DataType::kFloat32, c4::RedOp::kSum, comm);
        if (!st.isOk()) f.push_back("final allreduce: " + st.toString());
        (void)c4::commDestroy(comm);
        return f;
      },
      90);
  EXPECT_TRUE(summarize(outs).empty()) << summarize(outs);
}

TEST_P(AnySource, ADeadPeerFailsTheWaitNamingIt) {
  // Rank 2 exits; rank 1 stays alive and sends nothing. Rank 0's recvAny fails within seconds
  // (C4_TIMEOUT is 60) naming rank 2, not after the timeout and not by hanging.
  ScopedEnv timeout("C4_TIMEOUT", "60");
  ScopedEnv transport("C4_TRANSPORT", GetParam());
  int64_t t0 = monoMs();
  auto outs = runForked(
      3,
      [](int rank, int n, const c4::UniqueId& id) -> Failures {
        c4::Comm* comm = nullptr;
        c4::Status st = c4::commInitRank(&comm, n, id, rank);
        if (!st.isOk()) return {"init: " + st.toString()};
        if (rank == 2) _exit(0);
        if (rank == 1) {
          sleep(4);
          (void)c4::commAbort(comm);
          return {};
        }
        int32_t v = 0;
        int src = -1;
        int64_t s0 = monoMs();
        st = c4::recvAny(&v, 1, c4::DataType::kInt32, &src, comm);
        Failures f;
        if (st.isOk()) f.push_back("UNEXPECTED-OK from rank " + std::to_string(src));
        if (st.message().find("rank 2") == std::string::npos) f.push_back("does not name rank 2: " + st.toString());
        if (monoMs() - s0 > 3500) f.push_back("took " + std::to_string(monoMs() - s0) + " ms: " + st.toString());
        (void)c4::commAbort(comm);
        return f;
      },
      90);
  EXPECT_LT(monoMs() - t0, 30000);
  EXPECT_TRUE(summarize(outs).empty()) << summarize(outs);
}

INSTANTIATE_TEST_SUITE_P(P2p, AnySource, ::testing::ValuesIn(deathTransports()), transportName);

TEST(P2p, AnySourceBadInputAndTimeout) {
  ScopedEnv timeout("C4_TIMEOUT", "2");
  auto outs = runForked(
      2,
      [](int rank, int n, const c4::UniqueId& id) -> Failures {
        c4::Comm* comm = nullptr;
        c4::Status st = c4::commInitRank(&comm, n, id, rank);
        if (!st.isOk()) return {"init: " + st.toString()};
        Failures f;
        auto expect = [&f](const c4::Status& s, c4::Code want, const char* what) {
          if (s.code() != want) f.push_back(std::string(what) + " -> " + s.toString());
        };
        if (rank == 1) {
          sleep(5);  // alive, silent
          (void)c4::commDestroy(comm);
          return f;
        }
        int32_t v = 0;
        int src = -1;
        c4::ProbeResult pr;
        expect(c4::recvAny(&v, 1, c4::DataType::kInt32, nullptr, comm), Code::kInvalidArgument, "null source");
        expect(c4::recvAny(&v, 0, c4::DataType::kInt32, &src, comm), Code::kInvalidArgument, "0 elements");
        expect(c4::recvAny(nullptr, 1, c4::DataType::kInt32, &src, comm), Code::kInvalidArgument, "null buffer");
        expect(c4::recvAny(&v, 1, static_cast<c4::DataType>(99), &src, comm), Code::kInvalidArgument, "bad type");
        expect(c4::recvAny(&v, 1, c4::DataType::kInt32, &src, nullptr), Code::kInvalidArgument, "null comm");
        expect(c4::iprobe(0, comm, &pr), Code::kInvalidArgument, "probe of itself");
        expect(c4::iprobe(2, comm, &pr), Code::kInvalidArgument, "probe of rank 2 of 2");
        expect(c4::iprobe(-2, comm, &pr), Code::kInvalidArgument, "probe of rank -2");
        expect(c4::iprobe(1, comm, nullptr), Code::kInvalidArgument, "null result");
        expect(c4::probe(0, comm, &pr, 10), Code::kInvalidArgument, "blocking probe of itself");
        expect(c4::probe(1, nullptr, &pr, 10), Code::kInvalidArgument, "blocking probe, null comm");
        // A bounded probe of a silent peer comes back empty after its wait, without an error.
        int64_t p0 = monoMs();
        c4::Status ps = c4::probe(1, comm, &pr, 300);
        int64_t pt = monoMs() - p0;
        if (!ps.isOk() || pr.ready || pt < 290 || pt > 2000)
          f.push_back("bounded probe: " + ps.toString() + " after " + std::to_string(pt) + " ms");
        (void)c4::groupStart();
        expect(c4::recvAny(&v, 1, c4::DataType::kInt32, &src, comm), Code::kInvalidUsage, "in a group");
        (void)c4::groupEnd();
        // Nobody sends: the wait ends after C4_TIMEOUT (2 s) with a clear error.
        int64_t t0 = monoMs();
        c4::Status s = c4::recvAny(&v, 1, c4::DataType::kInt32, &src, comm);
        int64_t took = monoMs() - t0;
        if (s.isOk() || s.message().find("waiting on a send from any of the other") == std::string::npos)
          f.push_back("timeout: " + s.toString());
        if (took < 1900 || took > 4500) f.push_back("timeout took " + std::to_string(took) + " ms");
        (void)c4::commAbort(comm);
        return f;
      },
      60);
  EXPECT_TRUE(summarize(outs).empty()) << summarize(outs);
}

TEST(Lifecycle, ManyCommunicatorsConcurrently) {
  // Two independent communicators used at the same time by the same ranks (threads).
  auto outs = runThreads(2, [](int rank, int n, const c4::UniqueId& id) -> Failures {
    c4::Comm* a = nullptr;
    c4::Status st = c4::commInitRank(&a, n, id, rank);
    if (!st.isOk()) return {"init: " + st.toString()};
    c4::Comm* b = nullptr;
    st = c4::commSplit(a, 0, rank, &b);
    if (!st.isOk()) return {"split: " + st.toString()};
    Failures f;
    for (int it = 0; it < 50; ++it) {
      int64_t x = rank + it, y = 2 * rank;
      if (!c4::allReduce(&x, &x, 1, c4::DataType::kInt64, c4::RedOp::kSum, a).isOk() ||
          !c4::allReduce(&y, &y, 1, c4::DataType::kInt64, c4::RedOp::kSum, b).isOk() || x != 1 + 2 * it || y != 2)
        f.push_back("iteration " + std::to_string(it));
    }
    (void)c4::commDestroy(b);
    (void)c4::commDestroy(a);
    return f;
  });
  EXPECT_TRUE(summarize(outs).empty()) << summarize(outs);
}

}  // namespace
}  // namespace c4test

namespace c4test {
namespace {

/// Polls commGetAsyncError until it leaves kInProgress (at most 60 s).
c4::Status waitAsync(c4::Comm* comm) {
  const int64_t t0 = monoMs();
  for (;;) {
    c4::Status st = c4::commGetAsyncError(comm);
    if (st.code() != Code::kInProgress || monoMs() - t0 > 60000) return st;
    usleep(200);
  }
}

/// commInitRank with `cfg` (nonblocking: waited for here).
c4::Status initComm(const c4::Config& cfg, int rank, int n, const c4::UniqueId& id, c4::Comm** comm) {
  c4::Status st = c4::commInitRank(comm, n, id, rank, cfg);
  if (st.code() == Code::kInProgress) st = waitAsync(*comm);
  return st;
}

// Non-blocking communicators (Config::blocking = 0): init and every call queue their work and
// return kInProgress; commGetAsyncError says kInProgress until it is done. Collectives of every
// kind, a group of several, point-to-point and a receive from any source all arrive whole.
// commRegister / ncclCommRegister: a registered buffer works for collectives; bad input, a handle
// of another communicator and a second deregistration are refused; a handle never released is
// freed with its communicator (ASan would report the leak). Blocking and nonblocking (the call
// then runs on the progress thread's data path).
TEST(Api, RegisterAndDeregister) {
  for (int blocking : {1, 0}) {
    auto outs = runForked(2, [&](int rank, int n, const c4::UniqueId& id) -> Failures {
      Failures f;
      c4::Config cfg;
      cfg.blocking = blocking;
      c4::Comm* comm = nullptr;
      c4::Status st = initComm(cfg, rank, n, id, &comm);
      if (!st.isOk()) return {"init: " + st.toString()};
      auto expect = [&](const char* what, c4::Status got, Code want) {
        if (got.code() != want) f.push_back(std::string(what) + " -> " + got.toString());
      };
      std::vector<float> buf(100000, static_cast<float>(rank + 1));
      void* h = nullptr;
      expect("register", c4::commRegister(comm, buf.data(), buf.size() * sizeof(float), &h), Code::kSuccess);
      if (!h) return {"register gave a NULL handle"};
      st = c4::allReduce(buf.data(), buf.data(), buf.size(), c4::DataType::kFloat32, c4::RedOp::kSum, comm);
      if (st.code() == Code::kInProgress) st = waitAsync(comm);
      if (!st.isOk() || buf[0] != 3.0f || buf.back() != 3.0f)
        f.push_back("allreduce on registered memory: " + st.toString() + " " + std::to_string(buf[0]));
      void* h2 = nullptr;
      expect("register NULL buff", c4::commRegister(comm, nullptr, 16, &h2), Code::kInvalidArgument);
      expect("register NULL handle", c4::commRegister(comm, buf.data(), 16, nullptr), Code::kInvalidArgument);
      expect("register size 0", c4::commRegister(comm, buf.data(), 0, &h2), Code::kInvalidArgument);
      expect("deregister NULL", c4::commDeregister(comm, nullptr), Code::kInvalidArgument);
      // A handle of another communicator is refused and stays valid there.
      c4::Comm* sub = nullptr;
      st = c4::commSplit(comm, 0, rank, &sub, &cfg);
      if (st.code() == Code::kInProgress) st = waitAsync(sub);
      if (!st.isOk()) return {"split: " + st.toString()};
      void* hs = nullptr;
      expect("register on the split", c4::commRegister(sub, buf.data(), 4096, &hs), Code::kSuccess);
      expect("deregister the split's handle on the parent", c4::commDeregister(comm, hs), Code::kInvalidArgument);
      expect("deregister the parent's handle on the split", c4::commDeregister(sub, h), Code::kInvalidArgument);
      expect("deregister", c4::commDeregister(comm, h), Code::kSuccess);
      expect("deregister again", c4::commDeregister(comm, h), Code::kInvalidArgument);
      if (!strstr(c4::lastError(comm), "not a live registration"))
        f.push_back(std::string("last error '") + c4::lastError(comm) + "'");
      // Left registered: released by commDestroy.
      void* kept = nullptr;
      expect("register kept", c4::commRegister(comm, buf.data(), 64, &kept), Code::kSuccess);
      expect("destroy the split", c4::commDestroy(sub), Code::kSuccess);
      expect("destroy", c4::commDestroy(comm), Code::kSuccess);
      return f;
    });
    EXPECT_TRUE(summarize(outs).empty()) << "blocking=" << blocking << "\n" << summarize(outs);
  }
}

TEST(NonBlocking, InitCollectivesGroupsPointToPoint) {
  auto outs = runForked(3, [](int rank, int n, const c4::UniqueId& id) -> Failures {
    Failures f;
    c4::Config cfg;
    cfg.blocking = 0;
    c4::Comm* comm = nullptr;
    c4::Status st = c4::commInitRank(&comm, n, id, rank, cfg);
    if ((!st.isOk() && st.code() != Code::kInProgress) || !comm) return {"init: " + st.toString()};
    st = waitAsync(comm);
    if (!st.isOk()) return {"init completed with " + st.toString()};
    // A collective: kInProgress (or done already), then the data.
    std::vector<int32_t> in(100003, rank + 1), out(in.size(), -1);
    st = c4::allReduce(in.data(), out.data(), in.size(), c4::DataType::kInt32, c4::RedOp::kSum, comm);
    if (!st.isOk() && st.code() != Code::kInProgress) f.push_back("allReduce: " + st.toString());
    st = waitAsync(comm);
    if (!st.isOk() || out[0] != 6 || out.back() != 6) f.push_back("allReduce result " + std::to_string(out[0]));
    // Several calls queued back to back run in call order.
    std::vector<int32_t> g(3 * 7, -1), b(7, rank == 1 ? 42 : 0);
    int32_t mine[7];
    for (int i = 0; i < 7; ++i) mine[i] = rank * 10 + i;
    (void)c4::allGather(mine, g.data(), 7, c4::DataType::kInt32, comm);
    (void)c4::broadcast(b.data(), b.data(), 7, c4::DataType::kInt32, 1, comm);
    st = waitAsync(comm);
    if (!st.isOk()) f.push_back("queued calls: " + st.toString());
    for (int r = 0; r < 3; ++r)
      if (g[static_cast<size_t>(r * 7 + 3)] != r * 10 + 3) f.push_back("allGather block " + std::to_string(r));
    if (b[6] != 42) f.push_back("broadcast");
    // A group: one job on the progress thread.
    int32_t x = rank, y = rank;
    (void)c4::groupStart();
    (void)c4::allReduce(&x, &x, 1, c4::DataType::kInt32, c4::RedOp::kSum, comm);
    (void)c4::allReduce(&y, &y, 1, c4::DataType::kInt32, c4::RedOp::kMax, comm);
    st = c4::groupEnd();
    if (!st.isOk() && st.code() != Code::kInProgress) f.push_back("groupEnd: " + st.toString());
    st = waitAsync(comm);
    if (!st.isOk() || x != 3 || y != 2) f.push_back("group " + std::to_string(x) + " " + std::to_string(y));
    // Point to point around the ring, and a receive from any source (it waits for its sender).
    int32_t sendv = rank * 100, recvv = -1;
    (void)c4::groupStart();
    (void)c4::send(&sendv, 1, c4::DataType::kInt32, (rank + 1) % n, comm);
    (void)c4::recv(&recvv, 1, c4::DataType::kInt32, (rank + n - 1) % n, comm);
    (void)c4::groupEnd();
    st = waitAsync(comm);
    if (!st.isOk() || recvv != ((rank + n - 1) % n) * 100) f.push_back("ring exchange " + std::to_string(recvv));
    if (rank == 0) {
      int src = -1;
      int32_t v = -1;
      st = c4::recvAny(&v, 1, c4::DataType::kInt32, &src, comm);
      if (!st.isOk() || src != 2 || v != 77) f.push_back("recvAny: " + st.toString() + " from " + std::to_string(src));
    } else if (rank == 2) {
      int32_t v = 77;
      (void)c4::send(&v, 1, c4::DataType::kInt32, 0, comm);
      st = waitAsync(comm);
      if (!st.isOk()) f.push_back("send to 0: " + st.toString());
    }
    // Nobody leaves while rank 0 still receives from any source: a rank that goes fails that wait,
    // since it might have been the sender (docs/architecture.md).
    int32_t done = 1;
    (void)c4::allReduce(&done, &done, 1, c4::DataType::kInt32, c4::RedOp::kSum, comm);
    st = waitAsync(comm);
    if (!st.isOk() || done != 3) f.push_back("last allReduce: " + st.toString());
    st = c4::commDestroy(comm);
    if (!st.isOk()) f.push_back("destroy: " + st.toString());
    return f;
  });
  EXPECT_TRUE(summarize(outs).empty()) << summarize(outs);
}

// The progress thread with blocking calls (C4_PROGRESS_THREAD=1): the collective matrix.
TEST(NonBlocking, ProgressThreadRunsTheMatrix) {
  ScopedEnv pt("C4_PROGRESS_THREAD", "1");
  MatrixOptions opt;
  opt.counts = {0, 1, 1009, 70001};
  opt.bigBytes = 1u << 20;
  opt.allTypesForMovement = false;
  opt.trimmedIfQuick();
  for (int n : {2, 3}) {
    auto outs = runForked(n, [&](int r, int nr, const c4::UniqueId& id) -> Failures {
      c4::Comm* comm = nullptr;
      c4::Status st = c4::commInitRank(&comm, nr, id, r);
      if (!st.isOk()) return {"init: " + st.toString()};
      MatrixRunner runner(comm, r, nr);
      Failures f = runner.run(opt);
      st = c4::commDestroy(comm);
      if (!st.isOk()) f.push_back("destroy: " + st.toString());
      return f;
    });
    EXPECT_TRUE(summarize(outs).empty()) << n << " ranks:\n" << summarize(outs);
  }
}

// Revoke (ncclCommRevoke): an operation blocked on a peer that never joins, on another thread,
// fails; revoke returns once nothing runs; later calls, blocking or not, fail clearly and at once.
TEST(Revoke, StopsInFlightWorkThenRefusesCalls) {
  ScopedEnv timeout("C4_TIMEOUT", "60");
  // 7 floats: the one-shot path, which waits on shared memory alone and polls no transport;
  // 64 Ki floats: messages.
  for (size_t count : {size_t(7), size_t(1) << 16})
    for (int blocking : {1, 0}) {
      auto outs = runForked(2, [&](int rank, int n, const c4::UniqueId& id) -> Failures {
        Failures f;
        c4::Config cfg;
        cfg.blocking = blocking;
        c4::Comm* comm = nullptr;
        c4::Status st = initComm(cfg, rank, n, id, &comm);
        if (!st.isOk()) return {"init: " + st.toString()};
        if (rank == 1) {
          sleep(3);  // never joins the AllReduce; its peer's revoke must not wait for it
          (void)c4::commDestroy(comm);
          return f;
        }
        std::vector<float> b(count, 1.f);
        std::atomic<int> done{0};
        c4::Status inflight;
        const int64_t t0 = monoMs();
        std::thread t([&] {
          inflight = c4::allReduce(b.data(), b.data(), b.size(), c4::DataType::kFloat32, c4::RedOp::kSum, comm);
          if (inflight.code() == Code::kInProgress) inflight = waitAsync(comm);
          done = 1;
        });
        usleep(300000);
        st = c4::commRevoke(comm);
        if (!blocking && st.code() == Code::kInProgress) st = waitAsync(comm);
        if (!st.isOk()) f.push_back("revoke: " + st.toString());
        t.join();
        // Well before rank 1 ends (3 s), which would fail the call anyway.
        if (monoMs() - t0 > 2000) f.push_back("revoke took " + std::to_string(monoMs() - t0) + " ms");
        if (blocking && inflight.isOk()) f.push_back("the in-flight allreduce succeeded");
        c4::Status later = c4::allReduce(b.data(), b.data(), 1, c4::DataType::kFloat32, c4::RedOp::kSum, comm);
        if (later.code() != Code::kInvalidUsage || later.message().find("revoked") == std::string::npos)
          f.push_back("call after revoke: " + later.toString());
        int src = -1;
        later = c4::recvAny(b.data(), 1, c4::DataType::kFloat32, &src, comm);
        if (later.code() != Code::kInvalidUsage) f.push_back("recvAny after revoke: " + later.toString());
        if (!c4::commGetAsyncError(comm).isOk()) f.push_back("async error after revoke");
        st = c4::commDestroy(comm);
        if (!st.isOk()) f.push_back("destroy: " + st.toString());
        return f;
      });
      EXPECT_TRUE(summarize(outs).empty()) << "count " << count << ", blocking " << blocking << ":\n"
                                           << summarize(outs);
    }
}

// Bad use of non-blocking communicators: calls on a failed one return its error at once, never
// hang; destroying one with work queued completes that work first.
TEST(NonBlocking, FailedCommunicatorAndDestroyWithQueuedWork) {
  auto outs = runForked(2, [](int rank, int n, const c4::UniqueId& id) -> Failures {
    Failures f;
    c4::Config cfg;
    cfg.blocking = 0;
    c4::Comm* comm = nullptr;
    c4::Status st = initComm(cfg, rank, n, id, &comm);
    if (!st.isOk()) return {"init: " + st.toString()};
    // Queue work and destroy right away: the queue runs first, the data arrives.
    std::vector<int32_t> v(50000, rank + 1);
    for (int i = 0; i < 4; ++i)
      (void)c4::allReduce(v.data(), v.data(), v.size(), c4::DataType::kInt32, c4::RedOp::kSum, comm);
    // Before destroy finishes, 1+2 = 3 is doubled three times: 24 (the calls ran in order).
    c4::Comm* sub = nullptr;
    st = c4::commSplit(comm, 0, rank, &sub, &cfg);
    if (st.code() == Code::kInProgress) st = waitAsync(sub);
    if (!st.isOk()) f.push_back("split: " + st.toString());
    st = c4::commDestroy(comm);
    if (!st.isOk()) f.push_back("destroy: " + st.toString());
    if (v[0] != 24 || v.back() != 24) f.push_back("after destroy: " + std::to_string(v[0]));
    if (!sub) return f;
    // A peer that aborts: the other's queued call fails naming it, later calls fail at once.
    if (rank == 1) {
      usleep(200000);
      (void)c4::commAbort(sub);
      usleep(500000);
      return f;
    }
    const int64_t t0 = monoMs();
    (void)c4::allReduce(v.data(), v.data(), v.size(), c4::DataType::kInt32, c4::RedOp::kSum, sub);
    st = waitAsync(sub);
    if (st.isOk() || st.message().find("rank 1") == std::string::npos)
      f.push_back("after the peer aborted: " + st.toString());
    c4::Status later = c4::allReduce(v.data(), v.data(), 1, c4::DataType::kInt32, c4::RedOp::kSum, sub);
    if (later.isOk() || later.code() == Code::kInProgress)
      f.push_back("call on a failed communicator: " + later.toString());
    if (monoMs() - t0 > 10000) f.push_back("took " + std::to_string(monoMs() - t0) + " ms");
    (void)c4::commDestroy(sub);
    return f;
  });
  EXPECT_TRUE(summarize(outs).empty()) << summarize(outs);
}

// Destroying or aborting a communicator inside an open group used to leave the
// group's queued work pointing at freed memory (a crash in groupEnd). Now that work is dropped and
// groupEnd fails with an error that says why; nothing runs, so no peer waits for it.
TEST(Hardening, DestroyOrAbortInsideAnOpenGroupIsAnErrorNotACrash) {
  for (int variant = 0; variant < 3; ++variant) {
    auto outs = runForked(
        2,
        [&](int rank, int n, const c4::UniqueId& id) -> Failures {
          c4::Comm* comm = nullptr;
          c4::Status st = c4::commInitRank(&comm, n, id, rank);
          if (!st.isOk()) return {"init: " + st.toString()};
          std::vector<float> b(1024, 1.0f);
          if (!c4::groupStart().isOk()) return {"groupStart"};
          st = c4::allReduce(b.data(), b.data(), b.size(), c4::DataType::kFloat32, c4::RedOp::kSum, comm);
          if (st.isOk()) st = c4::send(b.data(), 16, c4::DataType::kFloat32, 1 - rank, comm);
          if (st.isOk()) st = c4::recv(b.data() + 16, 16, c4::DataType::kFloat32, 1 - rank, comm);
          if (!st.isOk()) return {"queueing: " + st.toString()};
          if (variant == 2) {
            // Destroyed by another thread (commAbort may be called from any thread).
            std::thread t([comm] { (void)c4::commAbort(comm); });
            t.join();
          } else {
            st = variant == 0 ? c4::commDestroy(comm) : c4::commAbort(comm);
            if (!st.isOk()) return {"destroy/abort: " + st.toString()};
          }
          st = c4::groupEnd();
          Failures f;
          if (st.code() != c4::Code::kInvalidUsage) f.push_back("groupEnd: " + st.toString());
          const char* want = variant == 2 ? "was destroyed or aborted before the group ended" : "inside an open group";
          if (st.message().find(want) == std::string::npos) f.push_back("groupEnd does not say why: " + st.message());
          return f;
        },
        60);
    EXPECT_EQ(summarize(outs), "") << "variant " << variant;
  }
}

// A huge nranks used to abort the process (std::bad_alloc through the API).
TEST(Hardening, HugeNranksIsAnErrorNotAnAbort) {
  auto outs = runForked(
      1,
      [&](int, int, const c4::UniqueId& id) -> Failures {
        c4::Comm* comm = nullptr;
        c4::Status st = c4::commInitRank(&comm, 1 << 30, id, 0);
        if (st.code() != c4::Code::kInvalidArgument || st.message().find("exceeds") == std::string::npos)
          return {"nranks 2^30: " + st.toString()};
        c4::Comm* comms[2];
        st = c4::commInitAll(comms, 1 << 20);
        if (st.code() != c4::Code::kInvalidArgument) return {"commInitAll of 2^20: " + st.toString()};
        return {};
      },
      60);
  EXPECT_EQ(summarize(outs), "");
}

// Ranks launched with different C4_ALGO (or another setting that shapes the
// schedules or the wire) used to return wrong results (2 ranks) or hang (4 ranks). Now init fails
// on every rank naming the setting, two ranks and their values.
TEST(Hardening, RanksThatDisagreeOnASettingFailInitNamingIt) {
  struct Case {
    const char* env;
    const char* a;
    const char* b;
    int n;
  };
  for (const Case& c : {Case{"C4_ALGO", "ring", "tree", 2}, Case{"C4_ALGO", "allreduce:tree", "", 4},
                        Case{"NCCL_ALGO", "Ring", "Tree", 2}, Case{"C4_CHUNK_SIZE", "131072", "262144", 3}}) {
    auto outs = runForked(
        c.n,
        [&](int rank, int n, const c4::UniqueId& id) -> Failures {
          // The last rank differs.
          const char* v = rank == n - 1 ? c.b : c.a;
          if (*v) setenv(c.env, v, 1);
          c4::Comm* comm = nullptr;
          c4::Status st = c4::commInitRank(&comm, n, id, rank);
          if (st.isOk()) {
            (void)c4::commDestroy(comm);
            return {"init succeeded with " + std::string(c.env) + " different on rank " + std::to_string(n - 1)};
          }
          const std::string name = std::string(c.env) == "NCCL_ALGO" ? "C4_ALGO" : c.env;
          if (st.code() != c4::Code::kInvalidUsage ||
              st.message().find(name + " differs between ranks") == std::string::npos)
            return {"unclear error: " + st.toString()};
          if (st.message().find("rank " + std::to_string(n - 1)) == std::string::npos)
            return {"does not name the rank: " + st.message()};
          return {};
        },
        60);
    EXPECT_EQ(summarize(outs), "") << c.env << " " << c.a << " vs " << c.b;
  }
}

// A schedule file (C4_SCHEDULE_FILE) that fails the loader's checks fails init on every rank, with
// the file, rank and step in the error; a missing file names the file.
TEST(ScheduleFiles, BadFileFailsInitOnEveryRankNamingTheStep) {
  namespace gen = c4::sched::test;
  std::string text = gen::ringFile("allgather", 3, 1, "bad-ag");
  // Rank 1's third step forwards block 2 before it has it.
  const std::string from = "{\"op\": \"send\", \"peer\": 2, \"chunk\": 0}";
  const size_t at = text.find(from, text.find("{\"steps\"", text.find("{\"steps\"") + 1));
  ASSERT_NE(at, std::string::npos);
  text.replace(at, from.size(), "{\"op\": \"send\", \"peer\": 2, \"chunk\": 2}");
  const std::string bad = gen::writeTemp(text, "c4-api-badsched");
  const std::string missing = bad + ".missing";
  const struct {
    std::string path, want;
  } cases[] = {{bad, "C4_SCHEDULE_FILE: schedule file " + bad +
                         ": rank 1 step 2 (send chunk 2 (block 2 part 0), peer 2): sends data the rank does not have"},
               {missing, "C4_SCHEDULE_FILE: schedule file " + missing + ": cannot open it"}};
  for (const auto& c : cases) {
    auto outs = runForked(
        3,
        [&](int rank, int n, const c4::UniqueId& id) -> Failures {
          setenv("C4_SCHEDULE_FILE", c.path.c_str(), 1);
          c4::Comm* comm = nullptr;
          c4::Status st = c4::commInitRank(&comm, n, id, rank);
          if (st.isOk()) {
            (void)c4::commDestroy(comm);
            return {"init succeeded with C4_SCHEDULE_FILE=" + c.path};
          }
          if (st.message().find(c.want) == std::string::npos)
            return {"unclear error: " + st.toString() + " (expected '" + c.want + "')"};
          return {};
        },
        60);
    EXPECT_EQ(summarize(outs), "") << c.path;
  }
  unlink(bad.c_str());
}

// A value a setting does not accept used to be ignored or clamped
// in silence (C4_TIMEOUT=0, C4_CHUNK_SIZE=1, C4_TCP_PIECE_BYTES=0, C4_ALGO=bogus, C4_LANES=abc) or
// printed as a huge number (C4_SHM_SLOTS=-1). Set on one rank, it now fails init on every rank, naming
// that rank, the variable and what it accepts; through an NCCL alias it is a warning and init goes on.
TEST(Hardening, RefusedSettingFailsInitOnEveryRankNamingIt) {
  struct Case {
    const char* env;
    const char* value;
    const char* why;
  };
  const Case cases[] = {{"C4_TIMEOUT", "0", "out of range 1..31536000"},
                        {"C4_CHUNK_SIZE", "1", "out of range 0 or 4096..1073741824"},
                        {"C4_TCP_PIECE_BYTES", "0", "out of range 4096..67108864"},
                        {"C4_ALGO", "bogus", "unknown algorithm 'bogus'"},
                        {"C4_LANES", "abc", "not an integer"},
                        {"C4_SHM_SLOTS", "-1", "out of range 2..4096"},
                        {"C4_TRANSPORT", "ib", "no transport 'ib'"},
                        {"C4_TRACE", "all", "expected one of 0|off|none|op|1|step|2"},
                        {"C4_DEBUG_SUBSYS", "INIT,GRAPH", "unknown subsystem 'GRAPH'"}};
  for (const Case& c : cases) {
    auto outs = runForked(
        3,
        [&](int rank, int n, const c4::UniqueId& id) -> Failures {
          if (rank == 1) setenv(c.env, c.value, 1);
          c4::Comm* comm = nullptr;
          c4::Status st = c4::commInitRank(&comm, n, id, rank);
          if (st.isOk()) {
            (void)c4::commDestroy(comm);
            return {"init succeeded with " + std::string(c.env) + "=" + c.value + " on rank 1"};
          }
          const std::string want =
              "a setting of rank 1 is not accepted: " + std::string(c.env) + "=" + c.value + ": " + c.why;
          if (st.code() != c4::Code::kInvalidArgument || st.message().find(want) == std::string::npos)
            return {"unclear error: " + st.toString() + " (expected '" + want + "')"};
          return {};
        },
        60);
    EXPECT_EQ(summarize(outs), "") << c.env << "=" << c.value;
  }
  // An NCCL alias may carry a value only NVIDIA's library knows: a warning, and the default.
  auto outs = runForked(
      2,
      [&](int rank, int n, const c4::UniqueId& id) -> Failures {
        setenv("NCCL_ALGO", "NVLS", 1);
        c4::Comm* comm = nullptr;
        c4::Status st = c4::commInitRank(&comm, n, id, rank);
        if (!st.isOk()) return {"init with NCCL_ALGO=NVLS: " + st.toString()};
        std::vector<float> v(1000, 1.0f);
        st = c4::allReduce(v.data(), v.data(), v.size(), c4::DataType::kFloat32, c4::RedOp::kSum, comm);
        (void)c4::commDestroy(comm);
        if (!st.isOk() || v[999] != 2.0f) return {"allReduce: " + st.toString()};
        return {};
      },
      60);
  EXPECT_EQ(summarize(outs), "");
}

// A send to itself outside a group (it has no receive to pair with) used to fail the whole
// communicator, so every later call failed too. Such mistakes are now found before anything starts
// and fail only the call; the communicator goes on (blocking, and with a progress thread).
TEST(Hardening, SendToSelfWithoutItsReceiveFailsTheCallNotTheCommunicator) {
  for (int progressThread : {0, 1}) {
    auto outs = runForked(
        2,
        [&](int rank, int n, const c4::UniqueId& id) -> Failures {
          if (progressThread) setenv("C4_PROGRESS_THREAD", "1", 1);
          c4::Comm* comm = nullptr;
          c4::Status st = c4::commInitRank(&comm, n, id, rank);
          if (!st.isOk()) return {"init: " + st.toString()};
          Failures f;
          std::vector<int32_t> a(64, rank + 1), b(64, 0);
          const auto I = c4::DataType::kInt32;
          st = c4::send(a.data(), 64, I, rank, comm);
          if (st.code() != c4::Code::kInvalidUsage || st.message().find("send(s) to itself") == std::string::npos)
            f.push_back("send to self outside a group: " + st.toString());
          (void)c4::groupStart();
          (void)c4::send(a.data(), 64, I, rank, comm);
          (void)c4::recv(b.data(), 32, I, rank, comm);
          st = c4::groupEnd();
          if (st.code() != c4::Code::kInvalidUsage || st.message().find("does not match") == std::string::npos)
            f.push_back("mismatched self send/recv: " + st.toString());
          // The communicator still works: a collective and a matched self send/receive.
          st = c4::allReduce(a.data(), b.data(), 64, I, c4::RedOp::kSum, comm);
          if (!st.isOk() || b[63] != 3) f.push_back("allReduce afterwards: " + st.toString());
          std::fill(b.begin(), b.end(), 0);
          (void)c4::groupStart();
          (void)c4::send(a.data(), 64, I, rank, comm);
          (void)c4::recv(b.data(), 64, I, rank, comm);
          st = c4::groupEnd();
          if (!st.isOk() || b[0] != rank + 1) f.push_back("matched self send/recv afterwards: " + st.toString());
          (void)c4::commDestroy(comm);
          return f;
        },
        60);
    EXPECT_EQ(summarize(outs), "") << "C4_PROGRESS_THREAD=" << progressThread;
  }
}

// Send and receive buffers that overlap without being the in-place layout used
// to run and return wrong elements. Now they are rejected before anything runs; the in-place
// layouts still run and give the right result.
TEST(Hardening, PartlyOverlappingBuffersAreRejected) {
  auto outs = runForked(
      2,
      [&](int rank, int n, const c4::UniqueId& id) -> Failures {
        c4::Comm* comm = nullptr;
        c4::Status st = c4::commInitRank(&comm, n, id, rank);
        if (!st.isOk()) return {"init: " + st.toString()};
        Failures f;
        std::vector<float> b(4096, 1.0f);
        float* p = b.data();
        auto rejected = [&](const char* what, c4::Status s) {
          if (s.code() != c4::Code::kInvalidArgument || s.message().find("overlap") == std::string::npos)
            f.push_back(std::string(what) + ": " + s.toString());
        };
        const auto F = c4::DataType::kFloat32;
        const auto S = c4::RedOp::kSum;
        rejected("allReduce shifted by one", c4::allReduce(p, p + 1, 512, F, S, comm));
        rejected("allGather not at the rank's block", c4::allGather(p + 1, p, 256, F, comm));
        rejected("reduceScatter not at the rank's block", c4::reduceScatter(p, p + 10, 256, F, S, comm));
        rejected("alltoAll shifted", c4::alltoAll(p, p + 64, 128, F, comm));
        if (rank == 0) rejected("broadcast at the root", c4::broadcast(p, p + 3, 100, F, 0, comm));
        if (rank == 1) rejected("reduce at the root", c4::reduce(p + 3, p, 100, F, S, 1, comm));
        if (rank == 0) rejected("gather at the root", c4::gather(p + 7, p, 100, F, 0, comm));
        if (rank == 1) rejected("scatter at the root", c4::scatter(p, p + 5, 100, F, 1, comm));
        // The in-place layouts run (every rank calls them) and give the right sums.
        std::fill(b.begin(), b.end(), 1.0f);
        st = c4::allReduce(p, p, 512, F, S, comm);
        if (!st.isOk() || p[0] != 2.0f) f.push_back("in-place allReduce: " + st.toString());
        std::fill(b.begin(), b.end(), static_cast<float>(rank));
        st = c4::allGather(p + 256 * rank, p, 256, F, comm);
        if (!st.isOk() || p[0] != 0.0f || p[256] != 1.0f) f.push_back("in-place allGather: " + st.toString());
        std::fill(b.begin(), b.end(), 1.0f);
        st = c4::reduceScatter(p, p + 256 * rank, 256, F, S, comm);
        if (!st.isOk() || p[256 * rank] != 2.0f) f.push_back("in-place reduceScatter: " + st.toString());
        std::fill(b.begin(), b.end(), static_cast<float>(rank));
        st = c4::gather(rank == 1 ? p + 100 : p, p, 100, F, 1, comm);
        if (!st.isOk() || (rank == 1 && (p[99] != 0.0f || p[100] != 1.0f)))
          f.push_back("in-place gather: " + st.toString());
        for (int i = 0; i < 200; ++i) p[i] = static_cast<float>(10 + i / 100);
        st = c4::scatter(p, p + 100 * rank, 100, F, 0, comm);
        if (!st.isOk() || p[100 * rank] != static_cast<float>(10 + rank))
          f.push_back("in-place scatter: " + st.toString());
        (void)c4::commDestroy(comm);
        return f;
      },
      60);
  EXPECT_EQ(summarize(outs), "");
}

}  // namespace
}  // namespace c4test
