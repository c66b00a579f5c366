// c4-plan: C4P's plan for a fabric before a job runs (docs/c4p.md). Reads a topology (the JSON that
// tools/netlab writes, or a generated leaf-spine / fat-tree), places ranks host by host, takes the
// flows of one collective's schedules, and prints the c4p plan (flow -> lanes -> links), the per-link
// load, and what ECMP hashing (random source ports) gives over several seeds. With --service, what
// the fabric service (c4-fabricd) holds: its jobs, their lanes' paths, the per-link load.
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "planner/fabric_client.hpp"
#include "planner/flows.hpp"
#include "planner/planner.hpp"
#include "planner/topology.hpp"

namespace {

using namespace c4;

void usage() {
  fprintf(
      stderr,
      "usage: c4-plan TOPO.json | --leaf-spine H,P,L,S[,GBIT] | --fat-tree K,HOSTS_PER_LEAF,P[,GBIT]\n"
      "         [-C allreduce|allgather|reducescatter|broadcast|alltoall] [-A ring|tree|rhd|direct|hier]\n"
      "         [-b BYTES] [--ranks-per-host R] [--ports N] [--lanes L] [--seeds S] [--links N] [--roce] [--quiet]\n"
      "Places R ranks on every host in order (rank r on host r / R), each using the first N ports of its\n"
      "host (default: all), L lanes per connection (default: the ports); prints the c4p plan and link\n"
      "load, then ECMP (random source ports) over S seeds (default 10). Sizes take K, M, G suffixes.\n"
      "--roce: the lanes are RoCE v2 queue pairs (ibverbs), steered with source ports 49152-65535.\n"
      "   or: c4-plan --service HOST:PORT --key-file FILE [--json] [--links N]\n"
      "The fabric service's view (c4-fabricd): every job, its lanes' paths, the most loaded links;\n"
      "--json: the service's answer as it is.\n");
}

size_t parseSize(const char* s) {
  char* end = nullptr;
  double v = strtod(s, &end);
  switch (end != nullptr ? *end : 0) {
    case 'K':
    case 'k':
      v *= 1024;
      break;
    case 'M':
    case 'm':
      v *= 1024 * 1024;
      break;
    case 'G':
    case 'g':
      v *= 1024.0 * 1024 * 1024;
      break;
    default:
      break;
  }
  return static_cast<size_t>(v);
}

std::vector<double> numbers(const char* s) {
  std::vector<double> out;
  for (const char* p = s; *p;) {
    char* end = nullptr;
    out.push_back(strtod(p, &end));
    if (end == p) break;
    p = *end == ',' ? end + 1 : end;
  }
  return out;
}

bool parseColl(const std::string& s, Coll* out) {
  const struct {
    const char* name;
    Coll coll;
  } kColls[] = {
      {"allreduce", Coll::kAllReduce}, {"allgather", Coll::kAllGather}, {"reducescatter", Coll::kReduceScatter},
      {"broadcast", Coll::kBroadcast}, {"reduce", Coll::kReduce},       {"alltoall", Coll::kAlltoAll}};
  for (const auto& c : kColls)
    if (s == c.name) {
      *out = c.coll;
      return true;
    }
  return false;
}

}  // namespace

// c4-plan --service: asks the fabric service for its view and prints it.
int showService(const std::string& addr, const std::string& keyFile, bool asJson, int links) {
  plan::wire::Key key;
  Status st = plan::readKeyFile(keyFile, &key);
  if (!st.isOk()) return fprintf(stderr, "c4-plan: %s\n", st.message().c_str()), 1;
  std::unique_ptr<plan::FabricClient> client;
  st = plan::FabricClient::connect(addr, key, 5000, &client);
  plan::wire::Reply rep;
  if (st.isOk()) {
    plan::wire::Request req;
    req.op = plan::wire::Op::kStatus;
    st = client->call(req, &rep, 10000);
  }
  if (!st.isOk()) return fprintf(stderr, "c4-plan: %s\n", st.message().c_str()), 1;
  if (!rep.ok) return fprintf(stderr, "c4-plan: the fabric service %s: %s\n", addr.c_str(), rep.error.c_str()), 1;
  if (asJson) return printf("%s\n", rep.status.c_str()), 0;
  const nlohmann::json v = nlohmann::json::parse(rep.status, nullptr, false);
  if (v.is_discarded() || !v.is_object()) return fprintf(stderr, "c4-plan: the service's view is not JSON\n"), 1;
  const auto& jobs = v.value("jobs", nlohmann::json::array());
  printf("fabric service %s: %s (topology %s), %zu job(s); most loaded link %s, %.2f ms\n", addr.c_str(),
         v.value("topology", std::string("?")).c_str(), v.value("topo_hash", std::string("?")).c_str(), jobs.size(),
         v.value("bottleneck", std::string("none")).c_str(), v.value("fabric_s", 0.0) * 1e3);
  for (const auto& j : jobs) {
    std::string hosts;
    for (const auto& h : j.value("hosts", nlohmann::json::array()))
      hosts += (hosts.empty() ? "" : ",") + h.get<std::string>();
    printf("\njob %s  %s\n  %d ranks on %s, %d lane(s) per connection, lease %.1f s left, alone %.2f ms\n",
           j.value("id", std::string("?")).c_str(), j.value("name", std::string()).c_str(), j.value("ranks", 0),
           hosts.c_str(), j.value("lanes_per_connection", 0), j.value("lease_left_ms", 0) / 1e3,
           j.value("solo_s", 0.0) * 1e3);
    for (const auto& l : j.value("lanes", nlohmann::json::array()))
      printf("  rank %d - rank %d lane %d: %s\n", l.value("a", 0), l.value("b", 0), l.value("lane", 0),
             l.value("path", std::string()).c_str());
  }
  const auto& load = v.value("links", nlohmann::json::array());
  printf("\nlink load, most loaded first (every job):\n");
  int shown = 0;
  for (const auto& l : load) {
    if (shown++ >= links) break;
    printf("  %-28s %10.2f MB %9.2f ms  %d job(s)\n", l.value("link", std::string()).c_str(),
           l.value("bytes", 0.0) / 1e6, l.value("seconds", 0.0) * 1e3, l.value("jobs", 0));
  }
  if (load.empty()) printf("  (none)\n");
  const auto& health = v.value("health", nlohmann::json::array());
  printf("\nlink health the service believes (from the jobs' lanes):\n");
  for (const auto& h : health)
    printf("  %-28s %s, planned at %.0f%% of its capacity, since %.1f s, %.1f s more; found by %s\n",
           h.value("link", std::string()).c_str(), h.value("state", std::string()).c_str(),
           h.value("capacity", 1.0) * 100, h.value("since_ms_ago", 0) / 1e3, h.value("held_ms", 0) / 1e3,
           h.value("by", std::string()).c_str());
  if (health.empty()) printf("  every link well\n");
  return 0;
}

int main(int argc, char** argv) {
  std::string file, algoName = "ring", collName = "allreduce";
  std::vector<double> leafSpine;
  std::string fatTree;
  size_t bytes = 64u << 20;
  int ranksPerHost = 1, ports = 0, lanes = 0, seeds = 10, links = 12;
  bool quiet = false, roce = false, asJson = false;
  std::string service, keyFile;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto next = [&]() -> const char* {
      if (i + 1 >= argc) {
        usage();
        exit(2);
      }
      return argv[++i];
    };
    if (a == "-h" || a == "--help") return usage(), 0;
    if (a == "--leaf-spine")
      leafSpine = numbers(next());
    else if (a == "--fat-tree")
      fatTree = next();
    else if (a == "-C")
      collName = next();
    else if (a == "-A")
      algoName = next();
    else if (a == "-b")
      bytes = parseSize(next());
    else if (a == "--ranks-per-host")
      ranksPerHost = atoi(next());
    else if (a == "--ports")
      ports = atoi(next());
    else if (a == "--lanes")
      lanes = atoi(next());
    else if (a == "--seeds")
      seeds = atoi(next());
    else if (a == "--links")
      links = atoi(next());
    else if (a == "--quiet")
      quiet = true;
    else if (a == "--roce")
      roce = true;
    else if (a == "--service")
      service = next();
    else if (a == "--key-file")
      keyFile = next();
    else if (a == "--json")
      asJson = true;
    else if (!a.empty() && a[0] != '-' && file.empty())
      file = a;
    else
      return usage(), 2;
  }
  if (!service.empty()) {
    if (keyFile.empty()) return fprintf(stderr, "c4-plan: --service needs --key-file (the service's key)\n"), 2;
    return showService(service, keyFile, asJson, links);
  }
  plan::Topology topo;
  if (!file.empty()) {
    Status st = plan::Topology::load(file, &topo);
    if (!st.isOk()) return fprintf(stderr, "c4-plan: %s\n", st.toString().c_str()), 1;
  } else if (leafSpine.size() >= 4) {
    const double bps = (leafSpine.size() > 4 ? leafSpine[4] : 1) * 1e9;
    topo = plan::Topology::leafSpine(static_cast<int>(leafSpine[0]), static_cast<int>(leafSpine[1]),
                                     static_cast<int>(leafSpine[2]), static_cast<int>(leafSpine[3]), bps, bps);
  } else if (!fatTree.empty()) {
    Status st = plan::Topology::fatTreeFromSpec(fatTree, &topo);
    if (!st.isOk()) return fprintf(stderr, "c4-plan: %s\n", st.message().c_str()), 2;
  } else {
    return usage(), 2;
  }
  Coll coll;
  sched::Algo algo;
  if (!parseColl(collName, &coll)) return fprintf(stderr, "c4-plan: unknown collective %s\n", collName.c_str()), 2;
  if (!sched::parseAlgo(algoName, &algo))
    return fprintf(stderr, "c4-plan: unknown algorithm %s\n", algoName.c_str()), 2;
  if (ranksPerHost < 1) return fprintf(stderr, "c4-plan: --ranks-per-host must be >= 1\n"), 2;

  plan::PlanInput in;
  in.topo = &topo;
  std::vector<int32_t> hostOf;
  int maxPorts = 0;
  for (int h = 0; h < topo.numHosts(); ++h) {
    const int np = static_cast<int>(topo.host(h).ports.size());
    const int use = ports > 0 ? std::min(ports, np) : np;
    maxPorts = std::max(maxPorts, use);
    for (int r = 0; r < ranksPerHost; ++r) {
      plan::RankPlace p;
      p.host = h;
      for (int q = 0; q < use; ++q) p.ports.push_back(q);
      in.ranks.push_back(p);
      hostOf.push_back(h);
    }
  }
  in.lanes = lanes > 0 ? lanes : maxPorts;
  if (roce) in.sourcePorts = plan::PortRange{49152, 65535};
  const int n = static_cast<int>(in.ranks.size());
  sched::Algo used = algo;
  Status st = plan::scheduleFlows(algo, coll, n, bytes, hostOf, &in.flows, &used);
  if (!st.isOk()) return fprintf(stderr, "c4-plan: %s\n", st.toString().c_str()), 1;
  printf("c4-plan: %s; %d hosts, %d ranks, %d lane(s) per connection; %s %s of %zu B (%zu flows)\n",
         topo.source().c_str(), topo.numHosts(), n, in.lanes, sched::algoName(used), collName.c_str(), bytes,
         in.flows.size());

  plan::Plan c4p;
  in.mode = plan::Mode::kC4p;
  const auto t0 = std::chrono::steady_clock::now();
  st = plan::makePlan(in, &c4p);
  const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  if (!st.isOk()) return fprintf(stderr, "c4-plan: %s\n", st.toString().c_str()), 1;
  const double ideal = c4p.hostBoundSeconds(topo, in);
  auto ratio = [&](const plan::Plan& p) {
    const double s = p.maxLinkSeconds(topo);
    return s > 0 ? ideal / s : 1.0;
  };
  printf("\n== c4p (planned in %.1f ms): most loaded link %.2f ms, host-port bound %.2f ms: %.2f x ideal\n", ms,
         c4p.maxLinkSeconds(topo) * 1e3, ideal * 1e3, ratio(c4p));
  if (!quiet) printf("%s", c4p.describe(in).c_str());
  printf("-- link load (most loaded first):\n%s", c4p.describeLoad(topo, links).c_str());

  printf("\n== ecmp (random source ports, the fabric's hash) over %d seed(s):\n", seeds);
  double sum = 0, worst = INFINITY;
  for (int s = 1; s <= seeds; ++s) {
    plan::Plan e;
    in.mode = plan::Mode::kEcmp;
    in.seed = static_cast<uint64_t>(s);
    st = plan::makePlan(in, &e);
    if (!st.isOk()) return fprintf(stderr, "c4-plan: %s\n", st.toString().c_str()), 1;
    const double r = ratio(e);
    const int b = e.bottleneck(topo);
    printf("seed %2d: most loaded link %-20s %.2f ms: %.2f x ideal\n", s, b < 0 ? "-" : topo.link(b).name.c_str(),
           e.maxLinkSeconds(topo) * 1e3, r);
    sum += r;
    worst = std::min(worst, r);
  }
  if (seeds > 0)
    printf("ecmp: mean %.2f, worst %.2f x ideal; c4p %.2f (c4p / ecmp worst %.2f)\n", sum / seeds, worst, ratio(c4p),
           ratio(c4p) / worst);
  return 0;
}
