// The public C++ API (include/c4comm/c4comm.hpp): argument validation, group state, and the
// communicator life cycle. Every failure is recorded as this thread's last error.
#include <sched.h>

#include <algorithm>
#include <climits>
#include <condition_variable>
#include <cstring>
#include <functional>
#include <mutex>
#include <new>
#include <optional>
#include <string>
#include <system_error>
#include <thread>
#include <unordered_set>
#include <vector>

#include "c4comm/c4comm.hpp"
#include "c4comm/trace.hpp"
#include "common/hash.hpp"
#include "common/logging.hpp"
#include "common/params.hpp"
#include "common/status.hpp"
#include "core/bootstrap.hpp"
#include "core/comm.hpp"
#include "core/drive.hpp"
#include "core/memory.hpp"
#include "core/progress.hpp"
#include "core/staging.hpp"
#include "gpu/gpu.hpp"

namespace c4 {

C4_PARAM_INT(ProgressThread, "C4_PROGRESS_THREAD", nullptr, 0, 0, 1, kParamNone,
             "1: every communicator gets a progress thread that runs its operations in call order (blocking calls "
             "wait for it; between calls it keeps the network transports progressing); 0: the calling thread drives "
             "each operation. Communicators created with Config::blocking = 0 always have one")

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
  if (c->finalized) return makeError(Code::kInvalidUsage, "rank %d: communicator was finalized", c->rank);
  if (c->state.revoked())
    return makeError(Code::kInvalidUsage,
                     "rank %d: communicator was revoked (commRevoke); only commShrink, commFinalize, commDestroy and "
                     "commAbort are allowed on it",
                     c->rank);
  if (c->suspended.load(std::memory_order_acquire))
    return makeError(Code::kInvalidUsage, "rank %d: communicator is suspended (commSuspend); commResume first",
                     c->rank);
  return c->failure();
}

/// While it lives, C4D's heartbeats say this rank waits inside c4comm in `what`, a blocking call
/// that is no collective (so a peer's hang diagnosis does not call it busy outside c4comm).
class InsideCall {
 public:
  InsideCall(Comm* c, const char* what) : c_(c) { c_->health->telemetry().setInside(what); }
  ~InsideCall() { c_->health->telemetry().setInside(nullptr); }
  InsideCall(const InsideCall&) = delete;
  InsideCall& operator=(const InsideCall&) = delete;

 private:
  Comm* c_;
};

Status checkType(DataType dt) {
  if (!isValidDataType(static_cast<int>(dt)))
    return makeError(Code::kInvalidArgument, "invalid datatype %d (valid: 0..%d)", static_cast<int>(dt),
                     kNumDataTypes - 1);
  return Status::ok();
}

Status checkOp(const Comm* c, RedOp op, DataType dt) {
  int v = static_cast<int>(op);
  if (v >= 0 && v < kNumBuiltinOps) return Status::ok();
  size_t idx = static_cast<size_t>(v - kNumBuiltinOps);
  if (v < 0 || idx >= c->userOps.size() || !c->userOps[idx].live)
    return makeError(Code::kInvalidArgument, "invalid reduction operator %d on this communicator", v);
  if (c->userOps[idx].dtype != dt)
    return makeError(Code::kInvalidArgument, "reduction operator %d was created for %s but the call uses %s", v,
                     dataTypeName(c->userOps[idx].dtype), dataTypeName(dt));
  return Status::ok();
}

Status checkRoot(const Comm* c, int root, const char* what) {
  if (root < 0 || root >= c->nranks)
    return makeError(Code::kInvalidArgument, "%s %d out of range [0, %d)", what, root, c->nranks);
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

/// Whether a communicator with `config` gets a progress thread.
/// Where GPUs are, every communicator gets one too: calls on device buffers run there, and creating it
/// at the first such call would race with threads that query the communicator (PyTorch's watchdog
/// calls ncclCommGetAsyncError all along). Blocking host calls still run inline on the caller's thread.
bool wantsEngine(const Config& config) {
  return config.blocking == 0 || paramProgressThread() != 0 || gpu::deviceCount() > 0;
}

Status initComm(Comm* c, int nranks, const UniqueId& id, int rank, const Config& config) {
  c->cudaDevice = gpu::currentDevice();
  c->rank = rank;
  c->nranks = nranks;
  c->config = config;
  if (wantsEngine(config)) {
    c->engine = std::make_unique<ProgressEngine>(c);
    c->recorder.setShared(true);  // the progress thread and the caller record
    C4_CHECK(c->engine->start());
    auto job = std::make_shared<Job>();
    job->kind = Job::Kind::kInit;
    job->nranks = nranks;
    job->rank = rank;
    job->id = id;
    job->config = config;
    // Non-blocking: the communicator is handed out now and commGetAsyncError says when it is ready.
    return c->queueJob(job);
  }
  Status st;
  try {  // no exception crosses the API: memory exhaustion during init is an error
    st = c->init(nranks, id, rank, config);
  } catch (const std::bad_alloc&) {
    st = makeError(Code::kSystemError, "rank %d/%d: out of memory during communicator init", rank, nranks);
  } catch (const std::exception& e) {
    st = makeError(Code::kInternalError, "rank %d/%d: communicator init failed: %s", rank, nranks, e.what());
  }
  if (!st.isOk()) {
    C4_WARN(kLogInit, "rank %d/%d: init failed: %s", rank, nranks, st.toString().c_str());
    (void)c->fail(st);
  }
  return st;
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
                             c->rank, what, ops, init ? " and its deferred init" : "");
}

/// Writes the communicator's trace file (if it ever traced); a failure is logged, never returned.
void dumpTrace(Comm* c, trace::DumpReason why) {
  if (!c->recorder.allocated()) return;
  if (c->health && c->health->traceDue()) c->health->drainTrace();  // C4D's records go in too
  Status st = c->recorder.dump(why);
  if (!st.isOk()) C4_WARN(kLogInit, "%s", st.message().c_str());
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
  comm->health->setCallback(std::move(cb));
  return Status::ok();
}

Status getDiagnoses(const Comm* comm, std::vector<Diagnosis>* out) {
  C4_CHECK_RECORD(checkComm(comm));
  if (!out) return record(makeError(Code::kInvalidArgument, "getDiagnoses: out is NULL"));
  *out = comm->health->diagnoses();
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

/// Runs `fn` on the communicator's data path from the caller's thread: directly, or with the
/// progress thread's drive lock once its queue is empty.
static Status onDataPath(Comm* comm, const std::function<Status()>& fn) {
  if (!comm->engine) {
    BusyScope busy(comm);
    return fn();
  }
  for (;;) {
    comm->engine->drain();
    Status st;
    if (comm->engine->runInline(fn, &st)) return st;
    sched_yield();
  }
}

Status commRegister(Comm* comm, void* buff, size_t size, void** handle) {
  C4_CHECK_RECORD(checkUsable(comm));
  if (!buff) return record(makeError(Code::kInvalidArgument, "commRegister: buff is NULL"));
  if (!handle) return record(makeError(Code::kInvalidArgument, "commRegister: handle is NULL"));
  if (size == 0) return record(makeError(Code::kInvalidArgument, "commRegister: size is 0"));
  Comm::Registration* reg = nullptr;
  C4_CHECK_RECORD(onDataPath(comm, [&] { return comm->registerMemory(buff, size, &reg); }));
  *handle = reg;
  return Status::ok();
}

Status commDeregister(Comm* comm, void* handle) {
  C4_CHECK_RECORD(checkComm(comm));
  if (!handle) return record(makeError(Code::kInvalidArgument, "commDeregister: handle is NULL"));
  auto* reg = static_cast<Comm::Registration*>(handle);
  return record(onDataPath(comm, [&] { return comm->deregisterMemory(reg); }));
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
    st = initComm(c, nranks, id, rank, config);
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
    return initComm(c, n, id, static_cast<int>(r), config);
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
  if (comm->engine) comm->engine->drain();
  if (!newcomm) return record(makeError(Code::kInvalidArgument, "newcomm is NULL"));
  if (color < -1) return record(makeError(Code::kInvalidArgument, "color %d is negative (use -1 for no color)", color));
  InsideCall inside(comm, "ncclCommSplit");
  struct Entry {
    int32_t color, key;
  };
  std::vector<Entry> all(static_cast<size_t>(comm->nranks));
  all[static_cast<size_t>(comm->rank)] = Entry{color, key};
  C4_CHECK_RECORD(comm->bootstrap->allGather(all.data(), sizeof(Entry)));
  std::vector<int> members;
  for (int r = 0; r < comm->nranks; ++r)
    if (color >= 0 && all[static_cast<size_t>(r)].color == color) members.push_back(r);
  std::stable_sort(members.begin(), members.end(),
                   [&all](int a, int b) { return all[static_cast<size_t>(a)].key < all[static_cast<size_t>(b)].key; });
  // The first member of each color creates the id; everyone learns it through the parent.
  std::vector<UniqueId> ids(static_cast<size_t>(comm->nranks));
  memset(ids.data(), 0, ids.size() * sizeof(UniqueId));
  bool leader = !members.empty() && members[0] == comm->rank;
  if (leader) C4_CHECK_RECORD(detail::bootstrapEphemeralUniqueId("", &ids[static_cast<size_t>(comm->rank)]));
  C4_CHECK_RECORD(comm->bootstrap->allGather(ids.data(), sizeof(UniqueId)));
  if (color == -1) {
    *newcomm = nullptr;
    return Status::ok();
  }
  int newRank = static_cast<int>(std::find(members.begin(), members.end(), comm->rank) - members.begin());
  Config cfg = config ? *config : comm->config;
  return commInitRank(newcomm, static_cast<int>(members.size()), ids[static_cast<size_t>(members[0])], newRank, cfg);
}

Status commShrink(Comm* comm, const int* exclude, int nexclude, Comm** newcomm, const Config* config,
                  bool abortParent) {
  C4_CHECK_RECORD(checkComm(comm));
  if (!newcomm) return record(makeError(Code::kInvalidArgument, "newcomm is NULL"));
  if (nexclude < 0) return record(makeError(Code::kInvalidArgument, "exclude count %d is negative", nexclude));
  if (nexclude > 0 && !exclude) return record(makeError(Code::kInvalidArgument, "exclude list is NULL"));
  if (comm->finalized) return record(makeError(Code::kInvalidUsage, "rank %d: communicator was finalized", comm->rank));
  if (comm->engine && !abortParent) comm->engine->drain();
  std::vector<char> excluded(static_cast<size_t>(comm->nranks), 0);
  for (int i = 0; i < nexclude; ++i) {
    const int r = exclude[i];
    if (r < 0 || r >= comm->nranks)
      return record(
          makeError(Code::kInvalidArgument, "exclude list entry %d: rank %d is not in 0..%d", i, r, comm->nranks - 1));
    if (excluded[static_cast<size_t>(r)])
      return record(makeError(Code::kInvalidArgument, "exclude list names rank %d twice", r));
    excluded[static_cast<size_t>(r)] = 1;
  }
  if (excluded[static_cast<size_t>(comm->rank)])
    return record(makeError(Code::kInvalidUsage,
                            "rank %d is in its own exclude list: excluded ranks must not call commShrink", comm->rank));
  if (abortParent) {
    const Status why = makeError(Code::kRemoteError, "rank %d aborted the communicator to shrink it", comm->rank);
    if (comm->engine) comm->engine->failQueued(why);
    comm->requestAbort(why);
  }
  std::vector<int> members;
  for (int r = 0; r < comm->nranks; ++r)
    if (!excluded[static_cast<size_t>(r)]) members.push_back(r);
  // The first member creates the new id and sends it, with the exclude set it was given, to
  // every other member over the parent's bootstrap links (point to point: no dead rank in the way).
  struct Offer {
    UniqueId id;
    uint64_t excludeHash;
    int32_t members;
  };
  const uint64_t hash = fnv1a(excluded.data(), excluded.size());  // over the exclude bitmap
  const uint32_t tag = 0x5348524Bu + comm->shrinks++;             // "SHRK" + the n-th shrink of this communicator
  const int leader = members[0];
  Offer offer;
  memset(&offer, 0, sizeof(offer));  // padding included: it goes on the wire
  if (comm->rank == leader) {
    C4_CHECK_RECORD(detail::bootstrapEphemeralUniqueId("", &offer.id));
    offer.excludeHash = hash;
    offer.members = static_cast<int32_t>(members.size());
    for (size_t i = 1; i < members.size(); ++i) {
      Status st = comm->bootstrap->send(members[i], tag, &offer, sizeof(offer));
      if (!st.isOk())
        return record(makeError(st.code(), "rank %d: commShrink: sending the new communicator's id to rank %d: %s",
                                comm->rank, members[i], st.message().c_str()));
    }
  } else {
    Status st = comm->bootstrap->recv(leader, tag, &offer, sizeof(offer));
    if (!st.isOk())
      return record(makeError(st.code(),
                              "rank %d: commShrink: waiting for the new communicator's id from rank %d "
                              "(the lowest rank not excluded): %s",
                              comm->rank, leader, st.message().c_str()));
    if (offer.excludeHash != hash || offer.members != static_cast<int32_t>(members.size()))
      return record(makeError(Code::kInvalidUsage,
                              "rank %d: commShrink: ranks disagree on the exclude list: rank %d keeps %d ranks, this "
                              "rank %zu (or another set)",
                              comm->rank, leader, offer.members, members.size()));
  }
  const int newRank = static_cast<int>(std::find(members.begin(), members.end(), comm->rank) - members.begin());
  Config cfg = config ? *config : comm->config;
  C4_INFO(kLogInit, "rank %d: commShrink to %zu of %d ranks (new rank %d)", comm->rank, members.size(), comm->nranks,
          newRank);
  return commInitRank(newcomm, static_cast<int>(members.size()), offer.id, newRank, cfg);
}

Status commGrowId(Comm* comm, UniqueId* id) {
  C4_CHECK_RECORD(checkUsable(comm));
  if (!id) return record(makeError(Code::kInvalidArgument, "commGrowId: id is NULL"));
  if (comm->growIdPending)
    return record(makeError(Code::kInvalidUsage,
                            "rank %d: commGrowId: the id made earlier was not used by a commGrow yet (one at a time)",
                            comm->rank));
  C4_CHECK_RECORD(detail::bootstrapEphemeralUniqueId("", &comm->growId));
  comm->growIdPending = true;
  *id = comm->growId;
  return Status::ok();
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
  if (rank != -1)
    return record(makeError(Code::kInvalidArgument,
                            "rank %d: commGrow: a rank of the communicator passes rank -1 (it keeps its rank), not %d",
                            comm->rank, rank));
  if (nranks <= comm->nranks)
    return record(makeError(Code::kInvalidArgument, "rank %d: commGrow: %d ranks do not grow a communicator of %d",
                            comm->rank, nranks, comm->nranks));
  if (comm->engine) comm->engine->drain();
  // The rank that made the id hands it to the others; every rank learns who offers what, so a
  // mistake (no id, two ids, an id not made here) fails every rank alike instead of hanging one.
  struct Offer {
    UniqueId id;
    int32_t state;  // 0: no id, 1: an id from commGrowId, 2: an id that commGrowId did not make
    int32_t nranks;
  };
  std::vector<Offer> all(static_cast<size_t>(comm->nranks));
  Offer& mine = all[static_cast<size_t>(comm->rank)];
  memset(&mine, 0, sizeof(mine));
  mine.nranks = nranks;
  if (id) {
    mine.id = *id;
    mine.state = comm->growIdPending && memcmp(id->bytes, comm->growId.bytes, sizeof(id->bytes)) == 0 ? 1 : 2;
  }
  C4_CHECK_RECORD(comm->bootstrap->allGather(all.data(), sizeof(Offer)));
  int offerer = -1, offers = 0;
  for (int r = 0; r < comm->nranks; ++r) {
    const Offer& o = all[static_cast<size_t>(r)];
    if (o.nranks != nranks)
      return record(makeError(Code::kInvalidUsage, "rank %d: commGrow: rank %d grows to %d ranks, this rank to %d",
                              comm->rank, r, o.nranks, nranks));
    if (o.state == 2)
      return record(makeError(Code::kInvalidUsage,
                              "rank %d: commGrow: rank %d passed an id that its commGrowId on this communicator did "
                              "not make (or one used already)",
                              comm->rank, r));
    if (o.state == 1) {
      ++offers;
      offerer = r;
    }
  }
  if (offers != 1)
    return record(makeError(Code::kInvalidUsage,
                            "rank %d: commGrow: exactly one rank of the communicator passes the id from commGrowId; "
                            "%d did",
                            comm->rank, offers));
  if (comm->rank == offerer) comm->growIdPending = false;  // consumed
  C4_INFO(kLogInit, "rank %d: commGrow from %d to %d ranks (id from rank %d)", comm->rank, comm->nranks, nranks,
          offerer);
  return commInitRank(newcomm, nranks, all[static_cast<size_t>(offerer)].id, comm->rank,
                      config ? *config : comm->config);
}

Status commSuspend(Comm* comm, bool releaseMemory) {
  C4_CHECK_RECORD(checkUsable(comm));
  if (comm->engine) comm->engine->drain();
  C4_CHECK_RECORD(onDataPath(comm, [&] {
    if (releaseMemory) comm->releaseCaches();
    return Status::ok();
  }));
  comm->suspended.store(true, std::memory_order_release);
  C4_INFO(kLogInit, "rank %d: communicator suspended%s", comm->rank, releaseMemory ? " (caches released)" : "");
  return Status::ok();
}

Status commResume(Comm* comm) {
  C4_CHECK_RECORD(checkComm(comm));
  if (!comm->suspended.exchange(false, std::memory_order_acq_rel))
    return record(makeError(Code::kInvalidUsage, "rank %d: commResume: the communicator is not suspended", comm->rank));
  return Status::ok();
}

Status commMemStats(const Comm* comm, MemStats* out) {
  C4_CHECK_RECORD(checkComm(comm));
  if (!out) return record(makeError(Code::kInvalidArgument, "commMemStats: out is NULL"));
  *out = MemStats{};
  out->suspended = comm->suspended.load(std::memory_order_acquire);
  return Status::ok();
}

/// How window (de)registration runs its local changes: on the data path (core/rma.hpp, OnPath);
/// without a progress thread the caller's thread drives the communicator already (a BusyScope).
static Rma::OnPath windowPath(Comm* comm) {
  return [comm](const std::function<Status()>& fn) { return comm->engine ? onDataPath(comm, fn) : fn(); };
}

Status windowRegister(Comm* comm, void* buff, size_t size, int flags, Window** win) {
  C4_CHECK_RECORD(checkUsable(comm));
  if (!buff || !win) return record(makeError(Code::kInvalidArgument, "windowRegister: a NULL argument"));
  if (size == 0) return record(makeError(Code::kInvalidArgument, "windowRegister: size is 0"));
  (void)flags;  // NCCL's window flags change nothing here: puts are always ordered (docs/api-coverage.md)
  // A window on device memory needs the communicator's StreamGate (its one-sided calls run in
  // stream order) and is registered for collectives; a failure there fails the registration on
  // every rank (registerWindow). The exchange itself runs without the drive, so that this rank's
  // progress thread answers the peers meanwhile.
  Status prep;
  Comm::Registration* reg = nullptr;
  const gpu::PtrInfo where = gpu::pointerInfo(buff);
  if (where.mem == gpu::Mem::kDevice)
    prep = onDataPath(comm, [&] {
      C4_CHECK(comm->device.ensureGate(where.device, where.device, "windowRegister"));
      return comm->registerMemory(buff, size, &reg);
    });
  if (comm->engine) comm->engine->drain();
  // Without a progress thread this thread drives the communicator throughout (commAbort from
  // another thread waits for it); with one, it takes the drive only for the window's local changes.
  std::optional<BusyScope> busy;
  if (!comm->engine) busy.emplace(comm);
  InsideCall inside(comm, "ncclCommWindowRegister");
  return record(comm->rma.registerWindow(buff, size, prep, reg, windowPath(comm), win));
}

Status windowDeregister(Comm* comm, Window* win) {
  C4_CHECK_RECORD(checkComm(comm));
  if (comm->engine) comm->engine->drain();
  std::optional<BusyScope> busy;
  if (!comm->engine) busy.emplace(comm);
  InsideCall inside(comm, "ncclCommWindowDeregister");
  return record(comm->rma.deregisterWindow(win, windowPath(comm)));
}

Status windowUserPtr(const Comm* comm, const Window* win, void** ptr) {
  C4_CHECK_RECORD(checkComm(comm));
  if (!ptr) return record(makeError(Code::kInvalidArgument, "windowUserPtr: ptr is NULL"));
  C4_CHECK_RECORD(comm->rma.checkWindow("windowUserPtr", win));
  *ptr = win->base;
  return Status::ok();
}

namespace {
/// The checks and ordering of a one-sided call on host-memory windows: a usable communicator, and
/// (with a progress thread) the operations queued before it done, so it follows them as calls do.
Status beforeOneSided(Comm* comm) {
  C4_CHECK(checkUsable(comm));
  if (comm->engine) comm->engine->drain();
  return Status::ok();
}

/// The checks of a one-sided call on device windows: not in a CUDA graph capture, and not behind
/// calls of this communicator in the same open group (the group's calls run at groupEnd, after it).
Status checkStreamOneSided(Comm* comm, const char* fn, void* stream) {
  C4_CHECK(DevicePath::refuseCapture(stream, fn));
  if (tGroup.depth > 0)
    for (const GroupItem& item : tGroup.queue.items)
      if (item.comm == comm && !item.ops.empty())
        return makeError(Code::kInvalidUsage,
                         "%s: a one-sided call on device windows after a collective or send/recv of the same "
                         "communicator in one group is not supported (it would run before them); end the group first, "
                         "or put the one-sided calls first (docs/cuda.md)",
                         fn);
  return Status::ok();
}

/// A one-sided call on a communicator whose windows are device memory (core/rma.hpp), in `stream`'s
/// order as NCCL runs them: the stream reaches the call (and copies `stageBytes` of `src`, device
/// memory, into a staging slot: a put to a peer of another host), then waits while the progress
/// thread runs `run` (given the staged copy, or null); the caller returns at once. A failure there
/// fails the communicator (commGetAsyncError), and the stream goes on.
Status enqueueOneSided(Comm* comm, const char* fn, void* stream, const void* src, size_t stageBytes,
                       std::function<Status(const void* staged)> run) {
  C4_CHECK(checkStreamOneSided(comm, fn, stream));
  return comm->device.submitOneSided(stream, src, stageBytes, std::move(run));
}
}  // namespace

Status putSignal(const void* src, size_t bytes, int peer, Window* win, size_t offset, Comm* comm, void* stream) {
  C4_CHECK_RECORD(checkUsable(comm));
  if (bytes > 0 && !src) return record(makeError(Code::kInvalidArgument, "putSignal: the source buffer is NULL"));
  C4_CHECK_RECORD(comm->rma.checkPut(bytes, peer, win, offset));
  const gpu::Mem srcMem = bytes > 0 ? gpu::pointerInfo(src).mem : gpu::Mem::kHost;
  if (!win->device) {
    if (srcMem == gpu::Mem::kDevice)
      return record(makeError(Code::kInvalidUsage,
                              "putSignal: the source buffer is device memory and the window host memory; a put into "
                              "a host-memory window takes host memory (windows on device memory take device "
                              "memory; docs/cuda.md)"));
    C4_CHECK_RECORD(beforeOneSided(comm));
    return record(comm->rma.put(src, bytes, peer, win, offset));
  }
  if (bytes > 0 && srcMem == gpu::Mem::kHost)
    return record(makeError(Code::kInvalidArgument,
                            "putSignal: the window is device memory and the source buffer pageable host memory; a "
                            "put into a device window reads device (or pinned host) memory in the stream's order"));
  // To a peer of another host the data goes through host memory: the stream copies device memory there.
  const bool stage = srcMem == gpu::Mem::kDevice && comm->rma.viaNetwork(peer);
  return record(enqueueOneSided(comm, "putSignal", stream, src, stage ? bytes : 0,
                                [comm, src, bytes, peer, win, offset](const void* staged) {
                                  return comm->rma.putDevice(staged ? staged : src, bytes, peer, win, offset);
                                }));
}

Status signalPeer(int peer, Comm* comm, void* stream) {
  C4_CHECK_RECORD(checkUsable(comm));
  C4_CHECK_RECORD(comm->rma.checkPeer("signal", peer));
  if (!comm->rma.deviceMode()) {
    C4_CHECK_RECORD(beforeOneSided(comm));
    return record(comm->rma.signal(peer));
  }
  return record(enqueueOneSided(comm, "signal", stream, nullptr, 0,
                                [comm, peer](const void*) { return comm->rma.signal(peer); }));
}

Status waitSignal(int n, const int* peers, const int* counts, Comm* comm, void* stream) {
  C4_CHECK_RECORD(checkUsable(comm));
  if (n < 0) return record(makeError(Code::kInvalidArgument, "waitSignal: %d descriptors", n));
  if (n > 0 && (!peers || !counts)) return record(makeError(Code::kInvalidArgument, "waitSignal: a NULL array"));
  C4_CHECK_RECORD(comm->rma.checkWait(n, peers, counts));
  if (!comm->rma.deviceMode()) {
    C4_CHECK_RECORD(beforeOneSided(comm));
    return record(comm->rma.wait(n, peers, counts));
  }
  // No job: the stream waits for a flag the driving thread sets once the signals arrived (rma.hpp).
  C4_CHECK_RECORD(checkStreamOneSided(comm, "waitSignal", stream));
  return record(comm->rma.waitDevice(n, peers, counts, stream));
}

Status commFinalize(Comm* comm) {
  C4_CHECK_RECORD(checkComm(comm));
  if (comm->finalized) return Status::ok();
  comm->finalized = true;
  auto finish = [comm] {
    // A second clock sample (so c4-trace can correct drift); bounded, as a rank may not finalize.
    if (comm->recorder.allocated() && !comm->state.failed()) comm->traceClockSync(1, 2000);
    dumpTrace(comm, trace::DumpReason::kFinalize);
    return Status::ok();
  };
  if (comm->engine && !comm->config.blocking && !comm->state.failed()) {
    // Non-blocking (NCCL): queued behind the calls before it; kInProgress until commGetAsyncError
    // says it is done, so a late peer holds up nothing but the queue.
    auto job = std::make_shared<Job>();
    job->kind = Job::Kind::kCall;
    job->call = finish;
    return comm->queueJob(job);
  }
  // Host collectives complete before they return; a progress thread's queue runs to its end first.
  if (comm->engine) comm->engine->drain();
  return finish();
}

Status commDestroy(Comm* comm) {
  if (!comm) return Status::ok();  // like NCCL: destroying NULL is a no-op
  C4_CHECK_RECORD(checkComm(comm));
  unregisterComm(comm);
  dropGroupWork(comm, "destroyed");
  // A nonblocking init still waiting for its peers ends now rather than at C4_TIMEOUT.
  comm->cancelInit();
  // C4D's goodbye first: from now on the health thread asks this communicator for nothing.
  comm->health->stop(comm->state.failed() ? "failed" : "left");
  // What is queued on a progress thread runs first (NCCL's destroy also completes pending work).
  if (comm->engine) comm->engine->stop();
  comm->flushSends();
  if (!comm->finalized) dumpTrace(comm, trace::DumpReason::kDestroy);
  delete comm;
  return Status::ok();
}

Status commAbort(Comm* comm) {
  if (!comm) return Status::ok();
  C4_CHECK_RECORD(checkComm(comm));
  unregisterComm(comm);
  dropGroupWork(comm, "aborted");
  comm->cancelInit();  // a nonblocking init still waiting for its peers ends now
  comm->health->stop("aborted");
  const Status why = makeError(Code::kRemoteError, "rank %d aborted the communicator", comm->rank);
  if (comm->engine) {
    // The progress thread carries the abort out (in-flight work fails), then stops.
    comm->engine->failQueued(why);
    comm->requestAbort(why);
    comm->engine->stop();
  } else {
    comm->requestAbort(why);
    // Another thread may be inside an operation on it: it fails at its next poll; wait for it.
    while (comm->busy.load(std::memory_order_acquire)) sched_yield();
  }
  dumpTrace(comm, trace::DumpReason::kAbort);
  delete comm;
  return Status::ok();
}

Status commRevoke(Comm* comm) {
  C4_CHECK_RECORD(checkComm(comm));
  if (comm->finalized) return record(makeError(Code::kInvalidUsage, "rank %d: communicator was finalized", comm->rank));
  if (comm->state.revoke()) {
    C4_INFO(kLogInit, "rank %d: communicator %s revoked", comm->rank, comm->tag.c_str());
    const Status why = makeError(Code::kRemoteError, "rank %d revoked the communicator", comm->rank);
    if (comm->engine) comm->engine->failQueued(why);
    comm->requestAbort(why);
  }
  // Quiescent once no operation runs any more (in-flight ones fail at their next poll).
  auto quiescent = [comm] {
    return comm->engine ? !comm->engine->pending() : !comm->busy.load(std::memory_order_acquire);
  };
  if (!comm->config.blocking) {
    if (!quiescent()) return Status(Code::kInProgress, "revoke in progress");
  } else {
    while (!quiescent()) sched_yield();
  }
  return Status::ok();
}

Status commCount(const Comm* comm, int* count) {
  C4_CHECK_RECORD(checkComm(comm));
  if (!count) return record(makeError(Code::kInvalidArgument, "count is NULL"));
  *count = comm->nranks;
  return Status::ok();
}

Status commUserRank(const Comm* comm, int* rank) {
  C4_CHECK_RECORD(checkComm(comm));
  if (!rank) return record(makeError(Code::kInvalidArgument, "rank is NULL"));
  *rank = comm->rank;
  return Status::ok();
}

Status commCuDevice(const Comm* comm, int* device) {
  C4_CHECK_RECORD(checkComm(comm));
  if (!device) return record(makeError(Code::kInvalidArgument, "device is NULL"));
  // The GPU its device buffers are staged for, else the caller's current GPU at init (NCCL's rule).
  *device = comm->device.gate() ? comm->device.gate()->device() : comm->cudaDevice;
  return Status::ok();
}

Status commGetAsyncError(Comm* comm) {
  C4_CHECK_RECORD(checkComm(comm));
  const bool busy = comm->engine ? comm->engine->pending() : comm->busy.load(std::memory_order_acquire);
  if (comm->state.revoked()) return busy ? Status(Code::kInProgress, "revoke in progress") : Status::ok();
  if (comm->state.failed()) return comm->state.error();
  // A non-blocking communicator's init and operations are done once nothing is queued. Callers
  // poll this in a loop: yield, so that the progress thread gets the core (with ranks on every
  // core, a spinning poller otherwise holds it for a whole time slice).
  if (comm->engine && busy) {
    sched_yield();
    return Status(Code::kInProgress, "operations in progress");
  }
  return Status::ok();
}

Status redOpCreatePreMulSum(RedOp* op, const void* scalar, DataType dt, ScalarResidence residence, Comm* comm) {
  C4_CHECK_RECORD(checkUsable(comm));
  if (comm->engine) comm->engine->drain();  // its queued calls read the operator table
  if (!op) return record(makeError(Code::kInvalidArgument, "op is NULL"));
  if (!scalar) return record(makeError(Code::kInvalidArgument, "scalar is NULL"));
  C4_CHECK_RECORD(checkType(dt));
  if (residence != ScalarResidence::kDevice && residence != ScalarResidence::kHostImmediate)
    return record(makeError(Code::kInvalidArgument, "invalid scalar residence %d", static_cast<int>(residence)));
  UserOp u;
  u.live = true;
  u.dtype = dt;
  u.residence = residence;
  if (residence == ScalarResidence::kHostImmediate)
    memcpy(u.value, scalar, dataTypeSize(dt));
  else
    u.pointer = scalar;
  size_t idx = 0;
  while (idx < comm->userOps.size() && comm->userOps[idx].live) ++idx;
  if (idx == comm->userOps.size())
    comm->userOps.push_back(u);
  else
    comm->userOps[idx] = u;
  *op = static_cast<RedOp>(kNumBuiltinOps + static_cast<int>(idx));
  return Status::ok();
}

Status redOpDestroy(RedOp op, Comm* comm) {
  C4_CHECK_RECORD(checkComm(comm));
  if (comm->engine) comm->engine->drain();
  int v = static_cast<int>(op);
  size_t idx = static_cast<size_t>(v - kNumBuiltinOps);
  if (v < kNumBuiltinOps || idx >= comm->userOps.size() || !comm->userOps[idx].live)
    return record(makeError(Code::kInvalidArgument, "reduction operator %d was not created on this communicator", v));
  comm->userOps[idx].live = false;
  return Status::ok();
}

Status allReduce(const void* sendbuff, void* recvbuff, size_t count, DataType dt, RedOp op, Comm* comm, void* stream) {
  OpDesc d{Coll::kAllReduce, sendbuff, recvbuff, count, dt, op, 0, stream};
  C4_CHECK_RECORD(validate(comm, d, 1, 1, true, true));
  C4_CHECK_RECORD(
      checkOverlap("allReduce", sendbuff, count * dataTypeSize(dt), recvbuff, count * dataTypeSize(dt), recvbuff));
  C4_CHECK_RECORD(checkOp(comm, op, dt));
  C4_CHECK_RECORD(comm->submit(d, tGroup.depth > 0 ? &tGroup.queue : nullptr));
  return Status::ok();
}

Status allGather(const void* sendbuff, void* recvbuff, size_t sendcount, DataType dt, Comm* comm, void* stream) {
  OpDesc d{Coll::kAllGather, sendbuff, recvbuff, sendcount, dt, RedOp::kSum, 0, stream};
  C4_CHECK_RECORD(validate(comm, d, 1, static_cast<size_t>(comm && isLiveComm(comm) ? comm->nranks : 1), true, true));
  {
    const size_t b = sendcount * dataTypeSize(dt);
    C4_CHECK_RECORD(checkOverlap("allGather", sendbuff, b, recvbuff, b * static_cast<size_t>(comm->nranks),
                                 static_cast<const char*>(recvbuff) + b * static_cast<size_t>(comm->rank)));
  }
  C4_CHECK_RECORD(comm->submit(d, tGroup.depth > 0 ? &tGroup.queue : nullptr));
  return Status::ok();
}

Status broadcast(const void* sendbuff, void* recvbuff, size_t count, DataType dt, int root, Comm* comm, void* stream) {
  OpDesc d{Coll::kBroadcast, sendbuff, recvbuff, count, dt, RedOp::kSum, root, stream};
  C4_CHECK_RECORD(validate(comm, d, 1, 1, false, true));
  C4_CHECK_RECORD(checkRoot(comm, root, "root"));
  if (comm->rank == root) C4_CHECK_RECORD(checkPtr(sendbuff, count, "sendbuff (at root)"));
  if (comm->rank == root)
    C4_CHECK_RECORD(
        checkOverlap("broadcast", sendbuff, count * dataTypeSize(dt), recvbuff, count * dataTypeSize(dt), recvbuff));
  C4_CHECK_RECORD(comm->submit(d, tGroup.depth > 0 ? &tGroup.queue : nullptr));
  return Status::ok();
}

Status reduceScatter(const void* sendbuff, void* recvbuff, size_t recvcount, DataType dt, RedOp op, Comm* comm,
                     void* stream) {
  OpDesc d{Coll::kReduceScatter, sendbuff, recvbuff, recvcount, dt, op, 0, stream};
  C4_CHECK_RECORD(validate(comm, d, static_cast<size_t>(comm && isLiveComm(comm) ? comm->nranks : 1), 1, true, true));
  {
    const size_t b = recvcount * dataTypeSize(dt);
    C4_CHECK_RECORD(checkOverlap(
        "reduceScatter", sendbuff, b * static_cast<size_t>(comm->nranks), recvbuff, b,
        reinterpret_cast<const void*>(reinterpret_cast<uintptr_t>(recvbuff) - b * static_cast<size_t>(comm->rank))));
  }
  C4_CHECK_RECORD(checkOp(comm, op, dt));
  C4_CHECK_RECORD(comm->submit(d, tGroup.depth > 0 ? &tGroup.queue : nullptr));
  return Status::ok();
}

Status reduce(const void* sendbuff, void* recvbuff, size_t count, DataType dt, RedOp op, int root, Comm* comm,
              void* stream) {
  OpDesc d{Coll::kReduce, sendbuff, recvbuff, count, dt, op, root, stream};
  C4_CHECK_RECORD(validate(comm, d, 1, 1, true, false));
  C4_CHECK_RECORD(checkRoot(comm, root, "root"));
  C4_CHECK_RECORD(checkOp(comm, op, dt));
  if (comm->rank == root) C4_CHECK_RECORD(checkPtr(recvbuff, count, "recvbuff (at root)"));
  if (comm->rank == root)
    C4_CHECK_RECORD(
        checkOverlap("reduce", sendbuff, count * dataTypeSize(dt), recvbuff, count * dataTypeSize(dt), recvbuff));
  C4_CHECK_RECORD(comm->submit(d, tGroup.depth > 0 ? &tGroup.queue : nullptr));
  return Status::ok();
}

Status alltoAll(const void* sendbuff, void* recvbuff, size_t count, DataType dt, Comm* comm, void* stream) {
  OpDesc d{Coll::kAlltoAll, sendbuff, recvbuff, count, dt, RedOp::kSum, 0, stream};
  size_t n = static_cast<size_t>(comm && isLiveComm(comm) ? comm->nranks : 1);
  C4_CHECK_RECORD(validate(comm, d, n, n, true, true));
  C4_CHECK_RECORD(checkOverlap("alltoAll", sendbuff, n * count * dataTypeSize(dt), recvbuff,
                               n * count * dataTypeSize(dt), recvbuff));
  C4_CHECK_RECORD(comm->submit(d, tGroup.depth > 0 ? &tGroup.queue : nullptr));
  return Status::ok();
}

Status gather(const void* sendbuff, void* recvbuff, size_t count, DataType dt, int root, Comm* comm, void* stream) {
  OpDesc d{Coll::kGather, sendbuff, recvbuff, count, dt, RedOp::kSum, root, stream};
  size_t n = static_cast<size_t>(comm && isLiveComm(comm) ? comm->nranks : 1);
  C4_CHECK_RECORD(validate(comm, d, 1, n, true, false));
  C4_CHECK_RECORD(checkRoot(comm, root, "root"));
  if (comm->rank == root) {
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
  size_t n = static_cast<size_t>(comm && isLiveComm(comm) ? comm->nranks : 1);
  C4_CHECK_RECORD(validate(comm, d, n, 1, false, true));
  C4_CHECK_RECORD(checkRoot(comm, root, "root"));
  if (comm->rank == root) {
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
  if (peer == comm->rank)
    return makeError(Code::kInvalidArgument, "%s: peer %d is this rank; sends to itself pair with receives in a group",
                     fn, peer);
  return Status::ok();
}

/// waitProbe on the driving thread: the caller's, or the progress thread (the result is the caller's
/// whatever the communicator's blocking mode: a probe reports, it does not run an operation).
static Status runProbe(Comm* comm, int peer, ProbeResult* out, int64_t waitMs) {
  if (!comm->engine) {
    BusyScope busy(comm);
    return comm->waitProbe(peer, out, waitMs);
  }
  Status inl;
  if (comm->engine->runInline([&] { return comm->waitProbe(peer, out, waitMs); }, &inl)) return inl;
  auto job = std::make_shared<Job>();
  job->kind = Job::Kind::kProbe;
  job->peer = peer;
  job->waitMs = waitMs;
  Status st = comm->queueJob(job, /*forceWait=*/true);
  *out = job->probe;
  return st;
}

Status iprobe(int peer, Comm* comm, ProbeResult* out) {
  C4_CHECK_RECORD(checkProbe(peer, comm, out, "iprobe"));
  return record(runProbe(comm, peer, out, 0));  // one look
}

Status probe(int peer, Comm* comm, ProbeResult* out, int64_t waitMs) {
  C4_CHECK_RECORD(checkProbe(peer, comm, out, "probe"));
  return record(runProbe(comm, peer, out, waitMs));
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
  if (comm->nranks == 1)
    return record(makeError(Code::kInvalidUsage, "recvAny on a communicator of 1 rank: there is no other rank"));
  if (comm->engine) {
    // The sender is the result: the call waits even on a non-blocking communicator.
    auto job = std::make_shared<Job>();
    job->kind = Job::Kind::kRecvAny;
    job->ops.push_back(d);
    Status st = comm->queueJob(job, /*forceWait=*/true);
    if (st.isOk()) *source = job->source;
    return record(std::move(st));
  }
  BusyScope busy(comm);
  return record(comm->recvAny(d, source));
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
    for (const GroupItem& it : *items) it.comm->device.cancel(it.ops);
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
    first = initComm(inits[0].comm, inits[0].nranks, inits[0].id, inits[0].rank, inits[0].config);
  } else if (!inits.empty()) {
    first = initRanksInThreads(inits.size(), [&](size_t i) {
      return initComm(inits[i].comm, inits[i].nranks, inits[i].id, inits[i].rank, inits[i].config);
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
    Status st = it.comm->device.finishStaging(&it.ops);
    if (staging.isOk()) staging = st;
  }
  for (GroupItem& it : items) {
    if (!it.comm->engine) {
      here.push_back(std::move(it));
      continue;
    }
    std::shared_ptr<Job> job;
    for (auto& j : jobs)
      if (j.first == it.comm) job = j.second;
    if (!job) {
      job = std::make_shared<Job>();
      jobs.emplace_back(it.comm, job);
    }
    job->ops.insert(job->ops.end(), it.ops.begin(), it.ops.end());
  }
  for (auto& j : jobs) j.first->engine->submit(j.second);
  Status st;
  if (!here.empty()) {
    for (GroupItem& it : here) it.comm->busy.store(true, std::memory_order_seq_cst);
    st = runGroupItems(here);
    for (GroupItem& it : here) it.comm->busy.store(false, std::memory_order_release);
  }
  for (auto& j : jobs) {
    if (!j.first->config.blocking) {
      inProgress = true;  // commGetAsyncError reports its outcome
      continue;
    }
    // A part made only of calls on device buffers runs in its streams' order: nothing to wait for here.
    if (j.second->allStaged) continue;
    Status js = j.first->engine->wait(*j.second);
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
  C4_CHECK_RECORD(comm->recorder.setLevel(level));
  return Status::ok();
}

Status getLevel(const Comm* comm, Level* level) {
  C4_CHECK_RECORD(checkComm(comm));
  if (!level) return record(makeError(Code::kInvalidArgument, "level is NULL"));
  *level = static_cast<Level>(comm->recorder.level());
  return Status::ok();
}

Status flush(Comm* comm, std::string* path) {
  C4_CHECK_RECORD(checkComm(comm));
  C4_CHECK_RECORD(comm->recorder.dump(DumpReason::kRequest, path));
  return Status::ok();
}

Status readEvents(const Comm* comm, std::vector<Event>* out, uint64_t* dropped) {
  C4_CHECK_RECORD(checkComm(comm));
  if (!out) return record(makeError(Code::kInvalidArgument, "out is NULL"));
  comm->recorder.snapshot(out, dropped);
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
  if (!comm->recorder.on()) return Status::ok();
  Event e;
  e.type = EventType::kSpan;
  e.t0 = beginTicks;
  e.t1 = endTicks;
  e.bytes = bytes;
  e.seq = comm->recorder.intern(name);
  comm->recorder.record(e);
  return Status::ok();
}

Status addNote(Comm* comm, const char* text) {
  C4_CHECK_RECORD(checkComm(comm));
  if (!text) return record(makeError(Code::kInvalidArgument, "note text is NULL"));
  comm->recorder.note(text);
  return Status::ok();
}

}  // namespace trace

}  // namespace c4
