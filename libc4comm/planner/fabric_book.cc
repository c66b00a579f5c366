#include "planner/fabric_book.hpp"

#include <algorithm>
#include <nlohmann/json.hpp>
#include <utility>

#include "common/status.hpp"

namespace c4::plan {

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
  for (size_t l = 0; l < sum.size(); ++l) m = std::max(m, sum[l] * 8.0 / topo_.link(static_cast<int>(l)).bps);
  return m;
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
    Status st = makePlan(in, &j.plan);
    in.background.clear();
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
    links.push_back(
        {{"link", topo_.link(l).name}, {"bytes", sum[static_cast<size_t>(l)]}, {"seconds", secs(l)}, {"jobs", jobsOn}});
  }
  json o = {
      {"topology", topo_.source()},  {"topo_hash", strFormat("%016llx", static_cast<unsigned long long>(topo_.hash()))},
      {"jobs", std::move(jobs)},     {"links", std::move(links)},
      {"fabric_s", fabricSeconds()}, {"bottleneck", order.empty() ? "" : topo_.link(order.front()).name}};
  return o.dump();
}

}  // namespace c4::plan
