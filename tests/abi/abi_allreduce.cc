// ABI runtime test: a program built ONLY against NVIDIA's nccl.h and linked against c4comm's
// libnccl.so.2. It forks N ranks (argv[1]); rank 0 creates the unique id and pipes it to the others;
// each rank runs the collectives on host memory with a null stream and checks every result, then
// the error paths. The parent only forks, waits (with a deadline) and collects exit codes.
//
//   abi_allreduce <nranks> [<expected path of libnccl.so.2>]
#include C4_NVIDIA_NCCL_H

#include <dlfcn.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "abi_check.hpp"

namespace {

using abi::gFailures;
using abi::gRank;
using abi::readAll;
using abi::writeAll;

const cudaStream_t kNoStream = nullptr;

void checkFloats(const char* what, const std::vector<float>& got, const std::vector<float>& want) {
  int shown = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    if (got[i] != want[i] && shown++ < 5) EXPECT(false, "%s[%zu] = %g, expected %g", what, i, got[i], want[i]);
  }
}

void testCollectives(ncclComm_t comm, int rank, int n) {
  int count = -1, me = -1, dev = -2;
  NCCL_OK(ncclCommCount(comm, &count));
  NCCL_OK(ncclCommUserRank(comm, &me));
  NCCL_OK(ncclCommCuDevice(comm, &dev));
  EXPECT(count == n, "ncclCommCount = %d, expected %d", count, n);
  EXPECT(me == rank, "ncclCommUserRank = %d, expected %d", me, rank);

  // AllReduce, float sum, out of place then in place.
  const size_t kCount = 1027;  // odd, not a multiple of anything
  std::vector<float> send(kCount), recv(kCount, -1.f), want(kCount);
  for (size_t i = 0; i < kCount; ++i) {
    send[i] = static_cast<float>((rank + 1) * (i % 7 + 1));
    want[i] = static_cast<float>(n * (n + 1) / 2 * (i % 7 + 1));
  }
  NCCL_OK(ncclAllReduce(send.data(), recv.data(), kCount, ncclFloat, ncclSum, comm, kNoStream));
  checkFloats("allreduce", recv, want);
  std::vector<float> inplace = send;
  NCCL_OK(ncclAllReduce(inplace.data(), inplace.data(), kCount, ncclFloat32, ncclSum, comm, kNoStream));
  checkFloats("allreduce in place", inplace, want);
  // The profiling twin is the same function.
  std::vector<float> twin(kCount, -1.f);
  NCCL_OK(pncclAllReduce(send.data(), twin.data(), kCount, ncclFloat, ncclSum, comm, kNoStream));
  checkFloats("pncclAllReduce", twin, want);
  // Max over int32.
  int mine = 10 * rank + 3, best = -1;
  NCCL_OK(ncclAllReduce(&mine, &best, 1, ncclInt32, ncclMax, comm, kNoStream));
  EXPECT(best == 10 * (n - 1) + 3, "allreduce max = %d, expected %d", best, 10 * (n - 1) + 3);
  // Zero elements is legal and a no-op.
  NCCL_OK(ncclAllReduce(nullptr, nullptr, 0, ncclFloat, ncclSum, comm, kNoStream));

  // AllGather: rank r contributes r*100 + j.
  const size_t kGather = 5;
  std::vector<float> gsend(kGather), grecv(kGather * n, -1.f), gwant(kGather * n);
  for (size_t j = 0; j < kGather; ++j) gsend[j] = static_cast<float>(rank * 100 + j);
  for (int r = 0; r < n; ++r)
    for (size_t j = 0; j < kGather; ++j) gwant[r * kGather + j] = static_cast<float>(r * 100 + j);
  NCCL_OK(ncclAllGather(gsend.data(), grecv.data(), kGather, ncclFloat, comm, kNoStream));
  checkFloats("allgather", grecv, gwant);

  // Broadcast from the last rank, then the in-place ncclBcast from rank 0.
  const int root = n - 1;
  std::vector<float> bsend(kCount), brecv(kCount, -1.f), bwant(kCount);
  for (size_t i = 0; i < kCount; ++i) {
    bsend[i] = rank == root ? static_cast<float>(i) * 0.5f : -7.f;
    bwant[i] = static_cast<float>(i) * 0.5f;
  }
  NCCL_OK(ncclBroadcast(bsend.data(), brecv.data(), kCount, ncclFloat, root, comm, kNoStream));
  checkFloats("broadcast", brecv, bwant);
  std::vector<float> bbuf(kCount);
  for (size_t i = 0; i < kCount; ++i) bbuf[i] = rank == 0 ? static_cast<float>(i) + 1.f : 0.f;
  for (size_t i = 0; i < kCount; ++i) bwant[i] = static_cast<float>(i) + 1.f;
  NCCL_OK(ncclBcast(bbuf.data(), kCount, ncclFloat, 0, comm, kNoStream));
  checkFloats("bcast", bbuf, bwant);

  // ReduceScatter: element k of rank r's input is r*1000 + k; rank i gets block i of the sum.
  const size_t kBlock = 3;
  std::vector<float> rsend(kBlock * n), rrecv(kBlock, -1.f), rwant(kBlock);
  for (size_t k = 0; k < kBlock * n; ++k) rsend[k] = static_cast<float>(rank * 1000 + k);
  for (size_t j = 0; j < kBlock; ++j) {
    float s = 0;
    for (int r = 0; r < n; ++r) s += static_cast<float>(r * 1000 + rank * kBlock + j);
    rwant[j] = s;
  }
  NCCL_OK(ncclReduceScatter(rsend.data(), rrecv.data(), kBlock, ncclFloat, ncclSum, comm, kNoStream));
  checkFloats("reducescatter", rrecv, rwant);

  // Send/Recv around a ring, in a group so that the sends and receives progress together.
  const size_t kP2p = 257;
  const int next = (rank + 1) % n, prev = (rank + n - 1) % n;
  std::vector<float> psend(kP2p), precv(kP2p, -1.f), pwant(kP2p);
  for (size_t i = 0; i < kP2p; ++i) {
    psend[i] = static_cast<float>(rank * 10000 + i);
    pwant[i] = static_cast<float>(prev * 10000 + i);
  }
  NCCL_OK(ncclGroupStart());
  NCCL_OK(ncclSend(psend.data(), kP2p, ncclFloat, next, comm, kNoStream));
  NCCL_OK(ncclRecv(precv.data(), kP2p, ncclFloat, prev, comm, kNoStream));
  NCCL_OK(ncclGroupEnd());
  checkFloats("send/recv ring", precv, pwant);

  // Reduce (sum to root 0), AlltoAll, Gather (to the last rank), Scatter (from rank 0).
  std::vector<float> red(kCount, -1.f);
  NCCL_OK(ncclReduce(send.data(), rank == 0 ? red.data() : nullptr, kCount, ncclFloat, ncclSum, 0, comm, kNoStream));
  if (rank == 0) checkFloats("reduce", red, want);
  std::vector<float> asend(n * 2), arecv(n * 2, -1.f), awant(n * 2);
  for (int j = 0; j < n; ++j)
    for (int e = 0; e < 2; ++e) {
      asend[j * 2 + e] = static_cast<float>(rank * 100 + j * 10 + e);  // to rank j
      awant[j * 2 + e] = static_cast<float>(j * 100 + rank * 10 + e);  // from rank j
    }
  NCCL_OK(ncclAlltoAll(asend.data(), arecv.data(), 2, ncclFloat, comm, kNoStream));
  checkFloats("alltoall", arecv, awant);
  std::vector<float> grecv2(kGather * n, -1.f);
  NCCL_OK(ncclGather(gsend.data(), rank == root ? grecv2.data() : nullptr, kGather, ncclFloat, root, comm, kNoStream));
  if (rank == root) checkFloats("gather", grecv2, gwant);
  std::vector<float> srecv(kGather, -1.f), swant(gsend.begin(), gsend.end());
  NCCL_OK(ncclScatter(rank == 0 ? gwant.data() : nullptr, srecv.data(), kGather, ncclFloat, 0, comm, kNoStream));
  checkFloats("scatter", srecv, swant);

  // Split into even and odd ranks (config NULL: inherit) and reduce within each half.
  ncclComm_t half = nullptr;
  NCCL_OK(ncclCommSplit(comm, rank % 2, rank, &half, nullptr));
  EXPECT(half != nullptr, "ncclCommSplit returned a NULL communicator");
  if (half != nullptr) {
    int hn = 0, hr = -1, v = rank, sum = -1, expect = 0;
    NCCL_OK(ncclCommCount(half, &hn));
    NCCL_OK(ncclCommUserRank(half, &hr));
    for (int r = rank % 2; r < n; r += 2) expect += r;
    EXPECT(hn == (n - rank % 2 + 1) / 2, "split size %d", hn);
    EXPECT(hr == rank / 2, "split rank %d, expected %d", hr, rank / 2);
    NCCL_OK(ncclAllReduce(&v, &sum, 1, ncclInt, ncclSum, half, kNoStream));
    EXPECT(sum == expect, "split allreduce = %d, expected %d", sum, expect);
    NCCL_OK(ncclCommDestroy(half));
  }

  // Shrink: every rank but 0 (which does not call) makes a communicator without rank 0.
  ncclComm_t rest = nullptr;
  EXPECT(ncclCommShrink(comm, nullptr, 0, &rest, nullptr, 0x7) == ncclInvalidArgument, "bad shrinkFlags accepted");
  if (n > 1 && rank > 0) {
    int zero[] = {0};
    NCCL_OK(ncclCommShrink(comm, zero, 1, &rest, nullptr, NCCL_SHRINK_DEFAULT));
    EXPECT(rest != nullptr, "ncclCommShrink returned a NULL communicator");
    if (rest != nullptr) {
      int rn = 0, rr = -1, v = rank, sum = -1;
      NCCL_OK(ncclCommCount(rest, &rn));
      NCCL_OK(ncclCommUserRank(rest, &rr));
      EXPECT(rn == n - 1 && rr == rank - 1, "shrunk rank/size %d/%d", rr, rn);
      NCCL_OK(ncclAllReduce(&v, &sum, 1, ncclInt, ncclSum, rest, kNoStream));
      EXPECT(sum == n * (n - 1) / 2, "shrunk allreduce = %d", sum);
      NCCL_OK(ncclCommDestroy(rest));
    }
  }

  // Registration and ncclMemAlloc: host memory is accepted as is; an AllReduce on ncclMemAlloc
  // buffers (zero-copy when the ranks share the host) gives the same result.
  const size_t kMemCount = 16384;
  void* mem = nullptr;
  NCCL_OK(ncclMemAlloc(&mem, kMemCount * sizeof(float)));
  EXPECT(mem != nullptr && reinterpret_cast<uintptr_t>(mem) % 4096 == 0, "ncclMemAlloc gave %p", mem);
  void* handle = nullptr;
  NCCL_OK(ncclCommRegister(comm, mem, kMemCount * sizeof(float), &handle));
  EXPECT(handle != nullptr, "ncclCommRegister gave a NULL handle");
  ncclWindow_t win = nullptr;
  NCCL_OK(ncclCommWindowRegister(comm, mem, kMemCount * sizeof(float), &win, NCCL_WIN_COLL_SYMMETRIC));
  EXPECT(win != nullptr, "ncclCommWindowRegister gave a NULL window");
  float* fm = static_cast<float*>(mem);
  for (size_t i = 0; i < kMemCount; ++i) fm[i] = static_cast<float>(rank + i % 7);
  NCCL_OK(ncclAllReduce(fm, fm, kMemCount, ncclFloat, ncclSum, comm, kNoStream));
  for (size_t i = 0; i < kMemCount; ++i) {
    float want = static_cast<float>(n * (n - 1) / 2 + n * static_cast<int>(i % 7));
    if (fm[i] != want) {
      EXPECT(false, "ncclMemAlloc allreduce element %zu = %g, expected %g", i, fm[i], want);
      break;
    }
  }
  NCCL_OK(ncclCommWindowDeregister(comm, win));
  NCCL_OK(ncclCommDeregister(comm, handle));
  NCCL_OK(ncclMemFree(mem));

  ncclResult_t async = ncclInternalError;
  NCCL_OK(ncclCommGetAsyncError(comm, &async));
  EXPECT(async == ncclSuccess, "async error %d", static_cast<int>(async));
}

void testErrors(ncclComm_t comm) {
  float x = 1, y = 0;
  ncclResult_t r = ncclAllReduce(&x, &y, 1, ncclFloat, ncclSum, nullptr, kNoStream);
  EXPECT(r == ncclInvalidArgument, "null comm -> %d, expected ncclInvalidArgument", static_cast<int>(r));
  EXPECT(strlen(ncclGetLastError(nullptr)) > 0, "no last error text after a null comm");
  r = ncclAllReduce(&x, &y, 1, static_cast<ncclDataType_t>(99), ncclSum, comm, kNoStream);
  EXPECT(r == ncclInvalidArgument, "bad dtype -> %d, expected ncclInvalidArgument", static_cast<int>(r));
  EXPECT(strstr(ncclGetLastError(comm), "99") != nullptr, "last error does not name the type: '%s'",
         ncclGetLastError(comm));
  r = ncclAllReduce(&x, &y, 1, ncclFloat, static_cast<ncclRedOp_t>(-1), comm, kNoStream);
  EXPECT(r == ncclInvalidArgument, "bad op -> %d", static_cast<int>(r));
  r = ncclAllReduce(nullptr, &y, 1, ncclFloat, ncclSum, comm, kNoStream);
  EXPECT(r == ncclInvalidArgument, "null sendbuff -> %d", static_cast<int>(r));
  r = ncclBroadcast(&x, &y, 1, ncclFloat, 1 << 20, comm, kNoStream);
  EXPECT(r == ncclInvalidArgument, "bad root -> %d", static_cast<int>(r));
  r = ncclSend(&x, 1, ncclFloat, -1, comm, kNoStream);
  EXPECT(r == ncclInvalidArgument, "bad peer -> %d", static_cast<int>(r));
  int n = 0;
  r = ncclCommCount(nullptr, &n);
  EXPECT(r == ncclInvalidArgument, "ncclCommCount(NULL) -> %d", static_cast<int>(r));
  r = ncclCommCount(comm, nullptr);
  EXPECT(r == ncclInvalidArgument, "ncclCommCount(comm, NULL) -> %d", static_cast<int>(r));
  r = ncclGetVersion(nullptr);
  EXPECT(r == ncclInvalidArgument, "ncclGetVersion(NULL) -> %d", static_cast<int>(r));
  void* h = nullptr;
  r = ncclCommRegister(comm, nullptr, 16, &h);
  EXPECT(r == ncclInvalidArgument, "ncclCommRegister(NULL buff) -> %d", static_cast<int>(r));

  // A window must lie in ncclMemAlloc memory (the other ranks map it from there).
  char buf[64];
  ncclWindow_t win = nullptr;
  r = ncclCommWindowRegister(comm, buf, sizeof(buf), &win, NCCL_WIN_DEFAULT);
  EXPECT(r == ncclInvalidArgument, "ncclCommWindowRegister(stack buffer) -> %d, expected ncclInvalidArgument",
         static_cast<int>(r));
  EXPECT(strstr(ncclGetLastError(comm), "ncclMemAlloc") != nullptr, "last error '%s'", ncclGetLastError(comm));
  r = ncclMemFree(buf);
  EXPECT(r == ncclInvalidArgument, "ncclMemFree(stack buffer) -> %d", static_cast<int>(r));

  r = ncclCommRevoke(comm, 0x40);
  EXPECT(r == ncclInvalidArgument, "ncclCommRevoke(bad flags) -> %d", static_cast<int>(r));

  // ncclGroupSimulateEnd: the tuner's estimate, and nothing runs; without a group, a usage error.
  ncclSimInfo_t sim = NCCL_SIM_INFO_INITIALIZER;
  r = ncclGroupSimulateEnd(&sim);
  EXPECT(r == ncclInvalidUsage, "ncclGroupSimulateEnd outside a group -> %d", static_cast<int>(r));
  float simOut = -1.f;
  NCCL_OK(ncclGroupStart());
  NCCL_OK(ncclAllReduce(&x, &simOut, 1, ncclFloat, ncclSum, comm, kNoStream));
  NCCL_OK(ncclGroupSimulateEnd(&sim));
  EXPECT(sim.estimatedTime > 0.f, "estimatedTime %g", static_cast<double>(sim.estimatedTime));
  EXPECT(simOut == -1.f, "the simulated AllReduce ran (%g)", static_cast<double>(simOut));

  // The communicator still works after all those errors.
  NCCL_OK(ncclAllReduce(&x, &y, 1, ncclFloat, ncclSum, comm, kNoStream));
  int nranks = 0;
  NCCL_OK(ncclCommCount(comm, &nranks));
  EXPECT(y == static_cast<float>(nranks), "allreduce after errors = %g", y);
}

/// Errors that need no communicator, checked in the parent before forking ranks.
void testStatic(const char* expectedLib) {
  static const char* kStrings[] = {
      "no error",
      "unhandled cuda error (run with NCCL_DEBUG=INFO for details)",
      "unhandled system error (run with NCCL_DEBUG=INFO for details)",
      "internal error - please report this issue to the NCCL developers",
      "invalid argument (run with NCCL_DEBUG=WARN for details)",
      "invalid usage (run with NCCL_DEBUG=WARN for details)",
      "remote process exited or there was a network error",
      "NCCL operation in progress",
      "timeout",  // ncclTimeout, NCCL 2.30 (the library answers for it whatever header the program saw)
      "unknown result code",
  };
  for (int i = 0; i < static_cast<int>(sizeof(kStrings) / sizeof(kStrings[0])); ++i) {
    const char* s = ncclGetErrorString(static_cast<ncclResult_t>(i));
    EXPECT(s != nullptr && strcmp(s, kStrings[i]) == 0, "ncclGetErrorString(%d) = '%s'", i, s ? s : "(null)");
  }
  int v = 0;
  ncclResult_t r = ncclGetVersion(&v);
  // The library matches NCCL 2.32.3; a program built against an older header runs on it.
  EXPECT(r == ncclSuccess && v == 23203 && v >= NCCL_VERSION_CODE, "ncclGetVersion -> %d, %d (expected 23203)",
         static_cast<int>(r), v);

  // The functions come from c4comm's libnccl, not NVIDIA's.
  Dl_info info{};
  void* sym = dlsym(RTLD_DEFAULT, "ncclAllReduce");
  EXPECT(sym != nullptr && dladdr(sym, &info) != 0, "cannot locate ncclAllReduce");
  if (sym != nullptr && info.dli_fname != nullptr) {
    char got[PATH_MAX], want[PATH_MAX];
    printf("ncclAllReduce comes from %s\n", info.dli_fname);
    if (expectedLib != nullptr && realpath(info.dli_fname, got) && realpath(expectedLib, want)) {
      EXPECT(strcmp(got, want) == 0, "ncclAllReduce comes from %s, expected %s", got, want);
    }
  }

  // A config not made with NCCL_CONFIG_INITIALIZER is refused before any bootstrap.
  ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
  cfg.magic = 0;
  ncclUniqueId id;
  memset(&id, 0, sizeof(id));
  ncclComm_t comm = nullptr;
  r = ncclCommInitRankConfig(&comm, 2, id, 0, &cfg);
  EXPECT(r == ncclInvalidArgument, "bad config magic -> %d", static_cast<int>(r));
  cfg = NCCL_CONFIG_INITIALIZER;
  cfg.blocking = 7;
  r = ncclCommInitRankConfig(&comm, 2, id, 0, &cfg);
  EXPECT(r == ncclInvalidArgument, "config blocking=7 -> %d", static_cast<int>(r));
  EXPECT(strstr(ncclGetLastError(nullptr), "blocking") != nullptr, "last error '%s'", ncclGetLastError(nullptr));
  r = ncclCommInitRank(&comm, 2, id, 5);
  EXPECT(r == ncclInvalidArgument, "rank 5 of 2 -> %d", static_cast<int>(r));
  r = ncclCommInitRank(nullptr, 2, id, 0);
  EXPECT(r == ncclInvalidArgument, "null comm pointer -> %d", static_cast<int>(r));
  EXPECT(ncclCommDestroy(nullptr) == ncclSuccess, "ncclCommDestroy(NULL) must succeed");
}

void testInitAll(int n) {
  gRank = -1;
  std::vector<ncclComm_t> comms(n, nullptr);
  NCCL_OK(ncclCommInitAll(comms.data(), n, nullptr));
  std::vector<std::vector<int>> bufs(n, std::vector<int>(3));
  NCCL_OK(ncclGroupStart());
  for (int r = 0; r < n; ++r) {
    bufs[r] = {r, 1, 2 * r};
    NCCL_OK(ncclAllReduce(bufs[r].data(), bufs[r].data(), 3, ncclInt32, ncclSum, comms[r], kNoStream));
  }
  NCCL_OK(ncclGroupEnd());
  for (int r = 0; r < n; ++r) {
    int rank = -1;
    NCCL_OK(ncclCommUserRank(comms[r], &rank));
    EXPECT(rank == r, "ncclCommInitAll: comm %d has rank %d", r, rank);
    const int sum = n * (n - 1) / 2;
    EXPECT(bufs[r][0] == sum && bufs[r][1] == n && bufs[r][2] == 2 * sum, "ncclCommInitAll allreduce on %d: %d %d %d",
           r, bufs[r][0], bufs[r][1], bufs[r][2]);
  }
  for (ncclComm_t c : comms) NCCL_OK(ncclCommDestroy(c));
  if (gFailures == 0) printf("ncclCommInitAll with %d ranks: ok\n", n);
}

/// The pipes of a rank: rank 0 writes to every other rank (ids, barrier releases), the others write
/// to rank 0 (barrier arrivals).
struct Pipes {
  int in = -1;            // rank > 0: from rank 0
  std::vector<int> outs;  // rank 0: to ranks 1..n-1
  int up = -1;            // rank > 0: to rank 0
  std::vector<int> ups;   // rank 0: from ranks 1..n-1
};

/// A barrier outside the communicators (a revoke must not race a peer still finishing an
/// operation with this rank).
bool pipeBarrier(int rank, const Pipes& p) {
  char b = 1;
  if (rank == 0) {
    for (int fd : p.ups)
      if (!readAll(fd, &b, 1)) return false;
    for (int fd : p.outs)
      if (!writeAll(fd, &b, 1)) return false;
    return true;
  }
  return writeAll(p.up, &b, 1) && readAll(p.in, &b, 1);
}

/// Polls ncclCommGetAsyncError until it leaves ncclInProgress (at most 60 s); its final value.
ncclResult_t waitAsync(ncclComm_t comm) {
  ncclResult_t r = ncclInProgress;
  for (int i = 0; i < 600000 && r == ncclInProgress; ++i) {
    r = ncclCommGetAsyncError(comm, &r) == ncclSuccess ? r : ncclInternalError;
    if (r == ncclInProgress) usleep(100);
  }
  return r;
}

/// Non-blocking communicators (config.blocking = 0): init, a collective, a group and a revoke
/// return ncclSuccess or ncclInProgress, and ncclCommGetAsyncError says ncclInProgress until done,
/// as NCCL documents. Then a revoked communicator refuses work and is destroyed.
void testNonBlocking(int rank, int n, const ncclUniqueId& id, const Pipes& pipes) {
  ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
  cfg.blocking = 0;
  cfg.commName = "abi_nonblocking";
  ncclComm_t comm = nullptr;
  ncclResult_t r = ncclCommInitRankConfig(&comm, n, id, rank, &cfg);
  EXPECT((r == ncclSuccess || r == ncclInProgress) && comm != nullptr, "non-blocking init -> %d", static_cast<int>(r));
  if (comm == nullptr) return;
  r = waitAsync(comm);
  EXPECT(r == ncclSuccess, "non-blocking init completed with %d: %s", static_cast<int>(r), ncclGetLastError(comm));
  std::vector<float> big(1 << 18, static_cast<float>(rank + 1)), got(big.size(), -1.f);
  r = ncclAllReduce(big.data(), got.data(), big.size(), ncclFloat, ncclSum, comm, kNoStream);
  EXPECT(r == ncclSuccess || r == ncclInProgress, "non-blocking allreduce -> %d", static_cast<int>(r));
  r = waitAsync(comm);
  const float want = static_cast<float>(n * (n + 1) / 2);
  EXPECT(r == ncclSuccess && got[0] == want && got.back() == want, "non-blocking allreduce: %d, %g (want %g)",
         static_cast<int>(r), static_cast<double>(got[0]), static_cast<double>(want));
  int a = rank, b = 2 * rank;
  NCCL_OK(ncclGroupStart());
  NCCL_OK(ncclAllReduce(&a, &a, 1, ncclInt32, ncclSum, comm, kNoStream));
  NCCL_OK(ncclAllReduce(&b, &b, 1, ncclInt32, ncclMax, comm, kNoStream));
  r = ncclGroupEnd();
  EXPECT(r == ncclSuccess || r == ncclInProgress, "non-blocking group -> %d", static_cast<int>(r));
  r = waitAsync(comm);
  EXPECT(r == ncclSuccess && a == n * (n - 1) / 2 && b == 2 * (n - 1), "non-blocking group: %d, %d %d",
         static_cast<int>(r), a, b);
  // Revoke: quiescent (ncclInProgress, then ncclSuccess), then every call is refused.
  if (!pipeBarrier(rank, pipes)) EXPECT(false, "barrier before revoke");
  r = ncclCommRevoke(comm, NCCL_REVOKE_DEFAULT);
  EXPECT(r == ncclSuccess || r == ncclInProgress, "ncclCommRevoke (non-blocking) -> %d", static_cast<int>(r));
  r = waitAsync(comm);
  EXPECT(r == ncclSuccess, "revoke completed with %d", static_cast<int>(r));
  r = ncclAllReduce(&a, &a, 1, ncclInt32, ncclSum, comm, kNoStream);
  EXPECT(r == ncclInvalidUsage && strstr(ncclGetLastError(comm), "revoked") != nullptr,
         "allreduce after revoke -> %d ('%s')", static_cast<int>(r), ncclGetLastError(comm));
  NCCL_OK(ncclCommDestroy(comm));
}

int runRank(int rank, int n, const Pipes& pipes) {
  gRank = rank;
  ncclUniqueId id, id2;
  if (rank == 0) {
    ncclResult_t r = ncclGetUniqueId(&id);
    ncclResult_t r2 = ncclGetUniqueId(&id2);
    if (r != ncclSuccess || r2 != ncclSuccess) {
      fprintf(stderr, "[rank 0] ncclGetUniqueId -> %d: %s\n", static_cast<int>(r), ncclGetLastError(nullptr));
      return 1;  // the other ranks see EOF on their pipe and fail too
    }
    for (int fd : pipes.outs) {
      if (!writeAll(fd, &id, sizeof(id)) || !writeAll(fd, &id2, sizeof(id2))) return 1;
    }
  } else if (!readAll(pipes.in, &id, sizeof(id)) || !readAll(pipes.in, &id2, sizeof(id2))) {
    fprintf(stderr, "[rank %d] did not receive the unique ids\n", rank);
    return 1;
  }
  ncclComm_t comm = nullptr;
  // Odd ranks pass a config (blocking, named), rank 2 (mod 4) uses the scalable init with one id,
  // the others take the defaults: all of them join the same communicator.
  ncclResult_t r;
  if (rank % 4 == 2) {
    r = ncclCommInitRankScalable(&comm, n, rank, 1, &id, nullptr);
  } else if (rank % 2) {
    ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
    cfg.blocking = 1;
    cfg.commName = "abi_allreduce";
    r = ncclCommInitRankConfig(&comm, n, id, rank, &cfg);
  } else {
    r = ncclCommInitRank(&comm, n, id, rank);
  }
  if (r != ncclSuccess || comm == nullptr) {
    fprintf(stderr, "[rank %d] ncclCommInitRank -> %d (%s): %s\n", rank, static_cast<int>(r), ncclGetErrorString(r),
            ncclGetLastError(nullptr));
    return 1;
  }
  testCollectives(comm, rank, n);
  testErrors(comm);
  testNonBlocking(rank, n, id2, pipes);
  // Revoke on a blocking communicator: returns once quiescent; then calls are refused.
  if (!pipeBarrier(rank, pipes)) EXPECT(false, "barrier before revoke");
  r = ncclCommRevoke(comm, NCCL_REVOKE_DEFAULT);
  EXPECT(r == ncclSuccess, "ncclCommRevoke -> %d", static_cast<int>(r));
  float z = 1.f;
  r = ncclAllReduce(&z, &z, 1, ncclFloat, ncclSum, comm, kNoStream);
  EXPECT(r == ncclInvalidUsage, "allreduce after revoke -> %d", static_cast<int>(r));
  r = ncclCommGetAsyncError(comm, &r) == ncclSuccess ? r : ncclInternalError;
  EXPECT(r == ncclSuccess, "async error after revoke: %d", static_cast<int>(r));
  r = ncclCommDestroy(comm);
  EXPECT(r == ncclSuccess, "ncclCommDestroy -> %d", static_cast<int>(r));
  if (gFailures == 0) printf("[rank %d] ok\n", rank);
  return gFailures == 0 ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  const int n = argc > 1 ? atoi(argv[1]) : 2;
  if (n < 1 || n > 64) {
    fprintf(stderr, "usage: %s <nranks 1..64> [<expected libnccl path>]\n", argv[0]);
    return 2;
  }
  setvbuf(stdout, nullptr, _IOLBF, 0);
  testStatic(argc > 2 ? argv[2] : nullptr);
  if (gFailures) return 1;

  // Two pipes per rank > 0: rank 0 -> it, it -> rank 0. Fork everything before any communicator exists.
  std::vector<int> readEnds(n, -1), writeEnds, upRead, upWrite(n, -1);
  for (int r = 1; r < n; ++r) {
    int fds[2], ups[2];
    if (pipe(fds) != 0 || pipe(ups) != 0) {
      perror("pipe");
      return 1;
    }
    readEnds[r] = fds[0];
    writeEnds.push_back(fds[1]);
    upRead.push_back(ups[0]);
    upWrite[r] = ups[1];
  }
  std::vector<pid_t> pids;
  for (int r = 0; r < n; ++r) {
    pid_t pid = fork();
    if (pid < 0) {
      perror("fork");
      for (pid_t p : pids) kill(p, SIGKILL);
      return 1;
    }
    if (pid == 0) {
      for (int q = 1; q < n; ++q) {
        if (q != r) close(readEnds[q]);
        if (q != r) close(upWrite[q]);
      }
      Pipes p;
      if (r == 0) {
        p.outs = writeEnds;
        p.ups = upRead;
      } else {
        for (int fd : writeEnds) close(fd);
        for (int fd : upRead) close(fd);
        p.in = readEnds[r];
        p.up = upWrite[r];
      }
      _exit(runRank(r, n, p));
    }
    pids.push_back(pid);
  }
  for (int fd : writeEnds) close(fd);
  for (int fd : upRead) close(fd);
  for (int r = 1; r < n; ++r) {
    close(readEnds[r]);
    close(upWrite[r]);
  }

  // Wait with a deadline: a hung rank must fail the test, not hang it.
  const int kDeadlineSec = argc > 3 ? atoi(argv[3]) : 90;
  int failed = 0, left = n;
  for (int waited = 0; left > 0 && waited < kDeadlineSec * 10;) {
    int status = 0;
    pid_t pid = waitpid(-1, &status, WNOHANG);
    if (pid > 0) {
      --left;
      int rank = 0;
      while (pids[rank] != pid) ++rank;
      pids[rank] = -1;
      if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
        fprintf(stderr, "rank %d (pid %d) failed: %s %d\n", rank, pid, WIFEXITED(status) ? "exit" : "signal",
                WIFEXITED(status) ? WEXITSTATUS(status) : WTERMSIG(status));
        ++failed;
      }
    } else {
      usleep(100000);
      ++waited;
    }
  }
  for (int r = 0; r < n; ++r) {
    if (pids[r] > 0) {
      fprintf(stderr, "rank %d (pid %d) still running after %d s: killed\n", r, pids[r], kDeadlineSec);
      kill(pids[r], SIGKILL);
      waitpid(pids[r], nullptr, 0);
      ++failed;
    }
  }
  // Single-process clique: every rank in this process, driven from one thread through a group.
  if (failed == 0) testInitAll(n);
  if (failed || gFailures) {
    fprintf(stderr, "FAIL: %d of %d ranks failed%s\n", failed, n, gFailures ? ", ncclCommInitAll test failed" : "");
    return 1;
  }
  printf("PASS: %d ranks\n", n);
  return 0;
}
