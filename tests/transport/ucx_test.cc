// The ucx transport's choice under C4_TRANSPORT=auto ("selected by capability"): a
// candidate between hosts only where UCX reaches an RDMA device, which this machine lacks; the
// conformance suite and the collective matrix test the transport itself. Its setup: a rank whose
// UCX cannot start fails every rank at once. And how it finds a dead peer (C4_UCX_PEER_FAILURE),
// per peer: which UCX transports the endpoint gets, and that a killed peer fails the survivor fast.
#include <gtest/gtest.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <ucs/debug/log_def.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "common/logging.hpp"
#include "tests/shm/shm_test_util.hpp"
#include "transports/registry.hpp"
#include "transports/ucx/ucx_transport.hpp"

namespace c4::transport {
namespace {

TEST(UcxAuto, RdmaMeansAnIbComponentWithADevice) {
  using C = std::vector<std::pair<std::string, unsigned>>;
  EXPECT_TRUE(ucxComponentsReachRdma(C{{"self", 1}, {"tcp", 1}, {"ib", 2}}));
  EXPECT_FALSE(ucxComponentsReachRdma(C{{"self", 1}, {"tcp", 1}, {"ib", 0}, {"rdmacm", 0}}));  // this machine
  EXPECT_FALSE(ucxComponentsReachRdma(C{{"tcp", 1}, {"cma", 1}}));  // UCX built without verbs
  EXPECT_FALSE(ucxComponentsReachRdma(C{}));
}

TEST(UcxAuto, RegisteredAfterIbverbsAndOnlyWhereUcxReachesRdma) {
  const std::vector<TransportEntry>& all = transportRegistry();
  int ucx = -1, ib = -1, tcp = -1;
  for (size_t i = 0; i < all.size(); ++i) {
    const std::string name = all[i].name;
    if (name == "ucx") ucx = static_cast<int>(i);
    if (name == "ibverbs") ib = static_cast<int>(i);
    if (name == "tcp") tcp = static_cast<int>(i);
  }
  ASSERT_GE(ucx, 0);
  ASSERT_GE(tcp, 0);
  const TransportEntry& e = all[static_cast<size_t>(ucx)];
  EXPECT_TRUE(e.autoFirst);
  ASSERT_NE(e.autoEnabled, nullptr);
  if (ib >= 0) {
    EXPECT_LT(ib, ucx) << "ibverbs is tried before ucx under auto";
  }
  EXPECT_FALSE(all[static_cast<size_t>(tcp)].autoFirst);
  // Here UCX finds no verbs device (the kernel has no RDMA): auto leaves ucx out.
  const bool devices = system("test -n \"$(ls -A /sys/class/infiniband 2>/dev/null)\"") == 0;
  if (!devices) {
    EXPECT_FALSE(e.autoEnabled());
  }
}

// After a ucx peer died, UCX's own messages (a flush that timed out, "shmat failed", "mm ep
// failed to connect", requests not returned to a memory pool) came out raw as UCX ERRORs. Now they
// are reworded into c4comm's log saying what they mean; other UCX messages pass through unchanged.
TEST(UcxLog, MessagesAboutADeadPeerSayWhatTheyMean) {
  installUcxLogHandler();
  setenv("C4_DEBUG", "WARN", 1);  // c4comm's default prints no warnings: UCX's then go unsaid
  logReload();
  char path[] = "/tmp/c4-ucxlog-XXXXXX";
  const int fd = mkstemp(path);
  ASSERT_GE(fd, 0);
  fflush(stdout);
  fflush(stderr);
  const int saved = dup(2), savedOut = dup(1);
  dup2(fd, 2);
  dup2(fd, 1);  // UCX prints to standard output
  ucs_log_dispatch("src/uct/sm/mm/sysv/mm_sysv.c", 57, "uct_sysv_mem_attach", UCS_LOG_LEVEL_ERROR,
                   &ucs_global_opts.log_component, "shmat(shmid=%d) failed: Invalid argument", 458812);
  ucs_log_dispatch("src/ucs/datastruct/mpool.c", 90, "ucs_mpool_cleanup", UCS_LOG_LEVEL_WARN,
                   &ucs_global_opts.log_component, "object %p was not returned to mpool ucp_requests",
                   static_cast<void*>(path));
  ucs_log_dispatch("src/ucp/core/ucp_context.c", 1014, "f", UCS_LOG_LEVEL_WARN, &ucs_global_opts.log_component,
                   "an unrelated warning %d", 7);
  fflush(stdout);
  fflush(stderr);
  dup2(saved, 2);
  dup2(savedOut, 1);
  close(saved);
  close(savedOut);
  unsetenv("C4_DEBUG");
  logReload();
  std::string text(8192, '\0');
  text.resize(static_cast<size_t>(std::max<ssize_t>(0, pread(fd, &text[0], text.size(), 0))));
  close(fd);
  unlink(path);
  EXPECT_NE(text.find("ucx: a same-host peer's shared memory is gone (that peer exited) [UCX mm_sysv.c:57: shmat"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("ucx: requests UCX still held when it was torn down"), std::string::npos) << text;
  EXPECT_EQ(text.find("UCX  ERROR"), std::string::npos) << text;
  EXPECT_NE(text.find("an unrelated warning 7"), std::string::npos) << "other messages pass through: " << text;
}

// A rank whose UCX cannot start (here: UCX_TLS names no transport) fails its creation, and the
// others fail with it naming that rank instead of waiting for it in the address exchange (under
// auto they then fall back together).
TEST(UcxSetup, OneRankWithoutUcxFailsEveryRankAtOnce) {
  const std::string tag = testing::freshTag();
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<int> st = testing::runForked(
      2,
      [&](int r, Oob& oob) -> int {
        if (r == 1) setenv("UCX_TLS", "c4-no-such-transport", 1);
        Context c = testing::makeContext(r, 2, tag, &oob, 20000);
        std::unique_ptr<Transport> t;
        Status s = findTransport("ucx")->create(c, &t);
        if (s.isOk()) return 10;
        const std::string want = r == 1 ? "UCX could not be initialized" : "rank 1 could not start UCX";
        if (s.message().find(want) == std::string::npos) {
          fprintf(stderr, "rank %d: %s\n", r, s.message().c_str());
          return 11;
        }
        return 0;
      },
      60);
  for (int r = 0; r < 2; ++r)
    EXPECT_TRUE(WIFEXITED(st[static_cast<size_t>(r)]) && WEXITSTATUS(st[static_cast<size_t>(r)]) == 0)
        << "rank " << r << " wait status " << st[static_cast<size_t>(r)];
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(15));
}

// C4_UCX_PEER_FAILURE and where the peer is: 1 (default) on one host gives an endpoint on UCX's
// shared memory and a watched process; 1 between hosts (emulated with host ids) and 2 anywhere give
// UCX's peer-failure handling (tcp here). Each way, a peer killed while the survivor waits for its
// message fails the survivor's receive within seconds, naming the rank.
struct PeerFailureCase {
  const char* mode;
  bool sameHost;
  bool sharedMemory;  // the endpoint's UCX transports: shared memory only, or tcp
  const char* says;   // in the survivor's error
};

class UcxPeerFailure : public ::testing::TestWithParam<PeerFailureCase> {};

TEST_P(UcxPeerFailure, TransportsAndAKilledPeer) {
  const PeerFailureCase pc = GetParam();
  const std::string tag = testing::freshTag();
  std::vector<int> st = testing::runForked(
      2,
      [&](int r, Oob& oob) -> int {
        setenv("C4_UCX_PEER_FAILURE", pc.mode, 1);
        unsetenv("UCX_TLS");
        Context c = testing::makeContext(r, 2, tag, &oob, 60000);
        if (!pc.sameHost) c.hostIds = {1, 2};
        std::unique_ptr<Transport> t;
        Status s = findTransport("ucx")->create(c, &t);
        Connection* conn = nullptr;
        if (s.isOk()) s = t->connect(1 - r, &conn);
        if (!s.isOk()) {
          fprintf(stderr, "rank %d: %s\n", r, s.toString().c_str());
          return 10;
        }
        // A payload each way (rendezvous: the endpoint is wired up whole afterwards).
        const size_t bytes = 1 << 20;
        std::vector<char> out(bytes), in(bytes);
        testing::fillPattern(out.data(), bytes, static_cast<uint32_t>(r + 1));
        Request a, b;
        s = conn->isend(out.data(), bytes, testing::testSig(0, bytes), &a);
        if (s.isOk()) s = conn->irecv(in.data(), bytes, testing::testSig(0, bytes), nullptr, &b);
        if (s.isOk()) s = testing::waitAll(t.get(), {&a, &b}, 20000);
        if (!s.isOk() || !testing::checkPattern(in.data(), bytes, static_cast<uint32_t>(2 - r))) {
          fprintf(stderr, "rank %d: exchange: %s\n", r, s.toString().c_str());
          return 11;
        }
        const std::string state = conn->describeState();
        const bool tcp = state.find("tcp/") != std::string::npos;
        const bool shm = state.find("sysv/") != std::string::npos || state.find("posix/") != std::string::npos;
        if (pc.sharedMemory ? (tcp || !shm) : !tcp) {
          fprintf(stderr, "rank %d: mode %s, %s host: %s\n", r, pc.mode, pc.sameHost ? "same" : "other", state.c_str());
          return 12;
        }
        if (!oob.barrier().isOk()) return 13;
        if (r == 1) raise(SIGKILL);
        Request q;
        s = conn->irecv(in.data(), bytes, testing::testSig(1, bytes), nullptr, &q);
        const auto t0 = std::chrono::steady_clock::now();
        if (s.isOk()) s = testing::waitAll(t.get(), {&q}, 30000);
        const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        if (s.isOk() || q.state != Request::kFailed || s.message().find("rank 1") == std::string::npos ||
            s.message().find(pc.says) == std::string::npos || secs > 10) {
          fprintf(stderr, "rank 0: after %.1f s: %s\n", secs, s.toString().c_str());
          return 14;
        }
        return 0;
      },
      90);
  EXPECT_TRUE(WIFEXITED(st[0]) && WEXITSTATUS(st[0]) == 0) << "rank 0 wait status " << st[0];
  EXPECT_TRUE(WIFSIGNALED(st[1]) && WTERMSIG(st[1]) == SIGKILL) << "rank 1 wait status " << st[1];
}

INSTANTIATE_TEST_SUITE_P(Modes, UcxPeerFailure,
                         ::testing::Values(PeerFailureCase{"1", true, true, "exited"},
                                           PeerFailureCase{"1", false, false, "failed"},
                                           PeerFailureCase{"2", true, false, "failed"}),
                         [](const ::testing::TestParamInfo<PeerFailureCase>& i) {
                           return std::string("mode") + i.param.mode + (i.param.sameHost ? "_sameHost" : "_otherHost");
                         });

}  // namespace
}  // namespace c4::transport
