// The ucx transport's choice under C4_TRANSPORT=auto (issue 18: "selected by capability"): a
// candidate between hosts only where UCX reaches an RDMA device, which this machine lacks; the
// conformance suite and the collective matrix test the transport itself. And its setup: a rank whose
// UCX cannot start fails every rank at once.
#include <gtest/gtest.h>
#include <stdlib.h>
#include <sys/wait.h>

#include <chrono>
#include <cstdio>
#include <memory>
#include <string>
#include <utility>
#include <vector>

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

}  // namespace
}  // namespace c4::transport
