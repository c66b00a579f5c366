// The public C++ API (include/c4comm/c4comm.hpp): argument validation, the thread's group, the
// creation of communicators, and the calls handed to them (Comm::submit; the rest of a
// communicator's side is core/comm_api.cc). Every failure is recorded as this thread's last error.

#include <algorithm>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <new>
#include <string>
#include <system_error>
#include <thread>
#include <unordered_set>
#include <vector>

#include "c4comm/c4comm.hpp"
#include "c4comm/trace.hpp"
#include "common/logging.hpp"
#include "common/params.hpp"
#include "common/status.hpp"
#include "core/bootstrap.hpp"
#include "core/comm.hpp"
#include "core/drive.hpp"
#include "core/memory.hpp"
#include "core/progress.hpp"
#include "gpu/gpu.hpp"

namespace c4 {

namespace {

thread_local std::string tLastError;

struct DeferredInit {
  Comm* comm;
  int nranks;
  UniqueId id;
  int rank;
  Config config;
};

struct GroupState {
  int depth = 0;
  GroupQueue queue;  // the calls
  std::vector<DeferredInit> inits;
  Status error;
};
thread_local GroupState tGroup;

/// Records a failure as the thread's last error (and the group's, inside a group).
Status record(Status&& st) {
  if (!st.isOk() && st.code() != Code::kInProgress) {
    // A rejected argument is first understood here; failures from below were logged where they arose.
    if (st.code() == Code::kInvalidArgument) C4_WARN(kLogCall, "%s", st.message().c_str());
    tLastError = st.message();
    if (tGroup.depth > 0 && tGroup.error.isOk()) tGroup.error = st;
  }
  return st;
}

/// Like C4_CHECK, recording the failure as the last error.
#define C4_CHECK_RECORD(expr)                             \
  do {                                                    \
    ::c4::Status c4_st_ = (expr);                         \
    if (!c4_st_.isOk()) return record(std::move(c4_st_)); \
  } while (0)

Status checkComm(const Comm* c) {
  if (!c) return makeError(Code::kInvalidArgument, "comm is NULL");
  if (!isLiveComm(c))
    return makeError(Code::kInvalidUsage, "communicator %p is not valid (destroyed, aborted, or never created)",
                     static_cast<const void*>(c));
  return Status::ok();
}

Status checkUsable(Comm* c) {
  C4_CHECK(checkComm(c));
  return c->usable();
}

Status checkType(DataType dt) {
  if (!isValidDataType(static_cast<int>(dt)))
    return makeError(Code::kInvalidArgument, "invalid datatype %d (valid: 0..%d)", static_cast<int>(dt),
                     kNumDataTypes - 1);
  return Status::ok();
}

Status checkRoot(const Comm* c, int root, const char* what) {
  if (root < 0 || root >= c->numRanks())
    return makeError(Code::kInvalidArgument, "%s %d out of range [0, %d)", what, root, c->numRanks());
  return Status::ok();
}

/// count * mult elements of dt must fit in size_t bytes.
Status checkCount(size_t count, size_t mult, DataType dt) {
  size_t es = dataTypeSize(dt), elems = 0, bytes = 0;
  if (__builtin_mul_overflow(count, mult, &elems) || __builtin_mul_overflow(elems, es, &bytes))
    return makeError(Code::kInvalidArgument, "count %zu x %zu x %zu bytes overflows the address space", count, mult,
                     es);
  return Status::ok();
}

Status checkPtr(const void* p, size_t count, const char* name) {
  if (count > 0 && !p) return makeError(Code::kInvalidArgument, "%s is NULL with count %zu", name, count);
  return Status::ok();
}

/// Common validation for collectives; `inMult`/`outMult` are the buffer sizes in units of count.
Status validate(Comm* comm, const OpDesc& op, size_t inMult, size_t outMult, bool needIn, bool needOut) {
  C4_CHECK(checkUsable(comm));
  C4_CHECK(checkType(op.dtype));
  C4_CHECK(checkCount(op.count, std::max(inMult, outMult), op.dtype));
  if (needIn) C4_CHECK(checkPtr(op.sendbuff, op.count, "sendbuff"));
  if (needOut) C4_CHECK(checkPtr(op.recvbuff, op.count, "recvbuff"));
  return Status::ok();
}

/// Buffers that overlap must be the collective's in-place layout (`inPlaceSend` is where sendbuff
/// lies then); any other overlap would read data the call has already overwritten. NCCL leaves it
/// undefined; c4comm rejects it.
Status checkOverlap(const char* fn, const void* send, size_t sendBytes, const void* recv, size_t recvBytes,
                    const void* inPlaceSend) {
  if (!send || !recv || !sendBytes || !recvBytes || send == inPlaceSend) return Status::ok();
  const auto s = reinterpret_cast<uintptr_t>(send), r = reinterpret_cast<uintptr_t>(recv);
  if (s >= r + recvBytes || r >= s + sendBytes) return Status::ok();
  return makeError(Code::kInvalidArgument,
                   "%s: sendbuff [%p, +%zu) and recvbuff [%p, +%zu) overlap without being the in-place layout "
                   "(sendbuff at %p); use separate buffers or that layout",
                   fn, send, sendBytes, recv, recvBytes, inPlaceSend);
}

/// `c` is being destroyed or aborted: this thread's open group must not run anything on it later.
/// Its queued operations and deferred init are dropped, and the group fails at groupEnd naming why.
void dropGroupWork(Comm* c, const char* what) {
  if (tGroup.depth == 0) return;
  size_t ops = 0;
  for (auto it = tGroup.queue.items.begin(); it != tGroup.queue.items.end();) {
    if (it->comm != c) {
      ++it;
      continue;
    }
    ops += it->ops.size();
    it = tGroup.queue.items.erase(it);
  }
  const size_t before = tGroup.inits.size();
  tGroup.inits.erase(
      std::remove_if(tGroup.inits.begin(), tGroup.inits.end(), [c](const DeferredInit& d) { return d.comm == c; }),
      tGroup.inits.end());
  const bool init = tGroup.inits.size() != before;
  if ((ops || init) && tGroup.error.isOk())
    tGroup.error = makeError(Code::kInvalidUsage,
                             "rank %d: communicator %s inside an open group with %zu queued operation(s)%s; "
                             "the group runs nothing",
                             c->thisRank(), what, ops, init ? " and its deferred init" : "");
}

/// The most ranks a communicator may have: per-rank tables of every rank are kept in each process.
constexpr int kMaxRanks = 1 << 24;

Status checkInitArgs(Comm** comm, int nranks, int rank) {
  if (!comm) return makeError(Code::kInvalidArgument, "comm output pointer is NULL");
  if (nranks < 1) return makeError(Code::kInvalidArgument, "nranks %d must be at least 1", nranks);
  if (nranks > kMaxRanks)
    return makeError(Code::kInvalidArgument, "nranks %d exceeds the largest communicator c4comm supports (%d ranks)",
                     nranks, kMaxRanks);
  if (rank < 0 || rank >= nranks)
    return makeError(Code::kInvalidArgument, "rank %d out of range [0, %d)", rank, nranks);
  return Status::ok();
}

Status checkConfig(const Config& c) {
  if (c.timeoutMs < 0)
    return makeError(Code::kInvalidArgument, "Config::timeoutMs %lld is negative (0: C4_TIMEOUT)",
                     static_cast<long long>(c.timeoutMs));
  if (c.spinUs < -1 || c.spinUs > 60000000)
    return makeError(Code::kInvalidArgument, "Config::spinUs %lld is outside [-1, 60000000] (-1: the default)",
                     static_cast<long long>(c.spinUs));
  return Status::ok();
}

}  // namespace

int version() { return 23203; }

std::vector<ParamDesc> params() {
  std::vector<ParamDesc> out;
  for (const ParamInfo* p : allParams())
    out.push_back(ParamDesc{p->env, p->ncclEnv ? p->ncclEnv : "", p->defaultText, p->help, p->isString,
                            paramRangeText(*p), (p->flags & kParamSameOnAllRanks) != 0});
  return out;
}

Status paramValue(const char* name, std::string* text, bool* isInteger, int64_t* number) {
  if (!name || !text || !isInteger || !number)
    return record(makeError(Code::kInvalidArgument, "paramValue: a NULL argument"));
  const ParamInfo* p = findParam(name);
  if (!p) return record(makeError(Code::kInvalidArgument, "no parameter is named '%s' (docs/params.md)", name));
  *text = paramEffective(*p);
  *isInteger = !p->isString;
  *number = 0;
  if (!p->isString && !detail::parseIntParam(text->c_str(), number))
    return record(makeError(Code::kInternalError, "parameter %s: value '%s' is not an integer", name, text->c_str()));
  return Status::ok();
}

void log(LogKind kind, const char* subsys, const char* message) {
  uint32_t bits = subsys ? logSubsysMask(subsys) : 0;
  if (bits == 0) bits = kLogCall;
  const LogLevel level = kind == LogKind::kWarn ? LogLevel::kWarn : LogLevel::kInfo;
  if (logEnabled(level, bits)) logMessage(level, bits, "", 0, "%s", message ? message : "(null)");
}

void reloadLogConfig() { logReload(); }

const char* lastError(const Comm*) { return tLastError.c_str(); }

Status setDiagnosisCallback(Comm* comm, DiagnosisCallback cb) {
  C4_CHECK_RECORD(checkComm(comm));
  comm->setDiagnosisCallback(std::move(cb));
  return Status::ok();
}

Status getDiagnoses(const Comm* comm, std::vector<Diagnosis>* out) {
  C4_CHECK_RECORD(checkComm(comm));
  if (!out) return record(makeError(Code::kInvalidArgument, "getDiagnoses: out is NULL"));
  *out = comm->diagnoses();
  return Status::ok();
}

Status memAlloc(void** ptr, size_t size) { return record(memAllocShared(ptr, size)); }

namespace {
// memAllocPreferDevice's device allocations, so that memFree frees only those.
std::mutex gDeviceAllocMu;
std::unordered_set<void*>& deviceAllocs() {
  static auto* s = new std::unordered_set<void*>;  // never destroyed: frees may run during exit
  return *s;
}
}  // namespace

Status memAllocPreferDevice(void** ptr, size_t size) {
  if (gpu::deviceCount() == 0) return memAlloc(ptr, size);
  if (!ptr) return record(makeError(Code::kInvalidArgument, "memAlloc: ptr is NULL"));
  if (size == 0) return record(makeError(Code::kInvalidArgument, "memAlloc: size is 0"));
  C4_CHECK(record(gpu::deviceAlloc(ptr, size)));
  std::lock_guard<std::mutex> g(gDeviceAllocMu);
  deviceAllocs().insert(*ptr);
  return Status::ok();
}

Status memFree(void* ptr) {
  if (ptr != nullptr && gpu::deviceCount() > 0) {
    std::unique_lock<std::mutex> g(gDeviceAllocMu);
    if (deviceAllocs().erase(ptr) > 0) {
      g.unlock();
      return record(gpu::deviceFree(ptr));
    }
  }
  return record(memFreeShared(ptr));
}
bool memShareable(const void* ptr, size_t size) {
  MemRef ref;
  return memLookup(ptr, size, &ref);
}

Status commRegister(Comm* comm, void* buff, size_t size, void** handle) {
  C4_CHECK_RECORD(checkUsable(comm));
  if (!buff) return record(makeError(Code::kInvalidArgument, "commRegister: buff is NULL"));
  if (!handle) return record(makeError(Code::kInvalidArgument, "commRegister: handle is NULL"));
  if (size == 0) return record(makeError(Code::kInvalidArgument, "commRegister: size is 0"));
  Comm::Registration* reg = nullptr;
  C4_CHECK_RECORD(comm->onDataPath([&] { return comm->registerMemory(buff, size, &reg); }));
  *handle = reg;
  return Status::ok();
}

Status commDeregister(Comm* comm, void* handle) {
  C4_CHECK_RECORD(checkComm(comm));
  if (!handle) return record(makeError(Code::kInvalidArgument, "commDeregister: handle is NULL"));
  auto* reg = static_cast<Comm::Registration*>(handle);
  return record(comm->onDataPath([&] { return comm->deregisterMemory(reg); }));
}

Status getUniqueId(UniqueId* id) {
  if (!id) return record(makeError(Code::kInvalidArgument, "uniqueId is NULL"));
  return record(bootstrapGetUniqueId(id));
}

Status commInitRank(Comm** comm, int nranks, const UniqueId& id, int rank, const Config& config) {
  C4_CHECK_RECORD(checkInitArgs(comm, nranks, rank));
  C4_CHECK_RECORD(checkConfig(config));
  auto* c = new Comm();
  Status st;
  try {
    registerComm(c);
    if (tGroup.depth > 0) {
      // Completed at groupEnd (several ranks of one process may be initialized in one group).
      tGroup.inits.push_back(DeferredInit{c, nranks, id, rank, config});
      *comm = c;
      return Status::ok();
    }
    st = c->start(nranks, id, rank, config);
  } catch (...) {  // out of memory: nothing of the communicator stays behind
    if (tGroup.depth > 0) tGroup.queue.threw = true;
    unregisterComm(c);
    delete c;
    throw;
  }
  if (st.code() == Code::kInProgress) {
    *comm = c;  // non-blocking: ready once commGetAsyncError says so
    return st;
  }
  if (!st.isOk()) {
    unregisterComm(c);
    delete c;
    return record(std::move(st));
  }
  *comm = c;
  return Status::ok();
}

/// Runs init(r) for r in [0, n) on n threads that start together once all exist (if one cannot be
/// created, the others must not wait in the bootstrap for it: none runs), and joins them. Nothing
/// escapes a thread: a rank that runs out of memory fails. Returns the first failure.
static Status initRanksInThreads(size_t n, const std::function<Status(size_t)>& init) {
  std::vector<Status> res(n);
  std::vector<char> outOfMemory(n, 0);
  std::vector<std::thread> threads;
  threads.reserve(n);
  std::mutex gateMu;
  std::condition_variable gateCv;
  int gate = 0;  // 0: wait, 1: go, -1: give up
  auto rankMain = [&](size_t r) {
    {
      std::unique_lock<std::mutex> g(gateMu);
      gateCv.wait(g, [&] { return gate != 0; });
      if (gate < 0) return;
    }
    try {
      res[r] = init(r);
    } catch (const std::bad_alloc&) {  // no Status without memory: a flag
      outOfMemory[r] = 1;
    }
  };
  const char* notStarted = nullptr;  // why a thread could not start (its message is made after the joins)
  try {
    for (size_t r = 0; r < n; ++r) threads.emplace_back(rankMain, r);
  } catch (const std::bad_alloc&) {  // the thread's state
    notStarted = "out of memory (std::bad_alloc)";
  } catch (const std::system_error&) {
    notStarted = "the system refused a thread";
  }
  {
    std::lock_guard<std::mutex> g(gateMu);
    gate = notStarted == nullptr ? 1 : -1;
  }
  gateCv.notify_all();
  for (auto& t : threads) t.join();
  if (notStarted != nullptr)
    return makeError(Code::kSystemError, "cannot start the thread of rank %zu of %zu: %s", threads.size(), n,
                     notStarted);
  for (size_t r = 0; r < n; ++r) {
    if (outOfMemory[r]) return makeError(Code::kSystemError, "rank %zu ran out of memory (std::bad_alloc) in init", r);
    if (!res[r].isOk()) return res[r];
  }
  return Status::ok();
}

Status commInitAll(Comm** comms, int n, const Config& config) {
  if (!comms) return record(makeError(Code::kInvalidArgument, "comms array is NULL"));
  if (n < 1) return record(makeError(Code::kInvalidArgument, "ndev %d must be at least 1", n));
  if (n > 4096) return record(makeError(Code::kInvalidArgument, "ndev %d: at most 4096 ranks in one process", n));
  C4_CHECK_RECORD(checkConfig(config));
  UniqueId id;  // in-process ranks: never the fixed C4_COMM_ID port
  C4_CHECK_RECORD(detail::bootstrapEphemeralUniqueId("", &id));
  std::vector<Comm*> out(static_cast<size_t>(n), nullptr);
  Status first = initRanksInThreads(static_cast<size_t>(n), [&](size_t r) {
    auto* c = new Comm();
    out[r] = c;
    return c->start(n, id, static_cast<int>(r), config);
  });
  if (!first.isOk()) {
    for (Comm* c : out) delete c;
    return record(std::move(first));
  }
  try {
    for (Comm* c : out) registerComm(c);
  } catch (...) {  // out of memory: nothing of the communicators stays behind
    for (Comm* c : out) {
      unregisterComm(c);
      delete c;
    }
    throw;
  }
  for (int r = 0; r < n; ++r) comms[r] = out[static_cast<size_t>(r)];
  return Status::ok();
}

Status commInitFromEnv(Comm** comm, const Config& config) {
  if (!comm) return record(makeError(Code::kInvalidArgument, "comm output pointer is NULL"));
  LaunchInfo info;
  C4_CHECK_RECORD(readLaunchInfo(&info));
  UniqueId id;
  C4_CHECK_RECORD(checkConfig(config));
  C4_CHECK_RECORD(uniqueIdFromLaunch(info, commTimeoutMs(config), &id));
  return commInitRank(comm, info.nranks, id, info.rank, config);
}

Status commSplit(Comm* comm, int color, int key, Comm** newcomm, const Config* config) {
  C4_CHECK_RECORD(checkUsable(comm));
  if (!newcomm) return record(makeError(Code::kInvalidArgument, "newcomm is NULL"));
  if (color < -1) return record(makeError(Code::kInvalidArgument, "color %d is negative (use -1 for no color)", color));
  Comm::Offspring o;
  C4_CHECK_RECORD(comm->split(color, key, config, &o));
  if (o.none) {
    *newcomm = nullptr;
    return Status::ok();
  }
  return commInitRank(newcomm, o.nranks, o.id, o.rank, o.config);
}

Status commShrink(Comm* comm, const int* exclude, int nexclude, Comm** newcomm, const Config* config,
                  bool abortParent) {
  C4_CHECK_RECORD(checkComm(comm));
  if (!newcomm) return record(makeError(Code::kInvalidArgument, "newcomm is NULL"));
  if (nexclude < 0) return record(makeError(Code::kInvalidArgument, "exclude count %d is negative", nexclude));
  if (nexclude > 0 && !exclude) return record(makeError(Code::kInvalidArgument, "exclude list is NULL"));
  Comm::Offspring o;
  C4_CHECK_RECORD(comm->shrink(exclude, nexclude, config, abortParent, &o));
  return commInitRank(newcomm, o.nranks, o.id, o.rank, o.config);
}

Status commGrowId(Comm* comm, UniqueId* id) {
  C4_CHECK_RECORD(checkUsable(comm));
  if (!id) return record(makeError(Code::kInvalidArgument, "commGrowId: id is NULL"));
  return record(comm->makeGrowId(id));
}

Status commGrow(Comm* comm, int nranks, const UniqueId* id, int rank, Comm** newcomm, const Config* config) {
  if (!newcomm) return record(makeError(Code::kInvalidArgument, "commGrow: newcomm is NULL"));
  if (comm == nullptr) {  // a new rank
    if (!id) return record(makeError(Code::kInvalidArgument, "commGrow: a new rank (comm NULL) needs the id"));
    if (rank < 0 || rank >= nranks)
      return record(
          makeError(Code::kInvalidArgument, "commGrow: rank %d of a new rank is not in 0..%d", rank, nranks - 1));
    return commInitRank(newcomm, nranks, *id, rank, config ? *config : Config{});
  }
  C4_CHECK_RECORD(checkUsable(comm));
  Comm::Offspring o;
  C4_CHECK_RECORD(comm->grow(nranks, id, rank, config, &o));
  return commInitRank(newcomm, o.nranks, o.id, o.rank, o.config);
}

Status commSuspend(Comm* comm, bool releaseMemory) {
  C4_CHECK_RECORD(checkUsable(comm));
  return record(comm->suspend(releaseMemory));
}

Status commResume(Comm* comm) {
  C4_CHECK_RECORD(checkComm(comm));
  return record(comm->resume());
}

Status commMemStats(const Comm* comm, MemStats* out) {
  C4_CHECK_RECORD(checkComm(comm));
  if (!out) return record(makeError(Code::kInvalidArgument, "commMemStats: out is NULL"));
  *out = MemStats{};
  out->suspended = comm->isSuspended();
  return Status::ok();
}

Status windowRegister(Comm* comm, void* buff, size_t size, int flags, Window** win) {
  C4_CHECK_RECORD(checkUsable(comm));
  if (!buff || !win) return record(makeError(Code::kInvalidArgument, "windowRegister: a NULL argument"));
  if (size == 0) return record(makeError(Code::kInvalidArgument, "windowRegister: size is 0"));
  (void)flags;  // NCCL's window flags change nothing here: puts are always ordered (docs/api-coverage.md)
  return record(comm->registerWindow(buff, size, win));
}

Status windowDeregister(Comm* comm, Window* win) {
  C4_CHECK_RECORD(checkComm(comm));
  return record(comm->deregisterWindow(win));
}

Status windowUserPtr(const Comm* comm, const Window* win, void** ptr) {
  C4_CHECK_RECORD(checkComm(comm));
  if (!ptr) return record(makeError(Code::kInvalidArgument, "windowUserPtr: ptr is NULL"));
  return record(comm->windowBase(win, ptr));
}

namespace {
/// Whether `comm` has calls queued in this thread's open group: a one-sided call on device windows
/// would run before them (refused).
bool behindGroupCalls(const Comm* comm) {
  if (tGroup.depth == 0) return false;
  for (const GroupItem& item : tGroup.queue.items)
    if (item.comm == comm && !item.ops.empty()) return true;
  return false;
}
}  // namespace

Status putSignal(const void* src, size_t bytes, int peer, Window* win, size_t offset, Comm* comm, void* stream) {
  C4_CHECK_RECORD(checkUsable(comm));
  if (bytes > 0 && !src) return record(makeError(Code::kInvalidArgument, "putSignal: the source buffer is NULL"));
  return record(comm->putSignal(src, bytes, peer, win, offset, stream, behindGroupCalls(comm)));
}

Status signalPeer(int peer, Comm* comm, void* stream) {
  C4_CHECK_RECORD(checkUsable(comm));
  return record(comm->signalPeer(peer, stream, behindGroupCalls(comm)));
}

Status waitSignal(int n, const int* peers, const int* counts, Comm* comm, void* stream) {
  C4_CHECK_RECORD(checkUsable(comm));
  if (n < 0) return record(makeError(Code::kInvalidArgument, "waitSignal: %d descriptors", n));
  if (n > 0 && (!peers || !counts)) return record(makeError(Code::kInvalidArgument, "waitSignal: a NULL array"));
  return record(comm->waitSignal(n, peers, counts, stream, behindGroupCalls(comm)));
}

Status commFinalize(Comm* comm) {
  C4_CHECK_RECORD(checkComm(comm));
  return comm->finalize();
}

Status commDestroy(Comm* comm) {
  if (!comm) return Status::ok();  // like NCCL: destroying NULL is a no-op
  C4_CHECK_RECORD(checkComm(comm));
  unregisterComm(comm);
  dropGroupWork(comm, "destroyed");
  comm->destroy();
  delete comm;
  return Status::ok();
}

Status commAbort(Comm* comm) {
  if (!comm) return Status::ok();
  C4_CHECK_RECORD(checkComm(comm));
  unregisterComm(comm);
  dropGroupWork(comm, "aborted");
  comm->abort();
  delete comm;
  return Status::ok();
}

Status commRevoke(Comm* comm) {
  C4_CHECK_RECORD(checkComm(comm));
  return record(comm->revoke());
}

Status commCount(const Comm* comm, int* count) {
  C4_CHECK_RECORD(checkComm(comm));
  if (!count) return record(makeError(Code::kInvalidArgument, "count is NULL"));
  *count = comm->numRanks();
  return Status::ok();
}

Status commUserRank(const Comm* comm, int* rank) {
  C4_CHECK_RECORD(checkComm(comm));
  if (!rank) return record(makeError(Code::kInvalidArgument, "rank is NULL"));
  *rank = comm->thisRank();
  return Status::ok();
}

Status commCuDevice(const Comm* comm, int* device) {
  C4_CHECK_RECORD(checkComm(comm));
  if (!device) return record(makeError(Code::kInvalidArgument, "device is NULL"));
  *device = comm->cuDevice();
  return Status::ok();
}

Status commGetAsyncError(Comm* comm) {
  C4_CHECK_RECORD(checkComm(comm));
  return comm->asyncError();
}

Status redOpCreatePreMulSum(RedOp* op, const void* scalar, DataType dt, ScalarResidence residence, Comm* comm) {
  C4_CHECK_RECORD(checkUsable(comm));
  if (!op) return record(makeError(Code::kInvalidArgument, "op is NULL"));
  if (!scalar) return record(makeError(Code::kInvalidArgument, "scalar is NULL"));
  C4_CHECK_RECORD(checkType(dt));
  if (residence != ScalarResidence::kDevice && residence != ScalarResidence::kHostImmediate)
    return record(makeError(Code::kInvalidArgument, "invalid scalar residence %d", static_cast<int>(residence)));
  *op = comm->createPreMulSum(scalar, dt, residence);
  return Status::ok();
}

Status redOpDestroy(RedOp op, Comm* comm) {
  C4_CHECK_RECORD(checkComm(comm));
  return record(comm->destroyOp(op));
}

Status allReduce(const void* sendbuff, void* recvbuff, size_t count, DataType dt, RedOp op, Comm* comm, void* stream) {
  OpDesc d{Coll::kAllReduce, sendbuff, recvbuff, count, dt, op, 0, stream};
  C4_CHECK_RECORD(validate(comm, d, 1, 1, true, true));
  C4_CHECK_RECORD(
      checkOverlap("allReduce", sendbuff, count * dataTypeSize(dt), recvbuff, count * dataTypeSize(dt), recvbuff));
  C4_CHECK_RECORD(comm->checkOp(op, dt));
  C4_CHECK_RECORD(comm->submit(d, tGroup.depth > 0 ? &tGroup.queue : nullptr));
  return Status::ok();
}

Status allGather(const void* sendbuff, void* recvbuff, size_t sendcount, DataType dt, Comm* comm, void* stream) {
  OpDesc d{Coll::kAllGather, sendbuff, recvbuff, sendcount, dt, RedOp::kSum, 0, stream};
  C4_CHECK_RECORD(
      validate(comm, d, 1, static_cast<size_t>(comm && isLiveComm(comm) ? comm->numRanks() : 1), true, true));
  {
    const size_t b = sendcount * dataTypeSize(dt);
    C4_CHECK_RECORD(checkOverlap("allGather", sendbuff, b, recvbuff, b * static_cast<size_t>(comm->numRanks()),
                                 static_cast<const char*>(recvbuff) + b * static_cast<size_t>(comm->thisRank())));
  }
  C4_CHECK_RECORD(comm->submit(d, tGroup.depth > 0 ? &tGroup.queue : nullptr));
  return Status::ok();
}

Status broadcast(const void* sendbuff, void* recvbuff, size_t count, DataType dt, int root, Comm* comm, void* stream) {
  OpDesc d{Coll::kBroadcast, sendbuff, recvbuff, count, dt, RedOp::kSum, root, stream};
  C4_CHECK_RECORD(validate(comm, d, 1, 1, false, true));
  C4_CHECK_RECORD(checkRoot(comm, root, "root"));
  if (comm->thisRank() == root) C4_CHECK_RECORD(checkPtr(sendbuff, count, "sendbuff (at root)"));
  if (comm->thisRank() == root)
    C4_CHECK_RECORD(
        checkOverlap("broadcast", sendbuff, count * dataTypeSize(dt), recvbuff, count * dataTypeSize(dt), recvbuff));
  C4_CHECK_RECORD(comm->submit(d, tGroup.depth > 0 ? &tGroup.queue : nullptr));
  return Status::ok();
}

Status reduceScatter(const void* sendbuff, void* recvbuff, size_t recvcount, DataType dt, RedOp op, Comm* comm,
                     void* stream) {
  OpDesc d{Coll::kReduceScatter, sendbuff, recvbuff, recvcount, dt, op, 0, stream};
  C4_CHECK_RECORD(
      validate(comm, d, static_cast<size_t>(comm && isLiveComm(comm) ? comm->numRanks() : 1), 1, true, true));
  {
    const size_t b = recvcount * dataTypeSize(dt);
    C4_CHECK_RECORD(checkOverlap("reduceScatter", sendbuff, b * static_cast<size_t>(comm->numRanks()), recvbuff, b,
                                 reinterpret_cast<const void*>(reinterpret_cast<uintptr_t>(recvbuff) -
                                                               b * static_cast<size_t>(comm->thisRank()))));
  }
  C4_CHECK_RECORD(comm->checkOp(op, dt));
  C4_CHECK_RECORD(comm->submit(d, tGroup.depth > 0 ? &tGroup.queue : nullptr));
  return Status::ok();
}

Status reduce(const void* sendbuff, void* recvbuff, size_t count, DataType dt, RedOp op, int root, Comm* comm,
              void* stream) {
  OpDesc d{Coll::kReduce, sendbuff, recvbuff, count, dt, op, root, stream};
  C4_CHECK_RECORD(validate(comm, d, 1, 1, true, false));
  C4_CHECK_RECORD(checkRoot(comm, root, "root"));
  C4_CHECK_RECORD(comm->checkOp(op, dt));
  if (comm->thisRank() == root) C4_CHECK_RECORD(checkPtr(recvbuff, count, "recvbuff (at root)"));
  if (comm->thisRank() == root)
    C4_CHECK_RECORD(
        checkOverlap("reduce", sendbuff, count * dataTypeSize(dt), recvbuff, count * dataTypeSize(dt), recvbuff));
  C4_CHECK_RECORD(comm->submit(d, tGroup.depth > 0 ? &tGroup.queue : nullptr));
  return Status::ok();
}

Status alltoAll(const void* sendbuff, void* recvbuff, size_t count, DataType dt, Comm* comm, void* stream) {
  OpDesc d{Coll::kAlltoAll, sendbuff, recvbuff, count, dt, RedOp::kSum, 0, stream};
  size_t n = static_cast<size_t>(comm && isLiveComm(comm) ? comm->numRanks() : 1);
  C4_CHECK_RECORD(validate(comm, d, n, n, true, true));
  C4_CHECK_RECORD(checkOverlap("alltoAll", sendbuff, n * count * dataTypeSize(dt), recvbuff,
                               n * count * dataTypeSize(dt), recvbuff));
  C4_CHECK_RECORD(comm->submit(d, tGroup.depth > 0 ? &tGroup.queue : nullptr));
  return Status::ok();
}

Status gather(const void* sendbuff, void* recvbuff, size_t count, DataType dt, int root, Comm* comm, void* stream) {
  OpDesc d{Coll::kGather, sendbuff, recvbuff, count, dt, RedOp::kSum, root, stream};
  size_t n = static_cast<size_t>(comm && isLiveComm(comm) ? comm->numRanks() : 1);
  C4_CHECK_RECORD(validate(comm, d, 1, n, true, false));
  C4_CHECK_RECORD(checkRoot(comm, root, "root"));
  if (comm->thisRank() == root) {
    C4_CHECK_RECORD(checkPtr(recvbuff, count, "recvbuff (at root)"));
    // In place at the root: sendbuff is the root's block of recvbuff.
    const size_t b = count * dataTypeSize(dt);
    C4_CHECK_RECORD(
        checkOverlap("gather", sendbuff, b, recvbuff, b * n, static_cast<const char*>(recvbuff) + b * root));
  }
  C4_CHECK_RECORD(comm->submit(d, tGroup.depth > 0 ? &tGroup.queue : nullptr));
  return Status::ok();
}

Status scatter(const void* sendbuff, void* recvbuff, size_t count, DataType dt, int root, Comm* comm, void* stream) {
  OpDesc d{Coll::kScatter, sendbuff, recvbuff, count, dt, RedOp::kSum, root, stream};
  size_t n = static_cast<size_t>(comm && isLiveComm(comm) ? comm->numRanks() : 1);
  C4_CHECK_RECORD(validate(comm, d, n, 1, false, true));
  C4_CHECK_RECORD(checkRoot(comm, root, "root"));
  if (comm->thisRank() == root) {
    C4_CHECK_RECORD(checkPtr(sendbuff, count, "sendbuff (at root)"));
    // In place at the root: recvbuff is the root's block of sendbuff.
    const size_t b = count * dataTypeSize(dt);
    C4_CHECK_RECORD(checkOverlap("scatter", sendbuff, b * n, recvbuff, b,
                                 reinterpret_cast<const void*>(reinterpret_cast<uintptr_t>(recvbuff) - b * root)));
  }
  C4_CHECK_RECORD(comm->submit(d, tGroup.depth > 0 ? &tGroup.queue : nullptr));
  return Status::ok();
}

Status send(const void* sendbuff, size_t count, DataType dt, int peer, Comm* comm, void* stream) {
  OpDesc d{Coll::kSend, sendbuff, nullptr, count, dt, RedOp::kSum, peer, stream};
  C4_CHECK_RECORD(validate(comm, d, 1, 1, true, false));
  C4_CHECK_RECORD(checkRoot(comm, peer, "peer"));
  C4_CHECK_RECORD(comm->submit(d, tGroup.depth > 0 ? &tGroup.queue : nullptr));
  return Status::ok();
}

Status recv(void* recvbuff, size_t count, DataType dt, int peer, Comm* comm, void* stream) {
  OpDesc d{Coll::kRecv, nullptr, recvbuff, count, dt, RedOp::kSum, peer, stream};
  C4_CHECK_RECORD(validate(comm, d, 1, 1, false, true));
  C4_CHECK_RECORD(checkRoot(comm, peer, "peer"));
  C4_CHECK_RECORD(comm->submit(d, tGroup.depth > 0 ? &tGroup.queue : nullptr));
  return Status::ok();
}

/// The checks iprobe and probe share.
static Status checkProbe(int peer, Comm* comm, ProbeResult* out, const char* fn) {
  C4_CHECK(checkUsable(comm));
  if (!out) return makeError(Code::kInvalidArgument, "%s: result pointer is NULL", fn);
  if (peer == kAnySource) return Status::ok();
  C4_CHECK(checkRoot(comm, peer, fn));
  if (peer == comm->thisRank())
    return makeError(Code::kInvalidArgument, "%s: peer %d is this rank; sends to itself pair with receives in a group",
                     fn, peer);
  return Status::ok();
}

Status iprobe(int peer, Comm* comm, ProbeResult* out) {
  C4_CHECK_RECORD(checkProbe(peer, comm, out, "iprobe"));
  return record(comm->submitProbe(peer, out, 0));  // one look
}

Status probe(int peer, Comm* comm, ProbeResult* out, int64_t waitMs) {
  C4_CHECK_RECORD(checkProbe(peer, comm, out, "probe"));
  return record(comm->submitProbe(peer, out, waitMs));
}

Status recvAny(void* recvbuff, size_t count, DataType dt, int* source, Comm* comm, void* stream) {
  OpDesc d{Coll::kRecv, nullptr, recvbuff, count, dt, RedOp::kSum, kAnySource, stream};
  C4_CHECK_RECORD(validate(comm, d, 1, 1, false, true));
  if (!source) return record(makeError(Code::kInvalidArgument, "recvAny: source pointer is NULL"));
  if (count == 0)
    return record(makeError(Code::kInvalidArgument,
                            "recvAny of 0 elements: an empty send is never transmitted, so no sender can be found"));
  if (tGroup.depth > 0)
    return record(makeError(Code::kInvalidUsage,
                            "recvAny inside a group: its sender is only known when the message arrives; call it "
                            "outside groupStart/groupEnd"));
  if (comm->numRanks() == 1)
    return record(makeError(Code::kInvalidUsage, "recvAny on a communicator of 1 rank: there is no other rank"));
  return record(comm->submitRecvAny(d, source));
}

Status groupStart() {
  if (tGroup.depth == 0) {
    tGroup.error = Status::ok();
    tGroup.queue.threw = false;
  }
  ++tGroup.depth;
  return Status::ok();
}

/// Closes a group level for `fn` (groupEnd, groupSimulateEnd). *outermost is set when this closed
/// the outermost level: then the group's contents move to *inits and *items. An error if there was
/// no group, or if a call in the group was rejected (then nothing is to run, so that no rank
/// half-executes the group, and the communicators the group initializes are failed).
static Status closeGroup(const char* fn, bool* outermost, std::vector<DeferredInit>* inits,
                         std::vector<GroupItem>* items) {
  *outermost = false;
  if (tGroup.depth == 0) return record(makeError(Code::kInvalidUsage, "%s without a matching groupStart", fn));
  if (--tGroup.depth > 0) return Status::ok();
  *outermost = true;
  inits->swap(tGroup.inits);
  items->swap(tGroup.queue.items);
  // A communicator aborted by another thread while queued here is gone: run nothing on it.
  for (auto it = items->begin(); it != items->end();) {
    if (isLiveComm(it->comm)) {
      ++it;
      continue;
    }
    if (tGroup.error.isOk())
      tGroup.error = makeError(Code::kInvalidUsage,
                               "%s: a communicator with %zu queued operation(s) was destroyed or aborted before "
                               "the group ended; the group runs nothing",
                               fn, it->ops.size());
    it = items->erase(it);
  }
  if (tGroup.queue.threw && tGroup.error.isOk())
    tGroup.error = makeError(Code::kSystemError,
                             "%s: a call of the group ran out of memory (std::bad_alloc); the group runs nothing", fn);
  tGroup.queue.threw = false;
  Status err = tGroup.error;
  tGroup.error = Status::ok();
  if (!err.isOk()) {
    for (DeferredInit& d : *inits) (void)d.comm->fail(err);
    // Calls on device buffers staged their inputs (step 1 only): give their slots back.
    for (const GroupItem& it : *items) it.comm->cancelStaged(it.ops);
    tLastError = err.message();
  }
  return err;
}

Status groupEnd() {
  bool outermost = false;
  std::vector<DeferredInit> inits;
  std::vector<GroupItem> items;
  C4_CHECK(closeGroup("groupEnd", &outermost, &inits, &items));
  if (!outermost) return Status::ok();
  Status first;
  if (inits.size() == 1) {
    first = inits[0].comm->start(inits[0].nranks, inits[0].id, inits[0].rank, inits[0].config);
  } else if (!inits.empty()) {
    first = initRanksInThreads(inits.size(), [&](size_t i) {
      return inits[i].comm->start(inits[i].nranks, inits[i].id, inits[i].rank, inits[i].config);
    });
  }
  if (!first.isOk() && first.code() != Code::kInProgress) {
    tLastError = first.message();
    return first;
  }
  bool inProgress = first.code() == Code::kInProgress;
  if (items.empty()) return inProgress ? first : Status::ok();
  // Communicators with a progress thread get their part as one job each (their collectives in
  // call order, then their point-to-point batch); the others run here, together.
  std::vector<GroupItem> here;
  std::vector<std::pair<Comm*, std::shared_ptr<Job>>> jobs;
  // Calls on device buffers: every call's inputs were staged when it was made; now the streams'
  // waits and copies back, in call order, behind all of them.
  Status staging;
  for (GroupItem& it : items) {
    Status st = it.comm->finishStaging(&it.ops);
    if (staging.isOk()) staging = st;
  }
  std::vector<std::pair<Comm*, std::vector<OpDesc>>> parts;
  for (GroupItem& it : items) {
    if (!it.comm->hasProgressThread()) {
      here.push_back(std::move(it));
      continue;
    }
    std::vector<OpDesc>* ops = nullptr;
    for (auto& part : parts)
      if (part.first == it.comm) ops = &part.second;
    if (!ops) {
      parts.emplace_back(it.comm, std::vector<OpDesc>());
      ops = &parts.back().second;
    }
    ops->insert(ops->end(), it.ops.begin(), it.ops.end());
  }
  for (auto& part : parts) jobs.emplace_back(part.first, part.first->postGroupPart(std::move(part.second)));
  Status st;
  if (!here.empty()) {
    for (GroupItem& it : here) it.comm->markDriven(true);
    st = runGroupItems(here);
    for (GroupItem& it : here) it.comm->markDriven(false);
  }
  for (auto& j : jobs) {
    Status js = j.first->waitGroupPart(*j.second, &inProgress);
    if (st.isOk()) st = js;
  }
  if (st.isOk()) st = staging;
  if (!st.isOk()) {
    tLastError = st.message();
    return st;
  }
  return inProgress ? Status(Code::kInProgress, "group queued on a non-blocking communicator") : Status::ok();
}

Status groupSimulateEnd(double* estimatedUs) {
  if (!estimatedUs) return record(makeError(Code::kInvalidArgument, "estimatedUs is NULL"));
  *estimatedUs = 0;
  bool outermost = false;
  std::vector<DeferredInit> inits;
  std::vector<GroupItem> items;
  C4_CHECK(closeGroup("groupSimulateEnd", &outermost, &inits, &items));
  if (!outermost) return Status::ok();
  if (!inits.empty()) {
    Status err = makeError(Code::kInvalidUsage,
                           "groupSimulateEnd: the group initializes %zu communicator(s), which cannot be simulated",
                           inits.size());
    for (DeferredInit& d : inits) (void)d.comm->fail(err);
    return record(std::move(err));
  }
  for (const GroupItem& item : items) {
    double us = 0;
    for (const OpDesc& op : item.ops) us += item.comm->estimateUs(op);
    *estimatedUs = std::max(*estimatedUs, us);
  }
  return Status::ok();
}

// ---- tracer (include/c4comm/trace.hpp) ----
namespace trace {

Status setLevel(Comm* comm, Level level) {
  C4_CHECK_RECORD(checkComm(comm));
  C4_CHECK_RECORD(comm->tracer().setLevel(level));
  return Status::ok();
}

Status getLevel(const Comm* comm, Level* level) {
  C4_CHECK_RECORD(checkComm(comm));
  if (!level) return record(makeError(Code::kInvalidArgument, "level is NULL"));
  *level = static_cast<Level>(comm->tracer().level());
  return Status::ok();
}

Status flush(Comm* comm, std::string* path) {
  C4_CHECK_RECORD(checkComm(comm));
  C4_CHECK_RECORD(comm->tracer().dump(DumpReason::kRequest, path));
  return Status::ok();
}

Status readEvents(const Comm* comm, std::vector<Event>* out, uint64_t* dropped) {
  C4_CHECK_RECORD(checkComm(comm));
  if (!out) return record(makeError(Code::kInvalidArgument, "out is NULL"));
  comm->tracer().snapshot(out, dropped);
  for (Event& e : *out) {
    e.t0 = static_cast<uint64_t>(toNs(e.t0));
    e.t1 = static_cast<uint64_t>(toNs(e.t1));
  }
  return Status::ok();
}

uint64_t now() {
  initClock();
  return ticks();
}

int64_t ticksToNs(uint64_t t) {
  initClock();
  return toNs(t);
}

Status addSpan(Comm* comm, const char* name, uint64_t beginTicks, uint64_t endTicks, uint64_t bytes) {
  C4_CHECK_RECORD(checkComm(comm));
  if (!name) return record(makeError(Code::kInvalidArgument, "span name is NULL"));
  if (endTicks < beginTicks)
    return record(makeError(Code::kInvalidArgument, "span '%s' ends (%llu) before it begins (%llu)", name,
                            static_cast<unsigned long long>(endTicks), static_cast<unsigned long long>(beginTicks)));
  if (!comm->tracer().on()) return Status::ok();
  Event e;
  e.type = EventType::kSpan;
  e.t0 = beginTicks;
  e.t1 = endTicks;
  e.bytes = bytes;
  e.seq = comm->tracer().intern(name);
  comm->tracer().record(e);
  return Status::ok();
}

Status addNote(Comm* comm, const char* text) {
  C4_CHECK_RECORD(checkComm(comm));
  if (!text) return record(makeError(Code::kInvalidArgument, "note text is NULL"));
  comm->tracer().note(text);
  return Status::ok();
}

}  // namespace trace

}  // namespace c4
