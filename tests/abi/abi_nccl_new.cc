// ABI runtime test of what NCCL added after 2.28 (2.29-2.32): a program built ONLY against NVIDIA's
// newest nccl.h (from the nvidia-nccl-cu13 wheel, tools/fetch_nccl_header.py) and linked against
// c4comm's libnccl.so.2. It forks N ranks plus one more process that joins through ncclCommGrow;
// rank 0 hands out the ids through pipes. Each rank checks the per-call-config collectives, windows
// with one-sided puts and signals, suspend/resume, the parameter API, encryption and growing, with
// their error paths. The parent only forks and waits with a deadline.
//
//   abi_nccl_new <nranks> [hosts]     (hosts: every process claims a host of its own, C4_HOSTID, so
//                                     that the ranks talk over tcp and the puts go through the network)
#include C4_NVIDIA_NCCL_H

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "abi_check.hpp"

static_assert(NCCL_VERSION_CODE >= 23200, "this test needs NCCL 2.32's header");

namespace {

using abi::gFailures;
using abi::gRank;
using abi::readAll;
using abi::writeAll;

#define EXPECT_RES(call, want)                                                                                         \
  do {                                                                                                                 \
    ncclResult_t r_ = (call);                                                                                          \
    EXPECT(r_ == (want), "%s -> %d, expected %s (%s)", #call, static_cast<int>(r_), #want, ncclGetLastError(nullptr)); \
  } while (0)

const cudaStream_t kNoStream = nullptr;

// ---- nccl*Config: the results of the plain calls; the options NCCL's rules refuse ---------------
void testCollConfig(ncclComm_t comm, int rank, int n) {
  ncclCollConfig_t cfg = NCCL_COLLCONFIG_INITIALIZER;
  const ncclCollConfig_t* cfgs[2] = {nullptr, &cfg};
  for (const ncclCollConfig_t* c : cfgs) {
    const int count = 5;
    std::vector<int> in(count * n), out(count * n, -1);
    for (int i = 0; i < count * n; ++i) in[i] = rank * 100 + i;
    NCCL_OK(ncclAllReduceConfig(in.data(), out.data(), count, ncclInt32, ncclSum, comm, kNoStream, c));
    for (int i = 0; i < count; ++i) EXPECT(out[i] == 100 * n * (n - 1) / 2 + n * i, "allreduce[%d] = %d", i, out[i]);
    NCCL_OK(ncclBroadcastConfig(in.data(), out.data(), count, ncclInt32, n - 1, comm, kNoStream, c));
    for (int i = 0; i < count; ++i) EXPECT(out[i] == (n - 1) * 100 + i, "broadcast[%d] = %d", i, out[i]);
    NCCL_OK(ncclReduceConfig(in.data(), out.data(), count, ncclInt32, ncclMax, 0, comm, kNoStream, c));
    if (rank == 0)
      for (int i = 0; i < count; ++i) EXPECT(out[i] == (n - 1) * 100 + i, "reduce[%d] = %d", i, out[i]);
    NCCL_OK(ncclAllGatherConfig(in.data(), out.data(), count, ncclInt32, comm, kNoStream, c));
    for (int r = 0; r < n; ++r)
      for (int i = 0; i < count; ++i)
        EXPECT(out[r * count + i] == r * 100 + i, "allgather[%d] = %d", r * count + i, out[r * count + i]);
    NCCL_OK(ncclReduceScatterConfig(in.data(), out.data(), count, ncclInt32, ncclSum, comm, kNoStream, c));
    for (int i = 0; i < count; ++i)
      EXPECT(out[i] == 100 * n * (n - 1) / 2 + n * (rank * count + i), "reducescatter[%d] = %d", i, out[i]);
    NCCL_OK(ncclAlltoAllConfig(in.data(), out.data(), count, ncclInt32, comm, kNoStream, c));
    for (int r = 0; r < n; ++r)
      for (int i = 0; i < count; ++i)
        EXPECT(out[r * count + i] == r * 100 + rank * count + i, "alltoall[%d] = %d", r * count + i,
               out[r * count + i]);
    NCCL_OK(ncclGatherConfig(in.data(), out.data(), count, ncclInt32, 1 % n, comm, kNoStream, c));
    if (rank == 1 % n)
      for (int r = 0; r < n; ++r) EXPECT(out[r * count] == r * 100, "gather[%d] = %d", r * count, out[r * count]);
    NCCL_OK(ncclScatterConfig(in.data(), out.data(), count, ncclInt32, 0, comm, kNoStream, c));
    for (int i = 0; i < count; ++i) EXPECT(out[i] == rank * count + i, "scatter[%d] = %d", i, out[i]);
  }
  int x = 1, y = 0;
  ncclCollConfig_t bad = cfg;
  bad.magic = 0;
  EXPECT_RES(ncclAllReduceConfig(&x, &y, 1, ncclInt32, ncclSum, comm, kNoStream, &bad), ncclInvalidArgument);
  bad = cfg;
  bad.minCTAs = 8;
  bad.maxCTAs = 2;
  EXPECT_RES(ncclAllReduceConfig(&x, &y, 1, ncclInt32, ncclSum, comm, kNoStream, &bad), ncclInvalidArgument);
  bad = cfg;
  bad.algSelection = "ring";
  EXPECT_RES(ncclAllReduceConfig(&x, &y, 1, ncclInt32, ncclSum, comm, kNoStream, &bad), ncclInvalidUsage);
  EXPECT(strstr(ncclGetLastError(comm), "algSelection") != nullptr, "last error '%s'", ncclGetLastError(comm));
  bad.forceAlgSelection = 0;  // a wish, not a requirement: runs with the tuner's choice
  NCCL_OK(ncclAllReduceConfig(&x, &y, 1, ncclInt32, ncclSum, comm, kNoStream, &bad));
  EXPECT(y == n, "allreduce with a non-forced algSelection = %d", y);
  // Vendor options of other libraries are ignored, as NVIDIA's library ignores every one.
  ncclConfigExt_t ext2 = {nullptr, {0x123456, 2}, {0}};
  ncclConfigExt_t ext1 = {&ext2, {0x123456, 1}, {0}};
  ext1.val.i = 7;
  ncclCollConfig_t withExt = cfg;
  withExt.ext = &ext1;
  withExt.userProfilerTag = 42;
  NCCL_OK(ncclAllReduceConfig(&x, &y, 1, ncclInt32, ncclSum, comm, kNoStream, &withExt));
  EXPECT(y == n, "allreduce with vendor options = %d", y);
}

// ---- windows, ncclPutSignal / ncclSignal / ncclWaitSignal ----------------------------------------
void testOneSided(ncclComm_t comm, int rank, int n) {
  const size_t kBlock = 1000;  // floats each rank puts into each peer's window
  const size_t bytes = kBlock * sizeof(float) * static_cast<size_t>(n);
  float* win = nullptr;
  NCCL_OK(ncclMemAlloc(reinterpret_cast<void**>(&win), bytes));
  float* src = nullptr;
  NCCL_OK(ncclMemAlloc(reinterpret_cast<void**>(&src), kBlock * sizeof(float)));
  for (size_t i = 0; i < kBlock; ++i) src[i] = static_cast<float>(rank * 10000 + static_cast<int>(i));
  ncclWindow_t w = nullptr;
  NCCL_OK(ncclCommWindowRegister(comm, win, bytes, &w, NCCL_WIN_COLL_SYMMETRIC));
  void* user = nullptr;
  NCCL_OK(ncclWinGetUserPtr(comm, w, &user));
  EXPECT(user == win, "ncclWinGetUserPtr = %p, registered %p", user, static_cast<void*>(win));

  for (int round = 0; round < 3; ++round) {
    // Every rank writes its block into every rank's window (itself included), at its own slot.
    NCCL_OK(ncclGroupStart());
    for (int p = 0; p < n; ++p)
      NCCL_OK(ncclPutSignal(src, kBlock, ncclFloat32, p, w, static_cast<size_t>(rank) * kBlock * sizeof(float), 0, 0, 0,
                            comm, kNoStream));
    NCCL_OK(ncclGroupEnd());
    std::vector<ncclWaitSignalDesc_t> descs;
    for (int p = 0; p < n; ++p) descs.push_back(ncclWaitSignalDesc_t{1, p, 0, 0});
    NCCL_OK(ncclWaitSignal(n, descs.data(), comm, kNoStream));
    int shown = 0;
    for (int p = 0; p < n; ++p)
      for (size_t i = 0; i < kBlock; ++i) {
        const float want = static_cast<float>(p * 10000 + static_cast<int>(i) + round);
        const float got = win[static_cast<size_t>(p) * kBlock + i];
        if (got != want && shown++ < 5)
          EXPECT(false, "round %d: window[%d][%zu] = %g, expected %g", round, p, i, got, want);
      }
    for (size_t i = 0; i < kBlock; ++i) src[i] += 1.f;
    // No rank overwrites a window before its owner read it: a signal round (a barrier).
    for (int p = 0; p < n; ++p) NCCL_OK(ncclSignal(p, 0, 0, 0, comm, kNoStream));
    NCCL_OK(ncclWaitSignal(n, descs.data(), comm, kNoStream));
  }
  // A zero-byte put only signals.
  const int next = (rank + 1) % n, prev = (rank + n - 1) % n;
  NCCL_OK(ncclPutSignal(src, 0, ncclFloat32, next, w, 0, 0, 0, 0, comm, kNoStream));
  ncclWaitSignalDesc_t fromPrev = {1, prev, 0, 0};
  NCCL_OK(ncclWaitSignal(1, &fromPrev, comm, kNoStream));

  // Bad input: refused before anything is written.
  EXPECT_RES(ncclPutSignal(src, kBlock, ncclFloat32, next, w, bytes - 4, 0, 0, 0, comm, kNoStream),
             ncclInvalidArgument);
  EXPECT_RES(ncclPutSignal(src, kBlock, ncclFloat32, n, w, 0, 0, 0, 0, comm, kNoStream), ncclInvalidArgument);
  EXPECT_RES(ncclPutSignal(src, kBlock, ncclFloat32, next, w, 0, 1, 0, 0, comm, kNoStream), ncclInvalidArgument);
  EXPECT_RES(ncclPutSignal(src, kBlock, ncclFloat32, next, w, 0, 0, 1, 0, comm, kNoStream), ncclInvalidArgument);
  EXPECT_RES(ncclPutSignal(src, kBlock, ncclFloat32, next, w, 0, 0, 0, 4, comm, kNoStream), ncclInvalidArgument);
  EXPECT_RES(ncclPutSignal(src, kBlock, static_cast<ncclDataType_t>(77), next, w, 0, 0, 0, 0, comm, kNoStream),
             ncclInvalidArgument);
  int bogus = 0;
  EXPECT_RES(
      ncclPutSignal(src, 1, ncclFloat32, next, reinterpret_cast<ncclWindow_t>(&bogus), 0, 0, 0, 0, comm, kNoStream),
      ncclInvalidArgument);
  EXPECT_RES(ncclSignal(-1, 0, 0, 0, comm, kNoStream), ncclInvalidArgument);
  ncclWaitSignalDesc_t badDesc = {1, n + 3, 0, 0};
  EXPECT_RES(ncclWaitSignal(1, &badDesc, comm, kNoStream), ncclInvalidArgument);
  badDesc = ncclWaitSignalDesc_t{-1, prev, 0, 0};
  EXPECT_RES(ncclWaitSignal(1, &badDesc, comm, kNoStream), ncclInvalidArgument);
  EXPECT_RES(ncclWaitSignal(1, nullptr, comm, kNoStream), ncclInvalidArgument);
  NCCL_OK(ncclWaitSignal(0, nullptr, comm, kNoStream));  // nothing to wait for

  NCCL_OK(ncclCommWindowDeregister(comm, w));
  EXPECT_RES(ncclWinGetUserPtr(comm, w, &user), ncclInvalidArgument);
  // A window must be ncclMemAlloc memory, on every rank: all of them fail alike.
  std::vector<float> heap(16);
  EXPECT_RES(ncclCommWindowRegister(comm, heap.data(), 64, &w, NCCL_WIN_DEFAULT), ncclInvalidArgument);
  EXPECT_RES(ncclCommWindowRegister(comm, win, bytes, &w, 0x100), ncclInvalidArgument);
  NCCL_OK(ncclMemFree(src));
  NCCL_OK(ncclMemFree(win));
}

// ---- ncclCommSuspend / ncclCommResume / ncclCommMemStats -----------------------------------------
void testSuspend(ncclComm_t comm, int n) {
  uint64_t v = 99;
  NCCL_OK(ncclCommMemStats(comm, ncclStatGpuMemSuspended, &v));
  EXPECT(v == 0, "suspended = %llu before suspend", static_cast<unsigned long long>(v));
  NCCL_OK(ncclCommSuspend(comm, NCCL_SUSPEND_MEM));
  NCCL_OK(ncclCommMemStats(comm, ncclStatGpuMemSuspended, &v));
  EXPECT(v == 1, "suspended = %llu after suspend", static_cast<unsigned long long>(v));
  NCCL_OK(ncclCommMemStats(comm, ncclStatGpuMemTotal, &v));
  EXPECT(v == 0, "GPU memory total %llu (c4comm holds none)", static_cast<unsigned long long>(v));
  int x = 1, y = 0;
  EXPECT_RES(ncclAllReduce(&x, &y, 1, ncclInt32, ncclSum, comm, kNoStream), ncclInvalidUsage);
  EXPECT(strstr(ncclGetLastError(comm), "suspended") != nullptr, "last error '%s'", ncclGetLastError(comm));
  int count = 0;
  NCCL_OK(ncclCommCount(comm, &count));  // queries still answer
  NCCL_OK(ncclCommResume(comm));
  EXPECT_RES(ncclCommResume(comm), ncclInvalidUsage);
  NCCL_OK(ncclAllReduce(&x, &y, 1, ncclInt32, ncclSum, comm, kNoStream));
  EXPECT(y == n, "allreduce after resume = %d", y);
  EXPECT_RES(ncclCommSuspend(comm, 0x80), ncclInvalidArgument);
  EXPECT_RES(ncclCommMemStats(comm, static_cast<ncclCommMemStat_t>(9), &v), ncclInvalidArgument);
  EXPECT_RES(ncclCommMemStats(comm, ncclStatGpuMemTotal, nullptr), ncclInvalidArgument);
}

// ---- the parameter API: every key binds and reads ------------------------------------------------
void testParams() {
  const char** keys = nullptr;
  int nkeys = 0;
  NCCL_OK(ncclParamGetAllParameterKeys(&keys, &nkeys));
  EXPECT(nkeys > 20, "only %d parameter keys", nkeys);
  bool sawTimeout = false, sawNccl = false;
  for (int i = 0; i < nkeys; ++i) {
    std::string key = keys[i];
    sawTimeout |= key == "C4_TIMEOUT";
    sawNccl |= key.rfind("NCCL_", 0) == 0;
    ncclParamHandle_t h = nullptr;
    NCCL_OK(ncclParamBind(&h, key.c_str()));
    const char* text = nullptr;
    NCCL_OK(ncclParamGetStr(h, &text));
    const char* value = nullptr;
    int len = -1;
    NCCL_OK(ncclParamGetParameter(key.c_str(), &value, &len));
    EXPECT(std::string(value) == text && len == static_cast<int>(strlen(value)), "%s: '%s' (%d) vs '%s'", key.c_str(),
           value, len, text);
  }
  EXPECT(sawTimeout && sawNccl, "keys lack C4_TIMEOUT or NCCL_ names");
  setenv("C4_TIMEOUT", "123", 1);
  ncclParamHandle_t h = nullptr;
  NCCL_OK(ncclParamBind(&h, "C4_TIMEOUT"));
  ncclParamHandle_t h2 = nullptr;
  NCCL_OK(ncclParamBind(&h2, "C4_TIMEOUT"));
  EXPECT(h == h2, "two handles for one key");
  int64_t i64 = 0;
  NCCL_OK(ncclParamGetI64(h, &i64));
  EXPECT(i64 == 123, "C4_TIMEOUT = %lld", static_cast<long long>(i64));
  uint8_t u8 = 0;
  NCCL_OK(ncclParamGetU8(h, &u8));
  EXPECT(u8 == 123, "C4_TIMEOUT as u8 = %u", u8);
  setenv("C4_TIMEOUT", "1000", 1);
  int8_t i8 = 0;
  EXPECT_RES(ncclParamGetI8(h, &i8), ncclInvalidArgument);  // does not fit
  int16_t i16 = 0;
  NCCL_OK(ncclParamGetI16(h, &i16));
  EXPECT(i16 == 1000, "as i16 = %d", i16);
  unsetenv("C4_TIMEOUT");
  char raw[8];
  int len = 0;
  NCCL_OK(ncclParamGet(h, raw, sizeof(raw), &len));
  EXPECT(len == 8, "raw length %d", len);
  EXPECT_RES(ncclParamGet(h, raw, 4, &len), ncclInvalidArgument);
  const char* text = nullptr;
  int tlen = 0;
  NCCL_OK(ncclParamGetParameter("NCCL_DEBUG", &text, &tlen));  // an NCCL_ alias binds too
  ncclParamHandle_t none = nullptr;
  EXPECT_RES(ncclParamBind(&none, "NCCL_NO_SUCH_PARAMETER"), ncclInvalidArgument);
  EXPECT(none == nullptr, "a handle for an unknown key");
  EXPECT_RES(ncclParamBind(nullptr, "C4_TIMEOUT"), ncclInvalidArgument);
  EXPECT_RES(ncclParamGetI32(nullptr, reinterpret_cast<int32_t*>(raw)), ncclInvalidArgument);
  ncclParamDumpAll();
}

void testEncryption() {
  ncclEncryptionConfig_t cfg = NCCL_ENCRYPTION_CONFIG_INITIALIZER;
  NCCL_OK(ncclSetEncryption(&cfg));  // plaintext: what c4comm does
  cfg.mode = NCCL_ENCRYPTION_MODE_PSK;
  cfg.psk = "0123456789abcdef";
  EXPECT_RES(ncclSetEncryption(&cfg), ncclInvalidUsage);
  EXPECT(strstr(ncclGetLastError(nullptr), "not implemented") != nullptr, "last error '%s'", ncclGetLastError(nullptr));
  cfg.magic = 1;
  EXPECT_RES(ncclSetEncryption(&cfg), ncclInvalidArgument);
  EXPECT_RES(ncclSetEncryption(nullptr), ncclInvalidArgument);
}

struct Pipes {
  int idOut = -1, idIn = -1;      // rank 0 -> ranks 1..n-1: the unique id
  int growOut = -1, growIn = -1;  // rank 0 -> the new process: the grow id
};

void runInitial(int rank, int n, const Pipes& p) {
  ncclUniqueId id;
  if (rank == 0) {
    NCCL_OK(ncclGetUniqueId(&id));
    for (int r = 1; r < n; ++r)
      if (!writeAll(p.idOut, &id, sizeof(id))) EXPECT(false, "pipe write");
  } else if (!readAll(p.idIn, &id, sizeof(id))) {
    EXPECT(false, "pipe read");
    return;
  }
  ncclComm_t comm = nullptr;
  NCCL_OK(ncclCommInitRank(&comm, n, id, rank));
  int version = 0;
  NCCL_OK(ncclGetVersion(&version));
  EXPECT(version == NCCL_VERSION_CODE, "ncclGetVersion = %d, header %d", version, NCCL_VERSION_CODE);
  EXPECT(strcmp(ncclGetErrorString(ncclTimeout), "timeout") == 0, "ncclTimeout: '%s'", ncclGetErrorString(ncclTimeout));
  testCollConfig(comm, rank, n);
  testOneSided(comm, rank, n);
  testSuspend(comm, n);
  testParams();
  testEncryption();

  // Grow by one rank: rank 0 makes the id (one at a time) and hands it to the new process.
  ncclUniqueId gid;
  ncclComm_t big = nullptr;
  if (rank == 0) {
    NCCL_OK(ncclCommGetUniqueId(comm, &gid));
    ncclUniqueId again;
    EXPECT_RES(ncclCommGetUniqueId(comm, &again), ncclInvalidUsage);
    if (!writeAll(p.growOut, &gid, sizeof(gid))) EXPECT(false, "pipe write");
    NCCL_OK(ncclCommGrow(comm, n + 1, &gid, -1, &big, nullptr));
  } else {
    EXPECT_RES(ncclCommGrow(comm, n + 1, nullptr, 2, &big, nullptr), ncclInvalidArgument);  // local: rank must be -1
    NCCL_OK(ncclCommGrow(comm, n + 1, nullptr, -1, &big, nullptr));
  }
  int bn = 0, br = -1;
  NCCL_OK(ncclCommCount(big, &bn));
  NCCL_OK(ncclCommUserRank(big, &br));
  EXPECT(bn == n + 1 && br == rank, "grown communicator: rank %d of %d", br, bn);
  int x = rank, sum = -1;
  NCCL_OK(ncclAllReduce(&x, &sum, 1, ncclInt32, ncclSum, big, kNoStream));
  EXPECT(sum == n * (n + 1) / 2, "allreduce on the grown communicator = %d", sum);
  NCCL_OK(ncclAllReduce(&x, &sum, 1, ncclInt32, ncclSum, comm, kNoStream));  // the parent still works
  EXPECT(sum == n * (n - 1) / 2, "allreduce on the parent = %d", sum);
  NCCL_OK(ncclCommDestroy(big));
  NCCL_OK(ncclCommDestroy(comm));
}

void runNewRank(int n, const Pipes& p) {
  ncclUniqueId gid;
  if (!readAll(p.growIn, &gid, sizeof(gid))) {
    EXPECT(false, "pipe read");
    return;
  }
  ncclComm_t big = nullptr;
  EXPECT_RES(ncclCommGrow(nullptr, n + 1, nullptr, n, &big, nullptr), ncclInvalidArgument);  // needs the id
  NCCL_OK(ncclCommGrow(nullptr, n + 1, &gid, n, &big, nullptr));
  int x = n, sum = -1;
  NCCL_OK(ncclAllReduce(&x, &sum, 1, ncclInt32, ncclSum, big, kNoStream));
  EXPECT(sum == n * (n + 1) / 2, "allreduce on the grown communicator = %d", sum);
  NCCL_OK(ncclCommDestroy(big));
}

}  // namespace

int main(int argc, char** argv) {
  const int n = argc > 1 ? atoi(argv[1]) : 3;
  const bool hosts = argc > 2 && std::string(argv[2]) == "hosts";
  if (n < 1 || n > 32 || (argc > 2 && !hosts)) {
    fprintf(stderr, "usage: %s <nranks 1..32> [hosts]\n", argv[0]);
    return 2;
  }
  int idPipe[2], growPipe[2];
  if (pipe(idPipe) != 0 || pipe(growPipe) != 0) {
    perror("pipe");
    return 1;
  }
  std::vector<pid_t> pids;
  for (int r = 0; r <= n; ++r) {  // r == n: the process that joins through ncclCommGrow
    pid_t pid = fork();
    if (pid < 0) {
      perror("fork");
      for (pid_t q : pids) kill(q, SIGKILL);
      return 1;
    }
    if (pid == 0) {
      gRank = r;
      if (hosts) setenv("C4_HOSTID", std::to_string(500 + r).c_str(), 1);
      Pipes p;
      p.idOut = idPipe[1];
      p.idIn = idPipe[0];
      p.growOut = growPipe[1];
      p.growIn = growPipe[0];
      if (r < n) {
        runInitial(r, n, p);
      } else {
        runNewRank(n, p);
      }
      _exit(gFailures ? 1 : 0);
    }
    pids.push_back(pid);
  }
  close(idPipe[0]);
  close(idPipe[1]);
  close(growPipe[0]);
  close(growPipe[1]);
  const int kDeadlineSec = 120;
  int failed = 0, left = n + 1;
  for (int waited = 0; left > 0 && waited < kDeadlineSec * 10;) {
    int status = 0;
    pid_t pid = waitpid(-1, &status, WNOHANG);
    if (pid > 0) {
      --left;
      if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
        fprintf(stderr, "process %d failed (status 0x%x)\n", static_cast<int>(pid), status);
        ++failed;
      }
      continue;
    }
    usleep(100000);
    ++waited;
  }
  if (left > 0) {
    fprintf(stderr, "FAIL: %d process(es) still running after %d s (a hang); killing them\n", left, kDeadlineSec);
    for (pid_t q : pids) kill(q, SIGKILL);
    while (waitpid(-1, nullptr, 0) > 0) {
    }
    return 1;
  }
  if (failed) return 1;
  printf("abi_nccl_new: %d ranks + 1 grown%s: ok\n", n, hosts ? ", one host each" : "");
  return 0;
}
