#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>
#include <fstream>
#include <string>

#include "common/socket.hpp"
#include "core/bootstrap.hpp"
#include "test_util.hpp"

namespace c4 {
namespace {

using test::EnvGuard;

class LaunchEnvTest : public ::testing::Test {
 protected:
  void SetUp() override { env_.clearLaunchVars(); }
  void TearDown() override { EXPECT_TRUE(test::waitRootsGone(10000)); }
  EnvGuard env_;
};

bool fileExists(const std::string& p) {
  struct stat st;
  return ::stat(p.c_str(), &st) == 0;
}

TEST_F(LaunchEnvTest, NoLauncherNamesWhatIsMissing) {
  LaunchInfo li;
  Status st = readLaunchInfo(&li);
  EXPECT_EQ(Code::kInvalidUsage, st.code());
  for (const char* v : {"RANK", "WORLD_SIZE", "OMPI_COMM_WORLD_RANK", "SLURM_PROCID", "SLURM_NTASKS"})
    EXPECT_NE(std::string::npos, st.message().find(v)) << st.message();
  env_.set("RANK", "1");
  st = readLaunchInfo(&li);
  EXPECT_EQ(Code::kInvalidUsage, st.code());
  EXPECT_NE(std::string::npos, st.message().find("WORLD_SIZE")) << st.message();
  env_.set("WORLD_SIZE", "4");
  st = readLaunchInfo(&li);
  EXPECT_EQ(Code::kInvalidUsage, st.code());
  EXPECT_NE(std::string::npos, st.message().find("MASTER_ADDR")) << st.message();
  env_.set("WORLD_SIZE", "abc");
  EXPECT_EQ(Code::kInvalidUsage, readLaunchInfo(&li).code());
  env_.set("WORLD_SIZE", "1");
  env_.set("MASTER_ADDR", "10.0.0.1");
  env_.set("MASTER_PORT", "29500");
  st = readLaunchInfo(&li);
  EXPECT_EQ(Code::kInvalidUsage, st.code()) << "rank 1 of 1";
}

TEST_F(LaunchEnvTest, Torchrun) {
  env_.set("RANK", "3");
  env_.set("WORLD_SIZE", "8");
  env_.set("LOCAL_RANK", "1");
  env_.set("LOCAL_WORLD_SIZE", "2");
  env_.set("MASTER_ADDR", "10.1.2.3");
  env_.set("MASTER_PORT", "29500");
  LaunchInfo li;
  ASSERT_TRUE(readLaunchInfo(&li).isOk());
  EXPECT_EQ("torchrun", li.launcher);
  EXPECT_EQ(3, li.rank);
  EXPECT_EQ(8, li.nranks);
  EXPECT_EQ(1, li.localRank);
  EXPECT_EQ(2, li.localSize);
  EXPECT_EQ("10.1.2.3:29501", li.rootHostPort);
  EXPECT_FALSE(li.jobKey.empty());
  env_.set("MASTER_ADDR", "fd00::1");
  ASSERT_TRUE(readLaunchInfo(&li).isOk());
  EXPECT_EQ("[fd00::1]:29501", li.rootHostPort);
  env_.set("C4_COMM_ID", "10.9.9.9:1234");
  ASSERT_TRUE(readLaunchInfo(&li).isOk());
  EXPECT_EQ("10.9.9.9:1234", li.rootHostPort);
}

TEST_F(LaunchEnvTest, OpenMpi) {
  env_.set("OMPI_COMM_WORLD_RANK", "2");
  env_.set("OMPI_COMM_WORLD_SIZE", "4");
  env_.set("OMPI_COMM_WORLD_LOCAL_RANK", "0");
  env_.set("OMPI_COMM_WORLD_LOCAL_SIZE", "2");
  env_.set("OMPI_MCA_ess_base_jobid", "12345");
  LaunchInfo li;
  ASSERT_TRUE(readLaunchInfo(&li).isOk());
  EXPECT_EQ("mpirun", li.launcher);
  EXPECT_EQ(2, li.rank);
  EXPECT_EQ(4, li.nranks);
  EXPECT_EQ(0, li.localRank);
  EXPECT_EQ(2, li.localSize);
  EXPECT_EQ("", li.rootHostPort);
  EXPECT_NE(std::string::npos, li.jobKey.find("12345"));
  // Ranks on several hosts and no C4_COMM_ID: a clear error, not a hang.
  UniqueId id;
  Status st = uniqueIdFromLaunch(li, 1000, &id);
  EXPECT_EQ(Code::kInvalidUsage, st.code());
  EXPECT_NE(std::string::npos, st.message().find("C4_COMM_ID")) << st.message();
  env_.unset("OMPI_MCA_ess_base_jobid");
  env_.set("PMIX_NAMESPACE", "prterun-host-777@1");
  ASSERT_TRUE(readLaunchInfo(&li).isOk());
  EXPECT_NE(std::string::npos, li.jobKey.find("prterun-host-777@1"));
}

TEST_F(LaunchEnvTest, Slurm) {
  env_.set("SLURM_PROCID", "5");
  env_.set("SLURM_NTASKS", "6");
  env_.set("SLURM_LOCALID", "5");
  env_.set("SLURM_JOB_ID", "4242");
  env_.set("SLURM_STEP_ID", "0");
  env_.set("SLURM_STEP_NUM_NODES", "1");
  LaunchInfo li;
  ASSERT_TRUE(readLaunchInfo(&li).isOk());
  EXPECT_EQ("slurm", li.launcher);
  EXPECT_EQ(5, li.rank);
  EXPECT_EQ(6, li.nranks);
  EXPECT_EQ(5, li.localRank);
  EXPECT_EQ(6, li.localSize);
  EXPECT_NE(std::string::npos, li.jobKey.find("4242.0"));
  env_.set("SLURM_STEP_NUM_NODES", "2");
  ASSERT_TRUE(readLaunchInfo(&li).isOk());
  EXPECT_EQ(-1, li.localSize);
  // Open MPI launched inside a Slurm allocation: Open MPI wins.
  env_.set("OMPI_COMM_WORLD_RANK", "0");
  env_.set("OMPI_COMM_WORLD_SIZE", "2");
  ASSERT_TRUE(readLaunchInfo(&li).isOk());
  EXPECT_EQ("mpirun", li.launcher);
}

// Each forked child plays one Open MPI rank on this host and rendezvouses through /dev/shm.
TEST_F(LaunchEnvTest, FileRendezvousAcrossProcesses) {
  const int n = 4;
  const std::string job = "c4test-" + std::to_string(getpid());
  const std::string path = detail::launchRendezvousPath("ompi:" + job, 0);
  const std::string path2 = detail::launchRendezvousPath("ompi:" + job, 1);
  ::unlink(path.c_str());
  std::vector<int> codes = test::forkRanks(n, 60000, [&](int r) {
    setenv("OMPI_COMM_WORLD_RANK", std::to_string(r).c_str(), 1);
    setenv("OMPI_COMM_WORLD_SIZE", std::to_string(n).c_str(), 1);
    setenv("OMPI_COMM_WORLD_LOCAL_RANK", std::to_string(r).c_str(), 1);
    setenv("OMPI_COMM_WORLD_LOCAL_SIZE", std::to_string(n).c_str(), 1);
    setenv("OMPI_MCA_ess_base_jobid", job.c_str(), 1);
    LaunchInfo li;
    Status st = readLaunchInfo(&li);
    // Two communicators in a row from the same job (the second uses the next file name).
    for (int comm = 0; st.isOk() && comm < 2; ++comm) {
      UniqueId id;
      st = uniqueIdFromLaunch(li, 20000, &id);
      std::unique_ptr<Bootstrap> b;
      if (st.isOk()) st = Bootstrap::create(id, li.rank, li.nranks, test::testRankInfo(r), 20000, &b);
      uint64_t v[n] = {0};
      v[r] = 100 + r + comm;
      if (st.isOk()) st = b->allGather(v, sizeof(uint64_t));
      for (int k = 0; st.isOk() && k < n; ++k)
        if (v[k] != static_cast<uint64_t>(100 + k + comm)) st = Status(Code::kInternalError, "bad allGather");
      if (st.isOk()) st = b->barrier();
    }
    if (!st.isOk()) fprintf(stderr, "rank %d: %s\n", r, st.toString().c_str());
    return st.isOk() ? 0 : 1;
  });
  for (int r = 0; r < n; ++r) EXPECT_EQ(0, codes[r]) << "rank " << r;
  EXPECT_FALSE(fileExists(path)) << path << " was not removed";
  EXPECT_FALSE(fileExists(path2)) << path2 << " was not removed";
  ::unlink(path.c_str());
  ::unlink(path2.c_str());
}

TEST_F(LaunchEnvTest, StaleRendezvousFileIsReplaced) {
  const int n = 2;
  const std::string job = "c4stale-" + std::to_string(getpid());
  const std::string path = detail::launchRendezvousPath("slurm:" + job + ".0", 0);
  {
    // A file from a "previous run": garbage content, mode 0600.
    std::ofstream f(path);
    f << "stale stale stale";
  }
  ::chmod(path.c_str(), 0600);
  std::vector<int> codes = test::forkRanks(n, 60000, [&](int r) {
    setenv("SLURM_PROCID", std::to_string(r).c_str(), 1);
    setenv("SLURM_NTASKS", std::to_string(n).c_str(), 1);
    setenv("SLURM_NNODES", "1", 1);
    setenv("SLURM_JOB_ID", job.c_str(), 1);
    setenv("SLURM_STEP_ID", "0", 1);
    LaunchInfo li;
    Status st = readLaunchInfo(&li);
    UniqueId id;
    if (st.isOk()) st = uniqueIdFromLaunch(li, 20000, &id);
    std::unique_ptr<Bootstrap> b;
    if (st.isOk()) st = Bootstrap::create(id, li.rank, li.nranks, test::testRankInfo(r), 20000, &b);
    if (st.isOk()) st = b->barrier();
    if (!st.isOk()) fprintf(stderr, "rank %d: %s\n", r, st.toString().c_str());
    return st.isOk() ? 0 : 1;
  });
  for (int r = 0; r < n; ++r) EXPECT_EQ(0, codes[r]) << "rank " << r;
  EXPECT_FALSE(fileExists(path));
  ::unlink(path.c_str());
}

TEST_F(LaunchEnvTest, RendezvousTimesOutWithoutRankZero) {
  LaunchInfo li;
  li.launcher = "slurm";
  li.rank = 1;
  li.nranks = 2;
  li.localSize = 2;
  li.jobKey = "c4lonely-" + std::to_string(getpid());
  UniqueId id;
  Status st = uniqueIdFromLaunch(li, 200, &id);
  EXPECT_EQ(Code::kRemoteError, st.code());
  EXPECT_NE(std::string::npos, st.message().find("rank 0")) << st.message();
}

// torchrun: the root is rank 0 at MASTER_ADDR:MASTER_PORT+1, the secret derived from the job.
TEST_F(LaunchEnvTest, TorchrunAcrossProcesses) {
  detail::NetIf lo;
  ASSERT_TRUE(detail::chooseInterface("lo", nullptr, &lo).isOk());
  detail::SockAddr bound;
  {
    detail::Fd l;
    ASSERT_TRUE(detail::listenSocket(lo.addr, 1, false, &l, &bound).isOk());
  }
  const int n = 3;
  const int masterPort = bound.port() - 1;
  std::vector<int> codes = test::forkRanks(n, 60000, [&](int r) {
    setenv("RANK", std::to_string(r).c_str(), 1);
    setenv("WORLD_SIZE", std::to_string(n).c_str(), 1);
    setenv("LOCAL_RANK", std::to_string(r).c_str(), 1);
    setenv("MASTER_ADDR", "127.0.0.1", 1);
    setenv("MASTER_PORT", std::to_string(masterPort).c_str(), 1);
    LaunchInfo li;
    Status st = readLaunchInfo(&li);
    UniqueId id;
    if (st.isOk()) st = uniqueIdFromLaunch(li, 20000, &id);
    std::unique_ptr<Bootstrap> b;
    if (st.isOk()) st = Bootstrap::create(id, li.rank, li.nranks, test::testRankInfo(r), 20000, &b);
    if (st.isOk()) st = b->barrier();
    if (!st.isOk()) fprintf(stderr, "rank %d: %s\n", r, st.toString().c_str());
    return st.isOk() ? 0 : 1;
  });
  for (int r = 0; r < n; ++r) EXPECT_EQ(0, codes[r]) << "rank " << r;
}

}  // namespace
}  // namespace c4
