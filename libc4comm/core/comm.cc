#include "core/comm.hpp"

#include <poll.h>
#include <sched.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <map>
#include <set>
#include <unordered_set>

#include "common/clock.hpp"
#include "common/logging.hpp"
#include "common/params.hpp"
#include "common/process.hpp"
#include "common/siphash.hpp"
#include "common/socket.hpp"
#include "common/status.hpp"
#include "core/drive.hpp"
#include "core/paths.hpp"
#include "core/progress.hpp"
#include "core/settings.hpp"
#include "kernels/host/reduce.hpp"
#include "transports/idle.hpp"
#include "transports/registry.hpp"

namespace c4 {

namespace {
Status chooseTransports(const std::string& spec, std::vector<const transport::TransportEntry*>* out);
// C4_TRANSPORT: auto or a list of the transports of this build.
bool checkTransportSpec(const std::string& spec, std::string* why) {
  std::vector<const transport::TransportEntry*> chosen;
  Status st = chooseTransports(spec, &chosen);
  if (!st.isOk()) {
    // Its message without the "C4_TRANSPORT='...': " the registry's report puts first.
    const std::string& m = st.message();
    const size_t at = m.find("': ");
    *why = at == std::string::npos ? m : m.substr(at + 3);
  }
  return st.isOk();
}
}  // namespace

C4_PARAM_INT(Timeout, "C4_TIMEOUT", nullptr, 300, 1, 31536000, kParamNone,
             "Seconds a rank waits without any progress (bootstrap, a peer, a collective) before failing with an "
             "error naming whom it waited for")
C4_PARAM_STR(Transport, "C4_TRANSPORT", nullptr, "auto", checkTransportSpec, kParamSameOnAllRanks,
             "Which transports carry messages: auto (every transport of this build where it helps: shm between ranks "
             "of one host; between hosts ibverbs where RDMA works, else ucx where UCX reaches RDMA, else tcp), or a "
             "comma list of transport names in order of preference, each peer "
             "going over the first that reaches it (shm: ranks on other hosts are unreachable; tcp: tcp for every "
             "peer, also on one host)")
C4_PARAM_INT(ScheduleCache, "C4_SCHEDULE_CACHE", nullptr, 64, 1, 65536, kParamNone,
             "Generated schedules kept per communicator (LRU)")
C4_PARAM_INT(TraceClockRounds, "C4_TRACE_CLOCK_ROUNDS", nullptr, 8, 0, 1000, kParamSameOnAllRanks,
             "Ping-pongs per rank with rank 0 that align trace clocks at init and finalize (0: none)")
C4_PARAM_STR(TestInitStall, "C4_TEST_INIT_STALL", nullptr, "", "|bootstrap|transports|zerocopy|schedules|lanes|clock",
             kParamNone,
             "Tests only: this rank stops before the named phase of communicator init until it is killed, so that "
             "its peers wait for it there (an abort must still end their init at once)")

namespace {
/// C4_TEST_INIT_STALL: stops this rank before init phase `phase` for good.
void stallForTest(const char* phase) {
  if (paramTestInitStall() != phase) return;
  C4_WARN(kLogInit, "C4_TEST_INIT_STALL: stopped before init phase %s until killed", phase);
  for (;;) sleep(1);
}
}  // namespace

int64_t commTimeoutMs(const Config& config) {
  // The environment wins over the Config, as NCCL's variables win over ncclConfig_t.
  if (config.timeoutMs > 0 && !kC4ParamTimeout.isSet()) return config.timeoutMs;
  return std::max<int64_t>(1, paramTimeout()) * 1000;
}

namespace {
std::mutex& registryMu() {
  static auto* m = new std::mutex();
  return *m;
}
std::unordered_set<const Comm*>& registry() {
  static auto* r = new std::unordered_set<const Comm*>();
  return *r;
}

/// Writes `v` as one element of `dt` into out (8 bytes of room).
void storeScalar(double v, DataType dt, void* out) {
  switch (dt) {
    case DataType::kFloat16: {
      unsigned short h = kernels::floatToHalf(static_cast<float>(v));
      memcpy(out, &h, 2);
      break;
    }
    case DataType::kBfloat16: {
      unsigned short b = kernels::floatToBf16(static_cast<float>(v));
      memcpy(out, &b, 2);
      break;
    }
    case DataType::kFloat8e4m3:
      *static_cast<unsigned char*>(out) = kernels::floatToFp8e4m3(static_cast<float>(v));
      break;
    case DataType::kFloat8e5m2:
      *static_cast<unsigned char*>(out) = kernels::floatToFp8e5m2(static_cast<float>(v));
      break;
    case DataType::kFloat32: {
      float f = static_cast<float>(v);
      memcpy(out, &f, 4);
      break;
    }
    case DataType::kFloat64:
      memcpy(out, &v, 8);
      break;
    default:
      break;  // integer types never get a fractional scale
  }
}

/// The network transports' 128-bit key: SipHash of the whole UniqueId (which carries the root's
/// random secret) under two fixed domain keys. Every rank holding the id derives the same key.
void deriveAuthKey(const UniqueId& id, uint64_t key[2]) {
  static const uint8_t k0[16] = {'c', '4', 'c', 'o', 'm', 'm', '-', 'n', 'e', 't', '-', 'k', 'e', 'y', '-', '0'};
  static const uint8_t k1[16] = {'c', '4', 'c', 'o', 'm', 'm', '-', 'n', 'e', 't', '-', 'k', 'e', 'y', '-', '1'};
  key[0] = sipHash24(k0, id.bytes, sizeof(id.bytes));
  key[1] = sipHash24(k1, id.bytes, sizeof(id.bytes));
}

/// The registered transports C4_TRANSPORT names ("auto": all of them), in order of preference. Under
/// auto the same-host ones come first, then the network transports registered AUTO_FIRST (RDMA: by
/// capability, where it works it is the fastest between hosts; each may veto its try), then the
/// others; init falls back past an AUTO_FIRST one where it cannot run.
Status chooseTransports(const std::string& spec, std::vector<const transport::TransportEntry*>* out) {
  out->clear();
  if (spec == "auto" || spec.empty()) {
    const auto& all = transport::transportRegistry();
    for (const transport::TransportEntry& e : all)
      if (e.sameHostOnly) out->push_back(&e);
    for (const transport::TransportEntry& e : all)
      if (!e.sameHostOnly && e.autoFirst && (e.autoEnabled == nullptr || e.autoEnabled())) out->push_back(&e);
    for (const transport::TransportEntry& e : all)
      if (!e.sameHostOnly && !e.autoFirst) out->push_back(&e);
    return Status::ok();
  }
  size_t pos = 0;
  while (pos <= spec.size()) {
    size_t end = spec.find(',', pos);
    if (end == std::string::npos) end = spec.size();
    const std::string name = spec.substr(pos, end - pos);
    pos = end + 1;
    if (name.empty()) continue;
    const transport::TransportEntry* e = transport::findTransport(name);
    if (!e)
      return makeError(Code::kInvalidArgument, "C4_TRANSPORT='%s': no transport '%s' in this build (it has: auto, %s)",
                       spec.c_str(), name.c_str(), transport::transportNames().c_str());
    if (std::find(out->begin(), out->end(), e) == out->end()) out->push_back(e);
  }
  if (out->empty())
    return makeError(Code::kInvalidArgument, "C4_TRANSPORT='%s' names no transport (this build has: auto, %s)",
                     spec.c_str(), transport::transportNames().c_str());
  return Status::ok();
}

constexpr size_t kAlign = 4096;
BufRef absolute(const void* p) { return BufRef{BufBase::kAbsolute, reinterpret_cast<uintptr_t>(p)}; }
size_t alignUp(size_t x) { return (x + kAlign - 1) / kAlign * kAlign; }
}  // namespace

// Destroying a communicator bumps the generation, which invalidates every thread's cached answer.
std::atomic<uint64_t> gCommGeneration{1};
thread_local const Comm* tLiveComm = nullptr;
thread_local uint64_t tLiveGeneration = 0;

void registerComm(Comm* c) {
  std::lock_guard<std::mutex> g(registryMu());
  registry().insert(c);
}
void unregisterComm(Comm* c) {
  std::lock_guard<std::mutex> g(registryMu());
  registry().erase(c);
  gCommGeneration.fetch_add(1, std::memory_order_release);
}
bool isLiveComm(const Comm* c) {
  // Fast path: this thread already saw `c` alive and no communicator was destroyed since.
  uint64_t gen = gCommGeneration.load(std::memory_order_acquire);
  if (c == tLiveComm && gen == tLiveGeneration) return true;
  std::lock_guard<std::mutex> g(registryMu());
  if (registry().count(c) == 0) return false;
  tLiveComm = c;
  tLiveGeneration = gCommGeneration.load(std::memory_order_relaxed);
  return true;
}

namespace {
/// The memory space of a call's buffer: shared if it lies in one ncclMemAlloc allocation.
transport::MemSpace spaceOf(const void* p, size_t bytes) {
  MemRef ref;
  return p && bytes && memLookup(p, bytes, &ref) ? transport::MemSpace::kHostShared : transport::MemSpace::kHost;
}

}  // namespace

Comm::Comm()
    : messagePath_(makeMessagePath()),
      oneShotPath_(makeOneShotPath(&oneShot)),
      zeroCopyPath_(makeZeroCopyPath(&zeroCopy, messagePath_.get())) {
  health = std::make_unique<HealthMonitor>();
  cancelFd_ = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);  // -1: init cannot be cancelled (it times out)
}

void Comm::cancelInit() {
  if (initDone_.load(std::memory_order_acquire)) return;
  cancelled_.store(true, std::memory_order_release);
  if (cancelFd_ >= 0) {
    uint64_t one = 1;
    (void)!write(cancelFd_, &one, sizeof(one));  // readable for good
  }
}

void Comm::flushSends() {
  // Sends that completed before their acknowledgement (eager, or detached at an operation's end)
  // may still be unread by the peer: closing the sockets now could cut them off. Progress until
  // they are acknowledged, the connection breaks, or the time is up (a peer that never reads).
  if (state.failed() || state.abortPending()) return;
  const int64_t limitMs = std::min<int64_t>(timeoutMs > 0 ? timeoutMs : 30000, 60000);
  const int64_t t0 = detail::nowMs();
  for (int idle = 0;;) {
    bool pending = false;
    for (auto& t : transports) pending |= t->sendsPending();
    if (!pending || detail::nowMs() - t0 > limitMs) return;
    if (!progressTransports().isOk()) return;
    idleWait(++idle);
  }
}

Comm::~Comm() {
  // C4D first: a goodbye, so that the peers do not take this rank's closing links for a death.
  if (health) health->stop(state.failed() ? "failed" : "left");
  // The progress thread first: nothing may drive the transports while they go.
  if (engine) engine->stop();
  engine.reset();
  // This rank's mappings of the peers' registered device buffers go before its own registrations
  // (whose deregistration waits for the peers to close theirs).
  zeroCopy.closeDevice();
  // Registrations the user never released go with their transports.
  while (!registrations_.empty()) (void)deregisterMemory(registrations_.begin()->first);
  // C4P's fabric service session uses the bootstrap (the ranks' reports and moves): it goes first.
  lanePlanner.stop();
  // Transports go first: they may reference the bootstrap's peers during teardown.
  transports.clear();
  bootstrap.reset();
  free(scratch_);
  if (cancelFd_ >= 0) close(cancelFd_);
}

Status Comm::init(int n, const UniqueId& id, int r, const Config& cfg) {
  rank = r;
  nranks = n;
  config = cfg;
  tag = commTagOf(id);
  timeoutMs = commTimeoutMs(cfg);
  watchdog_.configure(r, timeoutMs);
  // As for the timeout, C4_SHM_SPIN wins over the Config.
  spinNs = cfg.spinUs >= 0 && !transport::kC4ParamShmSpin.isSet() ? cfg.spinUs * 1000 : -1;

  // Phase times for the INFO line at the end (init time grows with ranks: docs/performance.md).
  auto msNow = [] { return static_cast<double>(detail::nowNs()) / 1e6; };
  const double tStart = msNow();
  RankInfo mine;
  mine.hostId = localHostId();
  mine.clockId = localClockId(trace::configuredSkewNs());
  mine.pid = static_cast<int32_t>(getpid());
  mine.process = processToken();
  mine.pidNs = pidNamespaceId();
  gethostname(mine.hostname, sizeof(mine.hostname) - 1);
  stallForTest("bootstrap");
  C4_CHECK(Bootstrap::create(id, r, n, mine, timeoutMs, &bootstrap, cancelFd_));
  peers = bootstrap->rankInfo();
  const double tBootstrap = msNow();

  std::set<uint64_t> hosts;
  localRanks = 0;
  for (const RankInfo& p : peers) {
    hosts.insert(p.hostId);
    localRanks += p.hostId == mine.hostId;
  }
  // Ranks in other network namespaces of this machine (emulated hosts) share its cores too: count
  // ranks by host name for the CPU budget.
  int machineRanks = 0;
  for (const RankInfo& p : peers) machineRanks += strncmp(p.hostname, mine.hostname, sizeof(mine.hostname)) == 0;
  long cores = sysconf(_SC_NPROCESSORS_ONLN);
  cpu_set_t cpuSet;
  if (sched_getaffinity(0, sizeof(cpuSet), &cpuSet) == 0) cores = CPU_COUNT(&cpuSet);
  // A non-blocking communicator runs its calls on its progress thread while the application
  // polls: two busy threads per rank. (With blocking calls the caller runs them itself and the
  // progress thread sleeps between them: one.)
  const int threadsPerRank = engine && !cfg.blocking ? 2 : 1;
  oversubscribed = std::max(localRanks, machineRanks) * threadsPerRank > std::max(1L, cores);

  transport::Context ctx;
  ctx.rank = r;
  ctx.nranks = n;
  ctx.commTag = tag;
  ctx.oob = bootstrap.get();
  ctx.timeoutMs = 0;  // the watchdog decides (C4_TIMEOUT); transports only detect failures
  for (const RankInfo& p : peers) {
    ctx.hostIds.push_back(p.hostId);
    ctx.pids.push_back(visiblePid(mine, p));
    ctx.processes.push_back(p.process);
  }
  deriveAuthKey(id, ctx.authKey);
  ctx.lanePlan = lanePlanner.hook();

  stallForTest("transports");
  // Every rank's settings must be acceptable, and those that shape the schedules or the wire
  // (C4_TRANSPORT among them) the same on every rank: one collective check (core/settings.hpp).
  C4_CHECK(checkSettings(*bootstrap, r, n));
  // Which transports, in which order of preference: every registered one (auto), or the list in
  // C4_TRANSPORT.
  std::vector<const transport::TransportEntry*> chosen;
  C4_CHECK(chooseTransports(paramTransport(), &chosen));
  const bool listed = paramTransport() != "auto";
  if (!listed && n > 1 && hosts.size() > 1) {
    // An automatic candidate whose answer depends on the host (ucx: whether UCX reaches an RDMA
    // device here) is tried only where every rank would try it, or ranks would set up different
    // transports: one bit per registry entry, ANDed over the ranks.
    const std::vector<transport::TransportEntry>& reg = transport::transportRegistry();
    std::vector<uint64_t> bits(static_cast<size_t>(n), 0);
    for (const transport::TransportEntry* e : chosen)
      if (e->autoFirst) bits[static_cast<size_t>(r)] |= uint64_t{1} << (e - reg.data());
    C4_CHECK(bootstrap->allGather(bits.data(), sizeof(uint64_t)));
    uint64_t everywhere = ~uint64_t{0};
    for (uint64_t b : bits) everywhere &= b;
    chosen.erase(std::remove_if(chosen.begin(), chosen.end(),
                                [&](const transport::TransportEntry* e) {
                                  return e->autoFirst && !((everywhere >> (e - reg.data())) & 1);
                                }),
                 chosen.end());
  }
  bool haveNetwork = false;
  // Whether the transports made so far reach every peer (the same answer on every rank: a same-host
  // transport decides collectively whom it reaches, e.g. shm where /dev/shm has no room).
  auto reachAll = [&] {
    for (int p = 0; p < n; ++p) {
      bool reached = p == r;
      for (const auto& t : transports) reached = reached || t->canConnect(p);
      if (!reached) return false;
    }
    return true;
  };
  for (const transport::TransportEntry* e : chosen) {
    // Automatically, a network transport is only worth its setup when some peer is not reached
    // yet (a rank elsewhere), and only the first (in order of preference): it reaches every rank,
    // so no peer would use another.
    if (!listed && !e->sameHostOnly && (n == 1 || haveNetwork || (hosts.size() == 1 && reachAll()))) continue;
    std::unique_ptr<transport::Transport> t;
    Status made = e->create(ctx, &t);
    // Under auto, an AUTO_FIRST transport (RDMA) is only a candidate: where any rank cannot use it
    // (its creation tells every rank, so all fall back together), the next network transport
    // carries the traffic.
    if (!made.isOk() && !listed && e->autoFirst) {
      const char* next = "the next network transport";
      for (auto it = std::find(chosen.begin(), chosen.end(), e) + 1; it != chosen.end(); ++it)
        if (!(*it)->sameHostOnly && !(*it)->autoFirst) {
          next = (*it)->name;
          break;
        }
      C4_INFO(kLogInit, "rank %d: not using %s between hosts (%s); %s carries them", r, e->autoLabel,
              made.message().c_str(), next);
      continue;
    }
    C4_CHECK(made);
    haveNetwork |= !e->sameHostOnly;
    transports.push_back(std::move(t));
  }
  // Each peer goes over the first transport (in order of preference) that reaches it.
  peerTransport.assign(static_cast<size_t>(n), nullptr);
  for (int p = 0; p < n; ++p) {
    if (p == r) continue;
    for (auto& t : transports) {
      if (!t->canConnect(p)) continue;
      peerTransport[static_cast<size_t>(p)] = t.get();
      break;
    }
  }
  // The tuner plans for the slowest transport in use; with several hosts it prices the
  // hierarchical schedules with the transports within and between hosts. Its inputs must be the
  // same on every rank, or ranks build different schedules that cannot match: a rank alone on its
  // host uses no same-host transport while the others do, so "in use" is the union over the ranks
  // (one small allGather), and the transports within and between hosts are the ones some rank uses.
  struct TransportUse {
    uint32_t used;         // bit i: transports[i] reaches one of this rank's peers
    int32_t intra, inter;  // index of the transport to a peer on this host / on another (-1: none)
  };
  std::vector<TransportUse> use(static_cast<size_t>(n), TransportUse{0, -1, -1});
  for (int p = 0; p < n; ++p) {
    for (size_t i = 0; i < transports.size(); ++i) {
      if (peerTransport[static_cast<size_t>(p)] != transports[i].get()) continue;
      TransportUse& u = use[static_cast<size_t>(r)];
      u.used |= 1u << i;
      int32_t& slot = peers[static_cast<size_t>(p)].hostId == mine.hostId ? u.intra : u.inter;
      if (slot < 0) slot = static_cast<int32_t>(i);
    }
  }
  C4_CHECK(bootstrap->allGather(use.data(), sizeof(TransportUse)));
  uint32_t usedAnywhere = 0;
  int32_t intraIndex = -1, interIndex = -1;
  for (const TransportUse& u : use) {
    usedAnywhere |= u.used;
    if (intraIndex < 0) intraIndex = u.intra;
    if (interIndex < 0) interIndex = u.inter;
  }
  transport::Caps caps;
  bool haveCaps = false;
  std::string names;
  for (size_t i = 0; i < transports.size(); ++i) {
    if (!(usedAnywhere & (1u << i)) && n > 1) continue;
    transport::Caps c = transports[i]->caps();
    if (!haveCaps || c.bwGBps < caps.bwGBps) caps = c;
    haveCaps = true;
    names += (names.empty() ? "" : "+") + std::string(transports[i]->name());
  }
  const transport::Transport* intraT = intraIndex >= 0 ? transports[static_cast<size_t>(intraIndex)].get() : nullptr;
  const transport::Transport* interT = interIndex >= 0 ? transports[static_cast<size_t>(interIndex)].get() : nullptr;
  // One-shot and zero-copy collectives run through the shared arenas of a same-host transport:
  // never when it is not in use (C4_TRANSPORT=tcp).
  transport::Transport* arenaT = nullptr;
  for (auto& t : transports)
    if (!arenaT && t->hostArena() != nullptr) arenaT = t.get();
  for (auto& t : transports)
    if (transport::WaitSource* w = t->waitSource()) {
      waitFds.push_back(pollfd{w->waitFd(), POLLIN, 0});
      waitSources.push_back(w);
    }
  std::string transportList;
  peerTransportIndex.assign(static_cast<size_t>(n), 0);
  for (size_t i = 0; i < transports.size(); ++i) {
    caps_.push_back(transports[i]->caps());
    transportList += (i ? "," : "") + std::string(transports[i]->name());
    for (int p = 0; p < n; ++p)
      if (peerTransport[static_cast<size_t>(p)] == transports[i].get())
        peerTransportIndex[static_cast<size_t>(p)] = static_cast<uint8_t>(i);
  }
  transport::setOversubscribed(oversubscribed);
  const double tTransports = msNow();
  oneShot.init(this, localRanks, arenaT);
  stallForTest("zerocopy");
  std::vector<PeerProcess> procs;
  for (const RankInfo& p : peers) procs.push_back(PeerProcess{visiblePid(mine, p), p.process});
  C4_CHECK(zeroCopy.init(this, procs, timeoutMs, &oneShot, arenaT, device.gateSlot(),
                         [this](const void* p, size_t len) { return registeredRange(p, len); }));
  const double tZeroCopy = msNow();
  cpuSharing = localRanks > 1 && arenaT != nullptr ? arenaT->cpuSharing() : nullptr;
  p2pSendSeq.assign(static_cast<size_t>(n), 0);
  p2pRecvSeq.assign(static_cast<size_t>(n), 0);
  C4_CHECK(tuner.init(n, static_cast<int>(hosts.size()), caps));
  std::vector<int32_t> hostOf;
  std::map<uint64_t, int32_t> hostIndex;
  for (const RankInfo& p : peers)
    hostOf.push_back(hostIndex.emplace(p.hostId, static_cast<int32_t>(hostIndex.size())).first->second);
  // Several hosts: the hierarchical schedules become candidates, priced with both cost models.
  if (hosts.size() > 1 && interT != nullptr)
    tuner.setHosts(hostOf, intraT != nullptr ? intraT->caps() : interT->caps(), interT->caps());
  // Schedule files (C4_SCHEDULE_FILE) before C4P plans: its flows follow the schedules in use.
  stallForTest("schedules");
  {
    uint64_t topoHash = 0;
    const bool haveTopo = lanePlanner.readTopology(&topoHash);
    // Every rank takes part in the comparison, a rank whose files did not load too (as a record
    // no rank accepts), so that none waits for it.
    Status local = tuner.loadSchedules(haveTopo, topoHash, timeoutMs);
    struct {
      uint64_t hash;
      int32_t ok;
      int32_t pad;
    } mineS{local.isOk() ? tuner.schedulesHash() : 0, local.isOk() ? 1 : 0, 0};
    std::vector<decltype(mineS)> allS(static_cast<size_t>(n));
    allS[static_cast<size_t>(r)] = mineS;
    C4_CHECK(bootstrap->allGather(allS.data(), sizeof(mineS)));
    C4_CHECK(local);
    for (int q = 0; q < n; ++q) {
      if (!allS[static_cast<size_t>(q)].ok)
        return makeError(Code::kInvalidUsage,
                         "C4_SCHEDULE_FILE: rank %d could not load its schedule files (see its log)", q);
      if (allS[static_cast<size_t>(q)].hash != mineS.hash)
        return makeError(Code::kInvalidUsage,
                         "C4_SCHEDULE_FILE: ranks %d and %d use different schedules (different files, contents or "
                         "topologies); give every rank the same files",
                         r, q);
    }
  }
  trace::RecorderInfo ti;
  ti.rank = r;
  ti.nranks = n;
  ti.commTag = tag;
  ti.commName = cfg.name;
  ti.host = mine.hostname;
  C4_CHECK(recorder.init(ti));
  recorder.setTransports(transportList);
  // C4P plans the lanes of the network transport in use (collective: every rank takes part).
  transport::Transport* laneT = nullptr;
  for (transport::Transport* t : peerTransport)
    if (t != nullptr && laneT == nullptr && t->laneSetup() != nullptr) laneT = t;
  stallForTest("lanes");
  C4_CHECK(lanePlanner.init(r, n, bootstrap.get(), hostOf, laneT, tuner, &recorder));
  // Transports that open their lanes at init (ibverbs' queue pairs) do it now, on the plan.
  for (auto& t : transports)
    if (transport::LaneSetup* lanes = t->laneSetup()) C4_CHECK(lanes->startLanes());
  stallForTest("clock");
  traceClockSync(0, timeoutMs);
  // The services get what they need of the communicator (docs/architecture.md).
  RankDirectory directory;
  directory.rank = r;
  directory.nranks = n;
  directory.ranks = peers;
  directory.sideChannel = bootstrap.get();
  HealthHost hh;
  static_cast<RankDirectory&>(hh) = directory;
  hh.tag = tag;
  hh.lanesTo = [this](int p) {
    transport::Transport* t = peerTransport[static_cast<size_t>(p)];
    return t ? t->laneSetup() : nullptr;
  };
  hh.connect = [this](int p, transport::Connection** c) { return connection(p, c); };
  hh.requestAbort = [this](const Status& st) { requestAbort(st); };
  hh.traceNote = [this](const std::string& s) { recorder.note(s); };
  C4_CHECK(health->start(std::move(hh)));
  RmaHost rh;
  static_cast<RankDirectory&>(rh) = std::move(directory);
  rh.timeoutMs = timeoutMs;
  rh.failure = [this] { return failure(); };
  rh.failed = [this] { return state.failed(); };
  rh.fail = [this](const Status& st) { return fail(st); };
  rh.deregister = [this](void* reg) { return deregisterMemory(static_cast<Registration*>(reg)); };
  rh.gate = [this] { return device.gate(); };
  rh.nudge = [this] {
    if (engine) engine->nudge();
  };
  rma.bind(std::move(rh));
  observers.attachBuiltins(this);
  initDone_.store(true, std::memory_order_release);
  const double tEnd = msNow();
  C4_INFO(kLogInit,
          "comm %s rank %d/%d pid %d: %zu host(s), %d rank(s) on this host%s, transports: %s; init %.1f ms (bootstrap "
          "%.1f, transports %.1f, zero-copy probe %.1f, tuner and trace clock %.1f)",
          tag.c_str(), r, n, mine.pid, hosts.size(), localRanks, oversubscribed ? " (more ranks than cores)" : "",
          names.empty() ? "none" : names.c_str(), tEnd - tStart, tBootstrap - tStart, tTransports - tBootstrap,
          tZeroCopy - tTransports, tEnd - tZeroCopy);
  return Status::ok();
}

Status Comm::connection(int peer, transport::Connection** out) {
  transport::Transport* t = peerTransport[static_cast<size_t>(peer)];
  if (!t) {
    const RankInfo& p = peers[static_cast<size_t>(peer)];
    return makeError(Code::kInvalidUsage,
                     "rank %d: no transport reaches rank %d on host %s (host id %016llx; this rank is on another "
                     "host) with C4_TRANSPORT=%s: shm only reaches ranks of the same host; use C4_TRANSPORT=auto "
                     "or tcp",
                     rank, peer, p.hostname, static_cast<unsigned long long>(p.hostId), paramTransport().c_str());
  }
  return t->connect(peer, out);
}

transport::Caps Comm::capsOf(int peer) const {
  const transport::Transport* t = peerTransport[static_cast<size_t>(peer)];
  return t ? caps_[peerTransportIndex[static_cast<size_t>(peer)]] : transport::Caps{};
}

uint8_t Comm::transportIndexOf(int peer) const { return peerTransportIndex[static_cast<size_t>(peer)]; }

uint64_t Comm::transportProgress() const {
  uint64_t n = 0;
  for (const auto& t : transports) n += t->progressCount();
  return n;
}

void Comm::idleWait(int idleRounds) {
  const long us = transport::idleBackoffUs(idleRounds, spinNs, cpuSharing);
  if (cpuSharing && (idleRounds & 15) == 0) {
    std::string note = cpuSharing->takeNote();
    if (!note.empty()) recorder.note(note);
  }
  if (us == 0) return;
  timespec ts{0, us * 1000};
  if (waitFds.empty()) {
    while (nanosleep(&ts, &ts) == -1 && errno == EINTR) {
    }
    return;
  }
  for (transport::WaitSource* w : waitSources)
    if (!w->armWait()) return;                                // events already pending: poll again at once
  (void)ppoll(waitFds.data(), waitFds.size(), &ts, nullptr);  // EINTR or timeout: the caller polls again
}

Status Comm::progressTransports() {
  if (state.abortPending()) takeAbortRequest();
  if (state.failed()) return state.error();
  zeroCopy.pollDeregistrations();
  for (auto& t : transports) C4_CHECK(t->progress());
  return Status::ok();
}

bool Comm::registeredRange(const void* p, size_t len) const {
  const auto a = reinterpret_cast<uintptr_t>(p);
  for (const auto& kv : registrations_) {
    const auto b = reinterpret_cast<uintptr_t>(kv.second->buff);
    if (a >= b && len <= kv.second->size && a - b <= kv.second->size - len) return true;
  }
  return false;
}

void Comm::requestAbort(const Status& st) {
  state.requestAbort(st);
  // Nobody drives the communicator: carry it out here. (A driving thread sees the flag at its next
  // poll; the progress thread between jobs.)
  if (!engine && !busy.load(std::memory_order_acquire)) takeAbortRequest();
}

void Comm::takeAbortRequest() {
  Status st;
  if (!state.takeAbort(&st)) return;
  (void)fail(st, false);  // a local abort, or C4D's own diagnosis: nothing to explain
}

Status Comm::fail(const Status& st0, bool explain) {
  if (state.failed()) return state.error();
  const Status st = explain ? observers.explain(st0) : st0;
  Status first;
  if (!state.setFailed(st, &first)) return first;
  C4_WARN(kLogColl, "rank %d: communicator %s failed: %s", rank, tag.c_str(), st.toString().c_str());
  observers.failed(st);  // before the transports tell: the peers learn why first
  for (auto& t : transports) t->abort(st.message());
  // The ring collectives stop; send/recv stay up for commShrink among the ranks that are left.
  if (bootstrap) bootstrap->interruptCollectives();
  return st;
}

Status Comm::failure() {
  if (state.abortPending() && (!engine || engine->onThread())) takeAbortRequest();
  if (!state.failed()) return Status::ok();
  const Status e = state.error();
  return Status(e.code(), "communicator failed earlier: " + e.message());
}

Status Comm::registerMemory(void* buff, size_t size, Registration** out) {
  auto reg = std::make_unique<Registration>();
  reg->buff = buff;
  reg->size = size;
  const transport::MemSpace space = spaceOf(buff, size);
  for (auto& t : transports) {
    std::unique_ptr<transport::MemRegion> r;
    Status st = t->registerMemory(buff, size, space, &r);
    if (!st.isOk()) {
      for (size_t i = 0; i < reg->regions.size(); ++i) (void)transports[i]->deregisterMemory(reg->regions[i].get());
      return makeError(st.code(), "rank %d: registering %zu bytes at %p with %s: %s", rank, size, buff, t->name(),
                       st.message().c_str());
    }
    reg->regions.push_back(std::move(r));
  }
  *out = reg.get();
  registrations_.emplace(reg.get(), std::move(reg));
  return Status::ok();
}

Status Comm::deregisterMemory(Registration* reg) {
  auto it = registrations_.find(reg);
  if (it == registrations_.end())
    return makeError(Code::kInvalidArgument,
                     "handle %p is not a live registration of this communicator (registered on another one, "
                     "already deregistered, or not from commRegister)",
                     static_cast<void*>(reg));
  Status first;
  for (size_t i = 0; i < reg->regions.size() && i < transports.size(); ++i) {
    Status st = transports[i]->deregisterMemory(reg->regions[i].get());
    if (first.isOk()) first = st;
  }
  const bool device = gpu::pointerInfo(reg->buff).mem == gpu::Mem::kDevice;
  registrations_.erase(it);
  // Peers may keep registered device buffers mapped (core/zerocopy.hpp): they close them first
  // (not on a failed communicator, whose peers may be gone).
  if (device && !state.failed()) {
    Status st = zeroCopy.deviceDeregistered();
    if (first.isOk()) first = st;
  }
  return first;
}

void Comm::releaseCaches() {
  cache_.clear();
  lru_.clear();
  free(scratch_);
  scratch_ = nullptr;
  scratchBytes_ = 0;
}

void* Comm::scratch(size_t bytes) {
  if (bytes > scratchBytes_) {
    free(scratch_);
    size_t sz = alignUp(bytes);
    if (posix_memalign(&scratch_, kAlign, sz) != 0) {
      scratch_ = nullptr;
      scratchBytes_ = 0;
      return nullptr;
    }
    scratchBytes_ = sz;
  }
  return scratch_;
}

Result<CachedPlan*> Comm::cachedPlan(const sched::CollArgs& args, size_t nominalBytes) {
  const ScheduleChoice* sc = tuner.scheduleFor(args.coll);
  CacheKey key{static_cast<int>(args.coll),
               static_cast<int>(args.dtype),
               args.root,
               args.count,
               args.aliased,
               sc != nullptr ? static_cast<int>(sc->algo) : -1};
  auto it = cache_.find(key);
  if (it != cache_.end()) {
    if (it->second.second != lru_.begin()) lru_.splice(lru_.begin(), lru_, it->second.second);
    return it->second.first.get();
  }
  TuneResult tr = tuner.choose(args.coll, nominalBytes);
  sched::CollArgs a = args;
  a.chunkBytes = tr.chunkBytes;
  a.hostOf = tuner.hostOf();
  C4_ASSIGN_OR_RETURN(sched::Schedule s, sched::generate(tr.algo, a));
  auto entry = std::make_unique<CachedPlan>();
  buildPlan(s, &entry->plan);
  entry->plan.singleCopy = tr.singleCopy;
  entry->schedScratch = alignUp(s.scratchBytes);
  entry->algo = tr.algo;
  C4_CHECK(entry->exec.bind(this, &entry->plan));
  C4_INFO(kLogTuning, "rank %d: %s %zu bytes (%s): algorithm %s, chunk %zu bytes, %zu steps%s: %s", rank,
          collName(args.coll), nominalBytes, dataTypeName(args.dtype), sched::algoName(tr.algo), tr.chunkBytes,
          s.steps.size(), tr.singleCopy ? ", single copy allowed" : "", tr.why.c_str());
  size_t limit = static_cast<size_t>(std::max<int64_t>(1, paramScheduleCache()));
  while (cache_.size() >= limit) {
    cache_.erase(lru_.back());
    lru_.pop_back();
  }
  lru_.push_front(key);
  CachedPlan* raw = entry.get();
  cache_.emplace(key, std::make_pair(std::move(entry), lru_.begin()));
  return raw;
}

namespace {
bool buffersOverlap(const void* a, size_t aBytes, const void* b, size_t bBytes) {
  if (!a || !b || aBytes == 0 || bBytes == 0) return false;
  const uintptr_t x = reinterpret_cast<uintptr_t>(a), y = reinterpret_cast<uintptr_t>(b);
  return x < y + bBytes && y < x + aBytes;
}

bool collReduces(Coll c) { return c == Coll::kAllReduce || c == Coll::kReduceScatter || c == Coll::kReduce; }

}  // namespace

double Comm::estimateUs(const OpDesc& op) const {
  const size_t bytes = nominalBytes(op, nranks);
  if (op.coll == Coll::kSend || op.coll == Coll::kRecv) return tuner.estimateUs(sched::Algo::kDirect, op.coll, bytes);
  return tuner.estimateUs(tuner.choose(op.coll, bytes).algo, op.coll, bytes);
}

Status Comm::prepareCollective(const OpDesc& op, PreparedCall* p) {
  p->op = op;
  p->noop = false;
  p->postDivide = false;
  p->traceAlgo = trace::kAlgoNone;
  OpSig sig;
  sig.seq = collSeq++;
  sig.count = op.count;
  sig.root =
      (op.coll == Coll::kBroadcast || op.coll == Coll::kReduce || op.coll == Coll::kGather || op.coll == Coll::kScatter)
          ? op.root
          : -1;
  sig.coll = static_cast<uint8_t>(op.coll);
  sig.dtype = static_cast<uint8_t>(op.dtype);
  bool reduces = collReduces(op.coll);
  int opv = static_cast<int>(op.op);
  sig.op = reduces ? (opv >= kNumBuiltinOps ? 0xff : static_cast<uint8_t>(opv)) : 0;
  p->sig = sig;
  p->op.seq = sig.seq;
  p->collective = true;
  // The path (core/route.hpp, rules 6-8).
  C4_CHECK(choosePath(op, p));
  const bool viaArena = p->kind == PathKind::kOneShot;
  // One-shot calls are stamped by OneShot when they publish (see OneShot::start).
  p->traceOneShot = viaArena && recorder.on();
  p->traceT0 = recorder.on() && !viaArena ? trace::ticks() : 0;
  if (op.count == 0) {
    p->noop = true;
    p->path = nullptr;
    return Status::ok();
  }

  sched::CollArgs args;
  args.coll = op.coll;
  args.rank = rank;
  args.nranks = nranks;
  args.count = op.count;
  args.dtype = op.dtype;
  args.root = op.root;
  args.reduces = reduces;
  // Disjoint buffers get a plan without write-after-read waits between input and output (an
  // in-place call, or any overlap, keeps the conservative one).
  args.aliased = buffersOverlap(op.sendbuff, sched::inputBytes(args), op.recvbuff, sched::outputBytes(args));
  CachedPlan* cp = nullptr;
  if (!viaArena) {
    C4_ASSIGN_OR_RETURN(cp, cachedPlan(args, nominalBytes(op, nranks)));
  }
  const size_t schedScratch = cp ? cp->schedScratch : 0;

  // PreMulSum and floating-point Avg scale each rank's input first (as NCCL does); integer Avg
  // sums and divides the result.
  const void* input = op.sendbuff;
  kernels::KOp kop = kernels::KOp::kSum;
  unsigned char scalar[8] = {0};
  bool prescale = false;
  if (reduces) {
    if (opv < static_cast<int>(RedOp::kAvg)) {
      kop = static_cast<kernels::KOp>(opv);
    } else if (opv == static_cast<int>(RedOp::kAvg)) {
      if (isFloatType(op.dtype)) {
        storeScalar(1.0 / nranks, op.dtype, scalar);
        prescale = true;
      } else {
        p->postDivide = true;
      }
    } else {
      const UserOp& u = userOps[static_cast<size_t>(opv - kNumBuiltinOps)];
      memcpy(scalar, u.residence == ScalarResidence::kDevice ? u.pointer : u.value, dataTypeSize(op.dtype));
      prescale = true;
    }
  }
  // In-place AlltoAll overwrites blocks it still has to send: work from a copy of the input.
  bool copyInput = op.coll == Coll::kAlltoAll && op.sendbuff == op.recvbuff && nranks > 1;
  size_t inBytes = (prescale || copyInput) ? sched::inputBytes(args) : 0;
  size_t need = schedScratch + inBytes;
  char* scr = nullptr;
  if (need > 0) {
    scr = static_cast<char*>(scratch(need));
    if (!scr) return makeError(Code::kSystemError, "rank %d: cannot allocate %zu bytes of scratch", rank, need);
  }
  if (prescale && input != nullptr) {
    char* scaled = scr + schedScratch;
    kernels::scale(scaled, input, scalar, inBytes / dataTypeSize(op.dtype), op.dtype);
    input = scaled;
  } else if (copyInput) {
    kernels::copy(scr + schedScratch, input, inBytes);
    input = scr + schedScratch;
  }
  p->kop = kop;
  p->bases[static_cast<int>(BufBase::kInput)] = input;
  p->bases[static_cast<int>(BufBase::kOutput)] = op.recvbuff;
  p->bases[static_cast<int>(BufBase::kScratch)] = scr;
  if (viaArena) {
    p->traceAlgo = trace::kAlgoOneShot;
    return Status::ok();
  }
  p->spaces[static_cast<int>(BufBase::kInput)] = spaceOf(input, sched::inputBytes(args));
  p->spaces[static_cast<int>(BufBase::kOutput)] = spaceOf(op.recvbuff, sched::outputBytes(args));
  p->traceAlgo = static_cast<uint8_t>(cp->algo);
  cp->plan.sig = sig;
  cp->plan.dtype = op.dtype;
  cp->plan.op = kop;
  p->exec = &cp->exec;
  return Status::ok();
}

Status Comm::prepareP2p(const std::vector<OpDesc>& ops, PreparedCall* p) {
  p->traceT0 = recorder.on() ? trace::ticks() : 0;
  p->traceAlgo = trace::kAlgoP2p;
  p->noop = false;
  p->postDivide = false;
  p->owned = std::make_unique<CachedPlan>();
  ExecPlan& plan = p->owned->plan;
  // A send whose buffer overlaps a receive of the same batch (in-place exchange, as nccl-tests
  // runs it) must not read data a receive already overwrote: single-copy peers pull from the
  // sender's buffer at their own pace. Such sends go out of a snapshot in scratch.
  auto overlapsRecv = [&ops](const OpDesc& s) {
    const char* a = static_cast<const char*>(s.sendbuff);
    size_t len = s.count * dataTypeSize(s.dtype);
    for (const OpDesc& r : ops) {
      if (r.coll != Coll::kRecv) continue;
      const char* b = static_cast<const char*>(r.recvbuff);
      size_t rl = r.count * dataTypeSize(r.dtype);
      if (len && rl && a < b + rl && b < a + len) return true;
    }
    return false;
  };
  size_t snapBytes = 0;
  for (const OpDesc& op : ops)
    if (op.coll == Coll::kSend && overlapsRecv(op)) snapBytes += alignUp(op.count * dataTypeSize(op.dtype));
  char* snap = nullptr;
  if (snapBytes) {
    snap = static_cast<char*>(scratch(snapBytes));
    if (!snap) return makeError(Code::kSystemError, "rank %d: cannot allocate %zu bytes of scratch", rank, snapBytes);
  }
  std::vector<OpDesc> batch(ops);
  for (OpDesc& op : batch) {
    if (op.coll != Coll::kSend || !overlapsRecv(op)) continue;
    size_t len = op.count * dataTypeSize(op.dtype);
    kernels::copy(snap, op.sendbuff, len);
    op.sendbuff = snap;
    snap += alignUp(len);
  }

  // Self sends pair with self receives in call order, as local copies.
  std::vector<const OpDesc*> selfSends, selfRecvs;
  for (const OpDesc& op : batch) {
    OpSig sig;
    sig.count = op.count;
    sig.coll = static_cast<uint8_t>(op.coll);
    sig.dtype = static_cast<uint8_t>(op.dtype);
    const size_t bytes = op.count * dataTypeSize(op.dtype);
    if (op.root == rank) {
      (op.coll == Coll::kSend ? selfSends : selfRecvs).push_back(&op);
      continue;
    }
    if (bytes == 0) continue;
    ExecStep st;
    st.peer = op.root;
    st.bytes = bytes;
    if (op.coll == Coll::kSend) {
      sig.seq = p2pSendSeq[static_cast<size_t>(op.root)]++;
      st.kind = sched::StepKind::kSend;
      st.src = absolute(op.sendbuff);
    } else {
      sig.seq = p2pRecvSeq[static_cast<size_t>(op.root)]++;
      st.kind = sched::StepKind::kRecv;
      st.dst = absolute(op.recvbuff);
    }
    st.sigIdx = static_cast<uint32_t>(plan.sigs.size());
    plan.sigs.push_back(sig);
    plan.add(st, nullptr, 0);
  }
  // checkSelfPairs() passed before the group started.
  for (size_t i = 0; i < selfSends.size(); ++i) {
    const OpDesc& s = *selfSends[i];
    const OpDesc& r = *selfRecvs[i];
    ExecStep st;
    st.kind = sched::StepKind::kCopy;
    st.src = absolute(s.sendbuff);
    st.dst = absolute(r.recvbuff);
    st.bytes = s.count * dataTypeSize(s.dtype);
    plan.add(st, nullptr, 0);
  }
  p->noop = plan.steps.empty();
  p->kind = PathKind::kMessages;
  p->path = p->noop ? nullptr : messagePath_.get();
  if (!p->noop) {
    C4_CHECK(p->owned->exec.bind(this, &plan));
    p->exec = &p->owned->exec;
  }
  return Status::ok();
}

void Comm::traceClockSync(int which, int64_t waitMs) {
  const int rounds = static_cast<int>(std::min<int64_t>(paramTraceClockRounds(), 1000));
  if (nranks < 2 || rounds <= 0 || !bootstrap) return;
  ClockOffset c;
  Status st = clockSyncToRank0(*bootstrap, rounds, waitMs, &trace::clockNs, &c);
  if (!st.isOk()) {
    C4_INFO(kLogInit, "rank %d: trace clock alignment %s skipped: %s", rank, which == 0 ? "at init" : "at finalize",
            st.message().c_str());
    return;
  }
  trace::ClockSample s;
  s.offsetNs = c.offsetNs;
  s.rttNs = c.rttNs;
  s.atNs = c.atNs;
  recorder.setClock(which, s);
}

Status Comm::runCollective(const OpDesc& op) {
  // The common case (one blocking call) without the group's bookkeeping. The API checked failure().
  PreparedCall p;
  Status st = prepareCollective(op, &p);
  if (!st.isOk()) return fail(st);
  return runCall(this, &p);
}

Status Comm::probe(int peer, ProbeResult* out) {
  *out = ProbeResult{};
  C4_CHECK(progressTransports());
  const bool any = peer == kAnySource;
  const int first = any ? probeNext_ : peer;
  const int n = any ? nranks : 1;
  for (int i = 0; i < n; ++i) {
    const int p = (first + i) % nranks;
    if (p == rank) continue;
    transport::Connection* c = nullptr;
    C4_CHECK(connection(p, &c));
    bool ready = false;
    OpSig sig;
    size_t bytes = 0;
    C4_CHECK(c->peek(&ready, &sig, &bytes));
    // The next message from p may belong to a collective p entered ahead of this rank: that is
    // not a send.
    if (!ready || sig.coll != static_cast<uint8_t>(Coll::kSend)) continue;
    out->ready = true;
    out->source = p;
    out->count = static_cast<size_t>(sig.count);
    out->dtype = static_cast<DataType>(sig.dtype);
    if (any) probeNext_ = (p + 1) % nranks;
    return Status::ok();
  }
  // Nothing yet: every 100 ms, make sure the ranks probed can still send.
  constexpr int64_t kHealthEveryMs = 100;
  const int64_t now = detail::nowMs();
  if (now - probeHealthMs_ < kHealthEveryMs) return Status::ok();
  probeHealthMs_ = now;
  for (int i = 0; i < n; ++i) {
    const int p = (first + i) % nranks;
    if (p != rank && peerTransport[static_cast<size_t>(p)])
      C4_CHECK(peerTransport[static_cast<size_t>(p)]->peerHealth(p));
  }
  return Status::ok();
}

Status Comm::waitProbe(int peer, ProbeResult* out, int64_t waitMs) {
  const int64_t start = detail::nowMs();
  int idle = 0;
  // Unbounded, the wait is a call the observers see (the watchdog times it, naming the ranks
  // probed; C4D counts it as time inside the library).
  PreparedCall wait;
  wait.probe = true;
  wait.op.root = peer;
  wait.sig.seq = ~uint64_t{0} - 1;  // not an operation of the sequence
  wait.sig.coll = static_cast<uint8_t>(Coll::kRecv);
  if (waitMs < 0) observers.started(wait);
  for (;;) {
    Status st = probe(peer, out);
    if (st.isOk() && (out->ready || waitMs == 0)) {
      if (waitMs < 0) finish(&wait);
      return Status::ok();
    }
    if (st.isOk() && waitMs > 0 && (++idle & 15) == 0 && detail::nowMs() - start >= waitMs) return Status::ok();
    if (st.isOk() && waitMs < 0) st = observers.idle(wait);
    if (!st.isOk()) return fail(st);
    idleWait(idle ? idle : ++idle);
  }
}

Status Comm::recvAny(const OpDesc& op, int* source) {
  ProbeResult found;
  C4_CHECK(waitProbe(kAnySource, &found, -1));
  OpDesc r = op;
  r.root = found.source;
  C4_CHECK(runP2p({r}));
  *source = found.source;
  return Status::ok();
}

Status Comm::checkSelfPairs(const std::vector<OpDesc>& ops) const {
  std::vector<const OpDesc*> sends, recvs;
  for (const OpDesc& op : ops)
    if ((op.coll == Coll::kSend || op.coll == Coll::kRecv) && op.root == rank)
      (op.coll == Coll::kSend ? sends : recvs).push_back(&op);
  if (sends.size() != recvs.size())
    return makeError(Code::kInvalidUsage,
                     "rank %d: %zu send(s) to itself but %zu receive(s) from itself in one group (a send to itself "
                     "pairs with a receive from itself in the same group)",
                     rank, sends.size(), recvs.size());
  for (size_t i = 0; i < sends.size(); ++i)
    if (sends[i]->count != recvs[i]->count || sends[i]->dtype != recvs[i]->dtype)
      return makeError(Code::kInvalidUsage, "rank %d: send to itself of %zu %s does not match receive of %zu %s", rank,
                       sends[i]->count, dataTypeName(sends[i]->dtype), recvs[i]->count, dataTypeName(recvs[i]->dtype));
  return Status::ok();
}

Status Comm::runP2p(const std::vector<OpDesc>& ops) {
  std::vector<GroupItem> items(1);
  items[0].comm = this;
  items[0].ops = ops;
  return runGroupItems(items);
}

}  // namespace c4
