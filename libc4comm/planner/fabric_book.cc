#include "planner/fabric_book.hpp"

#include <algorithm>
#include <cmath>
#include <nlohmann/json.hpp>
#include <utility>

#include "common/status.hpp"

namespace c4::plan {

namespace {

constexpr double kCutCapacity = 0.001;  // what planning counts on of a link booked cut
constexpr double kGoodRatio = 0.8;      // a lane this close to its connection's fastest clears its links

bool fabricLink(const Topology& t, int l) { return t.link(l).from >= 0 && t.link(l).to >= 0; }

bool sameRoute(const LaneChoice& x, const LaneChoice& y) {
  return x.localPort == y.localPort && x.remotePort == y.remotePort && x.path == y.path && x.backPath == y.backPath;
}

}  // namespace

const char* linkStateName(LinkHealth::State s) {
  switch (s) {
    case LinkHealth::State::kOk:
      return "ok";
    case LinkHealth::State::kSlow:
      return "slow";
    case LinkHealth::State::kCut:
      return "cut";
  }
  return "?";
}

FabricBook::FabricBook(Topology topo) : topo_(std::move(topo)) {}

const BookedJob* FabricBook::find(uint64_t id) const {
  auto it = jobs_.find(id);
  return it == jobs_.end() ? nullptr : &it->second;
}

std::vector<double> FabricBook::load(uint64_t except) const {
  std::vector<double> sum(static_cast<size_t>(topo_.numLinks()), 0.0);
  for (const auto& [id, j] : jobs_) {
    if (id == except) continue;
    for (size_t l = 0; l < sum.size() && l < j.plan.load.size(); ++l) sum[l] += j.plan.load[l];
  }
  return sum;
}

double FabricBook::fabricSeconds() const {
  const std::vector<double> sum = load();
  double m = 0;
  for (size_t l = 0; l < sum.size(); ++l) {
    auto h = health_.find(static_cast<int>(l));
    const double cap = h == health_.end() ? 1.0 : h->second.capacity;
    m = std::max(m, sum[l] * 8.0 / (topo_.link(static_cast<int>(l)).bps * cap));
  }
  return m;
}

std::vector<double> FabricBook::capacity() const {
  if (health_.empty()) return {};
  std::vector<double> c(static_cast<size_t>(topo_.numLinks()), 1.0);
  for (const auto& [l, h] : health_) c[static_cast<size_t>(l)] = h.capacity;
  return c;
}

Status FabricBook::add(uint64_t id, uint64_t token, const wire::JobSpec& spec, int64_t nowMs, int64_t leaseMs,
                       const BookedJob** out) {
  if (id == 0 || jobs_.count(id))
    return makeError(Code::kInvalidArgument, "fabric service: job id %llu is taken",
                     static_cast<unsigned long long>(id));
  if (spec.topoHash != topo_.hash())
    return makeError(Code::kInvalidUsage,
                     "fabric service: the job read another topology (hash %016llx) than the service's %s (%016llx): "
                     "give the job and the service the same C4_TOPO_FILE",
                     static_cast<unsigned long long>(spec.topoHash), topo_.source().c_str(),
                     static_cast<unsigned long long>(topo_.hash()));
  BookedJob j;
  j.id = id;
  j.token = token;
  j.spec = spec;
  j.spec.keep.clear();
  PlanInput& in = j.input;
  in.topo = &topo_;
  in.ranks = spec.ranks;
  in.flows = spec.flows;
  in.lanes = spec.lanes;
  in.mode = Mode::kC4p;
  in.portSalt = spec.portSalt;
  in.sourcePorts = spec.sourcePorts;
  if (spec.keep.empty()) {
    // On what every other job leaves; the job's own load is Plan::load.
    in.background = load();
    in.capacity = capacity();
    Status st = makePlan(in, &j.plan);
    in.background.clear();
    in.capacity.clear();
    if (!st.isOk()) return st;
  } else {
    C4_CHECK(adoptPlan(in, spec.keep, &j.plan));
  }
  j.registeredMs = j.renewedMs = nowMs;
  j.leaseMs = leaseMs;
  j.leaseUntilMs = nowMs + leaseMs;
  auto it = jobs_.emplace(id, std::move(j)).first;
  // The map moved the job: its input points at the book's topology still, nothing else to fix.
  if (out != nullptr) *out = &it->second;
  return Status::ok();
}

Status FabricBook::renew(uint64_t id, uint64_t token, int64_t nowMs, int64_t leaseMs, bool* unknown) {
  *unknown = false;
  auto it = jobs_.find(id);
  if (it == jobs_.end()) {
    *unknown = true;
    return makeError(Code::kInvalidUsage, "fabric service: no job %016llx (the service may have restarted)",
                     static_cast<unsigned long long>(id));
  }
  if (it->second.token != token)
    return makeError(Code::kInvalidUsage, "fabric service: a wrong token for job %016llx",
                     static_cast<unsigned long long>(id));
  it->second.renewedMs = nowMs;
  if (leaseMs > 0) it->second.leaseMs = leaseMs;
  it->second.leaseUntilMs = nowMs + it->second.leaseMs;
  return Status::ok();
}

Status FabricBook::release(uint64_t id, uint64_t token, bool* unknown) {
  *unknown = false;
  auto it = jobs_.find(id);
  if (it == jobs_.end()) {
    *unknown = true;
    return makeError(Code::kInvalidUsage, "fabric service: no job %016llx", static_cast<unsigned long long>(id));
  }
  if (it->second.token != token)
    return makeError(Code::kInvalidUsage, "fabric service: a wrong token for job %016llx: it is not released",
                     static_cast<unsigned long long>(id));
  jobs_.erase(it);
  return Status::ok();
}

std::vector<uint64_t> FabricBook::expire(int64_t nowMs) {
  for (auto it = health_.begin(); it != health_.end();) it = it->second.untilMs <= nowMs ? health_.erase(it) : ++it;
  std::vector<uint64_t> gone;
  for (auto it = jobs_.begin(); it != jobs_.end();) {
    if (it->second.leaseUntilMs <= nowMs) {
      gone.push_back(it->first);
      it = jobs_.erase(it);
    } else {
      ++it;
    }
  }
  return gone;
}

Status FabricBook::report(uint64_t id, uint64_t token, const wire::JobReport& r, int64_t nowMs, int64_t holdMs,
                          std::vector<int>* changed) {
  changed->clear();
  auto it = jobs_.find(id);
  if (it == jobs_.end())
    return makeError(Code::kInvalidUsage, "fabric service: no job %016llx", static_cast<unsigned long long>(id));
  BookedJob& j = it->second;
  if (j.token != token)
    return makeError(Code::kInvalidUsage, "fabric service: a wrong token for job %016llx",
                     static_cast<unsigned long long>(id));
  if (!r.lanes.empty()) {
    std::vector<PlannedConn> conns = j.plan.conns;
    for (const PlannedConn& u : r.lanes) {
      auto c = std::find_if(conns.begin(), conns.end(), [&](const PlannedConn& x) { return x.a == u.a && x.b == u.b; });
      if (c == conns.end())
        return makeError(Code::kInvalidArgument,
                         "fabric service: job %016llx reports lanes between ranks %d and %d, which its flows do not "
                         "connect",
                         static_cast<unsigned long long>(id), u.a, u.b);
      c->lanes = u.lanes;
    }
    Plan p;
    Status st = adoptPlan(j.input, conns, &p);
    if (!st.isOk())
      return makeError(Code::kInvalidArgument, "fabric service: job %016llx's lanes: %s",
                       static_cast<unsigned long long>(id), st.message().c_str());
    j.plan = std::move(p);
  }
  // Which fabric links the report condemns: those of its slow or broken lanes, less those of its
  // lanes that run near their connection's fastest (the narrowing C4D does inside a job).
  std::map<int, std::pair<double, bool>> bad;  // link: (the least capacity share seen, cut)
  std::vector<char> good(static_cast<size_t>(topo_.numLinks()), 0);
  std::vector<int> links;
  for (const wire::LaneSample& x : r.samples) {
    const PlannedConn* c = j.plan.find(x.a, x.b);
    if (c == nullptr || c->a != x.a || x.lane < 0 || x.lane >= static_cast<int>(c->lanes.size())) continue;
    const bool isGood = x.verdict == wire::LaneSample::Verdict::kOk && x.ratio >= kGoodRatio;
    const bool isBad = x.verdict != wire::LaneSample::Verdict::kOk;
    if (!isGood && !isBad) continue;
    laneLinks(j.input, *c, c->lanes[static_cast<size_t>(x.lane)], x.fromA, &links);
    for (int l : links) {
      if (!fabricLink(topo_, l)) continue;
      if (isGood) {
        good[static_cast<size_t>(l)] = 1;
        continue;
      }
      const bool cut = x.verdict == wire::LaneSample::Verdict::kFailed;
      const double share = cut ? kCutCapacity : std::min(0.5, std::max(0.05, x.ratio > 0 ? x.ratio : 0.25));
      auto [b, fresh] = bad.emplace(l, std::make_pair(share, cut));
      if (!fresh) b->second = {std::min(b->second.first, share), b->second.second || cut};
    }
  }
  for (const auto& [l, v] : bad) {
    if (good[static_cast<size_t>(l)]) continue;
    auto [h, fresh] = health_.emplace(l, LinkHealth{});
    LinkHealth& lh = h->second;
    const LinkHealth::State to =
        v.second || lh.state == LinkHealth::State::kCut ? LinkHealth::State::kCut : LinkHealth::State::kSlow;
    if (fresh || lh.state != to) {
      changed->push_back(l);
      lh.sinceMs = nowMs;
    }
    lh.capacity = fresh ? v.first : std::min(lh.capacity, v.first);
    lh.state = to;
    lh.untilMs = nowMs + holdMs;
    lh.by = j.spec.name;
  }
  return Status::ok();
}

std::vector<std::pair<size_t, int>> FabricBook::lanesOnBadLinks(const BookedJob& j) const {
  std::vector<std::pair<size_t, int>> out;
  std::vector<int> links;
  for (size_t ci = 0; ci < j.plan.conns.size(); ++ci) {
    const PlannedConn& c = j.plan.conns[ci];
    for (size_t i = 0; i < c.lanes.size(); ++i) {
      if (c.lanes[i].retired) continue;
      bool hit = false;
      for (int dir = 0; dir < 2 && !hit; ++dir) {
        if ((dir == 0 ? c.bytesAB : c.bytesBA) <= 0) continue;
        laneLinks(j.input, c, c.lanes[i], dir == 0, &links);
        for (int l : links) hit = hit || health_.count(l) > 0;
      }
      if (hit) out.emplace_back(ci, static_cast<int>(i));
    }
  }
  return out;
}

std::vector<uint64_t> FabricBook::planMoves(int64_t nowMs, const MovePolicy& policy) {
  std::vector<uint64_t> moved;
  const std::vector<double> cap = capacity();
  // 1. Off the links booked bad, whatever the rate limit: each lane to the best path avoiding them.
  if (!health_.empty()) {
    std::vector<char> avoid(static_cast<size_t>(topo_.numLinks()), 0);
    std::string names;
    for (const auto& [l, h] : health_) {
      avoid[static_cast<size_t>(l)] = 1;
      names += (names.empty() ? "" : ", ") + topo_.link(l).name + " (" + linkStateName(h.state) + ")";
    }
    for (auto& [id, j] : jobs_) {
      const std::vector<std::pair<size_t, int>> lanes = lanesOnBadLinks(j);
      if (lanes.empty()) continue;
      PlanInput in = j.input;
      in.background = load(id);
      in.capacity = cap;
      std::vector<wire::LaneMove> mv;
      for (const auto& [ci, lane] : lanes) {
        const int a = j.plan.conns[ci].a, b = j.plan.conns[ci].b;
        Plan trial = j.plan;
        bool found = false;
        LaneChoice lc;
        if (!replaceLane(in, &trial, a, b, lane, avoid, false, &found, &lc).isOk() || !found) continue;
        j.plan = std::move(trial);
        mv.push_back(wire::LaneMove{a, b, lane, lc});
      }
      if (mv.empty()) continue;
      j.moves.insert(j.moves.end(), mv.begin(), mv.end());
      j.moveWhy = "off " + names;
      j.movedMs = nowMs;
      moved.push_back(id);
    }
    if (!moved.empty()) return moved;
  }
  // 2. For a better fabric. The objective is lexicographic: the most loaded link first, then the
  // next, and so on. Re-planning one job on what the others leave changes the load of some links;
  // the links it does not change read the same either way, so the re-plan is better where the most
  // loaded of the links it changes reads less afterwards (by policy.minGain). Jobs tried: those on
  // the most loaded link and those on the most loaded switch-to-switch link (a host's port link may
  // be the bottleneck, which no move relieves, while the spines are unbalanced).
  const std::vector<double> sum = load();
  auto secs = [&](size_t l, double bytes) {
    return bytes * 8.0 / (topo_.link(static_cast<int>(l)).bps * (cap.empty() ? 1.0 : cap[l]));
  };
  int top = -1, topFabric = -1;
  double w1 = 0, w2 = 0;
  for (size_t l = 0; l < sum.size(); ++l) {
    const double x = secs(l, sum[l]);
    if (x > w1 * (1 + 1e-12)) w1 = x, top = static_cast<int>(l);
    if (fabricLink(topo_, static_cast<int>(l)) && x > w2 * (1 + 1e-12)) w2 = x, topFabric = static_cast<int>(l);
  }
  if (top < 0) return moved;
  std::vector<std::pair<double, uint64_t>> onIt;  // (its bytes there, id), most first
  for (const auto& [id, j] : jobs_) {
    const int64_t last = std::max(j.registeredMs, j.movedMs);
    if (nowMs - last < policy.minIntervalMs) continue;
    double b = 0;
    for (int l : {top, topFabric})
      if (l >= 0 && static_cast<size_t>(l) < j.plan.load.size()) b += j.plan.load[static_cast<size_t>(l)];
    if (b > 0) onIt.emplace_back(b, id);
  }
  std::stable_sort(onIt.begin(), onIt.end(), [](const auto& x, const auto& y) { return x.first > y.first; });
  if (onIt.size() > static_cast<size_t>(std::max(0, policy.maxJobsTried)))
    onIt.resize(static_cast<size_t>(std::max(0, policy.maxJobsTried)));
  uint64_t bestId = 0;
  double bestRatio = 1 - policy.minGain, was = 0, now = 0;
  int relieved = -1;
  Plan bestPlan;
  for (const auto& [bytes, id] : onIt) {
    const BookedJob& j = jobs_.at(id);
    PlanInput in = j.input;
    in.background = load(id);
    in.capacity = cap;
    Plan p;
    if (!makePlan(in, &p).isOk() || p.load.size() != sum.size() || j.plan.load.size() != sum.size()) continue;
    double mOld = 0, mNew = 0;
    int at = -1;
    for (size_t l = 0; l < sum.size(); ++l) {
      const double o = j.plan.load[l], n = p.load[l];
      if (std::abs(o - n) <= 1e-9 * std::max(o, n)) continue;
      const double before = secs(l, sum[l]), after = secs(l, std::max(0.0, sum[l] - o + n));
      if (before > mOld) mOld = before, at = static_cast<int>(l);
      mNew = std::max(mNew, after);
    }
    if (mOld > 0 && mNew < mOld * bestRatio) {
      bestRatio = mNew / mOld;
      bestId = id;
      bestPlan = std::move(p);
      was = mOld;
      now = mNew;
      relieved = at;
    }
  }
  if (bestId == 0) return moved;
  BookedJob& j = jobs_.at(bestId);
  // The lanes that change: per connection, the new plan's choices that the job does not already
  // run replace, in order, the live lanes the new plan does not keep.
  std::vector<wire::LaneMove> mv;
  for (const PlannedConn& nc : bestPlan.conns) {
    const PlannedConn* oc = j.plan.find(nc.a, nc.b);
    if (oc == nullptr) continue;
    std::vector<int> oldLive;
    for (size_t i = 0; i < oc->lanes.size(); ++i)
      if (!oc->lanes[i].retired) oldLive.push_back(static_cast<int>(i));
    std::vector<LaneChoice> fresh;
    for (const LaneChoice& l : nc.lanes) {
      auto same = std::find_if(oldLive.begin(), oldLive.end(),
                               [&](int i) { return sameRoute(oc->lanes[static_cast<size_t>(i)], l); });
      if (same != oldLive.end())
        oldLive.erase(same);
      else
        fresh.push_back(l);
    }
    for (size_t k = 0; k < fresh.size() && k < oldLive.size(); ++k)
      mv.push_back(wire::LaneMove{nc.a, nc.b, oldLive[k], fresh[k]});
  }
  for (const wire::LaneMove& m : mv)
    if (!moveLane(j.input, &j.plan, m.a, m.b, m.lane, m.choice).isOk()) return moved;
  if (mv.empty()) return moved;
  j.moves.insert(j.moves.end(), mv.begin(), mv.end());
  j.moveWhy = strFormat("the most loaded link the move changes, %s: %.3f ms -> %.3f ms",
                        topo_.link(relieved).name.c_str(), was * 1e3, now * 1e3);
  j.movedMs = nowMs;
  moved.push_back(bestId);
  return moved;
}

std::vector<wire::LaneMove> FabricBook::takeMoves(uint64_t id, std::string* why) {
  std::vector<wire::LaneMove> out;
  auto it = jobs_.find(id);
  if (it == jobs_.end()) return out;
  out.swap(it->second.moves);
  *why = it->second.moveWhy;
  return out;
}

std::string FabricBook::statusJson(int64_t nowMs) const {
  using json = nlohmann::json;
  json jobs = json::array();
  for (const auto& [id, j] : jobs_) {
    json lanes = json::array();
    for (const PlannedConn& c : j.plan.conns)
      for (size_t l = 0; l < c.lanes.size(); ++l) {
        if (c.lanes[l].retired) continue;
        lanes.push_back({{"a", c.a},
                         {"b", c.b},
                         {"lane", l},
                         {"path", lanePath(j.input, j.plan, c.a, c.b, static_cast<int>(l))},
                         {"sport", c.lanes[l].sourcePort}});
      }
    std::vector<std::string> hosts;
    for (const RankPlace& r : j.spec.ranks) {
      const std::string& h = topo_.host(r.host).name;
      if (std::find(hosts.begin(), hosts.end(), h) == hosts.end()) hosts.push_back(h);
    }
    json o = {{"id", strFormat("%016llx", static_cast<unsigned long long>(id))},
              {"name", j.spec.name},
              {"ranks", j.spec.ranks.size()},
              {"hosts", hosts},
              {"flows", j.spec.flows.size()},
              {"lanes_per_connection", j.spec.lanes},
              {"registered_ms", j.registeredMs},
              {"lease_left_ms", std::max<int64_t>(0, j.leaseUntilMs - nowMs)},
              {"solo_s", j.plan.maxLinkSeconds(topo_)},
              {"lanes", std::move(lanes)}};
    jobs.push_back(std::move(o));
  }
  const std::vector<double> sum = load();
  std::vector<int> order;
  for (int l = 0; l < topo_.numLinks(); ++l)
    if (sum[static_cast<size_t>(l)] > 0) order.push_back(l);
  auto secs = [&](int l) { return sum[static_cast<size_t>(l)] * 8.0 / topo_.link(l).bps; };
  std::stable_sort(order.begin(), order.end(), [&](int x, int y) { return secs(x) > secs(y); });
  json links = json::array();
  for (int l : order) {
    int jobsOn = 0;
    for (const auto& [id, j] : jobs_)
      jobsOn += l < static_cast<int>(j.plan.load.size()) && j.plan.load[static_cast<size_t>(l)] > 0;
    json o = {
        {"link", topo_.link(l).name}, {"bytes", sum[static_cast<size_t>(l)]}, {"seconds", secs(l)}, {"jobs", jobsOn}};
    auto h = health_.find(l);
    if (h != health_.end()) o["health"] = linkStateName(h->second.state);
    links.push_back(std::move(o));
  }
  json health = json::array();
  for (const auto& [l, h] : health_)
    health.push_back({{"link", topo_.link(l).name},
                      {"state", linkStateName(h.state)},
                      {"capacity", h.capacity},
                      {"since_ms_ago", std::max<int64_t>(0, nowMs - h.sinceMs)},
                      {"held_ms", std::max<int64_t>(0, h.untilMs - nowMs)},
                      {"by", h.by}});
  json o = {{"topology", topo_.source()},
            {"topo_hash", strFormat("%016llx", static_cast<unsigned long long>(topo_.hash()))},
            {"jobs", std::move(jobs)},
            {"links", std::move(links)},
            {"health", std::move(health)},
            {"fabric_s", fabricSeconds()},
            {"bottleneck", order.empty() ? "" : topo_.link(order.front()).name}};
  return o.dump();
}

}  // namespace c4::plan
