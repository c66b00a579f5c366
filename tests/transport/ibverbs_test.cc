// The ibverbs transport's setup where it can be checked without RDMA hardware: NCCL's
// C4_IB_HCA syntax, the RoCE GID choice (on a made-up sysfs tree), libibverbs missing, and a rank
// without a usable device failing every rank at once, naming it. The data path runs over real verbs
// in the Soft-RoCE VM (tests/rdma-vm), where these tests run again with devices present.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

#include "tests/shm/shm_test_util.hpp"
#include "transports/ibverbs/ib_verbs.hpp"
#include "transports/ibverbs/ibverbs_transport.hpp"

namespace c4::transport {
namespace {

using ib::hcaMatches;

bool haveRdmaDevice() {
  const std::string dir = "/sys/class/infiniband";
  struct stat st {};
  if (stat(dir.c_str(), &st) != 0) return false;
  return system(("test -n \"$(ls -A " + dir + " 2>/dev/null)\"").c_str()) == 0;
}

TEST(IbVerbs, HcaSpecFollowsNccl) {
  EXPECT_TRUE(hcaMatches("", "mlx5_0", 1));
  EXPECT_TRUE(hcaMatches("mlx5", "mlx5_0", 1));  // a prefix
  EXPECT_TRUE(hcaMatches("mlx5_0:1", "mlx5_0", 1));
  EXPECT_FALSE(hcaMatches("mlx5_0:2", "mlx5_0", 1));
  EXPECT_FALSE(hcaMatches("=mlx5", "mlx5_0", 1));  // exact
  EXPECT_TRUE(hcaMatches("=mlx5_0", "mlx5_0", 1));
  EXPECT_FALSE(hcaMatches("=mlx5_0", "mlx5_01", 1));
  EXPECT_FALSE(hcaMatches("^mlx5_0", "mlx5_0", 1));  // excluded
  EXPECT_TRUE(hcaMatches("^mlx5_0", "mlx5_1", 1));
  EXPECT_TRUE(hcaMatches("^mlx5_0:1", "mlx5_0", 2));
  EXPECT_TRUE(hcaMatches("rxe1,mlx5_0:1", "rxe1", 1));
  EXPECT_TRUE(hcaMatches("^=rxe0", "rxe01", 1));
  EXPECT_FALSE(hcaMatches("^=rxe0", "rxe0", 1));
}

ibv_gid gidOf(const std::vector<uint8_t>& bytes) {
  ibv_gid g{};
  for (size_t i = 0; i < bytes.size() && i < 16; ++i) g.raw[i] = bytes[i];
  return g;
}

TEST(IbVerbs, RoceGidIsTheV2OneOfAnIpv4Address) {
  char dir[] = "/tmp/c4-ib-sysfs-XXXXXX";
  ASSERT_NE(nullptr, mkdtemp(dir));
  const std::string types = std::string(dir) + "/gid_attrs/types";
  ASSERT_EQ(0, system(("mkdir -p " + types).c_str()));
  auto type = [&](int i, const char* t) { std::ofstream(types + "/" + std::to_string(i)) << t << "\n"; };
  const ibv_gid linkLocal = gidOf({0xfe, 0x80, 0, 0, 0, 0, 0, 0, 0x88, 0x99, 0xa8, 0xff, 0xfe, 0xb0, 0xfb, 0x08});
  const ibv_gid v4 = gidOf({0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 192, 168, 77, 1});
  std::vector<ibv_gid> gids = {linkLocal, linkLocal, v4, v4};
  type(0, "IB/RoCE v1");
  type(1, "RoCE v2");
  type(2, "IB/RoCE v1");
  type(3, "RoCE v2");
  int idx = -1;
  ASSERT_TRUE(ib::pickRoceGid(dir, gids, -1, "rxe0:1", &idx).isOk());
  EXPECT_EQ(3, idx);  // RoCE v2 and an IPv4 address
  EXPECT_EQ("192.168.77.1", ib::gidText(gids[3]));
  // No IPv4 address: the first RoCE v2 GID.
  gids.resize(2);
  ASSERT_TRUE(ib::pickRoceGid(dir, gids, -1, "rxe0:1", &idx).isOk());
  EXPECT_EQ(1, idx);
  // Asked for: it must exist.
  ASSERT_TRUE(ib::pickRoceGid(dir, gids, 0, "rxe0:1", &idx).isOk());
  EXPECT_EQ(0, idx);
  Status st = ib::pickRoceGid(dir, gids, 7, "rxe0:1", &idx);
  EXPECT_FALSE(st.isOk());
  EXPECT_NE(std::string::npos, st.message().find("C4_IB_GID_INDEX")) << st.message();
  EXPECT_NE(std::string::npos, st.message().find("rxe0:1")) << st.message();
  // No GID at all (an interface without an address).
  std::vector<ibv_gid> none(4);
  st = ib::pickRoceGid(dir, none, -1, "rxe0:1", &idx);
  EXPECT_FALSE(st.isOk());
  EXPECT_NE(std::string::npos, st.message().find("no RoCE GID")) << st.message();
  ASSERT_EQ(0, system(("rm -rf " + std::string(dir)).c_str()));
}

// libibverbs cannot be loaded (rdma-core not installed): a clear error naming the setting and
// what to install. In a child: the library is loaded once per process.
TEST(IbVerbs, MissingLibraryIsAClearError) {
  pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    setenv("C4_IB_LIBRARY", "/nonexistent/libibverbs.so.1", 1);
    const ib::Verbs* v = nullptr;
    Status st = ib::loadVerbs(&v);
    const std::string m = st.message();
    const bool good = !st.isOk() && v == nullptr && m.find("C4_IB_LIBRARY") != std::string::npos &&
                      m.find("install") != std::string::npos && m.find("/nonexistent") != std::string::npos;
    if (!good) fprintf(stderr, "loadVerbs: %s\n", st.toString().c_str());
    _exit(good ? 0 : 1);
  }
  int status = 0;
  ASSERT_EQ(pid, waitpid(pid, &status, 0));
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
}

// Rank 1 has no libibverbs; rank 0 may have a device (the VM) or not (CI). Both fail at creation,
// neither hangs, and rank 0's error names rank 1 or its own missing device.
TEST(IbVerbs, ARankThatCannotUseRdmaFailsEveryRankNamingIt) {
  auto st = testing::runForked(
      2,
      [&](int r, Oob& oob) {
        if (r == 1) setenv("C4_IB_LIBRARY", "/nonexistent/libibverbs.so.1", 1);
        Context c = testing::makeContext(r, 2, testing::freshTag(), &oob, 10000);
        std::unique_ptr<Transport> t;
        Status s = createIbverbsTransport(c, &t);
        const std::string m = s.message();
        bool good = !s.isOk() && t == nullptr;
        if (r == 1) good = good && m.find("cannot load") != std::string::npos;
        if (r == 0)
          good = good && (m.find("rank 1 cannot use RDMA") != std::string::npos ||
                          m.find("no RDMA device") != std::string::npos);
        if (!good) fprintf(stderr, "rank %d: %s\n", r, s.toString().c_str());
        return good ? 0 : 1;
      },
      60);
  for (int r = 0; r < 2; ++r) EXPECT_TRUE(WIFEXITED(st[r]) && WEXITSTATUS(st[r]) == 0) << "rank " << r;
}

// Without a device (CI): "no RDMA device", saying how to get one. With devices (the VM): a filter
// that matches nothing, and a GID index that does not exist, are refused naming the setting.
TEST(IbVerbs, NoDeviceOrBadSettingsAreRefusedNamingThem) {
  const bool devices = haveRdmaDevice();
  pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    const ib::Verbs* v = nullptr;
    if (!ib::loadVerbs(&v).isOk()) _exit(2);
    std::vector<ib::IbPort> ports;
    bool good;
    if (!devices) {
      Status none = ib::discoverPorts(*v, &ports);
      good = !none.isOk() && none.message().find("no RDMA device") != std::string::npos &&
             none.message().find("rdma link add") != std::string::npos && ports.empty();
      if (!good) fprintf(stderr, "%s\n", none.toString().c_str());
      _exit(good ? 0 : 1);
    }
    setenv("C4_IB_HCA", "=nosuchdevice", 1);
    Status a = ib::discoverPorts(*v, &ports);
    unsetenv("C4_IB_HCA");
    setenv("C4_IB_GID_INDEX", "4000", 1);
    Status b = ib::discoverPorts(*v, &ports);
    unsetenv("C4_IB_GID_INDEX");
    Status c = ib::discoverPorts(*v, &ports);
    good = !a.isOk() && a.message().find("C4_IB_HCA") != std::string::npos && !b.isOk() &&
           b.message().find("C4_IB_GID_INDEX") != std::string::npos && c.isOk() && !ports.empty();
    if (!good) fprintf(stderr, "%s\n%s\n%s\n", a.toString().c_str(), b.toString().c_str(), c.toString().c_str());
    _exit(good ? 0 : 1);
  }
  int status = 0;
  ASSERT_EQ(pid, waitpid(pid, &status, 0));
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
}

}  // namespace
}  // namespace c4::transport
