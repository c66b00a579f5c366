#include "test_util.hpp"

#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <thread>

#include "common/logging.hpp"
#include "common/socket.hpp"

namespace c4::test {

EnvGuard::~EnvGuard() {
  for (auto& [name, old] : saved_) {
    if (old.first)
      setenv(name.c_str(), old.second.c_str(), 1);
    else
      unsetenv(name.c_str());
  }
  logReload();
}

void EnvGuard::remember(const std::string& name) {
  if (saved_.count(name)) return;
  const char* v = getenv(name.c_str());
  saved_[name] = {v != nullptr, v ? v : ""};
}

void EnvGuard::set(const std::string& name, const std::string& value) {
  remember(name);
  setenv(name.c_str(), value.c_str(), 1);
}

void EnvGuard::unset(const std::string& name) {
  remember(name);
  unsetenv(name.c_str());
}

void EnvGuard::clearLaunchVars() {
  for (const char* n : {"RANK",
                        "WORLD_SIZE",
                        "LOCAL_RANK",
                        "LOCAL_WORLD_SIZE",
                        "MASTER_ADDR",
                        "MASTER_PORT",
                        "TORCHELASTIC_RUN_ID",
                        "OMPI_COMM_WORLD_RANK",
                        "OMPI_COMM_WORLD_SIZE",
                        "OMPI_COMM_WORLD_LOCAL_RANK",
                        "OMPI_COMM_WORLD_LOCAL_SIZE",
                        "OMPI_MCA_ess_base_jobid",
                        "PMIX_NAMESPACE",
                        "OMPI_MCA_orte_ess_jobid",
                        "SLURM_PROCID",
                        "SLURM_NTASKS",
                        "SLURM_NPROCS",
                        "SLURM_LOCALID",
                        "SLURM_JOB_ID",
                        "SLURM_JOBID",
                        "SLURM_STEP_ID",
                        "SLURM_STEPID",
                        "SLURM_STEP_NUM_NODES",
                        "SLURM_NNODES",
                        "C4_COMM_ID",
                        "NCCL_COMM_ID",
                        "C4_SECRET",
                        "C4_SOCKET_IFNAME",
                        "NCCL_SOCKET_IFNAME"})
    unset(n);
}

RankInfo testRankInfo(int rank) {
  RankInfo info;
  info.hostId = localHostId();
  info.pid = getpid();
  info.localRankHint = rank;
  gethostname(info.hostname, sizeof(info.hostname) - 1);
  return info;
}

void runThreads(int n, const std::function<void(int)>& fn) {
  std::vector<std::thread> ts;
  for (int r = 0; r < n; ++r) ts.emplace_back(fn, r);
  for (auto& t : ts) t.join();
}

namespace {

std::vector<int> waitChildren(const std::vector<pid_t>& pids, int64_t timeoutMs) {
  std::vector<int> codes(pids.size(), -1);
  std::vector<bool> done(pids.size(), false);
  const int64_t deadline = detail::nowMs() + timeoutMs;
  size_t left = pids.size();
  while (left > 0) {
    bool progressed = false;
    for (size_t i = 0; i < pids.size(); ++i) {
      if (done[i]) continue;
      int status = 0;
      pid_t rc = waitpid(pids[i], &status, WNOHANG);
      if (rc == pids[i]) {
        codes[i] = WIFEXITED(status) ? WEXITSTATUS(status) : -WTERMSIG(status);
        done[i] = true;
        --left;
        progressed = true;
      }
    }
    if (left == 0) break;
    if (detail::nowMs() >= deadline) {
      for (size_t i = 0; i < pids.size(); ++i) {
        if (done[i]) continue;
        kill(pids[i], SIGKILL);
        waitpid(pids[i], nullptr, 0);
        codes[i] = 124;
      }
      break;
    }
    if (!progressed) std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  return codes;
}

}  // namespace

std::vector<int> forkRanks(int n, int64_t timeoutMs, const std::function<int(int)>& fn) {
  std::vector<pid_t> pids;
  fflush(stdout);
  fflush(stderr);
  for (int r = 0; r < n; ++r) {
    pid_t pid = fork();
    if (pid == 0) {
      int code = fn(r);
      fflush(stdout);
      fflush(stderr);
      _exit(code);
    }
    pids.push_back(pid);
  }
  return waitChildren(pids, timeoutMs);
}

std::vector<int> forkRanksWithId(int n, int64_t timeoutMs, const std::function<int(int, const UniqueId&)>& fn) {
  std::vector<int> writeEnds;
  std::vector<pid_t> pids;
  fflush(stdout);
  fflush(stderr);
  for (int r = 0; r < n; ++r) {
    int p[2];
    if (pipe(p) != 0) abort();
    pid_t pid = fork();
    if (pid == 0) {
      close(p[1]);
      for (int w : writeEnds) close(w);
      UniqueId id;
      Status st = detail::recvAll(p[0], &id, sizeof(id), detail::nowMs() + timeoutMs, -1, "id pipe");
      int code = st.isOk() ? fn(r, id) : 99;
      if (!st.isOk()) fprintf(stderr, "child %d: %s\n", r, st.toString().c_str());
      fflush(stdout);
      fflush(stderr);
      _exit(code);
    }
    close(p[0]);
    writeEnds.push_back(p[1]);
    pids.push_back(pid);
  }
  UniqueId id;
  Status st = bootstrapGetUniqueId(&id);
  if (!st.isOk()) fprintf(stderr, "bootstrapGetUniqueId: %s\n", st.toString().c_str());
  for (int w : writeEnds) {
    if (st.isOk()) {
      ssize_t rc = write(w, &id, sizeof(id));  // a pipe takes 128 bytes at once
      (void)rc;
    }
    close(w);
  }
  return waitChildren(pids, timeoutMs);
}

bool waitRootsGone(int64_t timeoutMs) {
  const int64_t deadline = detail::nowMs() + timeoutMs;
  while (detail::activeBootstrapRoots() > 0) {
    if (detail::nowMs() >= deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return true;
}

}  // namespace c4::test
