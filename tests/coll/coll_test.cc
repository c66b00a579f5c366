// The collective matrix over real processes (fork per rank) and over threads (ranks in one
// process), for 1, 2, 3, 4 and 8 ranks.
#include <gtest/gtest.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fstream>
#include <sstream>
#include <tuple>

#include "tests/coll/coll_matrix.hpp"
#include "tests/sched/schedule_file_gen.hpp"

namespace c4test {
namespace {

Failures matrixBody(int rank, int nranks, const c4::UniqueId& id, const MatrixOptions& opt) {
  c4::Comm* comm = nullptr;
  c4::Status st = c4::commInitRank(&comm, nranks, id, rank);
  if (!st.isOk()) return {"commInitRank: " + st.toString()};
  MatrixRunner runner(comm, rank, nranks);
  Failures f = runner.run(opt);
  st = c4::commDestroy(comm);
  if (!st.isOk()) f.push_back("commDestroy: " + st.toString());
  return f;
}

class ForkedMatrix : public ::testing::TestWithParam<int> {};

TEST_P(ForkedMatrix, AllCollectivesTypesOpsCounts) {
  int n = GetParam();
  MatrixOptions opt;
  if (n >= 8) {
    // Eight processes share two cores: keep the small-count matrix whole, trim movement types.
    opt.allTypesForMovement = false;
  }
  auto outs = runForked(n, [&](int r, int nr, const c4::UniqueId& id) { return matrixBody(r, nr, id, opt); });
  std::string s = summarize(outs);
  EXPECT_TRUE(s.empty()) << s;
}

INSTANTIATE_TEST_SUITE_P(Ranks, ForkedMatrix, ::testing::Values(1, 2, 3, 4, 8),
                         [](const ::testing::TestParamInfo<int>& i) { return "np" + std::to_string(i.param); });

/// The matrix on each execution path: messages only (no one-shot arena), and every algorithm
/// forced, so small counts also run through each generator and the executor.
struct PathConfig {
  const char* name;
  const char* algo;  // C4_ALGO, or "" for the tuner's choice
};
void PrintTo(const PathConfig& c, std::ostream* os) { *os << c.name; }
class PathMatrix : public ::testing::TestWithParam<std::tuple<int, PathConfig>> {};

TEST_P(PathMatrix, AllCollectivesTypesOpsCounts) {
  int n = std::get<0>(GetParam());
  const PathConfig& cfg = std::get<1>(GetParam());
  setenv("C4_ONESHOT_BYTES", "0", 1);
  if (*cfg.algo) setenv("C4_ALGO", cfg.algo, 1);
  MatrixOptions opt;
  opt.counts = {1, 1009, 70001};
  opt.bigBytes = 1u << 20;
  opt.allTypesForMovement = false;
  opt.trimmedIfQuick();
  auto outs = runForked(n, [&](int r, int nr, const c4::UniqueId& id) { return matrixBody(r, nr, id, opt); });
  unsetenv("C4_ONESHOT_BYTES");
  unsetenv("C4_ALGO");
  std::string s = summarize(outs);
  EXPECT_TRUE(s.empty()) << s;
}

INSTANTIATE_TEST_SUITE_P(Paths, PathMatrix,
                         ::testing::Combine(::testing::Values(3, 4),
                                            ::testing::Values(PathConfig{"messages", ""}, PathConfig{"ring", "ring"},
                                                              PathConfig{"tree", "tree"}, PathConfig{"rhd", "rhd"},
                                                              PathConfig{"direct", "direct"})),
                         [](const ::testing::TestParamInfo<std::tuple<int, PathConfig>>& i) {
                           return std::string(std::get<1>(i.param).name) + "_np" + std::to_string(std::get<0>(i.param));
                         });

/// The executor's staging: every send and receive through host bounce buffers (as for memory a
/// transport cannot reach), and every reducing receive landing in a bounce buffer and reduced when
/// complete (the path of a transport without reduction on receive); over shm and over tcp.
struct StagingConfig {
  const char* name;
  const char* env;  // NAME=VALUE
  const char* transport;
};
void PrintTo(const StagingConfig& c, std::ostream* os) { *os << c.name; }
class StagingMatrix : public ::testing::TestWithParam<StagingConfig> {};

TEST_P(StagingMatrix, AllCollectivesTypesOpsCounts) {
  const StagingConfig& cfg = GetParam();
  std::string env = cfg.env;
  const std::string name = env.substr(0, env.find('=')), value = env.substr(env.find('=') + 1);
  setenv(name.c_str(), value.c_str(), 1);
  setenv("C4_ONESHOT_BYTES", "0", 1);
  setenv("C4_TRANSPORT", cfg.transport, 1);
  MatrixOptions opt;
  opt.counts = {1, 1009, 70001};
  opt.bigBytes = 1u << 20;
  opt.allTypesForMovement = false;
  opt.trimmedIfQuick();
  auto outs = runForked(3, [&](int r, int nr, const c4::UniqueId& id) { return matrixBody(r, nr, id, opt); });
  unsetenv(name.c_str());
  unsetenv("C4_ONESHOT_BYTES");
  unsetenv("C4_TRANSPORT");
  std::string s = summarize(outs);
  EXPECT_TRUE(s.empty()) << s;
}

INSTANTIATE_TEST_SUITE_P(Exec, StagingMatrix,
                         ::testing::Values(StagingConfig{"staged_shm", "C4_EXEC_STAGING=1", "shm"},
                                           StagingConfig{"staged_tcp", "C4_EXEC_STAGING=1", "tcp"},
                                           StagingConfig{"reduceAfterReceive_shm", "C4_RECV_REDUCE=0", "shm"},
                                           StagingConfig{"reduceAfterReceive_tcp", "C4_RECV_REDUCE=0", "tcp"}),
                         [](const ::testing::TestParamInfo<StagingConfig>& i) { return std::string(i.param.name); });

/// The matrix over tcp with two lanes per peer: every peer over tcp (C4_TRANSPORT=tcp, also on one
/// host), and "mixed": ranks split over two fake hosts (C4_HOSTID per rank), so that shm carries
/// the pairs within a host and tcp the pairs across, in one communicator; "hier" forces the
/// hierarchical AllReduce on that layout (2D on 2+2 ranks, host leaders on 2+1).
struct TcpConfig {
  const char* name;
  bool mixed;
  const char* algo;  // C4_ALGO, or "" for the tuner's choice
};
void PrintTo(const TcpConfig& c, std::ostream* os) { *os << c.name; }
class TcpMatrix : public ::testing::TestWithParam<std::tuple<int, TcpConfig>> {};

TEST_P(TcpMatrix, AllCollectivesTypesOpsCounts) {
  int n = std::get<0>(GetParam());
  const TcpConfig& cfg = std::get<1>(GetParam());
  setenv("C4_LANES", "2", 1);
  setenv("C4_TRANSPORT", cfg.mixed ? "auto" : "tcp", 1);
  if (*cfg.algo) setenv("C4_ALGO", cfg.algo, 1);
  MatrixOptions opt;
  opt.counts = {0, 1, 1009, 70001};
  opt.bigBytes = 1u << 20;
  opt.allTypesForMovement = false;
  opt.trimmedIfQuick();
  auto outs = runForked(n, [&](int r, int nr, const c4::UniqueId& id) {
    if (cfg.mixed) setenv("C4_HOSTID", r < (nr + 1) / 2 ? "0x7c4a" : "0x7c4b", 1);
    return matrixBody(r, nr, id, opt);
  });
  unsetenv("C4_LANES");
  unsetenv("C4_TRANSPORT");
  unsetenv("C4_ALGO");
  std::string s = summarize(outs);
  EXPECT_TRUE(s.empty()) << s;
}

INSTANTIATE_TEST_SUITE_P(Tcp, TcpMatrix,
                         ::testing::Combine(::testing::Values(2, 3, 4),
                                            ::testing::Values(TcpConfig{"tcp", false, ""}, TcpConfig{"mixed", true, ""},
                                                              TcpConfig{"hier", true, "hier"})),
                         [](const ::testing::TestParamInfo<std::tuple<int, TcpConfig>>& i) {
                           return std::string(std::get<1>(i.param).name) + "_np" + std::to_string(std::get<0>(i.param));
                         });

/// The optional network transports each alone ("<name>") and with two emulated hosts
/// that use shm within and it between them ("<name>_mixed"): ucx where it is built; ibverbs where it
/// is built and this machine has an RDMA device (the Soft-RoCE VM, tests/rdma-vm).
std::vector<std::string> netTransports() {
  std::vector<std::string> out;
#ifdef C4_TEST_UCX
  out.push_back("ucx");
#endif
#ifdef C4_TEST_IBVERBS
  if (system("test -n \"$(ls -A /sys/class/infiniband 2>/dev/null)\"") == 0) out.push_back("ibverbs");
#endif
  return out;
}
class NetMatrix : public ::testing::TestWithParam<std::tuple<std::string, int, bool>> {};
GTEST_ALLOW_UNINSTANTIATED_PARAMETERIZED_TEST(NetMatrix);

TEST_P(NetMatrix, AllCollectivesTypesOpsCounts) {
  const std::string& transport = std::get<0>(GetParam());
  const int n = std::get<1>(GetParam());
  const bool mixed = std::get<2>(GetParam());
  setenv("C4_TRANSPORT", (mixed ? "shm," + transport : transport).c_str(), 1);
  MatrixOptions opt;
  opt.counts = {0, 1, 1009, 70001};
  opt.bigBytes = 1u << 20;
  opt.allTypesForMovement = false;
  opt.trimmedIfQuick();
  auto outs = runForked(n, [&](int r, int nr, const c4::UniqueId& id) {
    if (mixed) setenv("C4_HOSTID", r < (nr + 1) / 2 ? "0x7c4a" : "0x7c4b", 1);
    return matrixBody(r, nr, id, opt);
  });
  unsetenv("C4_TRANSPORT");
  std::string s = summarize(outs);
  EXPECT_TRUE(s.empty()) << s;
}

INSTANTIATE_TEST_SUITE_P(Net, NetMatrix,
                         ::testing::Combine(::testing::ValuesIn(netTransports()), ::testing::Values(2, 3, 4),
                                            ::testing::Bool()),
                         [](const ::testing::TestParamInfo<std::tuple<std::string, int, bool>>& i) {
                           return std::get<0>(i.param) + (std::get<2>(i.param) ? "_mixed" : "") + "_np" +
                                  std::to_string(std::get<1>(i.param));
                         });

/// C4_TRANSPORT=auto between two (emulated) hosts tries RDMA first: where a device is (the
/// Soft-RoCE VM) ibverbs carries the traffic between the hosts, where none is (CI) every rank falls
/// back to tcp together with one INFO line; either way the collectives are right. C4_IB_DISABLE=1
/// skips the try. The log settings are read when the library loads, so the test runs itself again
/// with them in its environment (C4_AUTO_TEST_LOGS names the log folder there).
TEST(AutoTransport, RdmaBetweenHostsWhereItWorksElseTcp) {
  if (const char* logs = getenv("C4_AUTO_TEST_LOGS")) {
    const bool disable = getenv("C4_IB_DISABLE") && std::string(getenv("C4_IB_DISABLE")) == "1";
    const bool rdma = system("test -n \"$(ls -A /sys/class/infiniband 2>/dev/null)\"") == 0;
    MatrixOptions opt;
    opt.counts = {0, 1009};
    opt.bigBytes = 64u << 10;
    opt.allTypesForMovement = false;
    auto outs = runForked(2, [&](int r, int nr, const c4::UniqueId& id) {
      setenv("C4_HOSTID", r == 0 ? "0x7c4a" : "0x7c4b", 1);
      return matrixBody(r, nr, id, opt);
    });
    EXPECT_EQ("", summarize(outs));
    std::string all;
    FILE* p = popen(("cat " + std::string(logs) + "/*.log").c_str(), "r");
    ASSERT_NE(nullptr, p);
    char buf[4096];
    for (size_t k; (k = fread(buf, 1, sizeof(buf), p)) > 0;) all.append(buf, k);
    pclose(p);
    const bool fellBack = all.find("not using RDMA between hosts") != std::string::npos;
    const bool usedRdma = all.find("queue pair(s) per peer") != std::string::npos;
    if (disable) {
      EXPECT_FALSE(fellBack || usedRdma) << "C4_IB_DISABLE=1 still tried RDMA:\n" << all.substr(0, 3000);
    } else if (rdma) {
      EXPECT_TRUE(usedRdma && !fellBack) << all.substr(0, 3000);
    } else {
      EXPECT_TRUE(fellBack && !usedRdma) << all.substr(0, 3000);
      EXPECT_NE(std::string::npos, all.find("no RDMA device")) << all.substr(0, 3000);
    }
    return;
  }
  for (int disable = 0; disable < 2; ++disable) {
    char logs[] = "/tmp/c4-auto-XXXXXX";
    ASSERT_NE(nullptr, mkdtemp(logs));
    pid_t pid = fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      setenv("C4_AUTO_TEST_LOGS", logs, 1);
      setenv("C4_TRANSPORT", "auto", 1);
      setenv("C4_DEBUG", "INFO", 1);
      setenv("C4_DEBUG_SUBSYS", "INIT,NET", 1);
      setenv("C4_DEBUG_FILE", (std::string(logs) + "/%p.log").c_str(), 1);
      setenv("C4_IB_DISABLE", disable ? "1" : "0", 1);
      execl("/proc/self/exe", "coll_test", "--gtest_filter=AutoTransport.RdmaBetweenHostsWhereItWorksElseTcp",
            static_cast<char*>(nullptr));
      _exit(127);
    }
    int status = 0;
    ASSERT_EQ(pid, waitpid(pid, &status, 0));
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "C4_IB_DISABLE=" << disable;
    ASSERT_EQ(0, system(("rm -rf " + std::string(logs)).c_str()));
  }
}

/// Buffers from c4::memAlloc: the zero-copy path on every eligible call ("all": every rank's
/// buffers shareable; the trace must show each of those calls zero-copy), and the fall back to
/// messages when only some ranks' are ("some": the trace must show none). One-shot is off so
/// that small counts take the path too. Forked ranks map each other's memory; "threads" ranks
/// share one process and use it in place.
struct ZeroCopyConfig {
  const char* name;
  int shareable;  // MatrixOptions::shareable
  bool threads;
};
void PrintTo(const ZeroCopyConfig& c, std::ostream* os) { *os << c.name; }
class ZeroCopyMatrix : public ::testing::TestWithParam<std::tuple<int, ZeroCopyConfig>> {};

TEST_P(ZeroCopyMatrix, AllCollectivesTypesOpsCounts) {
  int n = std::get<0>(GetParam());
  const ZeroCopyConfig& cfg = std::get<1>(GetParam());
  setenv("C4_ONESHOT_BYTES", "0", 1);
  setenv("C4_TRACE", "op", 1);
  // Streaming stores from 64 KiB, so the larger counts also take the path's streaming copies.
  setenv("C4_COPY_NT_THRESHOLD", "65536", 1);
  MatrixOptions opt;
  opt.counts = {1, 1009, 70001};
  opt.bigBytes = 1u << 20;
  opt.allTypesForMovement = false;
  opt.shareable = cfg.shareable;
  opt.checkZeroCopy = true;
  opt.trimmedIfQuick();
  auto body = [&](int r, int nr, const c4::UniqueId& id) { return matrixBody(r, nr, id, opt); };
  auto outs = cfg.threads ? runThreads(n, body) : runForked(n, body);
  unsetenv("C4_ONESHOT_BYTES");
  unsetenv("C4_TRACE");
  unsetenv("C4_COPY_NT_THRESHOLD");
  std::string s = summarize(outs);
  EXPECT_TRUE(s.empty()) << s;
}

INSTANTIATE_TEST_SUITE_P(ZeroCopy, ZeroCopyMatrix,
                         ::testing::Combine(::testing::Values(2, 3, 4),
                                            ::testing::Values(ZeroCopyConfig{"all", 1, false},
                                                              ZeroCopyConfig{"some", 2, false},
                                                              ZeroCopyConfig{"threads", 1, true})),
                         [](const ::testing::TestParamInfo<std::tuple<int, ZeroCopyConfig>>& i) {
                           return std::string(std::get<1>(i.param).name) + "_np" + std::to_string(std::get<0>(i.param));
                         });

/// Loaded schedules (C4_SCHEDULE_FILE, docs/schedules.md) in the matrix over real processes:
/// AllGather and AlltoAll relayed through rank 0 (explicit deps; AlltoAll's relayed blocks wait in
/// scratch), ReduceScatter and AllReduce as ring files with two chunks per block; they replace the tuner's choice for
/// their collectives (the TUNING log of every rank must say so), every other collective runs as before.
struct FileConfig {
  const char* name;
  const char* transport;
  int nranks;
};
void PrintTo(const FileConfig& c, std::ostream* os) { *os << c.name; }
class ScheduleFileMatrix : public ::testing::TestWithParam<FileConfig> {};

TEST_P(ScheduleFileMatrix, AllCollectivesTypesOpsCounts) {
  const FileConfig& cfg = GetParam();
  const int n = cfg.nranks;
  if (getenv("C4_SCHEDMATRIX_CHILD") != nullptr) {
    // The child process (below): the settings are in its environment from the start.
    MatrixOptions opt;
    opt.counts = {1, 1009, 70001};
    opt.bigBytes = 1u << 20;
    opt.allTypesForMovement = false;
    opt.trimmedIfQuick();
    auto outs = runForked(n, [&](int r, int nr, const c4::UniqueId& id) { return matrixBody(r, nr, id, opt); });
    std::string s = summarize(outs);
    EXPECT_TRUE(s.empty()) << s;
    return;
  }
  namespace gen = c4::sched::test;
  auto ringSteps = [](int nr) {
    std::vector<std::vector<gen::GenStep>> steps(static_cast<size_t>(nr));
    gen::ringAllGatherSteps(nr, 1, &steps);
    return steps;
  };
  const std::string stem = std::string("c4-schedmatrix-") + cfg.name;
  const std::string files[] = {gen::writeTemp(gen::starAllGatherFile(n, 2), stem + "-ag"),
                               gen::writeTemp(gen::ringFile("reducescatter", n, 2), stem + "-rs"),
                               gen::writeTemp(gen::ringFile("allreduce", n, 2), stem + "-ar"),
                               gen::writeTemp(gen::alltoallFile(n, 2, true), stem + "-a2a"),
                               // Another rank count: skipped, not an error.
                               gen::writeTemp(gen::ringFile("allreduce", n + 1, 1), stem + "-ar-other"),
                               // Made for a fabric this job does not run on (no C4_TOPO_FILE): skipped.
                               gen::writeTemp(gen::scheduleJson("ag-elsewhere", "allgather", n, 1, ringSteps(n),
                                                                ", \"topology\": {\"hash\": \"0x00000000000000a1\"}"),
                                              stem + "-ag-topo")};
  std::string list;
  for (const std::string& f : files) {
    ASSERT_FALSE(f.empty());
    list += (list.empty() ? "" : ",") + f;
  }
  char logDir[] = "/tmp/c4-schedlog-XXXXXX";
  ASSERT_NE(mkdtemp(logDir), nullptr);
  const ::testing::TestInfo* ti = ::testing::UnitTest::GetInstance()->current_test_info();
  const std::string filter = std::string("--gtest_filter=") + ti->test_suite_name() + "." + ti->name();
  pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    setenv("C4_SCHEDMATRIX_CHILD", "1", 1);
    setenv("C4_SCHEDULE_FILE", list.c_str(), 1);
    setenv("C4_ONESHOT_BYTES", "0", 1);
    setenv("C4_TRANSPORT", cfg.transport, 1);
    setenv("C4_DEBUG", "INFO", 1);
    setenv("C4_DEBUG_SUBSYS", "TUNING", 1);
    setenv("C4_DEBUG_FILE", (std::string(logDir) + "/rank-%p.log").c_str(), 1);
    execl("/proc/self/exe", "coll_test", filter.c_str(), static_cast<char*>(nullptr));
    _exit(127);
  }
  int status = 0;
  ASSERT_EQ(pid, waitpid(pid, &status, 0));
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "the matrix over schedule files failed (above)";
  // Every rank ran each file's collective with its schedule, and skipped the file of another size.
  std::string logs;
  FILE* cat = popen((std::string("cat ") + logDir + "/rank-*.log 2>/dev/null").c_str(), "r");
  ASSERT_NE(cat, nullptr);
  char buf[4096];
  size_t got;
  while ((got = fread(buf, 1, sizeof buf, cat)) > 0) logs.append(buf, got);
  pclose(cat);
  auto countOf = [&](const std::string& needle) {
    size_t k = 0;
    for (size_t p = logs.find(needle); p != std::string::npos; p = logs.find(needle, p + 1)) ++k;
    return k;
  };
  const std::string nn = std::to_string(n);
  EXPECT_GE(countOf("algorithm file:star-allgather-" + nn), static_cast<size_t>(n)) << logs.substr(0, 4000);
  EXPECT_GE(countOf("algorithm file:ring-reducescatter-" + nn + "x2"), static_cast<size_t>(n)) << logs.substr(0, 4000);
  EXPECT_GE(countOf("algorithm file:ring-allreduce-" + nn + "x2"), static_cast<size_t>(n)) << logs.substr(0, 4000);
  EXPECT_GE(countOf("algorithm file:relay-alltoall-" + nn + "x2"), static_cast<size_t>(n)) << logs.substr(0, 4000);
  EXPECT_GE(countOf("not used: this communicator has " + nn + " ranks"), static_cast<size_t>(n))
      << logs.substr(0, 4000);
  if (!::testing::Test::HasFailure()) (void)system((std::string("rm -rf ") + logDir).c_str());
  for (const std::string& f : files) unlink(f.c_str());
}

INSTANTIATE_TEST_SUITE_P(Files, ScheduleFileMatrix,
                         ::testing::Values(FileConfig{"shm_np3", "shm", 3}, FileConfig{"tcp_np4", "tcp", 4}),
                         [](const ::testing::TestParamInfo<FileConfig>& i) { return std::string(i.param.name); });

class ThreadMatrix : public ::testing::TestWithParam<int> {};

TEST_P(ThreadMatrix, AllCollectivesTypesOpsCounts) {
  int n = GetParam();
  MatrixOptions opt;
  opt.counts = {0, 1, 1009, 70001};
  opt.bigBytes = 1u << 20;
  opt.trimmedIfQuick();
  auto outs = runThreads(n, [&](int r, int nr, const c4::UniqueId& id) { return matrixBody(r, nr, id, opt); });
  std::string s = summarize(outs);
  EXPECT_TRUE(s.empty()) << s;
}

INSTANTIATE_TEST_SUITE_P(Ranks, ThreadMatrix, ::testing::Values(2, 3),
                         [](const ::testing::TestParamInfo<int>& i) { return "threads" + std::to_string(i.param); });

}  // namespace
}  // namespace c4test
