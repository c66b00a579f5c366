#include "core/lane_planner.hpp"

#include <algorithm>
#include <cstring>

#include "common/logging.hpp"
#include "common/status.hpp"
#include "core/tuner.hpp"
#include "planner/flows.hpp"
#include "planner/planner.hpp"
#include "planner/topology.hpp"
#include "sched/schedule.hpp"

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
  char missing[64] = {};  // the first of this rank's addresses the file does not list
};

uint16_t portOf(const std::string& addr) {
  const size_t c = addr.rfind(':');
  return c == std::string::npos ? 0 : static_cast<uint16_t>(atoi(addr.c_str() + c + 1));
}

}  // namespace

struct LanePlanner::State {
  int rank = 0;
  plan::Topology topo;
  plan::PlanInput input;
  plan::Plan plan;
  bool planned = false;
};

LanePlanner::LanePlanner() : s_(std::make_shared<State>()) {}
LanePlanner::~LanePlanner() = default;

std::function<transport::LanePlan(int, int)> LanePlanner::hook() {
  // The hook shares the state, so that it stays valid whichever of transport and planner goes first.
  std::shared_ptr<const State> s = s_;
  return [s](int peer, int lane) { return planFor(*s, peer, lane); };
}

transport::LanePlan LanePlanner::lanePlan(int peer, int lane) const { return planFor(*s_, peer, lane); }

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
  return lp;
}

Status LanePlanner::init(int rank, int nranks, transport::Oob* oob, const std::vector<int32_t>& hostOf,
                         transport::Transport* net, const Tuner& tuner) {
  rank_ = s_->rank = rank;
  plan::Mode mode = plan::Mode::kC4p;
  const std::string modeText = paramPlanner();
  if (!plan::parseMode(modeText, &mode))
    return makeError(Code::kInvalidArgument, "C4_PLANNER=%s: expected c4p, ecmp or off", modeText.c_str());
  // Collective from here whatever this rank finds, so that no rank waits for another that failed.
  PlaceRecord mine;
  mine.mode = static_cast<int32_t>(mode);
  Status local;
  const std::string file = paramTopoFile();
  const bool active = mode != plan::Mode::kOff && net != nullptr && net->caps().lanes;
  std::vector<std::string> addrs;
  if (active) {
    mine.lanes = net->lanesPerConnection();
    addrs = net->portAddresses();
    if (addrs.empty() || addrs.size() > static_cast<size_t>(kMaxPlanPorts))
      local = makeError(Code::kInvalidArgument, "C4P: rank %d has %zu NIC ports (1 to %d can be planned)", rank,
                        addrs.size(), kMaxPlanPorts);
    if (local.isOk() && !file.empty()) local = plan::Topology::load(file, &s_->topo);
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
          local = makeError(Code::kInvalidArgument,
                            "C4_TOPO_FILE %s: rank %d's NIC ports %s and %s lie on different hosts of the file (%s, %s)",
                            file.c_str(), rank, addrs[0].c_str(), addrs[i].c_str(),
                            s_->topo.host(mine.host).name.c_str(), s_->topo.host(hp.host).name.c_str());
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
    int hosts = 0;
    for (int32_t h : hostOf) hosts = std::max(hosts, h + 1);
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
  for (int r = 0; r < nranks; ++r) {
    const PlaceRecord& p = all[static_cast<size_t>(r)];
    plan::RankPlace rp;
    rp.host = file.empty() ? hostOf[static_cast<size_t>(r)] : p.host;
    for (int i = 0; i < p.nports; ++i) {
      rp.ports.push_back(p.ports[i]);
      rp.listenPorts.push_back(p.listen[i]);
    }
    in.ranks.push_back(std::move(rp));
  }
  // Different communicators of one job take different steering ports.
  uint32_t salt = 0;
  for (const PlaceRecord& p : all) salt = salt * 31 + p.listen[0];
  in.portSalt = salt;

  // Flows: the schedules of a large AllReduce, as the tuner would run it.
  const size_t bytes = static_cast<size_t>(std::max<int64_t>(paramPlanBytes(), 4 * nranks));
  sched::Algo algo = tuner.choose(Coll::kAllReduce, bytes).algo;
  st = plan::scheduleFlows(algo, Coll::kAllReduce, nranks, bytes, hostOf, &in.flows, &algo);
  if (!st.isOk()) return st;
  st = plan::makePlan(in, &s_->plan);
  if (!st.isOk()) return st;
  s_->planned = true;

  const plan::Topology& t = s_->topo;
  const int b = s_->plan.bottleneck(t);
  char buf[512];
  snprintf(buf, sizeof(buf), "%s over %s: %zu connection(s) x %d lane(s) for %s AllReduce of %zu B; most loaded link %s",
           plan::modeName(mode), file.empty() ? "a flat model" : file.c_str(), s_->plan.conns.size(), in.lanes,
           sched::algoName(algo), bytes, b < 0 ? "none" : t.link(b).name.c_str());
  summary_ = buf;
  C4_INFO(kLogPlan, "rank %d: C4P %s", rank, summary_.c_str());
  if (rank == 0 && logEnabled(LogLevel::kInfo, kLogPlan)) {
    const std::string d = s_->plan.describe(in);
    C4_INFO(kLogPlan, "C4P plan (lane: ports, path, source port, bytes each way):\n%s", d.c_str());
    const std::string l = s_->plan.describeLoad(t, 16);
    C4_INFO(kLogPlan, "C4P link load (most loaded first; ideal %.2f ms, plan %.2f ms):\n%s",
            s_->plan.hostBoundSeconds(t, in) * 1e3, s_->plan.maxLinkSeconds(t) * 1e3, l.c_str());
  }
  return Status::ok();
}

}  // namespace c4
