// The communicator's side of the C++ API (core/api.cc validates the arguments and keeps the
// thread's group and last error): its life cycle (start, finalize, destroy, abort, revoke), the
// communicators made from it (split, shrink, grow), suspension, reduction operators, windows and
// one-sided calls, probes, and what C4D and the tracer answer.
#include <sched.h>

#include <algorithm>
#include <cstring>
#include <functional>
#include <memory>
#include <optional>
#include <vector>

#include "c4comm/c4comm.hpp"
#include "common/hash.hpp"
#include "common/logging.hpp"
#include "common/params.hpp"
#include "common/status.hpp"
#include "core/bootstrap.hpp"
#include "core/comm.hpp"
#include "core/drive.hpp"
#include "core/progress.hpp"
#include "gpu/gpu.hpp"

namespace c4 {

C4_PARAM_INT(ProgressThread, "C4_PROGRESS_THREAD", nullptr, 0, 0, 1, kParamNone,
             "1: every communicator gets a progress thread that runs its operations in call order (blocking calls "
             "wait for it; between calls it keeps the network transports progressing); 0: the calling thread drives "
             "each operation. Communicators created with Config::blocking = 0 always have one")

namespace {

/// While it lives, C4D's heartbeats say this rank waits inside c4comm in `what`, a blocking call
/// that is no collective (so a peer's hang diagnosis does not call it busy outside c4comm).
class InsideCall {
 public:
  InsideCall(HealthMonitor* h, const char* what) : h_(h) { h_->telemetry().setInside(what); }
  ~InsideCall() { h_->telemetry().setInside(nullptr); }
  InsideCall(const InsideCall&) = delete;
  InsideCall& operator=(const InsideCall&) = delete;

 private:
  HealthMonitor* h_;
};

/// Whether a communicator with `config` gets a progress thread.
/// Where GPUs are, every communicator gets one too: calls on device buffers run there, and creating it
/// at the first such call would race with threads that query the communicator (PyTorch's watchdog
/// calls ncclCommGetAsyncError all along). Blocking host calls still run inline on the caller's thread.
bool wantsEngine(const Config& config) {
  return config.blocking == 0 || paramProgressThread() != 0 || gpu::deviceCount() > 0;
}

}  // namespace

// ---- life cycle ----

Status Comm::start(int n, const UniqueId& id, int r, const Config& cfg) {
  cudaDevice = gpu::currentDevice();
  rank = r;
  nranks = n;
  config = cfg;
  if (wantsEngine(cfg)) {
    engine = std::make_unique<ProgressEngine>(this);
    recorder.setShared(true);  // the progress thread and the caller record
    C4_CHECK(engine->start());
    auto job = std::make_shared<Job>();
    job->kind = Job::Kind::kInit;
    job->nranks = n;
    job->rank = r;
    job->id = id;
    job->config = cfg;
    // Non-blocking: the communicator is handed out now and commGetAsyncError says when it is ready.
    return queueJob(job);
  }
  Status st;
  try {  // no exception crosses the API: memory exhaustion during init is an error
    st = init(n, id, r, cfg);
  } catch (const std::bad_alloc&) {
    st = makeError(Code::kSystemError, "rank %d/%d: out of memory during communicator init", r, n);
  } catch (const std::exception& e) {
    st = makeError(Code::kInternalError, "rank %d/%d: communicator init failed: %s", r, n, e.what());
  }
  if (!st.isOk()) {
    C4_WARN(kLogInit, "rank %d/%d: init failed: %s", r, n, st.toString().c_str());
    (void)fail(st);
  }
  return st;
}

Status Comm::usable() {
  if (finalized) return makeError(Code::kInvalidUsage, "rank %d: communicator was finalized", rank);
  if (state.revoked())
    return makeError(Code::kInvalidUsage,
                     "rank %d: communicator was revoked (commRevoke); only commShrink, commFinalize, commDestroy and "
                     "commAbort are allowed on it",
                     rank);
  if (suspended.load(std::memory_order_acquire))
    return makeError(Code::kInvalidUsage, "rank %d: communicator is suspended (commSuspend); commResume first", rank);
  return failure();
}

void Comm::drain() {
  if (engine) engine->drain();
}

Status Comm::onDataPath(const std::function<Status()>& fn) {
  if (!engine) {
    BusyScope busy(this);
    return fn();
  }
  for (;;) {
    engine->drain();
    Status st;
    if (engine->runInline(fn, &st)) return st;
    sched_yield();
  }
}

void Comm::dumpTrace(trace::DumpReason why) {
  if (!recorder.allocated()) return;
  if (health && health->traceDue()) health->drainTrace();  // C4D's records go in too
  Status st = recorder.dump(why);
  if (!st.isOk()) C4_WARN(kLogInit, "%s", st.message().c_str());
}

Status Comm::finalize() {
  if (finalized) return Status::ok();
  finalized = true;
  auto finish = [this] {
    // A second clock sample (so c4-trace can correct drift); bounded, as a rank may not finalize.
    if (recorder.allocated() && !state.failed()) traceClockSync(1, 2000);
    dumpTrace(trace::DumpReason::kFinalize);
    return Status::ok();
  };
  if (engine && !config.blocking && !state.failed()) {
    // Non-blocking (NCCL): queued behind the calls before it; kInProgress until commGetAsyncError
    // says it is done, so a late peer holds up nothing but the queue.
    auto job = std::make_shared<Job>();
    job->kind = Job::Kind::kCall;
    job->call = finish;
    return queueJob(job);
  }
  // Host collectives complete before they return; a progress thread's queue runs to its end first.
  drain();
  return finish();
}

void Comm::destroy() {
  // A nonblocking init still waiting for its peers ends now rather than at C4_TIMEOUT.
  cancelInit();
  // C4D's goodbye first: from now on the health thread asks this communicator for nothing.
  health->stop(state.failed() ? "failed" : "left");
  // What is queued on a progress thread runs first (NCCL's destroy also completes pending work).
  if (engine) engine->stop();
  flushSends();
  if (!finalized) dumpTrace(trace::DumpReason::kDestroy);
}

void Comm::abort() {
  cancelInit();  // a nonblocking init still waiting for its peers ends now
  health->stop("aborted");
  const Status why = makeError(Code::kRemoteError, "rank %d aborted the communicator", rank);
  if (engine) {
    // The progress thread carries the abort out (in-flight work fails), then stops.
    engine->failQueued(why);
    requestAbort(why);
    engine->stop();
  } else {
    requestAbort(why);
    // Another thread may be inside an operation on it: it fails at its next poll; wait for it.
    while (busy.load(std::memory_order_acquire)) sched_yield();
  }
  dumpTrace(trace::DumpReason::kAbort);
}

Status Comm::revoke() {
  if (finalized) return makeError(Code::kInvalidUsage, "rank %d: communicator was finalized", rank);
  if (state.revoke()) {
    C4_INFO(kLogInit, "rank %d: communicator %s revoked", rank, tag.c_str());
    const Status why = makeError(Code::kRemoteError, "rank %d revoked the communicator", rank);
    if (engine) engine->failQueued(why);
    requestAbort(why);
  }
  // Quiescent once no operation runs any more (in-flight ones fail at their next poll).
  auto quiescent = [this] { return engine ? !engine->pending() : !busy.load(std::memory_order_acquire); };
  if (!config.blocking) {
    if (!quiescent()) return Status(Code::kInProgress, "revoke in progress");
  } else {
    while (!quiescent()) sched_yield();
  }
  return Status::ok();
}

Status Comm::asyncError() {
  const bool pending = engine ? engine->pending() : busy.load(std::memory_order_acquire);
  if (state.revoked()) return pending ? Status(Code::kInProgress, "revoke in progress") : Status::ok();
  if (state.failed()) return state.error();
  // A non-blocking communicator's init and operations are done once nothing is queued. Callers
  // poll this in a loop: yield, so that the progress thread gets the core (with ranks on every
  // core, a spinning poller otherwise holds it for a whole time slice).
  if (engine && pending) {
    sched_yield();
    return Status(Code::kInProgress, "operations in progress");
  }
  return Status::ok();
}

int Comm::cuDevice() const {
  // The GPU its device buffers are staged for, else the caller's current GPU at init (NCCL's rule).
  return device.gate() ? device.gate()->device() : cudaDevice;
}

// ---- communicators made from this one ----

Status Comm::split(int color, int key, const Config* cfg, Offspring* out) {
  drain();
  InsideCall inside(health.get(), "ncclCommSplit");
  struct Entry {
    int32_t color, key;
  };
  std::vector<Entry> all(static_cast<size_t>(nranks));
  all[static_cast<size_t>(rank)] = Entry{color, key};
  C4_CHECK(bootstrap->allGather(all.data(), sizeof(Entry)));
  std::vector<int> members;
  for (int r = 0; r < nranks; ++r)
    if (color >= 0 && all[static_cast<size_t>(r)].color == color) members.push_back(r);
  std::stable_sort(members.begin(), members.end(),
                   [&all](int a, int b) { return all[static_cast<size_t>(a)].key < all[static_cast<size_t>(b)].key; });
  // The first member of each color creates the id; everyone learns it through the parent.
  std::vector<UniqueId> ids(static_cast<size_t>(nranks));
  memset(ids.data(), 0, ids.size() * sizeof(UniqueId));
  bool leader = !members.empty() && members[0] == rank;
  if (leader) C4_CHECK(detail::bootstrapEphemeralUniqueId("", &ids[static_cast<size_t>(rank)]));
  C4_CHECK(bootstrap->allGather(ids.data(), sizeof(UniqueId)));
  out->none = color == -1;
  if (out->none) return Status::ok();
  out->rank = static_cast<int>(std::find(members.begin(), members.end(), rank) - members.begin());
  out->nranks = static_cast<int>(members.size());
  out->id = ids[static_cast<size_t>(members[0])];
  out->config = cfg ? *cfg : config;
  return Status::ok();
}

Status Comm::shrink(const int* exclude, int nexclude, const Config* cfg, bool abortParent, Offspring* out) {
  if (finalized) return makeError(Code::kInvalidUsage, "rank %d: communicator was finalized", rank);
  if (!abortParent) drain();
  std::vector<char> excluded(static_cast<size_t>(nranks), 0);
  for (int i = 0; i < nexclude; ++i) {
    const int r = exclude[i];
    if (r < 0 || r >= nranks)
      return makeError(Code::kInvalidArgument, "exclude list entry %d: rank %d is not in 0..%d", i, r, nranks - 1);
    if (excluded[static_cast<size_t>(r)])
      return makeError(Code::kInvalidArgument, "exclude list names rank %d twice", r);
    excluded[static_cast<size_t>(r)] = 1;
  }
  if (excluded[static_cast<size_t>(rank)])
    return makeError(Code::kInvalidUsage, "rank %d is in its own exclude list: excluded ranks must not call commShrink",
                     rank);
  if (abortParent) {
    const Status why = makeError(Code::kRemoteError, "rank %d aborted the communicator to shrink it", rank);
    if (engine) engine->failQueued(why);
    requestAbort(why);
  }
  std::vector<int> members;
  for (int r = 0; r < nranks; ++r)
    if (!excluded[static_cast<size_t>(r)]) members.push_back(r);
  // The first member creates the new id and sends it, with the exclude set it was given, to
  // every other member over the parent's bootstrap links (point to point: no dead rank in the way).
  struct Offer {
    UniqueId id;
    uint64_t excludeHash;
    int32_t members;
  };
  const uint64_t hash = fnv1a(excluded.data(), excluded.size());  // over the exclude bitmap
  const uint32_t tagOf = 0x5348524Bu + shrinks++;                 // "SHRK" + the n-th shrink of this communicator
  const int leader = members[0];
  Offer offer;
  memset(&offer, 0, sizeof(offer));  // padding included: it goes on the wire
  if (rank == leader) {
    C4_CHECK(detail::bootstrapEphemeralUniqueId("", &offer.id));
    offer.excludeHash = hash;
    offer.members = static_cast<int32_t>(members.size());
    for (size_t i = 1; i < members.size(); ++i) {
      Status st = bootstrap->send(members[i], tagOf, &offer, sizeof(offer));
      if (!st.isOk())
        return makeError(st.code(), "rank %d: commShrink: sending the new communicator's id to rank %d: %s", rank,
                         members[i], st.message().c_str());
    }
  } else {
    Status st = bootstrap->recv(leader, tagOf, &offer, sizeof(offer));
    if (!st.isOk())
      return makeError(st.code(),
                       "rank %d: commShrink: waiting for the new communicator's id from rank %d "
                       "(the lowest rank not excluded): %s",
                       rank, leader, st.message().c_str());
    if (offer.excludeHash != hash || offer.members != static_cast<int32_t>(members.size()))
      return makeError(Code::kInvalidUsage,
                       "rank %d: commShrink: ranks disagree on the exclude list: rank %d keeps %d ranks, this "
                       "rank %zu (or another set)",
                       rank, leader, offer.members, members.size());
  }
  out->none = false;
  out->rank = static_cast<int>(std::find(members.begin(), members.end(), rank) - members.begin());
  out->nranks = static_cast<int>(members.size());
  out->id = offer.id;
  out->config = cfg ? *cfg : config;
  C4_INFO(kLogInit, "rank %d: commShrink to %zu of %d ranks (new rank %d)", rank, members.size(), nranks, out->rank);
  return Status::ok();
}

Status Comm::makeGrowId(UniqueId* id) {
  if (growIdPending)
    return makeError(Code::kInvalidUsage,
                     "rank %d: commGrowId: the id made earlier was not used by a commGrow yet (one at a time)", rank);
  C4_CHECK(detail::bootstrapEphemeralUniqueId("", &growId));
  growIdPending = true;
  *id = growId;
  return Status::ok();
}

Status Comm::grow(int n, const UniqueId* id, int r, const Config* cfg, Offspring* out) {
  if (r != -1)
    return makeError(Code::kInvalidArgument,
                     "rank %d: commGrow: a rank of the communicator passes rank -1 (it keeps its rank), not %d", rank,
                     r);
  if (n <= nranks)
    return makeError(Code::kInvalidArgument, "rank %d: commGrow: %d ranks do not grow a communicator of %d", rank, n,
                     nranks);
  drain();
  // The rank that made the id hands it to the others; every rank learns who offers what, so a
  // mistake (no id, two ids, an id not made here) fails every rank alike instead of hanging one.
  struct Offer {
    UniqueId id;
    int32_t state;  // 0: no id, 1: an id from commGrowId, 2: an id that commGrowId did not make
    int32_t nranks;
  };
  std::vector<Offer> all(static_cast<size_t>(nranks));
  Offer& mine = all[static_cast<size_t>(rank)];
  memset(&mine, 0, sizeof(mine));
  mine.nranks = n;
  if (id) {
    mine.id = *id;
    mine.state = growIdPending && memcmp(id->bytes, growId.bytes, sizeof(id->bytes)) == 0 ? 1 : 2;
  }
  C4_CHECK(bootstrap->allGather(all.data(), sizeof(Offer)));
  int offerer = -1, offers = 0;
  for (int q = 0; q < nranks; ++q) {
    const Offer& o = all[static_cast<size_t>(q)];
    if (o.nranks != n)
      return makeError(Code::kInvalidUsage, "rank %d: commGrow: rank %d grows to %d ranks, this rank to %d", rank, q,
                       o.nranks, n);
    if (o.state == 2)
      return makeError(Code::kInvalidUsage,
                       "rank %d: commGrow: rank %d passed an id that its commGrowId on this communicator did "
                       "not make (or one used already)",
                       rank, q);
    if (o.state == 1) {
      ++offers;
      offerer = q;
    }
  }
  if (offers != 1)
    return makeError(Code::kInvalidUsage,
                     "rank %d: commGrow: exactly one rank of the communicator passes the id from commGrowId; "
                     "%d did",
                     rank, offers);
  if (rank == offerer) growIdPending = false;  // consumed
  C4_INFO(kLogInit, "rank %d: commGrow from %d to %d ranks (id from rank %d)", rank, nranks, n, offerer);
  out->none = false;
  out->nranks = n;
  out->id = all[static_cast<size_t>(offerer)].id;
  out->rank = rank;
  out->config = cfg ? *cfg : config;
  return Status::ok();
}

Status Comm::suspend(bool releaseMemory) {
  drain();
  C4_CHECK(onDataPath([&] {
    if (releaseMemory) releaseCaches();
    return Status::ok();
  }));
  suspended.store(true, std::memory_order_release);
  C4_INFO(kLogInit, "rank %d: communicator suspended%s", rank, releaseMemory ? " (caches released)" : "");
  return Status::ok();
}

Status Comm::resume() {
  if (!suspended.exchange(false, std::memory_order_acq_rel))
    return makeError(Code::kInvalidUsage, "rank %d: commResume: the communicator is not suspended", rank);
  return Status::ok();
}

// ---- reduction operators ----

Status Comm::checkOp(RedOp op, DataType dt) const {
  int v = static_cast<int>(op);
  if (v >= 0 && v < kNumBuiltinOps) return Status::ok();
  size_t idx = static_cast<size_t>(v - kNumBuiltinOps);
  if (v < 0 || idx >= userOps.size() || !userOps[idx].live)
    return makeError(Code::kInvalidArgument, "invalid reduction operator %d on this communicator", v);
  if (userOps[idx].dtype != dt)
    return makeError(Code::kInvalidArgument, "reduction operator %d was created for %s but the call uses %s", v,
                     dataTypeName(userOps[idx].dtype), dataTypeName(dt));
  return Status::ok();
}

RedOp Comm::createPreMulSum(const void* scalar, DataType dt, ScalarResidence residence) {
  drain();  // its queued calls read the operator table
  UserOp u;
  u.live = true;
  u.dtype = dt;
  u.residence = residence;
  if (residence == ScalarResidence::kHostImmediate)
    memcpy(u.value, scalar, dataTypeSize(dt));
  else
    u.pointer = scalar;
  size_t idx = 0;
  while (idx < userOps.size() && userOps[idx].live) ++idx;
  if (idx == userOps.size())
    userOps.push_back(u);
  else
    userOps[idx] = u;
  return static_cast<RedOp>(kNumBuiltinOps + static_cast<int>(idx));
}

Status Comm::destroyOp(RedOp op) {
  drain();
  int v = static_cast<int>(op);
  size_t idx = static_cast<size_t>(v - kNumBuiltinOps);
  if (v < kNumBuiltinOps || idx >= userOps.size() || !userOps[idx].live)
    return makeError(Code::kInvalidArgument, "reduction operator %d was not created on this communicator", v);
  userOps[idx].live = false;
  return Status::ok();
}

// ---- windows and one-sided calls ----

Rma::OnPath Comm::windowPath() {
  // Window (de)registration runs its local changes on the data path (core/rma.hpp, OnPath); without
  // a progress thread the caller's thread drives the communicator already (a BusyScope).
  return [this](const std::function<Status()>& fn) { return engine ? onDataPath(fn) : fn(); };
}

Status Comm::registerWindow(void* buff, size_t size, Window** win) {
  // A window on device memory needs the communicator's StreamGate (its one-sided calls run in
  // stream order) and is registered for collectives; a failure there fails the registration on
  // every rank (registerWindow). The exchange itself runs without the drive, so that this rank's
  // progress thread answers the peers meanwhile.
  Status prep;
  Registration* reg = nullptr;
  const gpu::PtrInfo where = gpu::pointerInfo(buff);
  if (where.mem == gpu::Mem::kDevice)
    prep = onDataPath([&] {
      C4_CHECK(device.ensureGate(where.device, where.device, "windowRegister"));
      return registerMemory(buff, size, &reg);
    });
  drain();
  // Without a progress thread this thread drives the communicator throughout (commAbort from
  // another thread waits for it); with one, it takes the drive only for the window's local changes.
  std::optional<BusyScope> driving;
  if (!engine) driving.emplace(this);
  InsideCall inside(health.get(), "ncclCommWindowRegister");
  return rma.registerWindow(buff, size, prep, reg, windowPath(), win);
}

Status Comm::deregisterWindow(Window* win) {
  drain();
  std::optional<BusyScope> driving;
  if (!engine) driving.emplace(this);
  InsideCall inside(health.get(), "ncclCommWindowDeregister");
  return rma.deregisterWindow(win, windowPath());
}

Status Comm::windowBase(const Window* win, void** ptr) const {
  C4_CHECK(rma.checkWindow("windowUserPtr", win));
  *ptr = win->base;
  return Status::ok();
}

Status Comm::checkStreamOneSided(const char* fn, void* stream, bool behindGroupCalls) {
  C4_CHECK(DevicePath::refuseCapture(stream, fn));
  if (behindGroupCalls)
    return makeError(Code::kInvalidUsage,
                     "%s: a one-sided call on device windows after a collective or send/recv of the same "
                     "communicator in one group is not supported (it would run before them); end the group first, "
                     "or put the one-sided calls first (docs/cuda.md)",
                     fn);
  return Status::ok();
}

Status Comm::putSignal(const void* src, size_t bytes, int peer, Window* win, size_t offset, void* stream,
                       bool behindGroupCalls) {
  C4_CHECK(rma.checkPut(bytes, peer, win, offset));
  const gpu::Mem srcMem = bytes > 0 ? gpu::pointerInfo(src).mem : gpu::Mem::kHost;
  if (!win->device) {
    if (srcMem == gpu::Mem::kDevice)
      return makeError(Code::kInvalidUsage,
                       "putSignal: the source buffer is device memory and the window host memory; a put into "
                       "a host-memory window takes host memory (windows on device memory take device "
                       "memory; docs/cuda.md)");
    drain();  // the calls queued before it are done, as for any call
    return rma.put(src, bytes, peer, win, offset);
  }
  if (bytes > 0 && srcMem == gpu::Mem::kHost)
    return makeError(Code::kInvalidArgument,
                     "putSignal: the window is device memory and the source buffer pageable host memory; a "
                     "put into a device window reads device (or pinned host) memory in the stream's order");
  // To a peer of another host the data goes through host memory: the stream copies device memory there.
  const bool stage = srcMem == gpu::Mem::kDevice && rma.viaNetwork(peer);
  C4_CHECK(checkStreamOneSided("putSignal", stream, behindGroupCalls));
  return device.submitOneSided(stream, src, stage ? bytes : 0, [this, src, bytes, peer, win, offset](const void* s) {
    return rma.putDevice(s ? s : src, bytes, peer, win, offset);
  });
}

Status Comm::signalPeer(int peer, void* stream, bool behindGroupCalls) {
  C4_CHECK(rma.checkPeer("signal", peer));
  if (!rma.deviceMode()) {
    drain();
    return rma.signal(peer);
  }
  C4_CHECK(checkStreamOneSided("signal", stream, behindGroupCalls));
  return device.submitOneSided(stream, nullptr, 0, [this, peer](const void*) { return rma.signal(peer); });
}

Status Comm::waitSignal(int n, const int* peers, const int* counts, void* stream, bool behindGroupCalls) {
  C4_CHECK(rma.checkWait(n, peers, counts));
  if (!rma.deviceMode()) {
    drain();
    return rma.wait(n, peers, counts);
  }
  // No job: the stream waits for a flag the driving thread sets once the signals arrived (rma.hpp).
  C4_CHECK(checkStreamOneSided("waitSignal", stream, behindGroupCalls));
  return rma.waitDevice(n, peers, counts, stream);
}

// ---- probes ----

Status Comm::submitProbe(int peer, ProbeResult* out, int64_t waitMs) {
  // On the driving thread: the caller's, or the progress thread (the result is the caller's whatever
  // the communicator's blocking mode: a probe reports, it does not run an operation).
  if (!engine) {
    BusyScope driving(this);
    return waitProbe(peer, out, waitMs);
  }
  Status inl;
  if (engine->runInline([&] { return waitProbe(peer, out, waitMs); }, &inl)) return inl;
  auto job = std::make_shared<Job>();
  job->kind = Job::Kind::kProbe;
  job->peer = peer;
  job->waitMs = waitMs;
  Status st = queueJob(job, /*forceWait=*/true);
  *out = job->probe;
  return st;
}

Status Comm::submitRecvAny(const OpDesc& op, int* source) {
  if (engine) {
    // The sender is the result: the call waits even on a non-blocking communicator.
    auto job = std::make_shared<Job>();
    job->kind = Job::Kind::kRecvAny;
    job->ops.push_back(op);
    Status st = queueJob(job, /*forceWait=*/true);
    if (st.isOk()) *source = job->source;
    return st;
  }
  BusyScope driving(this);
  return recvAny(op, source);
}

// ---- a group's part on this communicator (groupEnd) ----

Status Comm::finishStaging(std::vector<OpDesc>* ops) { return device.finishStaging(ops); }

void Comm::cancelStaged(const std::vector<OpDesc>& ops) { device.cancel(ops); }

std::shared_ptr<Job> Comm::postGroupPart(std::vector<OpDesc>&& ops) {
  auto job = std::make_shared<Job>();
  job->ops = std::move(ops);
  engine->submit(job);
  return job;
}

Status Comm::waitGroupPart(Job& job, bool* inProgress) {
  if (!config.blocking) {
    *inProgress = true;  // commGetAsyncError reports its outcome
    return Status::ok();
  }
  // A part made only of calls on device buffers runs in its streams' order: nothing to wait for here.
  if (job.allStaged) return Status::ok();
  return engine->wait(job);
}

// ---- what C4D and the tracer answer ----

void Comm::setDiagnosisCallback(DiagnosisCallback cb) { health->setCallback(std::move(cb)); }

std::vector<Diagnosis> Comm::diagnoses() const { return health->diagnoses(); }

}  // namespace c4
