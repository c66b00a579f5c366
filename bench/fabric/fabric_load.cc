// c4-fabric-load: the fabric service under load (docs/performance.md "C4P fabric service"). Registers
// JOBS jobs one after the other with a running c4-fabricd on a generated fat-tree (the same
// --fat-tree as the service's), each a ring over RANKS random hosts (every port of each, one rank
// per host, LANES lanes per connection), timing each registration from request to plan; then
// renews each once and releases them all. Prints progress every 20 jobs, then the percentiles.
//   c4-fabric-load --service HOST:PORT --key-file FILE [--fat-tree K,HOSTS_PER_LEAF,PORTS[,GBIT]]
//                  [--jobs N] [--min-ranks N] [--max-ranks N] [--lanes N] [--seed N] [--keep]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "planner/fabric_client.hpp"
#include "planner/fabric_wire.hpp"
#include "planner/topology.hpp"

namespace {

using namespace c4;

double percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t i = std::min(v.size() - 1, static_cast<size_t>(p / 100.0 * static_cast<double>(v.size())));
  return v[i];
}

int usage() {
  fprintf(stderr,
          "usage: c4-fabric-load --service HOST:PORT --key-file FILE [--fat-tree K,HOSTS_PER_LEAF,PORTS[,GBIT]]\n"
          "                      [--jobs N] [--min-ranks N] [--max-ranks N] [--lanes N] [--seed N] [--keep]\n"
          "defaults: --fat-tree 16,8,8,100 (1024 hosts x 8 ports), 200 jobs of 8 to 64 ranks, 8 lanes\n");
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  std::string service, keyFile;
  std::string tree = "16,8,8,100";
  int jobs = 200, minRanks = 8, maxRanks = 64, lanes = 8;
  uint32_t seed = 1;
  bool keep = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&]() -> const char* { return i + 1 < argc ? argv[++i] : (exit(usage()), ""); };
    if (a == "--service")
      service = next();
    else if (a == "--key-file")
      keyFile = next();
    else if (a == "--fat-tree")
      tree = next();
    else if (a == "--jobs")
      jobs = atoi(next());
    else if (a == "--min-ranks")
      minRanks = atoi(next());
    else if (a == "--max-ranks")
      maxRanks = atoi(next());
    else if (a == "--lanes")
      lanes = atoi(next());
    else if (a == "--seed")
      seed = static_cast<uint32_t>(atoi(next()));
    else if (a == "--keep")
      keep = true;
    else
      return usage();
  }
  if (service.empty() || keyFile.empty() || minRanks < 2 || maxRanks < minRanks || jobs < 1) return usage();
  plan::Topology topo;
  Status tst = plan::Topology::fatTreeFromSpec(tree, &topo);
  if (!tst.isOk()) return fprintf(stderr, "c4-fabric-load: %s\n", tst.message().c_str()), 2;
  if (maxRanks > topo.numHosts()) return fprintf(stderr, "c4-fabric-load: --max-ranks above the hosts\n"), 2;
  plan::wire::Key key;
  Status st = plan::readKeyFile(keyFile, &key);
  if (!st.isOk()) return fprintf(stderr, "c4-fabric-load: %s\n", st.message().c_str()), 1;
  std::unique_ptr<plan::FabricClient> client;
  st = plan::FabricClient::connect(service, key, 10000, &client);
  if (!st.isOk()) return fprintf(stderr, "c4-fabric-load: %s\n", st.message().c_str()), 1;
  printf("fabric service %s: %d hosts x %zu ports, %d links; %d jobs of %d-%d ranks, %d lanes\n", service.c_str(),
         topo.numHosts(), topo.host(0).ports.size(), topo.numLinks(), jobs, minRanks, maxRanks, lanes);
  std::mt19937 rng(seed);
  std::vector<int> hosts(static_cast<size_t>(topo.numHosts()));
  for (int h = 0; h < topo.numHosts(); ++h) hosts[static_cast<size_t>(h)] = h;
  std::vector<double> regMs, renewMs;
  std::vector<std::pair<uint64_t, uint64_t>> booked;
  double fabricS = 0;
  size_t ranksTotal = 0;
  for (int j = 0; j < jobs; ++j) {
    const int n = minRanks + static_cast<int>(rng() % static_cast<uint32_t>(maxRanks - minRanks + 1));
    std::shuffle(hosts.begin(), hosts.end(), rng);
    plan::wire::Request req;
    req.op = plan::wire::Op::kRegister;
    req.leaseMs = 600000;
    plan::wire::JobSpec& spec = req.job;
    spec.name = "load job " + std::to_string(j);
    spec.topoHash = topo.hash();
    spec.lanes = lanes;
    spec.portSalt = static_cast<uint32_t>(j);
    for (int r = 0; r < n; ++r) {
      plan::RankPlace p;
      p.host = hosts[static_cast<size_t>(r)];
      for (int q = 0; q < static_cast<int>(topo.host(p.host).ports.size()); ++q) {
        p.ports.push_back(q);
        p.listenPorts.push_back(static_cast<uint16_t>(4000 + q));
      }
      spec.ranks.push_back(std::move(p));
    }
    // A ring AllReduce of 256 MiB: each rank sends its successor 2 (n-1)/n of it.
    const double bytes = 2.0 * (n - 1) / n * 256.0 * (1 << 20);
    for (int r = 0; r < n; ++r) spec.flows.push_back(plan::Flow{r, (r + 1) % n, bytes});
    ranksTotal += static_cast<size_t>(n);
    plan::wire::Reply rep;
    const auto t0 = std::chrono::steady_clock::now();
    st = client->call(req, &rep, 60000);
    const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    if (!st.isOk() || !rep.ok)
      return fprintf(stderr, "c4-fabric-load: job %d: %s\n", j, st.isOk() ? rep.error.c_str() : st.message().c_str()),
             1;
    regMs.push_back(ms);
    booked.emplace_back(rep.id, rep.token);
    fabricS = rep.fabricSeconds;
    if ((j + 1) % 20 == 0 || j + 1 == jobs)
      printf(
          "  %3d jobs (%zu ranks) booked: last %d ranks in %.1f ms, p99 so far %.1f ms; fabric's most loaded link "
          "%.1f ms\n",
          j + 1, ranksTotal, n, ms, percentile(regMs, 99), fabricS * 1e3);
    fflush(stdout);
  }
  for (const auto& [id, token] : booked) {
    plan::wire::Request req;
    req.op = plan::wire::Op::kRenew;
    req.id = id;
    req.token = token;
    plan::wire::Reply rep;
    const auto t0 = std::chrono::steady_clock::now();
    st = client->call(req, &rep, 60000);
    if (!st.isOk() || !rep.ok) return fprintf(stderr, "c4-fabric-load: renew failed\n"), 1;
    renewMs.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
  }
  printf("registration (request to plan): p50 %.2f ms, p90 %.2f ms, p99 %.2f ms, max %.2f ms over %d jobs\n",
         percentile(regMs, 50), percentile(regMs, 90), percentile(regMs, 99), percentile(regMs, 100), jobs);
  printf("renewal: p50 %.3f ms, p99 %.3f ms\n", percentile(renewMs, 50), percentile(renewMs, 99));
  if (!keep)
    for (const auto& [id, token] : booked) {
      plan::wire::Request req;
      req.op = plan::wire::Op::kRelease;
      req.id = id;
      req.token = token;
      plan::wire::Reply rep;
      st = client->call(req, &rep, 60000);
      if (!st.isOk() || !rep.ok) return fprintf(stderr, "c4-fabric-load: release failed\n"), 1;
    }
  return 0;
}
