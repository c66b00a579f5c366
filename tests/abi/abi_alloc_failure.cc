// No exception crosses the C API: a program built against NVIDIA's nccl.h, whose global
// operator new is replaced by one that fails (std::bad_alloc) at the k-th allocation of the calling
// thread, runs each NCCL call with the failure at k = 1, 2, ... until the call no longer reaches it.
// Every call must return (never throw into the caller, never abort); an injected failure must come
// back as an error (ncclSystemError with "out of memory" in ncclGetLastError, or an error the core
// made of it), and the library must work again afterwards. Exit 0 on success.
#include C4_NVIDIA_NCCL_H

#include <stdlib.h>

#include <cstdio>
#include <cstring>
#include <functional>
#include <new>
#include <string>
#include <vector>

namespace {
thread_local long tAllocs = 0;      // allocations on this thread since the countdown started
thread_local long tFailAt = -1;     // the allocation that fails (1-based); -1: none
thread_local bool tFailed = false;  // the injected failure happened
}  // namespace

void* operator new(size_t n) {
  if (tFailAt > 0 && ++tAllocs == tFailAt) {
    tFailed = true;
    throw std::bad_alloc();
  }
  void* p = malloc(n ? n : 1);
  if (p == nullptr) throw std::bad_alloc();
  return p;
}
void* operator new[](size_t n) { return operator new(n); }
// Every other form too, so that each allocation and its release go through the same pair (ASan
// checks that they match).
void* operator new(size_t n, const std::nothrow_t&) noexcept {
  try {
    return operator new(n);
  } catch (...) {
    return nullptr;
  }
}
void* operator new[](size_t n, const std::nothrow_t& t) noexcept { return operator new(n, t); }
void* operator new(size_t n, std::align_val_t a) {
  if (tFailAt > 0 && ++tAllocs == tFailAt) {
    tFailed = true;
    throw std::bad_alloc();
  }
  const size_t al = static_cast<size_t>(a);
  void* p = aligned_alloc(al, (n + al - 1) / al * al);
  if (p == nullptr) throw std::bad_alloc();
  return p;
}
void* operator new[](size_t n, std::align_val_t a) { return operator new(n, a); }
void operator delete(void* p) noexcept { free(p); }
void operator delete[](void* p) noexcept { free(p); }
void operator delete(void* p, size_t) noexcept { free(p); }
void operator delete[](void* p, size_t) noexcept { free(p); }
void operator delete(void* p, const std::nothrow_t&) noexcept { free(p); }
void operator delete[](void* p, const std::nothrow_t&) noexcept { free(p); }
void operator delete(void* p, std::align_val_t) noexcept { free(p); }
void operator delete[](void* p, std::align_val_t) noexcept { free(p); }
void operator delete(void* p, size_t, std::align_val_t) noexcept { free(p); }
void operator delete[](void* p, size_t, std::align_val_t) noexcept { free(p); }

namespace {

struct Scenario {
  const char* name;
  std::function<bool()> setup;         // not injected; false: the scenario cannot run
  std::function<ncclResult_t()> call;  // injected
  std::function<void()> teardown;      // not injected
};

ncclUniqueId gId;
ncclComm_t gComm = nullptr, gOut = nullptr;
ncclComm_t gPair[2] = {nullptr, nullptr};
std::vector<float> gBuf(4096, 1.0f), gOut2(4096, 0.0f);

bool freshComm() {
  gComm = nullptr;
  return ncclGetUniqueId(&gId) == ncclSuccess && ncclCommInitRank(&gComm, 1, gId, 0) == ncclSuccess;
}
void dropComms() {
  if (gOut) ncclCommDestroy(gOut);
  if (gComm) ncclCommDestroy(gComm);
  for (ncclComm_t& c : gPair)
    if (c) ncclCommDestroy(c);
  gOut = gComm = gPair[0] = gPair[1] = nullptr;
}

// Runs `s` with the failure at k = 1, 2, ... (every k up to 400, then every 13th); returns the
// number of problems.
int run(const Scenario& s) {
  int bad = 0, injected = 0;
  long k = 1;
  for (; k < 20000; k = k < 400 ? k + 1 : k + 13) {
    if (!s.setup()) {
      fprintf(stderr, "%s: setup failed without injection\n", s.name);
      return 1;
    }
    tAllocs = 0;
    tFailed = false;
    tFailAt = k;
    ncclResult_t r = ncclSuccess;
    bool threw = false;
    try {
      r = s.call();
    } catch (...) {
      threw = true;
    }
    tFailAt = -1;
    const bool failed = tFailed;
    if (threw) {
      fprintf(stderr, "%s: an exception crossed the C API (failure at allocation %ld)\n", s.name, k);
      ++bad;
    } else if (failed && r == ncclSuccess) {
      // The core may absorb a failed allocation (a cache it can do without): then the call must
      // have worked. The data calls below check their results.
    } else if (failed && r == ncclSystemError) {
      const char* last = ncclGetLastError(nullptr);
      if (last == nullptr || (strstr(last, "out of memory") == nullptr && strstr(last, "memory") == nullptr &&
                              strstr(last, "alloc") == nullptr)) {
        fprintf(stderr, "%s: ncclSystemError at allocation %ld without saying why: %s\n", s.name, k,
                last ? last : "(null)");
        ++bad;
      }
    } else if (failed && r != ncclSuccess && r != ncclInProgress) {
      // Another error made of the failure (an init that failed on it, say): fine if it says so.
    } else if (!failed && r != ncclSuccess) {
      fprintf(stderr, "%s: failed (%s) although no allocation failed (k = %ld)\n", s.name, ncclGetErrorString(r), k);
      ++bad;
    }
    injected += failed;
    s.teardown();
    if (!failed) break;  // the call makes fewer than k allocations: all of them were tried
  }
  printf("%s: %d failure point(s) injected, %d problem(s)\n", s.name, injected, bad);
  fflush(stdout);
  if (injected == 0) {
    fprintf(stderr, "%s: no allocation happened in the call, so nothing was tested\n", s.name);
    ++bad;
  }
  return bad;
}

}  // namespace

int main() {
  setenv("C4_BOOTSTRAP_TIMEOUT", "3000", 1);  // roots of ids an injected failure left unused go soon
  setenv("C4_TIMEOUT", "20", 1);
  setenv("C4_TRACE", "0", 1);
  const size_t n = gBuf.size();
  std::vector<Scenario> scenarios = {
      {"ncclGetUniqueId", [] { return true; }, [] { return ncclGetUniqueId(&gId); }, [] {}},
      {"ncclCommInitRank", [] { return ncclGetUniqueId(&gId) == ncclSuccess; },
       [] { return ncclCommInitRank(&gComm, 1, gId, 0); }, dropComms},
      {"ncclAllReduce", freshComm,
       [n] { return ncclAllReduce(gBuf.data(), gOut2.data(), n, ncclFloat, ncclSum, gComm, nullptr); }, dropComms},
      {"ncclGroupEnd (send/recv to self)", freshComm,
       [n] {
         ncclGroupStart();
         ncclSend(gBuf.data(), n, ncclFloat, 0, gComm, nullptr);
         ncclRecv(gOut2.data(), n, ncclFloat, 0, gComm, nullptr);
         return ncclGroupEnd();
       },
       dropComms},
      {"ncclCommSplit", freshComm, [] { return ncclCommSplit(gComm, 0, 0, &gOut, nullptr); }, dropComms},
      {"ncclCommInitAll + grouped ncclAllReduce", [] { return true; },
       [n] {
         ncclResult_t r = ncclCommInitAll(gPair, 2, nullptr);
         if (r != ncclSuccess) return r;
         ncclGroupStart();
         for (ncclComm_t c : gPair) ncclAllReduce(gBuf.data(), gOut2.data(), n, ncclFloat, ncclSum, c, nullptr);
         return ncclGroupEnd();
       },
       dropComms},
  };
  int bad = 0;
  for (const Scenario& s : scenarios) bad += run(s);
  // Afterwards everything works, with the right result.
  if (!freshComm() || ncclAllReduce(gBuf.data(), gOut2.data(), n, ncclFloat, ncclSum, gComm, nullptr) != ncclSuccess ||
      gOut2[n - 1] != 1.0f) {
    fprintf(stderr, "after the injected failures an AllReduce does not work: %s\n", ncclGetLastError(gComm));
    ++bad;
  }
  dropComms();
  return bad == 0 ? 0 : 1;
}
