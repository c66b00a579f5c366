// Launcher integration: read rank / size / root from torchrun, Open MPI or Slurm variables, and
// agree on one UniqueId across the job without a side channel.
//
// Secrets. With a root address (C4_COMM_ID, or torchrun's MASTER_ADDR:MASTER_PORT+1) every rank
// derives the same secret from C4_SECRET (if set) and the job key. The job key is visible to anyone
// who can list the job's environment or guess it, so unless C4_SECRET is set to a private value
// this is NOT a security boundary: it only keeps unrelated jobs and stray connections apart. With
// the /dev/shm rendezvous (all ranks on one host), rank 0 draws a random secret and publishes it in
// a file readable only by the job's user (mode 0600), which is as strong as the user boundary.
//
// Rendezvous file: /dev/shm/c4comm-boot-<uid>-<hash of job key>-<n>, where n counts launcher inits
// of that job in this process (every rank initializes in the same order, so n agrees). Rank 0
// writes it atomically (temp file + rename) with its pid and process start time; the root thread
// removes it once every rank joined (or when it gives up). A file left by a dead process (same
// boot, same pid namespace, that pid gone or restarted) is stale: readers ignore it and rank 0
// replaces it.
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/inotify.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <mutex>
#include <string>

#include "common/logging.hpp"
#include "common/siphash.hpp"
#include "common/socket.hpp"
#include "common/status.hpp"
#include "core/bootstrap.hpp"

namespace c4 {
namespace {

constexpr char kRendezvousDir[] = "/dev/shm";
constexpr char kFileMagic[8] = {'c', '4', 'r', 'd', 'v', '0', '0', '1'};

struct RendezvousFile {
  char magic[8];
  uint64_t bootHash;  // hash of /proc/sys/kernel/random/boot_id
  uint64_t pidNs;     // inode of /proc/self/ns/pid
  int64_t pid;
  uint64_t startTime;  // field 22 of /proc/<pid>/stat (clock ticks since boot)
  UniqueId id;
};

const char* envOf(const char* name) {
  const char* v = getenv(name);
  return v && *v ? v : nullptr;
}

Status envInt(const char* name, int* out) {
  const char* v = envOf(name);
  if (!v) return makeError(Code::kInvalidUsage, "%s is not set", name);
  char* end = nullptr;
  errno = 0;
  long x = strtol(v, &end, 10);
  if (errno != 0 || *end != '\0' || x < INT_MIN || x > INT_MAX)
    return makeError(Code::kInvalidUsage, "%s='%s' is not an integer", name, v);
  *out = static_cast<int>(x);
  return Status::ok();
}

// Optional integer: absent leaves *out untouched.
Status envIntOpt(const char* name, int* out) { return envOf(name) ? envInt(name, out) : Status::ok(); }

uint64_t hashOf(const std::string& s) {
  static const uint8_t kKey[16] = {'c', '4', 'c', 'o', 'm', 'm', '-', 'r', 'e', 'n', 'd', 'e', 'z', 'v', 'o', 'u'};
  return sipHash24(kKey, s.data(), s.size());
}

uint64_t bootHash() {
  std::ifstream f("/proc/sys/kernel/random/boot_id");
  std::string s;
  std::getline(f, s);
  return hashOf(s);
}

uint64_t pidNsInode() {
  struct stat st;
  return ::stat("/proc/self/ns/pid", &st) == 0 ? static_cast<uint64_t>(st.st_ino) : 0;
}

// 0 if unknown (no such process).
uint64_t processStartTime(int64_t pid) {
  std::ifstream f("/proc/" + std::to_string(pid) + "/stat");
  std::string s;
  std::getline(f, s);
  size_t close = s.rfind(')');
  if (close == std::string::npos) return 0;
  // Fields after the command: state is field 3; starttime is field 22.
  size_t pos = close + 2;
  for (int field = 3; field < 22 && pos != std::string::npos; ++field) {
    pos = s.find(' ', pos);
    if (pos != std::string::npos) ++pos;
  }
  return pos == std::string::npos ? 0 : strtoull(s.c_str() + pos, nullptr, 10);
}

bool isStale(const RendezvousFile& f) {
  if (f.bootHash != bootHash() || f.pidNs != pidNsInode()) return false;  // cannot tell: trust it
  if (::kill(static_cast<pid_t>(f.pid), 0) != 0 && errno == ESRCH) return true;
  uint64_t st = processStartTime(f.pid);
  return st != 0 && st != f.startTime;
}

// Reads and validates the file; false if absent, partial, foreign or stale.
bool readRendezvous(const std::string& path, UniqueId* id) {
  int fd = C4_SYSCALL_RETRY(::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW));
  if (fd < 0) return false;
  detail::Fd guard(fd);
  struct stat st;
  if (::fstat(fd, &st) != 0 || st.st_uid != geteuid() || (st.st_mode & 077) != 0) {
    C4_WARN(kLogBootstrap, "ignoring rendezvous file %s: not owned by this user with mode 0600", path.c_str());
    return false;
  }
  RendezvousFile f;
  size_t got = 0;
  while (got < sizeof(f)) {
    ssize_t n = C4_SYSCALL_RETRY(::read(fd, reinterpret_cast<char*>(&f) + got, sizeof(f) - got));
    if (n <= 0) return false;
    got += static_cast<size_t>(n);
  }
  if (memcmp(f.magic, kFileMagic, sizeof(kFileMagic)) != 0) return false;
  if (isStale(f)) return false;
  *id = f.id;
  return true;
}

Status writeRendezvous(const std::string& path, const UniqueId& id) {
  RendezvousFile f;
  memset(static_cast<void*>(&f), 0, sizeof(f));
  memcpy(f.magic, kFileMagic, sizeof(kFileMagic));
  f.bootHash = bootHash();
  f.pidNs = pidNsInode();
  f.pid = getpid();
  f.startTime = processStartTime(f.pid);
  f.id = id;
  std::string tmp = path + ".tmp" + std::to_string(getpid());
  int fd = C4_SYSCALL_RETRY(::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0600));
  if (fd < 0) return makeError(Code::kSystemError, "creating %s: %s", tmp.c_str(), strerror(errno));
  {
    detail::Fd guard(fd);
    size_t put = 0;
    while (put < sizeof(f)) {
      ssize_t n = C4_SYSCALL_RETRY(::write(fd, reinterpret_cast<const char*>(&f) + put, sizeof(f) - put));
      if (n <= 0) {
        int err = errno;
        ::unlink(tmp.c_str());
        return makeError(Code::kSystemError, "writing %s: %s", tmp.c_str(), strerror(err));
      }
      put += static_cast<size_t>(n);
    }
  }
  // rename() replaces a stale file atomically: readers see the old or the new file, never a mix.
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    int err = errno;
    ::unlink(tmp.c_str());
    return makeError(Code::kSystemError, "renaming %s to %s: %s", tmp.c_str(), path.c_str(), strerror(err));
  }
  return Status::ok();
}

Status waitRendezvous(const LaunchInfo& info, const std::string& path, int64_t timeoutMs, UniqueId* id) {
  const int64_t start = detail::nowMs();
  const int64_t deadline = start + timeoutMs;
  // Watch before the first look, so that a file created in between still wakes us.
  detail::Fd ino(inotify_init1(IN_CLOEXEC | IN_NONBLOCK));
  if (ino.valid() && inotify_add_watch(ino.get(), kRendezvousDir, IN_CREATE | IN_MOVED_TO | IN_CLOSE_WRITE) < 0)
    ino.reset();
  for (;;) {
    if (readRendezvous(path, id)) return Status::ok();
    if (detail::nowMs() >= deadline)
      return makeError(Code::kRemoteError,
                       "%s rank %d: timed out after %lld ms waiting for rank 0 to publish the bootstrap id in %s (is "
                       "rank 0 running, on this host?)",
                       info.launcher.c_str(), info.rank, static_cast<long long>(detail::nowMs() - start), path.c_str());
    if (ino.valid()) {
      pollfd p{ino.get(), POLLIN, 0};
      int rc = C4_SYSCALL_RETRY(::poll(&p, 1, detail::msLeft(deadline)));
      if (rc > 0) {
        char buf[4096];
        while (C4_SYSCALL_RETRY(::read(ino.get(), buf, sizeof(buf))) > 0) {
        }
      }
    } else {
      // No inotify (limits): look again every 10 ms.
      C4_SYSCALL_RETRY(::poll(nullptr, 0, std::min(10, detail::msLeft(deadline))));
    }
  }
}

int nextLaunchSeq(const std::string& jobKey) {
  static std::mutex* mu = new std::mutex();
  static auto* seqs = new std::map<std::string, int>();
  std::lock_guard<std::mutex> g(*mu);
  return (*seqs)[jobKey]++;
}

std::string bracketed(const std::string& host) {
  return host.find(':') != std::string::npos && host[0] != '[' ? "[" + host + "]" : host;
}

}  // namespace

namespace detail {

std::string launchRendezvousPath(const std::string& jobKey, int seq) {
  char buf[128];
  snprintf(buf, sizeof(buf), "%s/c4comm-boot-%u-%016llx-%d", kRendezvousDir, static_cast<unsigned>(geteuid()),
           static_cast<unsigned long long>(hashOf(jobKey)), seq);
  return buf;
}

}  // namespace detail

Status readLaunchInfo(LaunchInfo* out) {
  if (out == nullptr) return makeError(Code::kInvalidArgument, "readLaunchInfo: out is null");
  LaunchInfo li;
  const std::string commId = detail::commIdEnv();
  if (envOf("RANK") || envOf("WORLD_SIZE")) {
    li.launcher = "torchrun";
    C4_CHECK(envInt("RANK", &li.rank));
    C4_CHECK(envInt("WORLD_SIZE", &li.nranks));
    C4_CHECK(envIntOpt("LOCAL_RANK", &li.localRank));
    C4_CHECK(envIntOpt("LOCAL_WORLD_SIZE", &li.localSize));
    const char* addr = envOf("MASTER_ADDR");
    const char* port = envOf("MASTER_PORT");
    if (!commId.empty()) {
      li.rootHostPort = commId;
    } else {
      if (!addr || !port)
        return makeError(Code::kInvalidUsage,
                         "torchrun launch (RANK, WORLD_SIZE set) but %s is not set (or set C4_COMM_ID)",
                         !addr ? "MASTER_ADDR" : "MASTER_PORT");
      int p = 0;
      C4_CHECK(envInt("MASTER_PORT", &p));
      if (p <= 0 || p >= 65535)
        return makeError(Code::kInvalidUsage, "MASTER_PORT=%d: the bootstrap root needs MASTER_PORT+1 to be a port", p);
      // MASTER_PORT itself belongs to torch's TCPStore.
      li.rootHostPort = bracketed(addr) + ":" + std::to_string(p + 1);
    }
    const char* runId = envOf("TORCHELASTIC_RUN_ID");
    li.jobKey = std::string("torchrun:") + (runId ? runId : "") + ":" + (addr ? addr : "") + ":" + (port ? port : "") +
                ":" + commId;
  } else if (envOf("OMPI_COMM_WORLD_RANK") || envOf("OMPI_COMM_WORLD_SIZE")) {
    li.launcher = "mpirun";
    C4_CHECK(envInt("OMPI_COMM_WORLD_RANK", &li.rank));
    C4_CHECK(envInt("OMPI_COMM_WORLD_SIZE", &li.nranks));
    C4_CHECK(envIntOpt("OMPI_COMM_WORLD_LOCAL_RANK", &li.localRank));
    C4_CHECK(envIntOpt("OMPI_COMM_WORLD_LOCAL_SIZE", &li.localSize));
    li.rootHostPort = commId;
    const char* job = envOf("OMPI_MCA_ess_base_jobid");
    if (!job) job = envOf("PMIX_NAMESPACE");
    if (!job) job = envOf("OMPI_MCA_orte_ess_jobid");
    if (job) li.jobKey = std::string("ompi:") + job;
  } else if (envOf("SLURM_PROCID") || envOf("SLURM_NTASKS")) {
    li.launcher = "slurm";
    C4_CHECK(envInt("SLURM_PROCID", &li.rank));
    if (envOf("SLURM_NTASKS"))
      C4_CHECK(envInt("SLURM_NTASKS", &li.nranks));
    else
      C4_CHECK(envInt("SLURM_NPROCS", &li.nranks));
    C4_CHECK(envIntOpt("SLURM_LOCALID", &li.localRank));
    int nodes = -1;
    if (envOf("SLURM_STEP_NUM_NODES"))
      C4_CHECK(envInt("SLURM_STEP_NUM_NODES", &nodes));
    else
      C4_CHECK(envIntOpt("SLURM_NNODES", &nodes));
    if (nodes == 1) li.localSize = li.nranks;
    li.rootHostPort = commId;
    const char* job = envOf("SLURM_JOB_ID");
    if (!job) job = envOf("SLURM_JOBID");
    const char* step = envOf("SLURM_STEP_ID");
    if (!step) step = envOf("SLURM_STEPID");
    if (job) li.jobKey = std::string("slurm:") + job + "." + (step ? step : "");
  } else {
    return makeError(Code::kInvalidUsage,
                     "no launcher recognized: set RANK and WORLD_SIZE (torchrun, with MASTER_ADDR/MASTER_PORT), "
                     "OMPI_COMM_WORLD_RANK and OMPI_COMM_WORLD_SIZE (Open MPI), or SLURM_PROCID and SLURM_NTASKS "
                     "(Slurm)");
  }
  if (li.nranks <= 0 || li.rank < 0 || li.rank >= li.nranks)
    return makeError(Code::kInvalidUsage, "%s: rank %d of %d is out of range", li.launcher.c_str(), li.rank, li.nranks);
  *out = li;
  return Status::ok();
}

Status uniqueIdFromLaunch(const LaunchInfo& info, int64_t timeoutMs, UniqueId* id) {
  if (id == nullptr) return makeError(Code::kInvalidArgument, "uniqueIdFromLaunch: id is null");
  if (info.nranks <= 0 || info.rank < 0 || info.rank >= info.nranks)
    return makeError(Code::kInvalidArgument, "uniqueIdFromLaunch: rank %d of %d is out of range", info.rank,
                     info.nranks);
  if (info.rootHostPort.empty() && info.jobKey.empty())
    return makeError(
        Code::kInvalidUsage,
        "%s: cannot identify the job (no job id in the environment) to rendezvous; set C4_COMM_ID=host:port "
        "(a free port on rank 0's host)",
        info.launcher.c_str());
  const int seq = nextLaunchSeq(info.jobKey);
  if (!info.rootHostPort.empty()) {
    const std::string secret = detail::secretEnv();
    const std::string seed = secret + "|" + info.jobKey + "#" + std::to_string(seq);
    return bootstrapUniqueIdForAddress(info.rootHostPort, seed, info.rank == 0, id);
  }
  if (info.localSize != info.nranks)
    return makeError(Code::kInvalidUsage,
                     "%s: the ranks are not all on one host (%d local of %d, or unknown), so they cannot rendezvous "
                     "through %s; set C4_COMM_ID=host:port (a free port on rank 0's host)",
                     info.launcher.c_str(), info.localSize, info.nranks, kRendezvousDir);
  const std::string path = detail::launchRendezvousPath(info.jobKey, seq);
  if (info.rank != 0) return waitRendezvous(info, path, timeoutMs, id);
  UniqueId fresh;
  C4_CHECK(detail::bootstrapEphemeralUniqueId(path, &fresh));
  C4_CHECK(writeRendezvous(path, fresh));
  *id = fresh;
  return Status::ok();
}

}  // namespace c4
