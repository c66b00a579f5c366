#include "core/lane_planner.hpp"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <condition_variable>
#include <cstring>
#include <map>
#include <mutex>
#include <set>
#include <thread>
#include <tuple>

#include "common/clock.hpp"
#include "common/logging.hpp"
#include "common/status.hpp"
#include "core/bootstrap.hpp"
#include "core/tuner.hpp"
#include "planner/fabric_client.hpp"
#include "planner/flows.hpp"
#include "planner/planner.hpp"
#include "planner/topology.hpp"
#include "sched/schedule.hpp"
#include "trace/recorder.hpp"

namespace c4 {

namespace {

constexpr int kMaxPlanPorts = 16;

// What each rank tells the others at init (one allGather).
struct PlaceRecord {
  uint64_t topoHash = 0;
  int32_t mode = 0;
  int32_t lanes = 0;
  int32_t host = -1;  // index in the topology file; -1 with the flat model
  int32_t nports = 0;
  int32_t ports[kMaxPlanPorts] = {};
  uint16_t listen[kMaxPlanPorts] = {};
  uint16_t sportLo = 0, sportHi = 0;  // Caps::sourcePortLo/Hi of the transport planned
  char missing[64] = {};              // the first of this rank's addresses the file does not list
};

// The port of "10.1.0.2:4000" or "[fe80::1]:4000"; 0 for an address without one ("10.1.0.2",
// "[fe80::1]", "fe80::1": RoCE ports, whose connections have no listening port of their own).
uint16_t portOf(const std::string& addr) {
  size_t c;
  if (!addr.empty() && addr[0] == '[') {
    const size_t e = addr.find(']');
    if (e == std::string::npos || e + 1 >= addr.size() || addr[e + 1] != ':') return 0;
    c = e + 1;
  } else {
    c = addr.find(':');
    if (c == std::string::npos || addr.find(':', c + 1) != std::string::npos) return 0;
  }
  return static_cast<uint16_t>(atoi(addr.c_str() + c + 1));
}

constexpr uint32_t kTagFabricPlan = 0xC4F00001u;    // rank 0 -> all: the fabric service's reply
constexpr uint32_t kTagFabricReport = 0xC4F00002u;  // every rank -> rank 0: lanes changed, lane samples
constexpr uint32_t kTagFabricMove = 0xC4F00003u;    // rank 0 -> the ranks of a moved lane: the service's moves
constexpr size_t kMaxPendingSamples = 4096;         // samples rank 0 holds for the service (the newest kept)
constexpr int64_t kMinRenewGapMs = 100;             // a report that cannot wait renews at most this often

// Adds `more` to `into`: a connection's lanes replace what `into` had of it; samples append (the
// newest kMaxPendingSamples kept).
void mergeReport(const plan::wire::JobReport& more, plan::wire::JobReport* into) {
  for (const plan::PlannedConn& c : more.lanes) {
    auto it = std::find_if(into->lanes.begin(), into->lanes.end(),
                           [&](const plan::PlannedConn& x) { return x.a == c.a && x.b == c.b; });
    if (it == into->lanes.end())
      into->lanes.push_back(c);
    else
      *it = c;
  }
  into->samples.insert(into->samples.end(), more.samples.begin(), more.samples.end());
  if (into->samples.size() > kMaxPendingSamples)
    into->samples.erase(into->samples.begin(),
                        into->samples.begin() + static_cast<std::ptrdiff_t>(into->samples.size() - kMaxPendingSamples));
}

// Rank 0's side of the fabric service (C4_PLANNER_SERVICE, docs/c4p.md "The fabric service"): the
// registration, a thread that renews the lease every third of it (and registers again, keeping
// the plan, with a service that restarted), and the release when the communicator goes. The
// renewals carry the ranks' reports (their own lane replacements, lane samples; the ranks send
// them over the bootstrap, rank 0 hands its own to report()); the moves the service asks for in
// reply go to the two ranks of each moved lane (rank 0's own wait in takeMoves()).
class FabricSession {
 public:
  FabricSession(std::string addr, plan::wire::Key key, int64_t timeoutMs, int64_t leaseMs, Bootstrap* oob)
      : addr_(std::move(addr)), key_(key), timeoutMs_(timeoutMs), leaseMs_(leaseMs), oob_(oob) {}
  ~FabricSession() { stop(); }

  /// Rank 0's own report; `urgent` renews now (within kMinRenewGapMs) rather than at the next renewal.
  void report(const plan::wire::JobReport& r, bool urgent) {
    {
      std::lock_guard<std::mutex> g(mu_);
      mergeReport(r, &pending_);
      urgent_ = urgent_ || urgent;
    }
    if (urgent) cv_.notify_all();
  }
  /// The moves the service asked of rank 0's lanes since the last call.
  std::vector<plan::wire::LaneMove> takeMoves(std::string* why) {
    std::lock_guard<std::mutex> g(mu_);
    *why = movesWhy_;
    std::vector<plan::wire::LaneMove> out;
    out.swap(moves_);
    return out;
  }

  /// Stops renewing and releases the job (before the bootstrap goes). Idempotent.
  void stop() {
    {
      std::lock_guard<std::mutex> g(mu_);
      if (stopped_) return;
      stopped_ = stop_ = true;
    }
    cv_.notify_all();
    if (thread_.joinable()) thread_.join();
    if (id_ == 0) return;
    plan::wire::Request req;
    req.op = plan::wire::Op::kRelease;
    req.id = id_;
    req.token = token_;
    plan::wire::Reply rep;
    Status st = call(req, &rep, std::min<int64_t>(timeoutMs_, 1000));
    if (!st.isOk() || !rep.ok)
      C4_WARN(kLogPlan, "C4P: the fabric service %s did not take the job's release (%s); its lease frees the links",
              addr_.c_str(), st.isOk() ? rep.error.c_str() : st.message().c_str());
    else
      C4_INFO(kLogPlan, "C4P: released job %016llx at the fabric service %s", static_cast<unsigned long long>(id_),
              addr_.c_str());
  }

  /// Registers `spec`; the reply (ok or not) in *rep.
  Status registerJob(const plan::wire::JobSpec& spec, plan::wire::Reply* rep) {
    plan::wire::Request req;
    req.op = plan::wire::Op::kRegister;
    req.job = spec;
    req.leaseMs = leaseMs_;
    C4_CHECK(call(req, rep, timeoutMs_));
    return Status::ok();
  }

  /// The job is booked under id/token with `plan`: renew it from now on.
  void start(uint64_t id, uint64_t token, plan::wire::JobSpec spec) {
    id_ = id;
    token_ = token;
    spec_ = std::move(spec);
    thread_ = std::thread([this] { renewLoop(); });
  }

 private:
  Status call(const plan::wire::Request& req, plan::wire::Reply* rep, int64_t timeoutMs) {
    if (!client_) {
      plan::wire::Key k = key_;
      C4_CHECK(plan::FabricClient::connect(addr_, k, timeoutMs, &client_));
    }
    Status st = client_->call(req, rep, timeoutMs);
    if (!st.isOk()) client_.reset();
    return st;
  }

  // The ranks' reports that arrived over the bootstrap, into pending_ (mu_ held); whether one of
  // them cannot wait for the next renewal.
  bool collectReports() {
    std::vector<std::pair<int, std::vector<char>>> msgs;
    oob_->take(kTagFabricReport, &msgs);
    bool urgent = false;
    for (auto& [from, bytes] : msgs) {
      plan::wire::JobReport r;
      const std::string text(bytes.begin(), bytes.end());
      Status st = plan::wire::parseJobReport(text, &r);
      if (!st.isOk()) {
        C4_WARN(kLogPlan, "C4P: a lane report of rank %d that does not parse: %s", from, st.message().c_str());
        continue;
      }
      urgent = urgent || !r.lanes.empty() ||
               std::any_of(r.samples.begin(), r.samples.end(), [](const plan::wire::LaneSample& x) {
                 return x.verdict != plan::wire::LaneSample::Verdict::kOk;
               });
      mergeReport(r, &pending_);
    }
    return urgent;
  }

  // The service's moves to the ranks of each moved lane: the acceptor first (it books the move), then
  // the opener (it opens the new lane and retires the old one).
  void handOut(const std::vector<plan::wire::LaneMove>& moves, const std::string& why) {
    std::map<int, std::vector<plan::wire::LaneMove>> byRank;
    for (const plan::wire::LaneMove& m : moves) {
      byRank[m.b].push_back(m);
      byRank[m.a].push_back(m);
    }
    std::vector<int> order;
    for (const plan::wire::LaneMove& m : moves) order.push_back(m.b);
    for (const plan::wire::LaneMove& m : moves) order.push_back(m.a);
    for (int r : order) {
      auto it = byRank.find(r);
      if (it == byRank.end()) continue;
      if (r == 0) {
        std::lock_guard<std::mutex> g(mu_);
        moves_.insert(moves_.end(), it->second.begin(), it->second.end());
        movesWhy_ = why;
      } else {
        const std::string text = plan::wire::encodeMoves(it->second, why);
        Status st = oob_->send(r, kTagFabricMove, text.data(), text.size(), timeoutMs_);
        if (!st.isOk())
          C4_WARN(kLogPlan, "C4P: cannot hand rank %d the fabric service's lane moves: %s", r, st.message().c_str());
      }
      byRank.erase(it);
    }
  }

  void renewLoop() {
    std::unique_lock<std::mutex> lk(mu_);
    bool warned = false;
    int64_t lastMs = detail::nowMs();
    for (;;) {
      // Every third of the lease, sooner (not within kMinRenewGapMs of the last) for a report that
      // cannot wait.
      const int64_t periodMs = std::max<int64_t>(leaseMs_ / 3, 100);
      for (;;) {
        if (stop_) return;
        urgent_ = collectReports() || urgent_;
        const int64_t now = detail::nowMs();
        const int64_t due = urgent_ ? lastMs + kMinRenewGapMs : lastMs + periodMs;
        if (now >= due) break;
        // Reports of other ranks arrive without a wake-up: look every kMinRenewGapMs.
        cv_.wait_for(lk, std::chrono::milliseconds(std::min<int64_t>(due - now, kMinRenewGapMs)));
      }
      lastMs = detail::nowMs();
      urgent_ = false;
      plan::wire::Request req;
      req.op = plan::wire::Op::kRenew;
      req.id = id_;
      req.token = token_;
      req.leaseMs = leaseMs_;
      req.report = std::move(pending_);
      pending_ = plan::wire::JobReport();
      // What a re-registration books: the lanes as the job runs them.
      for (const plan::PlannedConn& c : req.report.lanes)
        for (plan::PlannedConn& k : spec_.keep)
          if (k.a == c.a && k.b == c.b) k.lanes = c.lanes;
      lk.unlock();
      plan::wire::Reply rep;
      Status st = call(req, &rep, timeoutMs_);
      if (!st.isOk()) {
        // Not taken: the lanes go again with the next renewal (newer ones win), the samples too.
        std::lock_guard<std::mutex> g(mu_);
        plan::wire::JobReport again = std::move(req.report);
        mergeReport(pending_, &again);
        pending_ = std::move(again);
      }
      if (st.isOk() && rep.ok && !rep.moves.empty()) {
        C4_INFO(kLogPlan, "C4P: the fabric service %s asks the job to move %zu lane(s): %s", addr_.c_str(),
                rep.moves.size(), rep.moveWhy.c_str());
        handOut(rep.moves, rep.moveWhy);
      }
      if (st.isOk() && !rep.ok && rep.unknownJob) {
        // The service restarted without this job: book the plan the job runs, as it is.
        plan::wire::Reply again;
        st = registerJob(spec_, &again);
        if (st.isOk() && again.ok) {
          C4_WARN(kLogPlan,
                  "C4P: the fabric service %s did not know job %016llx (it restarted?): registered again "
                  "as %016llx with the plan the job runs",
                  addr_.c_str(), static_cast<unsigned long long>(id_), static_cast<unsigned long long>(again.id));
          id_ = again.id;
          token_ = again.token;
          rep.ok = true;
        } else if (st.isOk()) {
          rep.error = again.error;
        }
      }
      if (!st.isOk() || !rep.ok) {
        if (!warned)
          C4_WARN(kLogPlan,
                  "C4P: cannot renew job %016llx at the fabric service %s: %s (the job goes on; tried again "
                  "every %lld ms)",
                  static_cast<unsigned long long>(id_), addr_.c_str(),
                  st.isOk() ? rep.error.c_str() : st.message().c_str(), static_cast<long long>(leaseMs_ / 3));
        warned = true;
      } else if (warned) {
        C4_WARN(kLogPlan, "C4P: the fabric service %s renews job %016llx again", addr_.c_str(),
                static_cast<unsigned long long>(id_));
        warned = false;
      }
      lk.lock();
    }
  }

  const std::string addr_;
  const plan::wire::Key key_;
  const int64_t timeoutMs_, leaseMs_;
  Bootstrap* const oob_;
  std::unique_ptr<plan::FabricClient> client_;  // the renewal thread's once started
  uint64_t id_ = 0, token_ = 0;
  plan::wire::JobSpec spec_;  // with keep: what a re-registration books
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false, stopped_ = false;
  bool urgent_ = false;                      // mu_
  plan::wire::JobReport pending_;            // mu_: for the next renewal
  std::vector<plan::wire::LaneMove> moves_;  // mu_: rank 0's, not yet taken
  std::string movesWhy_;                     // mu_
  std::thread thread_;
};

// Rank 0: the fabric service's plan for the job (encoded reply), or "" with the reason in *why.
std::string askFabricService(const plan::PlanInput& in, const std::string& addr, int nranks, int hosts, Bootstrap* oob,
                             std::unique_ptr<FabricSession>* session, std::string* why) {
  const int64_t t0 = detail::nowNs();
  if (paramTopoFile().empty()) {
    *why = "it needs C4_TOPO_FILE, the fabric's topology (the same file as the service's)";
    return "";
  }
  const std::string keyFile = paramPlannerKeyFile();
  if (keyFile.empty()) {
    *why = "C4_PLANNER_KEY_FILE is not set";
    return "";
  }
  plan::wire::Key key;
  Status st = plan::readKeyFile(keyFile, &key);
  if (!st.isOk()) {
    *why = st.message();
    return "";
  }
  plan::wire::JobSpec spec;
  char host[256] = {0};
  gethostname(host, sizeof(host) - 1);
  spec.name = strFormat("%s pid %d: %d ranks on %d hosts", host, static_cast<int>(getpid()), nranks, hosts);
  spec.topoHash = in.topo->hash();
  spec.ranks = in.ranks;
  spec.flows = in.flows;
  spec.lanes = in.lanes;
  spec.portSalt = in.portSalt;
  spec.sourcePorts = in.sourcePorts;
  auto fs = std::make_unique<FabricSession>(addr, key, paramPlannerServiceMs(), paramPlannerLeaseMs(), oob);
  plan::wire::Reply rep;
  st = fs->registerJob(spec, &rep);
  if (!st.isOk()) {
    *why = st.message();
    return "";
  }
  if (!rep.ok) {
    *why = "it refused the job: " + rep.error;
    return "";
  }
  plan::Plan check;
  st = plan::adoptPlan(in, rep.conns, &check);
  if (!st.isOk()) {
    *why = "its plan does not fit the job: " + st.message();
    return "";
  }
  C4_INFO(kLogPlan,
          "C4P: the fabric service %s booked the job as %016llx in %.1f ms: its most loaded link %.2f ms, the "
          "fabric's %.2f ms with every job",
          addr.c_str(), static_cast<unsigned long long>(rep.id), (detail::nowNs() - t0) / 1e6, rep.soloSeconds * 1e3,
          rep.fabricSeconds * 1e3);
  spec.keep = rep.conns;
  fs->start(rep.id, rep.token, std::move(spec));
  *session = std::move(fs);
  return plan::wire::encodeReply(rep);
}

}  // namespace

struct LanePlanner::State {
  // What the rebalancer remembers of a lane between two looks.
  struct LaneSeen {
    uint64_t bytes = 0, busyNs = 0;
    double samples[3] = {0, 0, 0};  // the last throughput samples, bytes per busy ns
    int next = 0;                   // samples taken
    double rate = 0;                // their median
    int slow = 0;                   // consecutive looks well below its peers
    bool handled = false;           // retirement dealt with
  };
  int rank = 0;
  transport::Transport* net = nullptr;
  trace::Recorder* recorder = nullptr;
  int64_t periodNs = 0, lastNs = 0;
  uint64_t lastTicks = 0;                        // trace clock at the last look
  std::map<std::pair<int, int>, LaneSeen> seen;  // (peer, lane)
  std::vector<char> failed;                      // links a retired lane may have failed on
  plan::Topology topo;
  bool topoRead = false;  // readTopology() ran: topoStatus is the file's load result
  Status topoStatus;
  plan::PlanInput input;
  plan::Plan plan;
  bool planned = false;
  std::vector<std::string> rankHosts;     // on a C4_TOPO_FILE fabric: each rank's host
  std::unique_ptr<FabricSession> fabric;  // rank 0 with C4_PLANNER_SERVICE: the job's booking
  // Planned by the fabric service (every rank): reports go to rank 0, moves come from it.
  Bootstrap* oob = nullptr;
  bool fromService = false;
  int64_t reportPeriodNs = 0, lastReportNs = 0, lastMovesNs = 0;
  std::set<std::pair<int, int>> changedConns;  // connections this rank opens whose lanes changed
  // The newest sample per (connection, lane, direction) since the last report; a verdict is kept.
  std::map<std::tuple<int, int, int, bool>, plan::wire::LaneSample> samples;
  bool urgent = false;  // a report that cannot wait (lanes changed, a verdict)
  // The fabric service's moves whose new lane is being set up: the old lane retires once it is up.
  struct Retiring {
    int peer, a, b, oldLane, newLane;
    std::string was, now, why;
  };
  std::vector<Retiring> retiring;

  // A sample of lane `lane` of (a, b), sent by this rank.
  void sample(int a, int b, int lane, bool fromA, double bytesPerSec, double ratio, plan::wire::LaneSample::Verdict v) {
    plan::wire::LaneSample& x = samples[std::make_tuple(a, b, lane, fromA)];
    if (x.verdict != plan::wire::LaneSample::Verdict::kOk && v == plan::wire::LaneSample::Verdict::kOk) return;
    x = plan::wire::LaneSample{a, b, lane, fromA, bytesPerSec, ratio, v};
    urgent = urgent || v != plan::wire::LaneSample::Verdict::kOk;
  }
  void lanesChanged(int a, int b) {
    changedConns.insert({a, b});
    urgent = true;
  }
};

LanePlanner::LanePlanner() : s_(std::make_shared<State>()) {}
LanePlanner::~LanePlanner() = default;

bool LanePlanner::readTopology(uint64_t* hash) {
  const std::string file = paramTopoFile();
  s_->topoRead = true;
  s_->topoStatus = file.empty() ? Status::ok() : plan::Topology::load(file, &s_->topo);
  if (file.empty() || !s_->topoStatus.isOk()) return false;
  *hash = s_->topo.hash();
  return true;
}

std::function<transport::LanePlan(int, int)> LanePlanner::hook() {
  // The hook shares the state, so that it stays valid whichever of transport and planner goes first.
  std::shared_ptr<const State> s = s_;
  return [s](int peer, int lane) { return planFor(*s, peer, lane); };
}

transport::LanePlan LanePlanner::planFor(const State& s, int peer, int lane) {
  transport::LanePlan lp;
  if (!s.planned) return lp;
  const plan::PlannedConn* c = s.plan.find(s.rank, peer);
  if (c == nullptr || lane < 0 || lane >= static_cast<int>(c->lanes.size())) return lp;
  const plan::LaneChoice& l = c->lanes[static_cast<size_t>(lane)];
  const bool opener = s.rank == c->a;
  lp.localPort = opener ? l.localPort : l.remotePort;
  lp.remotePort = opener ? l.remotePort : l.localPort;
  if (opener) {
    lp.sourcePort = l.sourcePort;
    lp.sourcePortLo = l.sourceRange.lo;
    lp.sourcePortHi = l.sourceRange.hi;
  }
  lp.label = plan::lanePath(s.input, s.plan, c->a, c->b, lane);
  return lp;
}

namespace {

// "a -> b -> c" read the other way.
std::string reversePath(const std::string& p) {
  std::vector<std::string> hops;
  for (size_t pos = 0;;) {
    const size_t e = p.find(" -> ", pos);
    hops.push_back(p.substr(pos, e == std::string::npos ? std::string::npos : e - pos));
    if (e == std::string::npos) break;
    pos = e + 4;
  }
  std::string out;
  for (auto it = hops.rbegin(); it != hops.rend(); ++it) out += (out.empty() ? "" : " -> ") + *it;
  return out;
}

}  // namespace

Status LanePlanner::init(int rank, int nranks, Bootstrap* oob, const std::vector<int32_t>& hostOf,
                         transport::Transport* net, Tuner& tuner, trace::Recorder* recorder) {
  s_->recorder = recorder;
  s_->rank = rank;
  // One host: no fabric to plan, and no exchange (every rank sees the same host list).
  int32_t hosts = 0;
  for (int32_t h : hostOf) hosts = std::max(hosts, h + 1);
  if (hosts <= 1) return Status::ok();
  plan::Mode mode = plan::Mode::kC4p;
  const std::string modeText = paramPlanner();
  Status local;
  if (!plan::parseMode(modeText, &mode))
    local = makeError(Code::kInvalidArgument, "C4_PLANNER=%s: expected c4p, ecmp or off", modeText.c_str());
  // Collective from here whatever this rank finds, so that no rank waits for another that failed.
  PlaceRecord mine;
  mine.mode = static_cast<int32_t>(mode);
  const std::string file = paramTopoFile();
  transport::LaneSetup* lanes = net != nullptr ? net->laneSetup() : nullptr;
  const bool active = local.isOk() && mode != plan::Mode::kOff && lanes != nullptr;
  std::vector<std::string> addrs;
  if (active) {
    mine.lanes = lanes->lanesPerConnection();
    mine.sportLo = net->caps().sourcePortLo;
    mine.sportHi = net->caps().sourcePortHi;
    addrs = lanes->portAddresses();
    if (addrs.empty() || addrs.size() > static_cast<size_t>(kMaxPlanPorts))
      local = makeError(Code::kInvalidArgument, "C4P: rank %d has %zu NIC ports (1 to %d can be planned)", rank,
                        addrs.size(), kMaxPlanPorts);
    if (local.isOk() && !file.empty()) local = s_->topoRead ? s_->topoStatus : plan::Topology::load(file, &s_->topo);
    if (local.isOk()) {
      mine.topoHash = file.empty() ? 0 : s_->topo.hash();
      mine.nports = static_cast<int32_t>(addrs.size());
      for (size_t i = 0; i < addrs.size(); ++i) {
        mine.listen[i] = portOf(addrs[i]);
        mine.ports[i] = static_cast<int32_t>(i);
        if (file.empty()) continue;
        plan::HostPort hp;
        if (!s_->topo.findAddr(addrs[i], &hp)) {
          snprintf(mine.missing, sizeof(mine.missing), "%s", addrs[i].c_str());
          break;
        }
        if (mine.host >= 0 && hp.host != mine.host) {
          local =
              makeError(Code::kInvalidArgument,
                        "C4_TOPO_FILE %s: rank %d's NIC ports %s and %s lie on different hosts of the file (%s, %s)",
                        file.c_str(), rank, addrs[0].c_str(), addrs[i].c_str(), s_->topo.host(mine.host).name.c_str(),
                        s_->topo.host(hp.host).name.c_str());
          break;
        }
        mine.host = hp.host;
        mine.ports[i] = hp.port;
      }
    }
  }
  // A local error still takes part in the exchange (as a record no rank can plan with).
  if (!local.isOk()) mine.lanes = -1;
  std::vector<PlaceRecord> all(static_cast<size_t>(nranks));
  all[static_cast<size_t>(rank)] = mine;
  Status st = oob->allGather(all.data(), sizeof(PlaceRecord));
  if (!st.isOk()) return st;
  if (!local.isOk()) return local;
  for (int r = 0; r < nranks; ++r) {
    const PlaceRecord& p = all[static_cast<size_t>(r)];
    if (p.lanes < 0)
      return makeError(Code::kInvalidUsage, "C4P: rank %d could not set up its lane plan (see its log)", r);
    if (p.mode != mine.mode)
      return makeError(Code::kInvalidUsage, "C4_PLANNER differs between ranks (rank %d: %s, rank %d: %s); set it alike",
                       rank, plan::modeName(mode), r, plan::modeName(static_cast<plan::Mode>(p.mode)));
    if (!active) continue;
    if (p.topoHash != mine.topoHash)
      return makeError(Code::kInvalidUsage,
                       "C4_TOPO_FILE differs between ranks (rank %d and rank %d read different files or contents); "
                       "give every rank the same file",
                       rank, r);
    if (p.lanes != mine.lanes)
      return makeError(Code::kInvalidUsage, "C4P: ranks %d and %d open %d and %d lanes per connection", rank, r,
                       mine.lanes, p.lanes);
    if (p.sportLo != mine.sportLo || p.sportHi != mine.sportHi)
      return makeError(Code::kInvalidUsage,
                       "C4P: ranks %d and %d steer lanes with different source ports (%u-%u, %u-%u): their network "
                       "transports differ",
                       rank, r, static_cast<unsigned>(mine.sportLo), static_cast<unsigned>(mine.sportHi),
                       static_cast<unsigned>(p.sportLo), static_cast<unsigned>(p.sportHi));
    if (p.missing[0] != '\0')
      return makeError(Code::kInvalidArgument,
                       "C4_TOPO_FILE %s lists no port with address %s (rank %d's NIC port): the file is not this "
                       "job's fabric; fix it, or set C4_PLANNER=off",
                       file.c_str(), p.missing, r);
  }
  if (!active) return Status::ok();

  // The topology without a file: one non-blocking switch, each host with as many ports as its
  // ranks have.
  plan::PlanInput& in = s_->input;
  if (file.empty()) {
    std::vector<int> ports(static_cast<size_t>(hosts), 1);
    for (int r = 0; r < nranks; ++r)
      ports[static_cast<size_t>(hostOf[static_cast<size_t>(r)])] =
          std::max(ports[static_cast<size_t>(hostOf[static_cast<size_t>(r)])], all[static_cast<size_t>(r)].nports);
    s_->topo = plan::Topology::flat(ports);
  }
  in.topo = &s_->topo;
  in.mode = mode;
  in.lanes = mine.lanes;
  in.seed = static_cast<uint64_t>(paramPlanSeed());
  in.sourcePorts = plan::PortRange{mine.sportLo, mine.sportHi};
  for (int r = 0; r < nranks; ++r) {
    const PlaceRecord& p = all[static_cast<size_t>(r)];
    plan::RankPlace rp;
    rp.host = file.empty() ? hostOf[static_cast<size_t>(r)] : p.host;
    for (int i = 0; i < p.nports; ++i) {
      rp.ports.push_back(p.ports[i]);
      rp.listenPorts.push_back(p.listen[i]);
    }
    if (!file.empty()) s_->rankHosts.push_back(s_->topo.host(rp.host).name);
    in.ranks.push_back(std::move(rp));
  }
  // Different communicators of one job take different steering ports.
  uint32_t salt = 0;
  for (const PlaceRecord& p : all) salt = salt * 31 + p.listen[0];
  in.portSalt = salt;

  // Schedule files made for other hosts are dropped before their flows are planned.
  tuner.checkScheduleHosts(s_->rankHosts);
  // Flows: the schedules of a large AllReduce, as the tuner would run it, plus those of every
  // schedule file in use for another collective, at the same nominal size (a file's schedule may use
  // connections the AllReduce does not, which would otherwise run on unplanned lanes).
  const size_t bytes = static_cast<size_t>(std::max<int64_t>(paramPlanBytes(), 4 * nranks));
  sched::Algo algo = tuner.choose(Coll::kAllReduce, bytes).algo;
  st = plan::scheduleFlows(algo, Coll::kAllReduce, nranks, bytes, hostOf, &in.flows, &algo);
  if (!st.isOk()) return st;
  int files = 0;
  for (const ScheduleChoice& c : tuner.schedules()) {
    if (c.coll == Coll::kAllReduce) continue;  // planned above
    std::vector<plan::Flow> more;
    // scheduleFlows takes the per-rank count's bytes: the nominal size over the ranks for these.
    st = plan::scheduleFlows(c.algo, c.coll, nranks, bytes / static_cast<size_t>(nranks), hostOf, &more);
    if (!st.isOk()) return st;
    plan::addFlows(more, &in.flows);
    ++files;
  }
  // The fabric service (C4_PLANNER_SERVICE): rank 0 registers the job and hands the service's
  // reply to every rank; each checks the plan against the same input, so all take it or all plan
  // alone. What goes wrong with the service is a warning, never the job's failure.
  const std::string service = paramPlannerService();
  bool fromService = false;
  if (!service.empty() && mode == plan::Mode::kC4p) {
    std::string reply, why;
    if (rank == 0) {
      reply = askFabricService(in, service, nranks, hosts, oob, &s_->fabric, &why);
      if (reply.empty())
        C4_WARN(kLogPlan, "C4P: the fabric service %s does not plan this job, which plans alone: %s", service.c_str(),
                why.c_str());
    }
    st = oob->broadcast(kTagFabricPlan, &reply);
    if (!st.isOk()) return st;
    plan::wire::Reply rep;
    if (!reply.empty() && plan::wire::parseReply(reply, &rep).isOk() &&
        plan::adoptPlan(in, rep.conns, &s_->plan).isOk())
      fromService = true;
  }
  if (!fromService) {
    st = plan::makePlan(in, &s_->plan);
    if (!st.isOk()) return st;
  }
  s_->planned = true;
  s_->net = net;
  s_->periodNs = paramRebalanceMs() * 1000000;
  s_->oob = oob;
  s_->fromService = fromService;
  s_->reportPeriodNs = paramPlannerLeaseMs() / 3 * 1000000;
  active_ = (s_->periodNs > 0 || fromService) && !s_->plan.conns.empty();

  const plan::Topology& t = s_->topo;
  const int b = s_->plan.bottleneck(t);
  char buf[512];
  snprintf(
      buf, sizeof(buf), "%s%s over %s: %zu connection(s) x %d lane(s) for %s AllReduce of %zu B%s; most loaded link %s",
      plan::modeName(mode), fromService ? " (by the fabric service, beside the other jobs)" : "",
      file.empty() ? "a flat model" : file.c_str(), s_->plan.conns.size(), in.lanes, sched::algoName(algo), bytes,
      files > 0 ? strFormat(" and %d schedule file(s)", files).c_str() : "", b < 0 ? "none" : t.link(b).name.c_str());
  C4_INFO(kLogPlan, "rank %d: C4P %s", rank, buf);
  if (recorder != nullptr) recorder->plan(trace::PlanEvent::kPlan, std::string("C4P ") + buf);
  s_->lastTicks = trace::ticks();
  if (rank == 0 && logEnabled(LogLevel::kInfo, kLogPlan)) {
    const std::string d = s_->plan.describe(in);
    C4_INFO(kLogPlan, "C4P plan (lane: ports, path, source port, bytes each way):\n%s", d.c_str());
    const std::string l = s_->plan.describeLoad(t, 16);
    C4_INFO(kLogPlan, "C4P link load (most loaded first; ideal %.2f ms, plan %.2f ms):\n%s",
            s_->plan.hostBoundSeconds(t, in) * 1e3, s_->plan.maxLinkSeconds(t) * 1e3, l.c_str());
  }
  return Status::ok();
}

void LanePlanner::stop() {
  if (s_->fabric) s_->fabric->stop();
}

void LanePlanner::rebalance() {
  State& s = *s_;
  const int64_t now = detail::nowNs();
  constexpr int64_t kMovesLookNs = 50000000;  // the service's moves are looked for this often
  if (s.fromService && now - s.lastMovesNs >= kMovesLookNs) {
    s.lastMovesNs = now;
    applyMoves(s);
  }
  if (!s.retiring.empty()) finishMoves(s);
  if (s.periodNs > 0 && now - s.lastNs >= s.periodNs) {
    s.lastNs = now;
    look(s);
  }
  if (s.fromService) sendReport(s, now);
}

void LanePlanner::applyMoves(State& s) {
  std::vector<plan::wire::LaneMove> moves;
  std::string why;
  if (s.rank == 0) {
    if (s.fabric) moves = s.fabric->takeMoves(&why);
  } else {
    std::vector<std::pair<int, std::vector<char>>> msgs;
    s.oob->take(kTagFabricMove, &msgs);
    for (auto& [from, bytes] : msgs) {
      std::vector<plan::wire::LaneMove> m;
      std::string w;
      Status st = plan::wire::parseMoves(std::string(bytes.begin(), bytes.end()), &m, &w);
      if (!st.isOk()) {
        C4_WARN(kLogPlan, "rank %d: C4P: lane moves from rank %d that do not parse: %s", s.rank, from,
                st.message().c_str());
        continue;
      }
      moves.insert(moves.end(), m.begin(), m.end());
      why = w;
    }
  }
  for (const plan::wire::LaneMove& m : moves) {
    if (m.a != s.rank && m.b != s.rank) continue;
    const bool opener = m.a == s.rank;
    const int peer = opener ? m.b : m.a;
    size_t ci = 0;
    while (ci < s.plan.conns.size() && !(s.plan.conns[ci].a == m.a && s.plan.conns[ci].b == m.b)) ++ci;
    if (ci == s.plan.conns.size() || m.lane >= static_cast<int>(s.plan.conns[ci].lanes.size()) ||
        s.plan.conns[ci].lanes[static_cast<size_t>(m.lane)].retired) {
      // The lane changed since the service's books said (a replacement of this rank's): its next
      // report tells the service the lanes as they are.
      C4_INFO(kLogPlan, "rank %d: C4P: the fabric service's move of lane %d to rank %d skipped: not in service", s.rank,
              m.lane, peer);
      if (opener && ci < s.plan.conns.size()) s.lanesChanged(m.a, m.b);
      continue;
    }
    const std::string was = plan::lanePath(s.input, s.plan, m.a, m.b, m.lane);
    transport::Connection* conn = s.net->laneSetup()->existingConnection(peer);
    transport::LaneControl* control = conn != nullptr ? conn->laneControl() : nullptr;
    const plan::Plan before = s.plan;
    Status st;
    if (opener && control == nullptr) {
      // Not open yet: its lanes open on the new path from the start.
      s.plan.conns[ci].lanes[static_cast<size_t>(m.lane)] = m.choice;
      s.plan.computeLoad(s.input);
      s.lanesChanged(m.a, m.b);
      C4_INFO(kLogPlan, "rank %d: C4P: lane %d to rank %d (not open yet) planned on %s by the fabric service: %s",
              s.rank, m.lane, peer, plan::lanePath(s.input, s.plan, m.a, m.b, m.lane).c_str(), why.c_str());
      continue;
    }
    st = plan::moveLane(s.input, &s.plan, m.a, m.b, m.lane, m.choice);
    if (!st.isOk()) {
      C4_WARN(kLogPlan, "rank %d: C4P: the fabric service's move of lane %d to rank %d does not fit: %s", s.rank,
              m.lane, peer, st.message().c_str());
      continue;
    }
    const int index = static_cast<int>(s.plan.conns[ci].lanes.size()) - 1;
    const std::string now = plan::lanePath(s.input, s.plan, m.a, m.b, index);
    // Its retirement is the move's, not a failure (for this rank's look and reports).
    s.seen[{peer, m.lane}].handled = true;
    if (!opener) {
      // The peer opens the new lane and retires this one; this rank books it.
      C4_INFO(kLogPlan, "rank %d: C4P: lane %d to rank %d (%s) moves to %s (the fabric service: %s)", s.rank, m.lane,
              peer, was.c_str(), now.c_str(), why.c_str());
      continue;
    }
    int got = -1;
    st = control->addLane(planFor(s, peer, index), &got);
    if (!st.isOk()) {
      s.plan = before;
      s.seen[{peer, m.lane}].handled = false;
      C4_WARN(kLogPlan, "rank %d: C4P: cannot open the lane the fabric service asked for to rank %d (%s): %s", s.rank,
              peer, now.c_str(), st.message().c_str());
      s.lanesChanged(m.a, m.b);
      continue;
    }
    if (got != index)
      C4_WARN(kLogPlan, "rank %d: C4P: the new lane to rank %d is lane %d, the plan's %d", s.rank, peer, got, index);
    // The old lane retires once the new one is up (finishMoves): a connection of one lane keeps a
    // lane in service throughout, and nothing waits for the new lane's setup.
    s.retiring.push_back(State::Retiring{peer, m.a, m.b, m.lane, got, was, now, why});
    C4_INFO(kLogPlan, "rank %d: C4P: opening lane %d to rank %d (%s) for the fabric service's move of lane %d", s.rank,
            got, peer, now.c_str(), m.lane);
  }
}

void LanePlanner::finishMoves(State& s) {
  for (auto it = s.retiring.begin(); it != s.retiring.end();) {
    const State::Retiring& r = *it;
    transport::Connection* conn = s.net->laneSetup()->existingConnection(r.peer);
    transport::LaneControl* control = conn != nullptr ? conn->laneControl() : nullptr;
    const transport::Lane* fresh = conn != nullptr ? conn->lane(r.newLane) : nullptr;
    const transport::LaneState state = fresh != nullptr ? fresh->state() : transport::LaneState::kRetired;
    if (control != nullptr && state == transport::LaneState::kConnecting) {
      ++it;
      continue;
    }
    if (control != nullptr && state == transport::LaneState::kUp) {
      Status st = control->retireLane(r.oldLane, "C4P: the fabric service moved it (" + r.why + ")");
      C4_INFO(kLogPlan, "rank %d: C4P: lane %d to rank %d (%s) moved by the fabric service to lane %d (%s): %s%s",
              s.rank, r.oldLane, r.peer, r.was.c_str(), r.newLane, r.now.c_str(), r.why.c_str(),
              st.isOk() ? "" : (" (retiring the old lane: " + st.message() + ")").c_str());
      if (s.recorder != nullptr)
        s.recorder->plan(trace::PlanEvent::kReplan,
                         "lane " + std::to_string(r.oldLane) + " (" + r.was + ") moved by the fabric service to lane " +
                             std::to_string(r.newLane) + " (" + r.now + "): " + r.why,
                         r.peer, r.newLane);
    } else {
      // The new lane did not come up: the old one stays in service (the plan says so again).
      for (plan::PlannedConn& c : s.plan.conns) {
        if (c.a != r.a || c.b != r.b) continue;
        if (r.oldLane < static_cast<int>(c.lanes.size())) c.lanes[static_cast<size_t>(r.oldLane)].retired = false;
        if (r.newLane >= 0 && r.newLane < static_cast<int>(c.lanes.size()))
          c.lanes[static_cast<size_t>(r.newLane)].retired = true;
      }
      s.plan.computeLoad(s.input);
      s.seen[{r.peer, r.oldLane}].handled = false;
      s.seen[{r.peer, r.newLane}].handled = true;
      C4_WARN(kLogPlan,
              "rank %d: C4P: the lane the fabric service asked for to rank %d (%s) did not come up; lane %d (%s) "
              "stays in service",
              s.rank, r.peer, r.now.c_str(), r.oldLane, r.was.c_str());
    }
    s.lanesChanged(r.a, r.b);
    it = s.retiring.erase(it);
  }
}

void LanePlanner::sendReport(State& s, int64_t nowNs) {
  if (s.samples.empty() && s.changedConns.empty()) return;
  if (!s.urgent && nowNs - s.lastReportNs < s.reportPeriodNs) return;
  plan::wire::JobReport r;
  for (const auto& [a, b] : s.changedConns)
    if (const plan::PlannedConn* c = s.plan.find(a, b)) r.lanes.push_back(*c);
  for (const auto& [k, x] : s.samples) r.samples.push_back(x);
  const bool urgent = s.urgent;
  s.changedConns.clear();
  s.samples.clear();
  s.urgent = false;
  s.lastReportNs = nowNs;
  if (s.rank == 0) {
    if (s.fabric) s.fabric->report(r, urgent);
    return;
  }
  const std::string text = plan::wire::encodeJobReport(r);
  Status st = s.oob->send(0, kTagFabricReport, text.data(), text.size(), 1000);
  if (!st.isOk())
    C4_INFO(kLogPlan, "rank %d: C4P: cannot hand rank 0 the lane report for the fabric service: %s", s.rank,
            st.message().c_str());
}

void LanePlanner::look(State& s) {
  const uint64_t nowTicks = trace::ticks();
  const plan::Topology& t = s.topo;
  for (size_t ci = 0; ci < s.plan.conns.size(); ++ci) {
    // By value: re-planning below replaces s.plan (and with it the connection's record).
    const int ca = s.plan.conns[ci].a, cb = s.plan.conns[ci].b;
    if (ca != s.rank && cb != s.rank) continue;
    const int peer = ca == s.rank ? cb : ca;
    const bool opener = ca == s.rank;
    transport::Connection* conn = s.net->laneSetup()->existingConnection(peer);
    transport::LaneControl* control = conn != nullptr ? conn->laneControl() : nullptr;
    if (control == nullptr) continue;
    const int n = conn->numLanes();
    std::vector<transport::LaneSnapshot> snap;
    for (int i = 0; i < n; ++i) {
      const transport::Lane* l = conn->lane(i);
      snap.push_back(l != nullptr ? l->snapshot() : transport::LaneSnapshot{});
    }
    // Retired lanes: once each, replace it where this rank opens lanes, while the connection is
    // in use (another lane up: a connection whose lanes all closed lost its peer, or the peer left).
    int up = 0;
    for (const transport::LaneSnapshot& l : snap) up += l.state == transport::LaneState::kUp;
    bool lanesChanged = false;
    for (int i = 0; i < n; ++i) {
      State::LaneSeen& seen = s.seen[{peer, i}];
      if (snap[static_cast<size_t>(i)].state != transport::LaneState::kRetired || seen.handled) continue;
      seen.handled = true;
      // Broken here (not retired by the peer, nor moved by this rank): the links it crossed, each way
      // this rank sends, may have failed.
      const std::string& whyRetired = snap[static_cast<size_t>(i)].retiredWhy;
      if (whyRetired.rfind("retired by", 0) != 0 && whyRetired.rfind("the peer closed", 0) != 0)
        s.sample(ca, cb, i, opener, 0, -1, plan::wire::LaneSample::Verdict::kFailed);
      if (opener) s.lanesChanged(ca, cb);
      if (up == 0 || i >= static_cast<int>(s.plan.conns[ci].lanes.size()) ||
          s.plan.conns[ci].lanes[static_cast<size_t>(i)].retired)
        continue;
      const std::string was = plan::lanePath(s.input, s.plan, ca, cb, i);
      plan::markLaneLinks(s.input, s.plan, ca, cb, i, &s.failed);
      bool found = false;
      plan::LaneChoice lc;
      // The acceptor only books the retirement; the opener adds the replacement (same plan on both).
      Status st = plan::replaceLane(s.input, &s.plan, ca, cb, i, s.failed, false, &found, &lc);
      if (!st.isOk() || !found || !opener) {
        C4_INFO(kLogPlan, "rank %d: C4P: lane %d to rank %d (%s) left service%s", s.rank, i, peer, was.c_str(),
                !st.isOk() ? st.message().c_str()
                : !found   ? "; no healthy path is left to replace it"
                           : "");
        continue;
      }
      int index = -1;
      st = control->addLane(planFor(s, peer, static_cast<int>(s.plan.conns[ci].lanes.size()) - 1), &index);
      const std::string now_ =
          plan::lanePath(s.input, s.plan, ca, cb, static_cast<int>(s.plan.conns[ci].lanes.size()) - 1);
      if (!st.isOk() || index != static_cast<int>(s.plan.conns[ci].lanes.size()) - 1) {
        C4_WARN(kLogPlan, "rank %d: C4P: cannot replace lane %d to rank %d (%s): %s", s.rank, i, peer, was.c_str(),
                st.isOk() ? "lane numbers disagree with the plan" : st.message().c_str());
        continue;
      }
      C4_INFO(kLogPlan, "rank %d: C4P: lane %d to rank %d (%s) left service; lane %d replaces it (%s)", s.rank, i, peer,
              was.c_str(), index, now_.c_str());
      if (s.recorder != nullptr)
        s.recorder->plan(trace::PlanEvent::kReplan,
                         "lane " + std::to_string(i) + " (" + was + ") left service; lane " + std::to_string(index) +
                             " replaces it (" + now_ + ")",
                         peer, index);
      lanesChanged = true;
    }
    if (lanesChanged) continue;  // weigh the new set of lanes at the next look
    // Weights from throughput, measured over what each lane carried since the last look.
    std::vector<double> rate(static_cast<size_t>(n), 0.0);
    double best = 0;
    int measured = 0;
    for (int i = 0; i < n; ++i) {
      const transport::LaneSnapshot& l = snap[static_cast<size_t>(i)];
      State::LaneSeen& seen = s.seen[{peer, i}];
      const uint64_t db = l.bytesSent - seen.bytes, dt = l.busyNs - seen.busyNs;
      seen.bytes = l.bytesSent;
      seen.busyNs = l.busyNs;
      if (s.recorder != nullptr && db > 0 && i < static_cast<int>(s.plan.conns[ci].lanes.size())) {
        const std::string path = plan::lanePath(s.input, s.plan, ca, cb, i);
        s.recorder->plan(trace::PlanEvent::kLaneSample, opener ? path : reversePath(path), peer, i, db, s.lastTicks,
                         nowTicks);
      }
      if (l.state != transport::LaneState::kUp) continue;
      if (db >= (1u << 20) && dt > 0) {
        const double r = static_cast<double>(db) / static_cast<double>(dt);
        // The median of the last three samples: one odd sample (the peer was slow to read) moves
        // nothing, a link that changed rate is followed at the second sample.
        seen.samples[seen.next++ % 3] = r;
        const double* v = seen.samples;
        if (seen.next == 1)
          seen.rate = v[0];
        else if (seen.next == 2)
          seen.rate = 0.5 * (v[0] + v[1]);
        else
          seen.rate = std::max(std::min(v[0], v[1]), std::min(std::max(v[0], v[1]), v[2]));  // the median
      }
      if (seen.rate > 0) {
        rate[static_cast<size_t>(i)] = seen.rate;
        best = std::max(best, seen.rate);
        ++measured;
      }
    }
    for (int i = 0; i < n; ++i)
      if (rate[static_cast<size_t>(i)] > 0)
        s.sample(ca, cb, i, opener, rate[static_cast<size_t>(i)] * 1e9,
                 measured >= 2 ? rate[static_cast<size_t>(i)] / best : -1, plan::wire::LaneSample::Verdict::kOk);
    if (measured < 2 || best <= 0) continue;
    std::vector<double> w(static_cast<size_t>(n), 0.0);
    bool change = false;
    for (int i = 0; i < n; ++i) {
      const transport::LaneSnapshot& l = snap[static_cast<size_t>(i)];
      if (!(l.state == transport::LaneState::kUp || l.state == transport::LaneState::kConnecting)) continue;
      const double r = rate[static_cast<size_t>(i)];
      w[static_cast<size_t>(i)] = r > 0 ? std::max(0.05, r / best) : 1.0;
      if (std::abs(w[static_cast<size_t>(i)] - l.weight) > 0.1 * std::max(l.weight, 0.05)) change = true;
      // Well below its peers, look after look: a spare path (if the fabric has one) serves better.
      State::LaneSeen& seen = s.seen[{peer, i}];
      seen.slow = r > 0 && r < 0.5 * best ? seen.slow + 1 : 0;
      if (seen.slow >= 3 && i < static_cast<int>(s.plan.conns[ci].lanes.size())) {
        seen.slow = 0;
        s.sample(ca, cb, i, opener, r * 1e9, r / best, plan::wire::LaneSample::Verdict::kSlow);
        std::vector<char> avoid;
        plan::markLaneLinks(s.input, s.plan, ca, cb, i, &avoid);
        plan::Plan trial = s.plan;
        bool found = false;
        plan::LaneChoice lc;
        if (!plan::replaceLane(s.input, &trial, ca, cb, i, avoid, true, &found, &lc).isOk() || !found) continue;
        const std::string was = plan::lanePath(s.input, s.plan, ca, cb, i);
        const std::string pct = std::to_string(static_cast<int>(100 * r / best));
        Status st;
        int index = -1;
        if (opener) {
          // Open the lane on the spare path, then retire the slow one (its pieces move over).
          s.plan = std::move(trial);
          st = control->addLane(planFor(s, peer, static_cast<int>(s.plan.conns[ci].lanes.size()) - 1), &index);
          if (st.isOk())
            st = control->retireLane(
                i, "C4P: moved to a spare path (it ran at " + pct + "% of its connection's fastest lane)");
          s.seen[{peer, i}].handled = true;
          s.lanesChanged(ca, cb);
        } else {
          // Only the peer opens lanes: retire the slow one; the peer replaces it, avoiding its
          // links (the failover path above), on the spare path.
          st = control->retireLane(i, "C4P: ran at " + pct + "% of its connection's fastest lane; rank " +
                                          std::to_string(peer) + " replaces it on a spare path");
        }
        C4_INFO(kLogPlan, "rank %d: C4P: lane %d to rank %d (%s) at %s%% of its peers: %s", s.rank, i, peer,
                was.c_str(), pct.c_str(),
                !st.isOk() ? st.message().c_str()
                : opener   ? "moved to a spare path"
                           : "retired for the peer to replace on a spare path");
        if (s.recorder != nullptr && st.isOk())
          s.recorder->plan(trace::PlanEvent::kReplan,
                           opener
                               ? "lane " + std::to_string(i) + " (" + was + ") moved to a spare path as lane " +
                                     std::to_string(index) + " (" + plan::lanePath(s.input, s.plan, ca, cb, index) + ")"
                               : "lane " + std::to_string(i) + " (" + was + ") retired at " + pct +
                                     "% of its peers, for the peer to replace on a spare path",
                           peer, opener ? index : i);
        change = false;  // the lanes changed: weigh them at the next look
        break;
      }
    }
    if (!change) continue;
    Status st = control->setLaneWeights(w);
    if (st.isOk()) {
      std::string text;
      for (int i = 0; i < n; ++i) text += (i ? " " : "") + std::to_string(w[static_cast<size_t>(i)]).substr(0, 4);
      C4_INFO(kLogPlan, "rank %d: C4P: lane weights to rank %d: %s (measured throughput, %s)", s.rank, peer,
              text.c_str(), t.source().c_str());
      if (s.recorder != nullptr) s.recorder->plan(trace::PlanEvent::kWeights, "weights " + text, peer);
    }
  }
  s.lastTicks = nowTicks;
}

}  // namespace c4
