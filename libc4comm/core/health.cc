#include "core/health.hpp"

#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <nlohmann/json.hpp>
#include <set>
#include <thread>

#include "common/clock.hpp"
#include "common/logging.hpp"
#include "common/status.hpp"
#include "core/heartbeat_wire.hpp"
#include "trace/recorder.hpp"

namespace c4 {

namespace {

constexpr uint32_t kTagHealth = 0xC4D00001u;
// How often the process's health thread looks at its monitors (receives, link checks). Heartbeats
// go out every C4_HEARTBEAT_MS; this only bounds how late a closed link or a message is seen.
constexpr int64_t kTickMs = 50;

/// One thread per process serves every communicator's monitor (a PyTorch job has many
/// communicators; a thread each would be many idle threads).
class HealthService {
 public:
  static HealthService& get() {
    static HealthService* s = new HealthService();  // never destroyed: monitors may outlive statics
    return *s;
  }
  void add(HealthMonitor* m, std::function<void(int64_t)> tick) {
    std::lock_guard<std::mutex> g(mu_);
    monitors_.push_back({m, std::move(tick)});
    if (!thread_.joinable()) thread_ = std::thread([this] { run(); });
  }
  /// After it returns, `m`'s tick neither runs nor will run.
  void remove(HealthMonitor* m) {
    std::lock_guard<std::mutex> g(mu_);
    monitors_.erase(std::remove_if(monitors_.begin(), monitors_.end(), [m](const Entry& e) { return e.m == m; }),
                    monitors_.end());
  }
  /// In a forked child the thread is gone and the monitors belong to the parent.
  void afterFork() {
    // Only the forking thread exists in the child: the objects are reset in place, without
    // touching the parent's thread (no join, no detach) or a mutex it may have held.
    new (&mu_) std::mutex();
    new (&monitors_) std::vector<Entry>();
    new (&thread_) std::thread();
  }

 private:
  struct Entry {
    HealthMonitor* m;
    std::function<void(int64_t)> tick;
  };
  HealthService() {
    pthread_atfork(nullptr, nullptr, [] { HealthService::get().afterFork(); });
  }
  void run() {
    sigset_t all;
    sigfillset(&all);
    pthread_sigmask(SIG_BLOCK, &all, nullptr);  // signals go to the application's threads
    for (;;) {
      {
        std::lock_guard<std::mutex> g(mu_);
        const int64_t now = trace::toNs(trace::ticks());
        for (Entry& e : monitors_) e.tick(now);
      }
      usleep(kTickMs * 1000);
    }
  }
  std::mutex mu_;
  std::vector<Entry> monitors_;
  std::thread thread_;
};

/// Whether process `pid` of this host is gone (no such process, or a zombie).
bool processGone(int pid, std::string* why) {
  if (pid <= 0) return false;
  char path[64];
  snprintf(path, sizeof(path), "/proc/%d/stat", pid);
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    *why = strFormat("process %d no longer exists", pid);
    return errno == ENOENT;
  }
  char buf[512];
  ssize_t n = read(fd, buf, sizeof(buf) - 1);
  close(fd);
  if (n <= 0) return false;
  buf[n] = 0;
  const char* p = strrchr(buf, ')');  // the state follows the command name
  if (p && p[1] == ' ' && (p[2] == 'Z' || p[2] == 'X')) {
    *why = strFormat("process %d has exited (zombie)", pid);
    return true;
  }
  return false;
}

}  // namespace

std::vector<Telemetry::Op> Telemetry::history() const {
  std::vector<Op> out;
  for (const Slot& s : ring_) {
    const uint64_t tag = s.tag.load(std::memory_order_acquire);
    if (tag == 0) continue;
    Op op{tag - 1, s.enter.load(std::memory_order_relaxed), s.leave.load(std::memory_order_relaxed),
          s.p2p.load(std::memory_order_relaxed)};
    std::atomic_thread_fence(std::memory_order_acquire);
    if (s.tag.load(std::memory_order_relaxed) != tag) continue;
    out.push_back(op);
  }
  std::sort(out.begin(), out.end(), [](const Op& a, const Op& b) { return a.seq < b.seq; });
  return out;
}

// ---- faults ----

namespace {
/// The non-empty parts of `text` between `sep`s.
std::vector<std::string> splitOn(const std::string& text, char sep) {
  std::vector<std::string> out;
  size_t pos = 0;
  while (pos < text.size()) {
    size_t end = text.find(sep, pos);
    if (end == std::string::npos) end = text.size();
    if (end > pos) out.push_back(text.substr(pos, end - pos));
    pos = end + 1;
  }
  return out;
}
}  // namespace

Status parseFaults(const std::string& text, std::vector<FaultSpec>* out) {
  out->clear();
  for (const std::string& item : splitOn(text, ';')) {
    const size_t colon = item.find(':');
    const std::string kind = item.substr(0, colon);
    FaultSpec f;
    if (kind == "delay")
      f.kind = FaultSpec::kDelay;
    else if (kind == "kill")
      f.kind = FaultSpec::kKill;
    else if (kind == "stop")
      f.kind = FaultSpec::kStop;
    else if (kind == "stall")
      f.kind = FaultSpec::kStall;
    else if (kind == "drop")
      f.kind = FaultSpec::kDrop;
    else
      return makeError(Code::kInvalidArgument,
                       "C4_FAULT: unknown fault '%s' in '%s' (delay, kill, stop, stall or drop)", kind.c_str(),
                       item.c_str());
    for (const std::string& kv : splitOn(colon == std::string::npos ? "" : item.substr(colon + 1), ',')) {
      const size_t eq = kv.find('=');
      if (eq == std::string::npos)
        return makeError(Code::kInvalidArgument, "C4_FAULT: '%s' in '%s' is not key=value", kv.c_str(), item.c_str());
      const std::string k = kv.substr(0, eq), v = kv.substr(eq + 1);
      char* endp = nullptr;
      const long long num = strtoll(v.c_str(), &endp, 10);
      const bool isNum = !v.empty() && endp && *endp == 0;
      if (k == "op" && v == "*") {
        f.op = -1;
        continue;
      }
      if (!isNum || num < 0)
        return makeError(Code::kInvalidArgument, "C4_FAULT: %s=%s in '%s' is not a number >= 0", k.c_str(), v.c_str(),
                         item.c_str());
      if (k == "rank")
        f.rank = static_cast<int>(num);
      else if (k == "op")
        f.op = num;
      else if (k == "from")
        f.from = num;
      else if (k == "ms")
        f.ms = num;
      else if (k == "peer")
        f.peer = static_cast<int>(num);
      else if (k == "lane")
        f.lane = static_cast<int>(num);
      else
        return makeError(Code::kInvalidArgument, "C4_FAULT: unknown key '%s' in '%s' (rank, op, from, ms, peer, lane)",
                         k.c_str(), item.c_str());
    }
    if (f.kind == FaultSpec::kDelay && f.ms <= 0)
      return makeError(Code::kInvalidArgument, "C4_FAULT: '%s' needs ms=<milliseconds>", item.c_str());
    if (f.kind != FaultSpec::kDelay && f.op < 0)
      return makeError(Code::kInvalidArgument, "C4_FAULT: '%s' needs op=<collective sequence number>", item.c_str());
    out->push_back(f);
  }
  return Status::ok();
}

bool checkFaultSpec(const std::string& text, std::string* why) {
  std::vector<FaultSpec> faults;
  Status st = parseFaults(text, &faults);
  if (!st.isOk()) *why = st.message();
  return st.isOk();
}

void HealthMonitor::injectBefore(uint64_t seq) {
  for (const FaultSpec& f : faults_) {
    if (f.rank >= 0 && f.rank != host_.rank) continue;
    const bool due = f.op >= 0 ? seq == static_cast<uint64_t>(f.op) : seq >= static_cast<uint64_t>(f.from);
    if (!due) continue;
    switch (f.kind) {
      case FaultSpec::kDelay:
        usleep(static_cast<useconds_t>(f.ms * 1000));
        break;
      case FaultSpec::kKill:
        C4_WARN(kLogColl, "rank %d: C4_FAULT kills this process before collective seq %llu", host_.rank,
                static_cast<unsigned long long>(seq));
        raise(SIGKILL);
        break;
      case FaultSpec::kStop:
        C4_WARN(kLogColl, "rank %d: C4_FAULT stops this process before collective seq %llu", host_.rank,
                static_cast<unsigned long long>(seq));
        raise(SIGSTOP);
        break;
      case FaultSpec::kStall:
      case FaultSpec::kDrop:
        for (int p = 0; p < host_.nranks; ++p) {
          if (p == host_.rank || (f.peer >= 0 && p != f.peer)) continue;
          const auto kind = f.kind == FaultSpec::kStall ? transport::LaneFault::kSilent : transport::LaneFault::kReset;
          transport::Connection* c = nullptr;
          if (!host_.connect(p, &c).isOk() || c == nullptr) continue;
          transport::LaneSetup* drills = host_.lanesTo(p);
          const int lanes = c->numLanes();
          for (int l = 0; l < lanes; ++l) {
            if (f.lane >= 0 && l != f.lane) continue;
            Status st = drills ? drills->faultDrill(p, l, kind)
                               : makeError(Code::kInvalidUsage, "the transport to rank %d has no fault drills", p);
            C4_WARN(kLogColl, "rank %d: C4_FAULT %s lane %d to rank %d before collective seq %llu: %s", host_.rank,
                    f.kind == FaultSpec::kStall ? "stalls" : "drops", l, p, static_cast<unsigned long long>(seq),
                    st.isOk() ? "done" : st.message().c_str());
          }
        }
        break;
    }
  }
}

// ---- the monitor ----

namespace {
/// Time outside c4comm before collective hist[i] (ns): its entry minus the previous collective's
/// exit, less the point-to-point batches in between; -1 when that one is not in the history or
/// has not ended.
int64_t gapOf(const std::vector<Telemetry::Op>& hist, size_t i) {
  if (i == 0 || hist[i - 1].seq + 1 != hist[i].seq || hist[i - 1].leave == 0 || hist[i].enter == 0) return -1;
  const int64_t p2pNs = static_cast<int64_t>(static_cast<double>(hist[i].p2p - hist[i - 1].p2p) / trace::ticksPerNs());
  return std::max<int64_t>(0, trace::toNs(hist[i].enter) - trace::toNs(hist[i - 1].leave) - p2pNs);
}
}  // namespace

bool HealthMonitor::isFatal(const Diagnosis& d) {
  return d.kind == "dead_rank" || d.kind == "comm_hang" || d.kind == "noncomm_hang";
}

struct HealthMonitor::Peer {
  RankView v;
  int32_t localPid = 0;  // its pid where this process can look it up (visiblePid), else 0
  int64_t startNs = 0;
  int64_t lastHeardNs = 0;
  int64_t enteredAtNs = 0, leftAtNs = 0;  // this rank's clock
  int64_t stalledAtNs = 0;                // when its stall began (this rank's clock), 0: none
  bool warnedSilent = false;
  bool reportedGone = false;
  int sendSkip = 0;          // heartbeats to skip after a failed send
  uint64_t opsSentUpTo = 0;  // reporter: ops history sent so far (seq + 1)
  std::string diagJson;      // the last diagnosis it sent with its failure
  HeartbeatDelay delay;      // takes its heartbeats' delivery delays out of their times
};

HealthMonitor::HealthMonitor() = default;
HealthMonitor::~HealthMonitor() { stop(nullptr); }

int64_t HealthMonitor::nowNs() const { return trace::toNs(trace::ticks()); }

Status HealthMonitor::start(HealthHost host) {
  host_ = std::move(host);
  C4_CHECK(parseFaults(paramFault(), &faults_));
  if (!faults_.empty())
    C4_WARN(kLogInit, "rank %d: C4_FAULT is set ('%s'): faults will be injected", host_.rank, paramFault().c_str());
  if (host_.nranks < 2 || paramHealth() == 0 || !host_.sideChannel) return Status::ok();
  periodMs_ = std::max<int64_t>(50, paramHeartbeatMs());
  timeoutMs_ = std::max<int64_t>(2 * periodMs_, paramHeartbeatTimeout());
  const std::string df = paramDiagFile();
  if (!df.empty()) diagPath_ = expandPathPattern(df, host_.rank);
  SlowDetector::Config sc;
  sc.stragglerMs = std::max<int64_t>(1, paramStragglerMs());
  sc.slowPercent = static_cast<int>(std::min<int64_t>(99, std::max<int64_t>(1, paramSlowLinkPercent())));
  slow_.configure(sc);
  const int64_t now = nowNs();
  {
    std::lock_guard<std::mutex> g(mu_);
    peers_.resize(static_cast<size_t>(host_.nranks));
    // Hosts are named by host name; where emulated hosts share one (network namespaces of one
    // machine, tools/netlab), by host name and side-channel address.
    auto label = [this](int r) {
      const RankInfo& me = host_.ranks[static_cast<size_t>(r)];
      std::string name = me.hostname;
      for (const RankInfo& o : host_.ranks)
        if (o.hostId != me.hostId && strncmp(o.hostname, me.hostname, sizeof(me.hostname)) == 0) {
          std::string a = host_.sideChannel->peerAddress(r);
          const size_t colon = a.rfind(':');
          return name + "@" + (colon == std::string::npos ? a : a.substr(0, colon));
        }
      return name;
    };
    for (int r = 0; r < host_.nranks; ++r) {
      Peer& p = peers_[static_cast<size_t>(r)];
      p.v.rank = r;
      p.v.host = label(r);
      p.v.pid = host_.ranks[static_cast<size_t>(r)].pid;
      p.localPid = visiblePid(host_.ranks[static_cast<size_t>(host_.rank)], host_.ranks[static_cast<size_t>(r)]);
      p.startNs = now;
    }
  }
  running_ = true;
  nextPublish_.store(0, std::memory_order_relaxed);
  HealthService::get().add(this, [this](int64_t t) { tick(t); });
  return Status::ok();
}

void HealthMonitor::stop(const char* goodbye) {
  if (!running_.exchange(false)) return;
  HealthService::get().remove(this);
  if (goodbye == nullptr) return;
  nlohmann::json j;
  j["v"] = 1;
  j["bye"] = goodbye;
  const std::string s = j.dump();
  for (int r = 0; r < host_.nranks; ++r) {
    if (r == host_.rank) continue;
    {
      std::lock_guard<std::mutex> g(mu_);
      const Peer& p = peers_[static_cast<size_t>(r)];
      if (p.v.gone || p.v.leftInOrder || p.sendSkip > 0) continue;
    }
    (void)host_.sideChannel->send(r, kTagHealth, s.data(), s.size(), 200);
  }
}

void HealthMonitor::publish(uint64_t nowTicks) {
  const double tpn = trace::ticksPerNs();
  nextPublish_.store(nowTicks + static_cast<uint64_t>(static_cast<double>(periodMs_) * 5e5 * tpn),
                     std::memory_order_relaxed);
  std::vector<PeerRate> rates;
  for (int p = 0; p < host_.nranks; ++p) {
    transport::LaneSetup* lanes = host_.lanesTo(p);
    if (lanes == nullptr) continue;
    // A pair on one host has no network link to be slow (loopback runs at the speed of the cores
    // the ranks get): only pairs across hosts are compared.
    if (host_.ranks[static_cast<size_t>(p)].hostId == host_.ranks[static_cast<size_t>(host_.rank)].hostId) continue;
    transport::Connection* c = lanes->existingConnection(p);
    const transport::RateMeter* meter = c != nullptr ? c->rateMeter() : nullptr;
    if (meter == nullptr) continue;
    PeerRate pr;
    pr.peer = p;
    meter->receiveRate(&pr.bytes, &pr.ns);
    for (int l = 0; l < c->numLanes(); ++l) {
      const transport::Lane* ln = c->lane(l);
      if (!ln) continue;
      const transport::LaneSnapshot s = ln->snapshot();
      if (s.state == transport::LaneState::kRetired) {
        ++pr.lanesRetired;
        continue;
      }
      ++pr.lanesUp;
      pr.lanes += (pr.lanes.empty() ? "" : ", ") + s.localAddr + " <- " + s.remoteAddr;
    }
    rates.push_back(pr);
  }
  std::lock_guard<std::mutex> g(mu_);
  rates_ = std::move(rates);
}

void HealthMonitor::reportStall(const std::string& what, const std::vector<int>& waitingOn,
                                const std::vector<std::string>& states, const std::vector<int>& stuckTo,
                                int64_t stalledNs) {
  std::lock_guard<std::mutex> g(mu_);
  if (stallSinceNs_ == 0) stallSinceNs_ = nowNs() - std::max<int64_t>(0, stalledNs);
  stallWhat_ = what;
  waitingOn_ = waitingOn;
  stallStates_ = states;
  stuckTo_ = stuckTo;
}

void HealthMonitor::clearStall() {
  std::lock_guard<std::mutex> g(mu_);
  stallSinceNs_ = 0;
  waitingOn_.clear();
  stallStates_.clear();
  stuckTo_.clear();
}

RankView HealthMonitor::viewOf(int r, int64_t now) const {
  const Peer& p = peers_[static_cast<size_t>(r)];
  RankView v = p.v;
  auto ago = [now](int64_t t) { return t > 0 ? (now - t) / 1000000 : 0; };
  auto agoTicks = [&](uint64_t ticks) { return ticks ? ago(trace::toNs(ticks)) : 0; };  // 0: not timed
  if (r == host_.rank) {
    v.known = true;
    v.entered = telemetry_.entered();
    v.left = telemetry_.left();
    v.enteredAgoMs = agoTicks(telemetry_.enteredTicks());
    v.leftAgoMs = agoTicks(telemetry_.leftTicks());
    v.inP2p = telemetry_.inP2p();
    if (const char* in = telemetry_.inside()) v.inside = in;
    v.stalledMs = stallSinceNs_ ? ago(stallSinceNs_) : 0;
    v.waitingOn = waitingOn_;
    v.stuckTo = stuckTo_;
    v.failed = failedWith_;
    return v;
  }
  v.silentMs = ago(p.lastHeardNs ? p.lastHeardNs : p.startNs);
  v.unresponsive = !v.gone && !v.leftInOrder && v.silentMs > timeoutMs_;
  v.enteredAgoMs = ago(p.enteredAtNs);
  v.leftAgoMs = ago(p.leftAtNs);
  v.stalledMs = p.stalledAtNs ? ago(p.stalledAtNs) : 0;
  return v;
}

bool HealthMonitor::isReporter() const {
  for (int r = 0; r < host_.nranks; ++r) {
    if (r == host_.rank) return true;
    const Peer& p = peers_[static_cast<size_t>(r)];
    const int64_t now = nowNs();
    if (!p.v.gone && !p.v.leftInOrder && now - (p.lastHeardNs ? p.lastHeardNs : p.startNs) <= timeoutMs_ * 1000000)
      return false;
  }
  return true;
}

void HealthMonitor::tick(int64_t now) {
  // The evidence of deaths first, the messages second: a goodbye is read off a peer's stream before
  // its end is, so whatever ended before this look has its goodbye taken by receive().
  const std::vector<std::string> gone = deathEvidence(now, true);
  receive(now, false);
  checkLinks(now, gone);
  if (now >= nextBeatNs_) {
    nextBeatNs_ = now + periodMs_ * 1000000;
    sendHeartbeats(now);
    analyzeSlow(now);
  }
}

void HealthMonitor::sendTo(int r, const std::string& payload) {
  {
    std::lock_guard<std::mutex> g(mu_);
    Peer& p = peers_[static_cast<size_t>(r)];
    if (p.v.gone || p.v.leftInOrder) return;
    if (p.sendSkip > 0) {
      --p.sendSkip;
      return;
    }
  }
  Status st = host_.sideChannel->send(r, kTagHealth, payload.data(), payload.size(), 200);
  if (!st.isOk()) {
    std::lock_guard<std::mutex> g(mu_);
    peers_[static_cast<size_t>(r)].sendSkip = 5;
  }
}

void HealthMonitor::sendHeartbeats(int64_t now) {
  nlohmann::json base;
  int reporter = 0;
  std::vector<PeerRate> rates;
  std::vector<Telemetry::Op> hist;
  {
    std::lock_guard<std::mutex> g(mu_);
    const RankView me = viewOf(host_.rank, now);
    base["v"] = 1;
    base["hb"] = ++hbSeq_;
    // Sent at (us, CLOCK_MONOTONIC): the receiver takes delivery delays out. Not the trace clock:
    // its absolute values come from each process's own calibration (only its differences agree
    // across processes), which made the floor of (arrival - sent) meaningless and shifted a
    // clean run's arrivals by seconds (a false straggler in CI).
    base["t"] = detail::nowNs() / 1000;
    base["e"] = me.entered;
    base["ea"] = me.enteredAgoMs;
    base["l"] = me.left;
    base["la"] = me.leftAgoMs;
    base["p2p"] = me.inP2p;
    if (!me.inside.empty()) base["in"] = me.inside;
    base["st"] = me.stalledMs;
    base["w"] = me.waitingOn;
    base["k"] = me.stuckTo;
    if (!failedWith_.empty()) base["fail"] = failedWith_;
    for (reporter = 0; reporter < host_.nranks; ++reporter) {
      if (reporter == host_.rank) break;
      const Peer& p = peers_[static_cast<size_t>(reporter)];
      if (!p.v.gone && !p.v.leftInOrder && now - (p.lastHeardNs ? p.lastHeardNs : p.startNs) <= timeoutMs_ * 1000000)
        break;
    }
    rates = rates_;
  }
  hist = telemetry_.history();
  const std::string plain = base.dump();
  for (int r = 0; r < host_.nranks; ++r) {
    if (r == host_.rank) continue;
    if (r != reporter) {
      sendTo(r, plain);
      continue;
    }
    // The reporter also gets the arrival times of the collectives not sent yet and the rates.
    nlohmann::json j = base;
    nlohmann::json ops = nlohmann::json::array();
    uint64_t upTo;
    {
      std::lock_guard<std::mutex> g(mu_);
      upTo = peers_[static_cast<size_t>(r)].opsSentUpTo;
    }
    uint64_t newUpTo = upTo;
    for (size_t i = 0; i < hist.size(); ++i) {
      const Telemetry::Op& op = hist[i];
      if (op.seq + 1 <= upTo || op.enter == 0) continue;  // sent already, or not timed
      // [seq, age of its entry, time outside c4comm before it (us; -1: unknown)]
      const int64_t gap = gapOf(hist, i);
      ops.push_back({op.seq, (now - trace::toNs(op.enter)) / 1000, gap >= 0 ? gap / 1000 : -1});
      newUpTo = std::max(newUpTo, op.seq + 1);
    }
    j["ops"] = ops;
    nlohmann::json rs = nlohmann::json::array();
    for (const PeerRate& pr : rates) rs.push_back({pr.peer, pr.bytes, pr.ns, pr.lanesUp, pr.lanesRetired, pr.lanes});
    j["rates"] = rs;
    sendTo(r, j.dump());
    std::lock_guard<std::mutex> g(mu_);
    peers_[static_cast<size_t>(r)].opsSentUpTo = newUpTo;
  }
  // The reporter analyses its own arrivals and rates too.
  if (reporter == host_.rank) {
    std::lock_guard<std::mutex> g(mu_);
    for (size_t i = 0; i < hist.size(); ++i)
      if (hist[i].enter) slow_.addOp(host_.rank, hist[i].seq, trace::toNs(hist[i].enter), gapOf(hist, i));
    slow_.addRates(host_.rank, now, rates);
  }
}

void HealthMonitor::receive(int64_t now, bool failing) {
  std::vector<std::pair<int, std::vector<char>>> msgs;
  host_.sideChannel->take(kTagHealth, &msgs);
  std::vector<Diagnosis> adopted;
  for (auto& m : msgs) {
    const int from = m.first;
    if (from < 0 || from >= host_.nranks || from == host_.rank) continue;
    Heartbeat hb;
    bool heard = false;
    const Status parsed = parseHeartbeat(m.second.data(), m.second.size(), from, now, &hb, &heard);
    if (!heard) {
      C4_WARN(kLogInit, "rank %d: C4D: a malformed heartbeat from rank %d was ignored", host_.rank, from);
      continue;
    }
    std::lock_guard<std::mutex> g(mu_);
    Peer& p = peers_[static_cast<size_t>(from)];
    p.lastHeardNs = now;
    p.v.known = true;
    if (p.warnedSilent) {
      C4_WARN(kLogInit, "rank %d: C4D: rank %d answers again", host_.rank, from);
      p.warnedSilent = false;
    }
    if (!parsed.isOk()) {
      C4_WARN(kLogInit, "rank %d: C4D: a heartbeat from rank %d was ignored: %s", host_.rank, from,
              parsed.message().c_str());
      continue;
    }
    if (hb.bye) {
      p.v.leftInOrder = true;
      continue;
    }
    if (hb.hasState) {
      p.delay.align(detail::nowNs(), &hb);  // the same clock as the sender's "t" (same host: the very same)
      p.v.entered = hb.entered;
      p.v.left = hb.left;
      p.enteredAtNs = hb.enteredAtNs;
      p.leftAtNs = hb.leftAtNs;
      p.v.inP2p = hb.inP2p;
      p.v.inside = std::move(hb.inside);
      p.stalledAtNs = hb.stalledAtNs;
      p.v.waitingOn = std::move(hb.waitingOn);
      p.v.stuckTo = std::move(hb.stuckTo);
    }
    if (hb.hasFailed) p.v.failed = hb.failed;
    for (const Heartbeat::Op& op : hb.ops) slow_.addOp(from, op.seq, op.enterNs, op.gapNs);
    if (hb.hasRates) slow_.addRates(from, now, hb.rates);
    if (hb.hasDiag) {
      if (hb.failing) p.v.failed = hb.diag.kind + ": " + hb.diag.summary;
      adopted.push_back(std::move(hb.diag));
    }
  }
  for (Diagnosis& d : adopted) {
    // Several peers may send the same finding (each survivor of a death diagnoses it): once here.
    bool dup = false;
    {
      std::lock_guard<std::mutex> g(mu_);
      for (const Diagnosis& e : emitted_)
        dup |= e.kind == d.kind && e.ranks == d.ranks && e.links == d.links && e.seq == d.seq;
    }
    if (dup) continue;
    // A peer's hang or death diagnosis fails this rank too (fail fast), with the peer's words
    // (unless this rank is failing already: explainFailure takes it from emitted_).
    record(d, false);
    if (isFatal(d) && !failing) failComm(d, /*fromPeer=*/true);
  }
}

std::vector<std::string> HealthMonitor::deathEvidence(int64_t now, bool silentOnly) {
  std::vector<std::string> gone(static_cast<size_t>(host_.nranks));
  for (int r = 0; r < host_.nranks; ++r) {
    if (r == host_.rank) continue;
    int32_t pid;
    int64_t silent;
    {
      std::lock_guard<std::mutex> g(mu_);
      const Peer& p = peers_[static_cast<size_t>(r)];
      if (p.v.gone || p.v.leftInOrder) continue;
      pid = p.localPid;
      silent = now - (p.lastHeardNs ? p.lastHeardNs : p.startNs);
    }
    std::string& why = gone[static_cast<size_t>(r)];
    const std::string err = host_.sideChannel->peerStreamError(r);
    if (!err.empty()) {
      why = "its side-channel link closed without a goodbye (" + err + ")";
    } else if (pid > 0 && (!silentOnly || silent > 2 * periodMs_ * 1000000) && processGone(pid, &why) &&
               host_.sideChannel->peerStreamOpen(r)) {
      // Its process is gone, but what it sent last (a goodbye, maybe) is not read yet: look again.
      why.clear();
    }
  }
  return gone;
}

void HealthMonitor::checkLinks(int64_t now, const std::vector<std::string>& gone) {
  std::vector<Diagnosis> found;
  {
    std::lock_guard<std::mutex> g(mu_);
    for (int r = 0; r < host_.nranks; ++r) {
      if (r == host_.rank) continue;
      Peer& p = peers_[static_cast<size_t>(r)];
      if (p.v.gone || p.v.leftInOrder) continue;
      const std::string& why = gone[static_cast<size_t>(r)];
      if (!why.empty() && !p.v.failed.empty() && why.rfind("its side-channel link closed", 0) == 0) {
        // It exited after its communicator failed (and said so): not a death to diagnose.
        p.v.gone = true;
        p.v.goneWhy = "exited after its communicator failed (" + p.v.failed + ")";
        p.reportedGone = true;
        continue;
      }
      if (why.empty()) {
        const int64_t silent = now - (p.lastHeardNs ? p.lastHeardNs : p.startNs);
        if (silent > timeoutMs_ * 1000000 && !p.warnedSilent) {
          p.warnedSilent = true;
          C4_WARN(kLogInit, "rank %d: C4D: no heartbeat from rank %d (host %s) for %lld ms: unresponsive", host_.rank,
                  r, p.v.host.c_str(), static_cast<long long>(silent / 1000000));
        }
        continue;
      }
      p.v.gone = true;
      p.v.goneWhy = why;
    }
    if (!failedWith_.empty()) return;  // the communicator failed: its failure was explained already
    std::vector<RankView> views;
    for (int r = 0; r < host_.nranks; ++r) views.push_back(viewOf(r, now));
    bool fresh = false;
    for (int r = 0; r < host_.nranks; ++r)
      fresh |= peers_[static_cast<size_t>(r)].v.gone && !peers_[static_cast<size_t>(r)].reportedGone;
    if (!fresh) return;
    Diagnosis d = classifyFailure(host_.rank, "(found by the health checks)", views);
    if (d.kind.empty()) return;
    for (int r : d.ranks) peers_[static_cast<size_t>(r)].reportedGone = true;
    d.evidence = d.evidence.substr(0, d.evidence.find("; the data path reported"));
    found.push_back(d);
  }
  for (Diagnosis& d : found) {
    record(d, true);
    failComm(d, false);
  }
}

void HealthMonitor::analyzeSlow(int64_t now) {
  std::vector<Diagnosis> found;
  {
    std::lock_guard<std::mutex> g(mu_);
    if (!isReporter() || !failedWith_.empty()) return;
    std::vector<bool> live;
    std::vector<std::string> hosts;
    for (int r = 0; r < host_.nranks; ++r) {
      const RankView v = viewOf(r, now);
      live.push_back(!v.gone && !v.leftInOrder && !v.unresponsive);
      hosts.push_back(v.host);
    }
    found = slow_.analyze(now, live, hosts);
    if (!slow_.lastRates().empty() && now - ratesLoggedNs_ > 10000000000LL) {
      ratesLoggedNs_ = now;
      C4_INFO(kLogNet, "rank %d: C4D receive rates over the last 10 s: %s", host_.rank, slow_.lastRates().c_str());
    }
  }
  for (Diagnosis& d : found) {
    record(d, true);
    broadcast(d, false);
  }
}

void HealthMonitor::record(Diagnosis& d, bool mine) {
  // Every rank's record says what it learned: `rank` is this rank, `reporter` who diagnosed it.
  if (mine) d.reporter = host_.rank;
  d.json = diagnosisJson(d, host_.tag, host_.rank, host_.nranks);
  const char* verb = mine ? "" : " (from rank ";
  C4_WARN(kLogColl, "rank %d: C4D %s%s%s%s: %s", host_.rank, d.kind.c_str(), verb,
          mine ? "" : std::to_string(d.reporter).c_str(), mine ? "" : ")", d.summary.c_str());
  C4_INFO(kLogColl, "rank %d: C4D record: %s", host_.rank, d.json.c_str());
  if (!diagPath_.empty()) {
    std::string why;
    const int fd = openAppend(diagPath_, &why);
    if (fd >= 0) {
      const std::string line = d.json + "\n";
      ssize_t w = write(fd, line.data(), line.size());  // one write: lines of several ranks do not interleave
      (void)w;
      close(fd);
    } else {
      C4_WARN(kLogColl, "rank %d: C4D: cannot append to C4_DIAG_FILE %s: %s", host_.rank, diagPath_.c_str(),
              why.c_str());
    }
  }
  DiagnosisCallback cb;
  {
    std::lock_guard<std::mutex> g(mu_);
    emitted_.push_back(d);
    traceQueue_.push_back("C4D " + d.json);
    traceDue_.store(true, std::memory_order_relaxed);
    cb = callback_;
  }
  if (cb) cb(d);
}

void HealthMonitor::broadcast(const Diagnosis& d, bool failing) {
  nlohmann::json j;
  j["v"] = 1;
  j["diag"] = nlohmann::json::parse(d.json, nullptr, false);
  if (failing) j["failing"] = true;
  const std::string s = j.dump();
  // Sent now, not at the next tick: a peer that fails because of it should learn why before its
  // transports report this rank's abort.
  for (int r = 0; r < host_.nranks; ++r)
    if (r != host_.rank) sendTo(r, s);
}

void HealthMonitor::noteFailure(const Status& st) {
  if (!running_) return;
  {
    std::lock_guard<std::mutex> g(mu_);
    if (failNoticeSent_) return;
    failNoticeSent_ = true;
    if (failedWith_.empty()) failedWith_ = "failed: " + st.message();
  }
  nlohmann::json j;
  j["v"] = 1;
  j["fail"] = st.message();
  const std::string s = j.dump();
  for (int r = 0; r < host_.nranks; ++r)
    if (r != host_.rank) sendTo(r, s);
}

Status HealthMonitor::annotate(const Status& st, const Diagnosis& d, bool fromPeer) const {
  std::string m = st.message();
  m += strFormat(" [C4D %s%s: %s]", d.kind.c_str(),
                 fromPeer ? strFormat(" (diagnosed by rank %d)", d.reporter).c_str() : "", d.summary.c_str());
  return Status(st.code(), m);
}

void HealthMonitor::failComm(const Diagnosis& d, bool fromPeer) {
  {
    std::lock_guard<std::mutex> g(mu_);
    if (!failedWith_.empty()) return;
    failedWith_ = d.kind + ": " + d.summary;
  }
  if (!fromPeer) broadcast(d, true);
  Status st =
      annotate(makeError(Code::kRemoteError, "rank %d: the health checks found a fault", host_.rank), d, fromPeer);
  host_.requestAbort(st);
}

Status HealthMonitor::diagnoseHang(const Status& st, int64_t seq) {
  if (!running_) return st;
  // For a hang, a rank is alive when a heartbeat came within two periods, and its heartbeats have
  // stopped (frozen, stopped or unreachable) once none came for five periods (at least 2 s, at most
  // C4_HEARTBEAT_TIMEOUT). In between what its last heartbeat said is stale: wait for either, so
  // that the diagnosis never depends on how C4_TIMEOUT compares with the heartbeat timeout.
  const int64_t freshMs = 2 * periodMs_ + 250;
  const int64_t staleMs = std::min(timeoutMs_, std::max<int64_t>(5 * periodMs_, 2000));
  for (;;) {
    const int64_t now = nowNs();
    bool undecided = false;
    {
      std::lock_guard<std::mutex> g(mu_);
      if (!failedWith_.empty()) return st;
      for (int r = 0; r < host_.nranks; ++r) {
        if (r == host_.rank) continue;
        const RankView v = viewOf(r, now);
        undecided |= !v.gone && !v.leftInOrder && v.failed.empty() && v.silentMs > freshMs && v.silentMs <= staleMs;
      }
    }
    if (!undecided) break;
    receive(now, true);
    usleep(20000);
  }
  Diagnosis d;
  {
    std::lock_guard<std::mutex> g(mu_);
    if (!failedWith_.empty()) return st;
    const int64_t now = nowNs();
    HangInput in;
    in.self = host_.rank;
    in.nranks = host_.nranks;
    in.seq = seq;
    in.what = stallWhat_.empty() ? std::string("its operation") : stallWhat_;
    in.waitingOn = waitingOn_;
    in.states = stallStates_;
    in.heartbeatTimeoutMs = timeoutMs_;
    for (int r = 0; r < host_.nranks; ++r) {
      RankView v = viewOf(r, now);
      if (r != host_.rank && !v.gone && !v.leftInOrder && v.silentMs > staleMs) v.unresponsive = true;
      in.ranks.push_back(std::move(v));
    }
    d = classifyHang(in);
    failedWith_ = d.kind + ": " + d.summary;
  }
  record(d, true);
  broadcast(d, true);
  return annotate(st, d, false);
}

Status HealthMonitor::explainFailure(const Status& st) {
  if (!running_) return st;
  if (st.code() != Code::kRemoteError && st.code() != Code::kSystemError && st.code() != Code::kInternalError)
    return st;
  {
    std::lock_guard<std::mutex> g(mu_);
    if (!failedWith_.empty() && st.message().find("[C4D ") != std::string::npos) return st;  // diagnosed here
  }
  // The side channel's evidence may trail the data path's by a moment: a closed link, a peer's
  // diagnosis.
  const int64_t until = nowNs() + 500 * 1000000LL;
  for (;;) {
    const int64_t now = nowNs();
    // Deaths before messages, as in tick(): a goodbye read now wins over the end of its stream.
    const std::vector<std::string> gone = deathEvidence(now, false);
    receive(now, true);  // what the peers said meanwhile (a diagnosis, a failure, a goodbye)
    Diagnosis d;
    bool fromPeer = false;
    {
      std::lock_guard<std::mutex> g(mu_);
      // A hang or death diagnosed here (the health thread) or by a peer.
      for (auto it = emitted_.rbegin(); it != emitted_.rend(); ++it)
        if (isFatal(*it)) {
          d = *it;
          fromPeer = it->reporter != host_.rank;
          break;
        }
      if (d.kind.empty()) {
        for (int r = 0; r < host_.nranks; ++r) {
          if (r == host_.rank) continue;
          Peer& p = peers_[static_cast<size_t>(r)];
          if (p.v.gone || p.v.leftInOrder) continue;
          const std::string& why = gone[static_cast<size_t>(r)];
          if (!why.empty() && !p.v.failed.empty()) continue;  // it failed first (and said so), then exited
          if (!why.empty()) {
            p.v.gone = true;
            p.v.goneWhy = why;
          }
        }
        std::vector<RankView> views;
        for (int r = 0; r < host_.nranks; ++r) views.push_back(viewOf(r, now));
        d = classifyFailure(host_.rank, st.message(), views);
        if (!d.kind.empty()) {
          for (int r : d.ranks) peers_[static_cast<size_t>(r)].reportedGone = true;
          failedWith_ = d.kind + ": " + d.summary;
        }
      } else if (failedWith_.empty()) {
        failedWith_ = d.kind + ": " + d.summary;
      }
    }
    if (!d.kind.empty()) {
      if (d.json.empty()) {
        record(d, true);
        broadcast(d, true);
      }
      return annotate(st, d, fromPeer);
    }
    if (now >= until) break;
    usleep(10000);
  }
  return st;
}

void HealthMonitor::drainTrace() {
  std::vector<std::string> q;
  {
    std::lock_guard<std::mutex> g(mu_);
    q.swap(traceQueue_);
    traceDue_.store(false, std::memory_order_relaxed);
  }
  for (const std::string& s : q) host_.traceNote(s);
}

void HealthMonitor::setCallback(DiagnosisCallback cb) {
  std::lock_guard<std::mutex> g(mu_);
  callback_ = std::move(cb);
}

std::vector<Diagnosis> HealthMonitor::diagnoses() const {
  std::lock_guard<std::mutex> g(mu_);
  return emitted_;
}

}  // namespace c4
