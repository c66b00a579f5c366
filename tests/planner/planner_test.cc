// c4::plan::makePlan: c4p against the exhaustive optimum (small instances) and against the LP
// relaxation's bound (generated fat-trees), c4p against ECMP hashing, the 1024-host scale, the
// modes' port choices, steering ports, determinism and errors.
#include "planner/planner.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <map>
#include <random>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "lp_bound.hpp"
#include "planner/flows.hpp"
#include "planner/topology.hpp"
#include "planner_fixtures.hpp"

namespace {

using c4::plan::exhaustivePlan;
using c4::plan::Flow;
using c4::plan::HostPort;
using c4::plan::LaneChoice;
using c4::plan::makePlan;
using c4::plan::Mode;
using c4::plan::Plan;
using c4::plan::PlanInput;
using c4::plan::PortRange;
using c4::plan::RankPlace;
using c4::plan::Topology;
using c4test::onePerHost;
using c4test::ringFlows;
using c4test::shiftFlows;

constexpr double kMiB = 1024.0 * 1024.0;

PlanInput input(const Topology& t, std::vector<RankPlace> ranks, std::vector<Flow> flows, int lanes,
                Mode mode = Mode::kC4p) {
  PlanInput in;
  in.topo = &t;
  in.ranks = std::move(ranks);
  in.flows = std::move(flows);
  in.lanes = lanes;
  in.mode = mode;
  return in;
}

double fabricSecondsOf(const PlanInput& in, const Plan& p) { return c4::plan::fabricSeconds(in, p); }

double planSeconds(const PlanInput& in, Plan* out = nullptr) {
  Plan p;
  c4::Status st = makePlan(in, &p);
  EXPECT_TRUE(st.isOk()) << st.message();
  const double s = p.maxLinkSeconds(*in.topo);
  if (out != nullptr) *out = std::move(p);
  return s;
}

// Bytes each direction of every connection puts on the fabric must equal what the flows say:
// the sum over a host's port uplinks is the bytes its ranks send to other hosts.
void expectLoadConserved(const PlanInput& in, const Plan& p) {
  const Topology& t = *in.topo;
  std::map<int, double> out;
  for (const Flow& f : in.flows)
    if (in.ranks[static_cast<size_t>(f.src)].host != in.ranks[static_cast<size_t>(f.dst)].host && f.bytes > 0)
      out[in.ranks[static_cast<size_t>(f.src)].host] += f.bytes;
  for (int h = 0; h < t.numHosts(); ++h) {
    double up = 0;
    for (size_t q = 0; q < t.host(h).ports.size(); ++q)
      up += p.load[static_cast<size_t>(t.port(HostPort{h, static_cast<int>(q)}).up)];
    EXPECT_NEAR(up, out[h], 1e-6 * (1 + out[h])) << "host " << h;
  }
}

// c4p against the optimum by exhaustive search. Returns c4p / optimum.
double c4pOverOptimum(const char* name, const PlanInput& in) {
  Plan opt, c4p;
  const auto t0 = std::chrono::steady_clock::now();
  c4::Status st = exhaustivePlan(in, &opt);
  const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_TRUE(st.isOk()) << name << ": " << st.message();
  const double best = opt.maxLinkSeconds(*in.topo);
  const double got = planSeconds(in, &c4p);
  expectLoadConserved(in, opt);
  expectLoadConserved(in, c4p);
  EXPECT_GT(best, 0) << name;
  // The optimum is a lower bound on every plan: a c4p plan below it means exhaustivePlan missed one.
  EXPECT_GE(got, best * (1 - 1e-9)) << name;
  const double ratio = got / best;
  printf("[ exhaust  ] %-44s lanes %d: c4p %.4f ms, optimum %.4f ms, c4p/opt %.4f (search %.0f ms)\n", name, in.lanes,
         got * 1e3, best * 1e3, ratio, ms);
  return ratio;
}

// ---------------------------------------------------------------------------------------------
// 3. c4p against the exhaustive optimum.

// Flows of several schedules are summed per rank pair (C4P plans the AllReduce's and every schedule
// file's together): a pair in both gets both byte counts, new pairs are added in order.
TEST(PlannerTest, AddFlowsSumsPairsAndAppendsNewOnes) {
  std::vector<Flow> flows = {Flow{0, 1, 10}, Flow{1, 2, 20}};
  c4::plan::addFlows({Flow{1, 2, 5}, Flow{2, 0, 7}, Flow{1, 0, 1}, Flow{2, 0, 3}}, &flows);
  ASSERT_EQ(flows.size(), 4u);
  EXPECT_EQ(flows[0].src, 0);
  EXPECT_EQ(flows[0].bytes, 10);
  EXPECT_EQ(flows[1].bytes, 25);  // 1 -> 2 in both
  EXPECT_EQ(flows[2].src, 2);
  EXPECT_EQ(flows[2].dst, 0);
  EXPECT_EQ(flows[2].bytes, 10);  // 2 -> 0 twice in `more`
  EXPECT_EQ(flows[3].src, 1);     // 1 -> 0 is not 0 -> 1: directions are separate flows
  EXPECT_EQ(flows[3].dst, 0);
  c4::plan::addFlows({}, &flows);
  EXPECT_EQ(flows.size(), 4u);
}

TEST(PlannerTest, OptimalOnLeafSpineRing) {
  // 4 hosts x 2 ports, 2 leaves, 2 spines, all links 1 Gbit/s; ring 0->1->2->3->0 of 64 MiB.
  const Topology t = Topology::leafSpine(4, 2, 2, 2, 1e9, 1e9);
  for (int lanes : {1, 2}) {
    PlanInput in = input(t, onePerHost(t), ringFlows(4, 64 * kMiB), lanes);
    EXPECT_NEAR(c4pOverOptimum("leaf-spine 4x2 ring", in), 1.0, 1e-9) << "lanes " << lanes;
    // The fabric does not oversubscribe: the optimum is the host bound (64 MiB over 2 ports).
    Plan p;
    ASSERT_TRUE(makePlan(in, &p).isOk());
    EXPECT_NEAR(p.maxLinkSeconds(t), p.hostBoundSeconds(t, in) * (lanes == 1 ? 2 : 1), 1e-12);
  }
}

TEST(PlannerTest, OptimalOnThreeHostsOversubscribed) {
  // h0, h1 on leaf0, h2 on leaf1; 10 Gbit/s host ports, 2.5 Gbit/s uplinks: the spines bind.
  const Topology t = Topology::leafSpine(3, 2, 2, 2, 10e9, 2.5e9);
  ASSERT_EQ(t.sw(t.port(HostPort{1, 0}).leaf).name, "leaf0");
  ASSERT_EQ(t.sw(t.port(HostPort{2, 0}).leaf).name, "leaf1");
  std::vector<Flow> flows = ringFlows(3, 64 * kMiB);
  flows.push_back(Flow{2, 1, 16 * kMiB});
  for (int lanes : {1, 2, 3}) {
    PlanInput in = input(t, onePerHost(t), flows, lanes);
    EXPECT_NEAR(c4pOverOptimum("leaf-spine 3x2, uplinks 1/4", in), 1.0, 1e-9) << "lanes " << lanes;
  }
}

TEST(PlannerTest, OptimalOnUnevenCapacities) {
  // netlab's file with leaf0-spine1 at 400 Mbit/s and h3p1 at 250 Mbit/s.
  std::string text = c4test::replaceOnce(
      c4test::kNetlabTopo,
      "\"b\": \"spine1\", \"b_if\": \"l0\", \"b_netns\": \"nl-t-spine1\", \"rate_bps\": 1000000000}",
      "\"b\": \"spine1\", \"b_if\": \"l0\", \"b_netns\": \"nl-t-spine1\", \"rate_bps\": 400000000}");
  text = c4test::replaceOnce(text, "\"b_if\": \"h3p1\", \"b_netns\": \"nl-t-leaf1\", \"rate_bps\": 1000000000}",
                             "\"b_if\": \"h3p1\", \"b_netns\": \"nl-t-leaf1\", \"rate_bps\": 250000000}");
  Topology t;
  c4::Status st = Topology::parse(text, "uneven.json", &t);
  ASSERT_TRUE(st.isOk()) << st.message();
  ASSERT_DOUBLE_EQ(t.link(t.findLink("leaf0->spine1")).bps, 400e6);
  ASSERT_DOUBLE_EQ(t.link(t.port(HostPort{3, 1}).up).bps, 250e6);
  for (int lanes : {1, 2}) {
    PlanInput in = input(t, onePerHost(t), ringFlows(4, 64 * kMiB), lanes);
    EXPECT_NEAR(c4pOverOptimum("netlab 4x2, uneven links, ring", in), 1.0, 1e-9) << "lanes " << lanes;
  }
  // Two rings in opposite directions (both directions of every connection loaded).
  std::vector<Flow> both = ringFlows(4, 64 * kMiB);
  for (int i = 0; i < 4; ++i) both.push_back(Flow{(i + 1) % 4, i, 32 * kMiB});
  PlanInput in = input(t, onePerHost(t), both, 2);
  EXPECT_NEAR(c4pOverOptimum("netlab 4x2, uneven links, two rings", in), 1.0, 1e-9);
}

TEST(PlannerTest, OptimalWithTwoRanksPerHost) {
  // 2 hosts x 2 ports on two leaves, 2 spines; ranks 0, 1 on host 0 and ranks 2, 3 on host 1.
  const Topology t = Topology::leafSpine(2, 2, 2, 2, 1e9, 1e9);
  std::vector<Flow> flows;
  for (int i = 0; i < 4; ++i)
    for (int j = 0; j < 4; ++j)
      if (i != j) flows.push_back(Flow{i, j, (1 + i + 2 * j) * kMiB});
  // Each rank with its own port (a GPU's nearest NIC).
  std::vector<RankPlace> own = {{0, {0}, {}}, {0, {1}, {}}, {1, {0}, {}}, {1, {1}, {}}};
  for (int lanes : {1, 2, 3}) {
    PlanInput in = input(t, own, flows, lanes);
    EXPECT_NEAR(c4pOverOptimum("2 ranks/host, one port each", in), 1.0, 1e-9) << "lanes " << lanes;
  }
  // Both ranks of a host share both ports, listed in different orders.
  std::vector<RankPlace> shared = {{0, {0, 1}, {}}, {0, {1, 0}, {}}, {1, {0, 1}, {}}, {1, {1, 0}, {}}};
  PlanInput in = input(t, shared, flows, 1);
  EXPECT_NEAR(c4pOverOptimum("2 ranks/host, both ports each", in), 1.0, 1e-9);
  PlanInput in2 = input(t, shared, flows, 2);
  const double r2 = c4pOverOptimum("2 ranks/host, both ports each", in2);
  EXPECT_LE(r2, 1.0 + 1e-9);
}

TEST(PlannerTest, NearOptimalOnRandomTraffic) {
  // Random small instances (fixed seed; mt19937's raw output only, its distributions are not
  // portable): leaf-spines of 3-6 hosts x 1-2 ports, 2-3 leaves, 2-3 spines with random host and
  // uplink rates, and the netlab fabric with a random rate on every cable; random traffic (each
  // ordered pair with probability 1/3, 1-16 MiB); 1 or 2 lanes. Instances with more than 3e6
  // combinations are skipped.
  //
  // Measured gap: c4p's greedy + single-lane local search is exactly optimal on ~96% of these and
  // at most 1.29x the optimum over ~110k instances of this generator (other seeds; the worst ones
  // are local optima where no single lane can leave the bottleneck without making another link
  // as loaded: only a swap of two lanes helps). Hence the bound 1.30 on the worst, and at least
  // 90% exactly optimal.
  std::mt19937 rng(20240601);
  double worst = 1, sum = 0;
  int optimal = 0, ran = 0, skipped = 0;
  for (int it = 0; it < 600; ++it) {
    Topology t;
    std::string kind;
    if (it % 2 == 0) {
      const int hosts = 3 + static_cast<int>(rng() % 4), ports = 1 + static_cast<int>(rng() % 2);
      const int leaves = 2 + static_cast<int>(rng() % 2), spines = 2 + static_cast<int>(rng() % 2);
      const double hostBps = 1e9 * (1 + rng() % 4), upBps = 1e9 * (1 + rng() % 4);
      t = Topology::leafSpine(hosts, ports, leaves, spines, hostBps, upBps);
      kind = t.source();
    } else {
      c4::Status st = Topology::parse(c4test::netlabWithRates([&](int) { return 250e6 * (1 + rng() % 4); }),
                                      "netlab random rates", &t);
      ASSERT_TRUE(st.isOk()) << st.message();
      kind = "netlab 4x2 random rates";
    }
    const int n = t.numHosts();
    std::vector<Flow> flows;
    for (int i = 0; i < n; ++i)
      for (int j = 0; j < n; ++j)
        if (i != j && rng() % 3 == 0) flows.push_back(Flow{i, j, static_cast<double>(1 + rng() % 16) * kMiB});
    const int lanes = 1 + static_cast<int>(rng() % 2);
    if (flows.empty()) continue;
    PlanInput in = input(t, onePerHost(t), flows, lanes);
    Plan opt, c4p;
    if (!exhaustivePlan(in, &opt, 3000000).isOk()) {
      ++skipped;
      continue;
    }
    ASSERT_TRUE(makePlan(in, &c4p).isOk());
    const double best = opt.maxLinkSeconds(t), got = c4p.maxLinkSeconds(t);
    ASSERT_GT(best, 0);
    EXPECT_GE(got, best * (1 - 1e-9)) << "instance " << it << ": exhaustivePlan missed a better plan";
    const double r = got / best;
    if (r > 1 + 1e-9)
      printf("[ exhaust  ] instance %3d (%s, %zu flows, lanes %d): c4p/opt %.4f\n", it, kind.c_str(), flows.size(),
             lanes, r);
    EXPECT_LE(r, 1.30) << "instance " << it << " " << kind << "\n" << c4p.describe(in) << c4p.describeLoad(t, 4);
    worst = std::max(worst, r);
    sum += r;
    optimal += r <= 1 + 1e-9;
    ++ran;
  }
  printf(
      "[ exhaust  ] random traffic: %d instances (%d too large), %d optimal (%.1f%%), mean c4p/opt %.4f, worst %.4f\n",
      ran, skipped, optimal, 100.0 * optimal / ran, sum / ran, worst);
  EXPECT_GE(ran, 300);
  EXPECT_GE(optimal, ran * 9 / 10);
}

// Other jobs' bytes (PlanInput::background): a job planned alone takes the spine another job
// planned alone took (both see an empty fabric); planned on what the other leaves, it takes the
// other spine and both run as fast as alone.
TEST(PlannerTest, BackgroundPlacesAJobOnWhatTheOthersLeave) {
  const Topology t = Topology::leafSpine(4, 1, 2, 2, 1e9, 1e9);  // h0, h1 on leaf0; h2, h3 on leaf1
  auto job = [&](int x, int y) {
    std::vector<RankPlace> ranks(2);
    ranks[0].host = x;
    ranks[1].host = y;
    ranks[0].ports = ranks[1].ports = {0};
    return input(t, ranks, ringFlows(2, 16 * kMiB), 1);
  };
  PlanInput a = job(0, 2), b = job(1, 3);
  Plan pa, pbAlone, pb;
  ASSERT_TRUE(makePlan(a, &pa).isOk());
  ASSERT_TRUE(makePlan(b, &pbAlone).isOk());
  const double solo = pa.maxLinkSeconds(t);
  ASSERT_NEAR(pbAlone.maxLinkSeconds(t), solo, 1e-12);
  // Planned apart, they share a spine: the fabric's most loaded link carries both.
  b.background = pa.load;
  EXPECT_NEAR(fabricSecondsOf(b, pbAlone), 2 * solo, 1e-9) << "the jobs planned alone did not collide:\n"
                                                           << pa.describe(a) << pbAlone.describe(b);
  // Planned on A's load, B takes the other spine.
  ASSERT_TRUE(makePlan(b, &pb).isOk());
  EXPECT_NEAR(fabricSecondsOf(b, pb), solo, 1e-9) << pa.describe(a) << pb.describe(b);
  EXPECT_NE(c4::plan::lanePath(a, pa, 0, 1, 0), c4::plan::lanePath(b, pb, 0, 1, 0));
  EXPECT_NEAR(pb.maxLinkSeconds(t), solo, 1e-12);  // Plan::load is B's own
  expectLoadConserved(b, pb);
  // The optimum says the same.
  Plan opt;
  ASSERT_TRUE(exhaustivePlan(b, &opt).isOk());
  EXPECT_NEAR(fabricSecondsOf(b, opt), solo, 1e-9);
}

TEST(PlannerTest, BackgroundNearOptimalOnRandomTraffic) {
  // As NearOptimalOnRandomTraffic, on fabrics already carrying another job's bytes: a random job
  // planned by ECMP hashing (its load is the background). c4p against the exhaustive optimum of the
  // fabric's most loaded link, both counting the background.
  std::mt19937 rng(20261207);
  double worst = 1;
  int optimal = 0, ran = 0;
  for (int it = 0; it < 300; ++it) {
    const int hosts = 3 + static_cast<int>(rng() % 4), ports = 1 + static_cast<int>(rng() % 2);
    const int leaves = 2 + static_cast<int>(rng() % 2), spines = 2 + static_cast<int>(rng() % 2);
    const Topology t = Topology::leafSpine(hosts, ports, leaves, spines, 1e9 * (1 + rng() % 4), 1e9 * (1 + rng() % 4));
    auto randomFlows = [&] {
      std::vector<Flow> flows;
      for (int i = 0; i < hosts; ++i)
        for (int j = 0; j < hosts; ++j)
          if (i != j && rng() % 3 == 0) flows.push_back(Flow{i, j, static_cast<double>(1 + rng() % 16) * kMiB});
      return flows;
    };
    PlanInput other = input(t, onePerHost(t), randomFlows(), 1, Mode::kEcmp);
    other.seed = rng();
    Plan po;
    ASSERT_TRUE(makePlan(other, &po).isOk());
    const std::vector<Flow> flows = randomFlows();
    if (flows.empty()) continue;
    PlanInput in = input(t, onePerHost(t), flows, 1 + static_cast<int>(rng() % 2));
    in.background = po.load;
    Plan opt, c4p;
    if (!exhaustivePlan(in, &opt, 1000000).isOk()) continue;
    ASSERT_TRUE(makePlan(in, &c4p).isOk());
    expectLoadConserved(in, c4p);
    const double best = fabricSecondsOf(in, opt), got = fabricSecondsOf(in, c4p);
    ASSERT_GT(best, 0);
    EXPECT_GE(got, best * (1 - 1e-9)) << "instance " << it << ": exhaustivePlan missed a better plan";
    // Never below what the other job alone puts on its most loaded link.
    double floor = 0;
    for (size_t l = 0; l < po.load.size(); ++l)
      floor = std::max(floor, po.load[l] * 8.0 / t.link(static_cast<int>(l)).bps);
    EXPECT_GE(best, floor * (1 - 1e-9));
    const double r = got / best;
    EXPECT_LE(r, 1.30) << "instance " << it << "\n" << c4p.describe(in);
    worst = std::max(worst, r);
    optimal += r <= 1 + 1e-9;
    ++ran;
  }
  printf("[ exhaust  ] with background: %d instances, %d optimal, worst c4p/opt %.4f\n", ran, optimal, worst);
  EXPECT_GE(ran, 150);
  EXPECT_GE(optimal, ran * 9 / 10);
}

TEST(PlannerTest, BackgroundOfTheWrongShapeIsAnError) {
  const Topology t = Topology::leafSpine(4, 1, 2, 2, 1e9, 1e9);
  PlanInput in = input(t, onePerHost(t), ringFlows(4, kMiB), 1);
  Plan p;
  in.background.assign(static_cast<size_t>(t.numLinks()) - 1, 0.0);
  EXPECT_FALSE(makePlan(in, &p).isOk());
  in.background.assign(static_cast<size_t>(t.numLinks()), 0.0);
  in.background[3] = -1;
  EXPECT_FALSE(makePlan(in, &p).isOk());
  in.background[3] = NAN;
  EXPECT_FALSE(makePlan(in, &p).isOk());
  EXPECT_FALSE(exhaustivePlan(in, &p).isOk());
  in.background[3] = 0;
  EXPECT_TRUE(makePlan(in, &p).isOk());
}

// ---------------------------------------------------------------------------------------------
// 4. Balance on generated fabrics: c4p against the LP relaxation and against ECMP hashing.

struct Balance {
  double lp = 0, c4p = 0, ecmpBest = 0, ecmpWorst = 0;
};

Balance balance(const char* name, const Topology& t, const std::vector<Flow>& flows, int lanes) {
  Balance b;
  PlanInput in = input(t, onePerHost(t), flows, lanes);
  const auto t0 = std::chrono::steady_clock::now();
  const c4test::LpBound lp = c4test::lpLowerBound(in);
  const double lpMs = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_TRUE(lp.ok) << name << ": " << lp.error;
  b.lp = lp.seconds;
  Plan p;
  b.c4p = planSeconds(in, &p);
  expectLoadConserved(in, p);
  // The LP is a relaxation: no plan beats it, and it is at least the host ports' bound.
  EXPECT_GE(b.c4p, b.lp * (1 - 1e-6)) << name;
  EXPECT_GE(b.lp, p.hostBoundSeconds(t, in) * (1 - 1e-6)) << name;
  b.ecmpBest = INFINITY;
  for (uint64_t seed = 1; seed <= 5; ++seed) {
    PlanInput e = in;
    e.mode = Mode::kEcmp;
    e.seed = seed;
    const double s = planSeconds(e);
    b.ecmpBest = std::min(b.ecmpBest, s);
    b.ecmpWorst = std::max(b.ecmpWorst, s);
  }
  printf("[ balance  ] %-40s lanes %d: c4p/LP %.4f  ecmp/c4p %.2f-%.2f  (LP %.3f ms, %d vars, %.0f ms)\n", name, lanes,
         b.c4p / b.lp, b.ecmpBest / b.c4p, b.ecmpWorst / b.c4p, b.lp * 1e3, lp.vars, lpMs);
  // c4p is never worse than what hashing gives.
  EXPECT_LE(b.c4p, b.ecmpBest * (1 + 1e-9)) << name;
  return b;
}

// Measured c4p/LP on these instances: 1.0000 for every ring and every shift by n/2 except on 3
// spines, where a leaf pair's lanes (hosts per leaf x lanes: 8 or 16) cannot split evenly over 3
// spines: ceil(8/3)/(8/3) = ceil(16/3)/(16/3) = 1.125, the integral optimum (the LP splits bytes
// freely). Hence the bounds 1 (rings), 1.125 (shifts). ECMP (5 seeds) is 1.0-5.0x c4p.
TEST(PlannerTest, BalanceLeafSpineAgainstLp) {
  const double G = 1e9;
  struct Case {
    const char* name;
    Topology t;
  };
  std::vector<Case> cases = {
      {"leaf-spine 64x2, 8 leaves, 4 spines 1:1", Topology::leafSpine(64, 2, 8, 4, 100 * G, 400 * G)},
      {"leaf-spine 32x2, 4 leaves, 4 spines 2:1", Topology::leafSpine(32, 2, 4, 4, 100 * G, 100 * G)},
      {"leaf-spine 16x2, 4 leaves, 3 spines", Topology::leafSpine(16, 2, 4, 3, 100 * G, 100 * G)},
  };
  for (const Case& c : cases) {
    const int n = c.t.numHosts();
    for (int lanes : {2, 4}) {
      Balance ring = balance((std::string(c.name) + " ring").c_str(), c.t, ringFlows(n, 64 * kMiB), lanes);
      EXPECT_LE(ring.c4p / ring.lp, 1.0 + 1e-9) << c.name;
      Balance sh = balance((std::string(c.name) + " shift n/2").c_str(), c.t, shiftFlows(n, n / 2, 64 * kMiB), lanes);
      EXPECT_LE(sh.c4p / sh.lp, 1.125 + 1e-9) << c.name;
    }
  }
}

TEST(PlannerTest, BalanceFatTreeAgainstLp) {
  struct Case {
    const char* name;
    Topology t;
  };
  std::vector<Case> cases = {
      {"fat-tree k=4, 2 hosts/leaf x2", Topology::fatTree(4, 2, 2, 100e9)},
      {"fat-tree k=4, 1 host/leaf x2", Topology::fatTree(4, 1, 2, 100e9)},
      {"fat-tree k=8, 2 hosts/leaf x2", Topology::fatTree(8, 2, 2, 100e9)},
  };
  for (const Case& c : cases) {
    const int n = c.t.numHosts();
    for (int lanes : {2, 4}) {
      Balance ring = balance((std::string(c.name) + " ring").c_str(), c.t, ringFlows(n, 64 * kMiB), lanes);
      EXPECT_LE(ring.c4p / ring.lp, 1.0 + 1e-9) << c.name;
      // Every flow crosses the cores (k=8: pods 0-3 to 4-7): c4p matches the LP.
      Balance sh = balance((std::string(c.name) + " shift n/2").c_str(), c.t, shiftFlows(n, n / 2, 64 * kMiB), lanes);
      EXPECT_LE(sh.c4p / sh.lp, 1.0 + 1e-9) << c.name;
    }
  }
}

// Random permutations on non-blocking k=8 fat-trees: a known gap. GLPK's MIP (integral lanes per
// candidate; measured outside this test, seconds each) proves the integral optimum equal to the LP
// bound for 2x2 lanes 2 seeds 2 and 3 and 1x4 lanes 4 seeds 1-3, but c4p reaches 2x it: an exact plan is a bipartite
// edge colouring of the lanes over the aggregation switches, which needs long swap (Kempe) chains; the local search
// moves single lanes or chains of two and restarts from shuffled orders (that solved 1x4 lanes 4 seed 1). More lanes
// than ports leave slack (ratios 1.0-1.5). Hence only the bound 2 here, and c4p must still beat ECMP.
TEST(PlannerTest, BalanceFatTreeRandomPermutations) {
  struct Case {
    const char* name;
    Topology t;
    int lanes;
    double bound;
  };
  std::vector<Case> cases = {
      {"fat-tree k=8, 2 hosts/leaf x2", Topology::fatTree(8, 2, 2, 100e9), 2, 2.0},
      {"fat-tree k=8, 2 hosts/leaf x2", Topology::fatTree(8, 2, 2, 100e9), 4, 1.0},
      {"fat-tree k=8, 1 host/leaf x4", Topology::fatTree(8, 1, 4, 100e9), 4, 2.0},
      {"fat-tree k=8, 1 host/leaf x4", Topology::fatTree(8, 1, 4, 100e9), 8, 1.5},
      {"fat-tree k=4, 1 host/leaf x2", Topology::fatTree(4, 1, 2, 100e9), 2, 1.0},
  };
  for (const Case& c : cases) {
    const int n = c.t.numHosts();
    for (uint32_t seed : {1u, 2u, 3u}) {
      const std::vector<int> perm = c4test::randomPermutation(n, seed);
      std::vector<Flow> flows;
      for (int i = 0; i < n; ++i)
        if (perm[static_cast<size_t>(i)] != i) flows.push_back(Flow{i, perm[static_cast<size_t>(i)], 64 * kMiB});
      Balance b = balance((std::string(c.name) + " perm " + std::to_string(seed)).c_str(), c.t, flows, c.lanes);
      EXPECT_LE(b.c4p / b.lp, c.bound + 1e-9) << c.name << " lanes " << c.lanes << " seed " << seed;
    }
  }
}

// ---------------------------------------------------------------------------------------------
// 5. Scale.

TEST(PlannerTest, Scale1024HostsRing) {
  // 16 pods x 8 leaves x 8 hosts = 1024 hosts with 8 ports each; ring AllReduce, 8 lanes.
  const Topology t = Topology::fatTree(16, 8, 8, 100e9);
  ASSERT_EQ(t.numHosts(), 1024);
  PlanInput in = input(t, onePerHost(t), ringFlows(1024, 256 * kMiB), 8);
  Plan p;
  const auto t0 = std::chrono::steady_clock::now();
  c4::Status st = makePlan(in, &p);
  const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  ASSERT_TRUE(st.isOk()) << st.message();
  EXPECT_EQ(p.conns.size(), 1024u);
  const double got = p.maxLinkSeconds(t), bound = p.hostBoundSeconds(t, in);
  printf(
      "[ scale    ] fat-tree k=16, 1024 hosts x 8 ports, ring, 8 lanes: planned in %.0f ms; max link %.3f ms, "
      "host bound %.3f ms (ratio %.4f)\n",
      ms, got * 1e3, bound * 1e3, got / bound);
  // Each lane on its own port at both ends and the crossing lanes spread over distinct uplinks.
  EXPECT_NEAR(got, bound, 0.01 * bound) << p.describeLoad(t, 10);
  expectLoadConserved(in, p);
}

// ---------------------------------------------------------------------------------------------
// 6. Modes, steering, determinism, errors.

TEST(PlannerTest, OffAndEcmpUseLaneModPorts) {
  const Topology t = Topology::leafSpine(4, 3, 2, 2, 1e9, 1e9);
  // Rank 1 has two ports (in reverse order), the others three.
  std::vector<RankPlace> ranks = onePerHost(t);
  ranks[1].ports = {1, 0};
  for (Mode m : {Mode::kOff, Mode::kEcmp}) {
    PlanInput in = input(t, ranks, ringFlows(4, 8 * kMiB), 5, m);
    Plan p;
    ASSERT_TRUE(makePlan(in, &p).isOk());
    EXPECT_EQ(p.mode, m);
    ASSERT_EQ(p.conns.size(), 4u);
    for (const auto& c : p.conns) {
      ASSERT_EQ(c.lanes.size(), 5u);
      const size_t pa = in.ranks[static_cast<size_t>(c.a)].ports.size();
      const size_t pb = in.ranks[static_cast<size_t>(c.b)].ports.size();
      for (size_t l = 0; l < c.lanes.size(); ++l) {
        const LaneChoice& lc = c.lanes[l];
        EXPECT_EQ(lc.localPort, static_cast<int>(l % pa)) << modeName(m) << " conn " << c.a << "-" << c.b;
        EXPECT_EQ(lc.remotePort, static_cast<int>(l % pa % pb)) << modeName(m) << " conn " << c.a << "-" << c.b;
        const HostPort ha{in.ranks[static_cast<size_t>(c.a)].host,
                          in.ranks[static_cast<size_t>(c.a)].ports[static_cast<size_t>(lc.localPort)]};
        const HostPort hb{in.ranks[static_cast<size_t>(c.b)].host,
                          in.ranks[static_cast<size_t>(c.b)].ports[static_cast<size_t>(lc.remotePort)]};
        EXPECT_GE(lc.path, 0);
        EXPECT_LT(lc.path, t.numPaths(ha, hb));
        EXPECT_LT(lc.backPath, t.numPaths(hb, ha));
        if (m == Mode::kOff) {
          EXPECT_EQ(lc.sourcePort, 0);  // the kernel's
        } else {
          EXPECT_GE(lc.sourcePort, 32768);
          EXPECT_LE(lc.sourcePort, 60999);
        }
      }
    }
    expectLoadConserved(in, p);
  }
}

TEST(PlannerTest, EcmpSeedsAndDeterminism) {
  Topology t;
  ASSERT_TRUE(Topology::parse(c4test::kNetlabTopo, "netlab.json", &t).isOk());
  std::vector<RankPlace> ranks = onePerHost(t);
  for (RankPlace& r : ranks) r.listenPorts = {40000, 40001};
  PlanInput in = input(t, ranks, ringFlows(4, 8 * kMiB), 4, Mode::kEcmp);
  auto sports = [&](uint64_t seed) {
    PlanInput e = in;
    e.seed = seed;
    Plan p;
    EXPECT_TRUE(makePlan(e, &p).isOk());
    std::vector<std::tuple<int, int, int, int, int, int>> v;
    for (const auto& c : p.conns)
      for (const LaneChoice& l : c.lanes) {
        v.emplace_back(c.a, c.b, l.localPort, l.remotePort, l.path, l.sourcePort);
        // On a netlab fabric the hashed path is the match list's for those ports, both ways.
        const HostPort ha{c.a, l.localPort}, hb{c.b, l.remotePort};
        EXPECT_EQ(l.path, t.pathByPorts(ha, hb, l.sourcePort, static_cast<uint16_t>(40000 + l.remotePort)));
        EXPECT_EQ(l.backPath, t.pathByPorts(hb, ha, static_cast<uint16_t>(40000 + l.remotePort), l.sourcePort));
      }
    return v;
  };
  const auto s1 = sports(1), s1again = sports(1), s2 = sports(2);
  EXPECT_EQ(s1, s1again);
  EXPECT_NE(s1, s2);
  int differ = 0;
  for (size_t i = 0; i < s1.size(); ++i) differ += std::get<5>(s1[i]) != std::get<5>(s2[i]);
  EXPECT_GT(differ, static_cast<int>(s1.size()) / 2) << "seeds 1 and 2 drew mostly the same source ports";
}

TEST(PlannerTest, C4pIsDeterministic) {
  const Topology t = Topology::fatTree(4, 2, 2, 100e9);
  std::vector<Flow> flows = ringFlows(16, 64 * kMiB);
  for (Flow f : shiftFlows(16, 8, 16 * kMiB)) flows.push_back(f);
  PlanInput in = input(t, onePerHost(t), flows, 4);
  Plan a, b;
  ASSERT_TRUE(makePlan(in, &a).isOk());
  ASSERT_TRUE(makePlan(in, &b).isOk());
  ASSERT_EQ(a.conns.size(), b.conns.size());
  for (size_t i = 0; i < a.conns.size(); ++i) {
    ASSERT_EQ(a.conns[i].a, b.conns[i].a);
    ASSERT_EQ(a.conns[i].b, b.conns[i].b);
    ASSERT_EQ(a.conns[i].lanes.size(), b.conns[i].lanes.size());
    for (size_t l = 0; l < a.conns[i].lanes.size(); ++l) {
      const LaneChoice &x = a.conns[i].lanes[l], &y = b.conns[i].lanes[l];
      EXPECT_EQ(std::make_tuple(x.localPort, x.remotePort, x.path, x.backPath, x.sourcePort, x.sourceRange.lo,
                                x.sourceRange.hi),
                std::make_tuple(y.localPort, y.remotePort, y.path, y.backPath, y.sourcePort, y.sourceRange.lo,
                                y.sourceRange.hi));
    }
  }
  EXPECT_EQ(a.load, b.load);
  EXPECT_EQ(a.describe(in), b.describe(in));
}

// A listening port inside a steering range matches the rule before the reply's destination port
// does: the replies of a lane steered elsewhere take the listening port's spine, and the plan must
// book them there (LaneChoice::backPath), as ecmp's evaluation does.
TEST(PlannerTest, RepliesFromAListenPortInsideASteeringRange) {
  Topology t;
  ASSERT_TRUE(Topology::parse(c4test::kNetlabTopo, "netlab.json", &t).isOk());
  std::vector<RankPlace> ranks = onePerHost(t);
  for (RankPlace& r : ranks) r.listenPorts = {21000, 21001};  // spine0's steering range
  PlanInput in = input(t, ranks, ringFlows(4, 64 * kMiB), 2);
  Plan p;
  ASSERT_TRUE(makePlan(in, &p).isOk());
  int viaSpine1 = 0;
  for (const auto& c : p.conns)
    for (const LaneChoice& l : c.lanes) {
      const HostPort ha{ranks[static_cast<size_t>(c.a)].host,
                        ranks[static_cast<size_t>(c.a)].ports[static_cast<size_t>(l.localPort)]};
      const HostPort hb{ranks[static_cast<size_t>(c.b)].host,
                        ranks[static_cast<size_t>(c.b)].ports[static_cast<size_t>(l.remotePort)]};
      if (t.pathName(ha, hb, l.path) != "spine1") {
        EXPECT_EQ(l.backPath, -1);
        continue;
      }
      ++viaSpine1;
      ASSERT_GE(l.backPath, 0) << "replies of a lane via spine1 to listen port 2100x go via spine0";
      EXPECT_EQ(t.pathName(hb, ha, l.backPath), "spine0");
    }
  EXPECT_GT(viaSpine1, 0);
}

TEST(PlannerTest, SteeringPortsFollowTheRule) {
  Topology t;
  ASSERT_TRUE(Topology::parse(c4test::kNetlabTopo, "netlab.json", &t).isOk());
  std::vector<RankPlace> ranks = onePerHost(t);
  for (RankPlace& r : ranks) r.listenPorts = {40000, 40001};
  // Ring plus the shift by two: every host talks to both leaves; 4 lanes.
  std::vector<Flow> flows = ringFlows(4, 64 * kMiB);
  for (Flow f : shiftFlows(4, 2, 32 * kMiB)) flows.push_back(f);
  std::map<uint32_t, std::set<int>> bySalt;  // source ports used
  for (uint32_t salt : {0u, 777u}) {
    PlanInput in = input(t, ranks, flows, 4);
    in.portSalt = salt;
    Plan p;
    c4::Status st = makePlan(in, &p);
    ASSERT_TRUE(st.isOk()) << st.message();
    std::set<std::tuple<int, int, int>> used;  // (host, port, source port)
    int steered = 0;
    for (const auto& c : p.conns)
      for (const LaneChoice& l : c.lanes) {
        const HostPort ha{ranks[static_cast<size_t>(c.a)].host,
                          ranks[static_cast<size_t>(c.a)].ports[static_cast<size_t>(l.localPort)]};
        const HostPort hb{ranks[static_cast<size_t>(c.b)].host,
                          ranks[static_cast<size_t>(c.b)].ports[static_cast<size_t>(l.remotePort)]};
        const std::string spine = t.pathName(ha, hb, l.path);
        if (spine.empty()) {  // one leaf: nothing to steer
          EXPECT_EQ(l.sourcePort, 0);
          continue;
        }
        ++steered;
        const uint16_t lo = spine == "spine0" ? 20000 : 25000, hi = spine == "spine0" ? 24999 : 29999;
        EXPECT_GE(l.sourcePort, lo) << spine;
        EXPECT_LE(l.sourcePort, hi) << spine;
        EXPECT_EQ(l.sourceRange.lo, lo);
        EXPECT_EQ(l.sourceRange.hi, hi);
        // The fabric takes that port where the plan wants it, both ways (the replies by dport).
        const uint16_t dport = static_cast<uint16_t>(40000 + l.remotePort);
        EXPECT_EQ(t.pathByPorts(ha, hb, l.sourcePort, dport), l.path);
        EXPECT_EQ(t.pathName(hb, ha, t.pathByPorts(hb, ha, dport, l.sourcePort)), spine);
        EXPECT_TRUE(used.insert({ha.host, ha.port, l.sourcePort}).second)
            << "source port " << l.sourcePort << " twice on h" << ha.host << "p" << ha.port;
      }
    EXPECT_GE(steered, 8);
    for (const auto& u : used) bySalt[salt].insert(std::get<2>(u));
  }
  // Communicators of one job (different salts) steer with different ports.
  for (int port : bySalt[0]) EXPECT_EQ(bySalt[777].count(port), 0u) << "port " << port << " with both salts";
}

TEST(PlannerTest, SteeringSportModRail) {
  // Rail placement: c4p keeps a pair of ranks on one rail (no spine) when it can; ranks with one
  // port on different rails must cross a spine and get ports from that spine's two ranges.
  Topology t;
  ASSERT_TRUE(Topology::parse(c4test::kNetlabRailMod, "rail.json", &t).isOk());
  {
    PlanInput in = input(t, onePerHost(t), {Flow{0, 1, 64e6}, Flow{1, 0, 64e6}}, 6);
    Plan p;
    ASSERT_TRUE(makePlan(in, &p).isOk());
    for (const LaneChoice& l : p.conns[0].lanes) {
      EXPECT_EQ(l.localPort, l.remotePort);  // same rail
      EXPECT_EQ(l.sourcePort, 0);
    }
    EXPECT_NEAR(p.maxLinkSeconds(t), p.hostBoundSeconds(t, in), 1e-12);
  }
  std::vector<RankPlace> ranks = {{0, {0}, {40000}}, {1, {1}, {40000}}};
  for (uint32_t salt : {0u, 150u, 1000u}) {
    PlanInput in = input(t, ranks, {Flow{0, 1, 64e6}, Flow{1, 0, 32e6}}, 6);
    in.portSalt = salt;
    Plan p;
    c4::Status st = makePlan(in, &p);
    ASSERT_TRUE(st.isOk()) << st.message();
    std::map<std::string, int> perSpine;
    std::set<int> sports;
    for (const LaneChoice& l : p.conns[0].lanes) {
      const HostPort ha{0, 0}, hb{1, 1};
      const std::string sp = t.pathName(ha, hb, l.path);
      ++perSpine[sp];
      bool inRange = false;
      for (const PortRange& r : t.steeringRanges(ha, hb, l.path))
        inRange |= l.sourcePort >= r.lo && l.sourcePort <= r.hi && l.sourceRange.lo == r.lo && l.sourceRange.hi == r.hi;
      EXPECT_TRUE(inRange) << "salt " << salt << ": sport " << l.sourcePort << " for " << sp;
      EXPECT_EQ(t.pathByPorts(ha, hb, l.sourcePort, 40000), l.path) << "salt " << salt << " sport " << l.sourcePort;
      EXPECT_EQ(t.pathName(hb, ha, t.pathByPorts(hb, ha, 40000, l.sourcePort)), sp);
      EXPECT_TRUE(sports.insert(l.sourcePort).second) << "sport " << l.sourcePort << " twice";
    }
    // 6 equal lanes over 3 equal spines: two each.
    EXPECT_EQ(perSpine, (std::map<std::string, int>{{"spine0", 2}, {"spine1", 2}, {"spine2", 2}})) << p.describe(in);
  }
}

TEST(PlannerTest, SteeringRangeExhausted) {
  // A rule with 2 ports per spine: 3 lanes from one host port onto one spine cannot all be steered.
  std::string text =
      c4test::replaceOnce(c4test::kNetlabTopo, "{\"spine\": 0, \"sport_lo\": 20000, \"sport_hi\": 24999}",
                          "{\"spine\": 0, \"sport_lo\": 20000, \"sport_hi\": 20001}");
  text = c4test::replaceOnce(text, "{\"spine\": 1, \"sport_lo\": 25000, \"sport_hi\": 29999}",
                             "{\"spine\": 1, \"sport_lo\": 25000, \"sport_hi\": 25001}");
  Topology t;
  c4::Status st = Topology::parse(text, "narrow.json", &t);
  ASSERT_TRUE(st.isOk()) << st.message();
  std::vector<RankPlace> ranks = {{0, {0}, {}}, {2, {0}, {}}};
  PlanInput in = input(t, ranks, {Flow{0, 1, 64 * kMiB}}, 4);
  Plan p;
  ASSERT_TRUE(makePlan(in, &p).isOk());  // 2 + 2 ports: 4 lanes fit
  in.lanes = 5;
  st = makePlan(in, &p);
  ASSERT_FALSE(st.isOk());
  EXPECT_NE(st.message().find("h0 port p0"), std::string::npos) << st.message();
  EXPECT_NE(st.message().find("all taken"), std::string::npos) << st.message();
}

TEST(PlannerTest, RoceSourcePorts) {
  // RoCE v2 lanes (ibverbs) leave from UDP source ports 49152-65535 (their flow labels) and go to
  // port 4791: the planner steers them with the parts of the rule's ranges in that span only, and
  // the fabric's rule takes both directions (same source port, dport 4791) onto the planned spine.
  const std::string roce = c4test::replaceOnce(
      c4test::kNetlabTopo, "{\"spine\": 1, \"sport_lo\": 25000, \"sport_hi\": 29999}]",
      "{\"spine\": 1, \"sport_lo\": 25000, \"sport_hi\": 29999}, {\"spine\": 0, \"sport_lo\": 49152, "
      "\"sport_hi\": 50175}, {\"spine\": 1, \"sport_lo\": 50176, \"sport_hi\": 51199}]");
  Topology t;
  c4::Status st = Topology::parse(roce, "roce.json", &t);
  ASSERT_TRUE(st.isOk()) << st.message();
  std::vector<RankPlace> ranks = onePerHost(t);  // no listening ports: RoCE has none of its own
  std::vector<Flow> flows = ringFlows(4, 64 * kMiB);
  for (Flow f : shiftFlows(4, 2, 32 * kMiB)) flows.push_back(f);
  constexpr uint16_t kRoceDport = 4791;
  {
    PlanInput in = input(t, ranks, flows, 4);
    in.sourcePorts = PortRange{49152, 65535};
    Plan p;
    st = makePlan(in, &p);
    ASSERT_TRUE(st.isOk()) << st.message();
    std::set<std::tuple<int, int, int>> used;
    int steered = 0;
    for (const auto& c : p.conns)
      for (const LaneChoice& l : c.lanes) {
        const HostPort ha{ranks[static_cast<size_t>(c.a)].host,
                          ranks[static_cast<size_t>(c.a)].ports[static_cast<size_t>(l.localPort)]};
        const HostPort hb{ranks[static_cast<size_t>(c.b)].host,
                          ranks[static_cast<size_t>(c.b)].ports[static_cast<size_t>(l.remotePort)]};
        const std::string spine = t.pathName(ha, hb, l.path);
        if (spine.empty()) {
          EXPECT_EQ(l.sourcePort, 0);
          continue;
        }
        ++steered;
        const uint16_t lo = spine == "spine0" ? 49152 : 50176;
        EXPECT_GE(l.sourcePort, lo) << spine;
        EXPECT_LE(l.sourcePort, lo + 1023) << spine;
        EXPECT_EQ(l.sourceRange.lo, lo);
        EXPECT_EQ(l.sourceRange.hi, lo + 1023);
        EXPECT_EQ(l.backPath, -1);  // no listening port: the replies are not booked elsewhere
        EXPECT_EQ(t.pathByPorts(ha, hb, l.sourcePort, kRoceDport), l.path);
        EXPECT_EQ(t.pathName(hb, ha, t.pathByPorts(hb, ha, l.sourcePort, kRoceDport)), spine);
        EXPECT_TRUE(used.insert({ha.host, ha.port, l.sourcePort}).second) << "source port " << l.sourcePort;
      }
    EXPECT_GE(steered, 8);
  }
  {
    // Without a span, the same file steers with the first (TCP) ranges, as before.
    PlanInput in = input(t, ranks, flows, 4);
    Plan p;
    ASSERT_TRUE(makePlan(in, &p).isOk());
    for (const auto& c : p.conns)
      for (const LaneChoice& l : c.lanes) EXPECT_LT(l.sourcePort, 30000);
  }
  {
    // ecmp: random source ports of the span.
    PlanInput in = input(t, ranks, flows, 4, Mode::kEcmp);
    in.sourcePorts = PortRange{49152, 65535};
    Plan p;
    ASSERT_TRUE(makePlan(in, &p).isOk());
    for (const auto& c : p.conns)
      for (const LaneChoice& l : c.lanes) {
        EXPECT_GE(l.sourcePort, 49152);
        EXPECT_EQ(l.sourceRange.lo, 49152);
        EXPECT_EQ(l.sourceRange.hi, 65535);
      }
  }
  {
    // A fabric whose rule steers with TCP ports only cannot steer RoCE: a clear error.
    Topology tcpOnly;
    ASSERT_TRUE(Topology::parse(c4test::kNetlabTopo, "netlab.json", &tcpOnly).isOk());
    PlanInput in = input(tcpOnly, onePerHost(tcpOnly), flows, 2);
    in.sourcePorts = PortRange{49152, 65535};
    Plan p;
    st = makePlan(in, &p);
    ASSERT_FALSE(st.isOk());
    EXPECT_NE(st.message().find("with source ports 2"), std::string::npos) << st.message();
    EXPECT_NE(st.message().find("sends from 49152-65535"), std::string::npos) << st.message();
    EXPECT_NE(st.message().find("steering range"), std::string::npos) << st.message();
  }
}

TEST(PlannerTest, FindEitherOrder) {
  const Topology t = Topology::leafSpine(4, 2, 2, 2, 1e9, 1e9);
  std::vector<Flow> flows = {Flow{2, 0, 8 * kMiB}, Flow{3, 1, 4 * kMiB}, Flow{1, 3, 1 * kMiB}, Flow{0, 0, 9 * kMiB}};
  PlanInput in = input(t, onePerHost(t), flows, 2);
  for (Mode m : {Mode::kC4p, Mode::kEcmp, Mode::kOff}) {
    in.mode = m;
    Plan p;
    ASSERT_TRUE(makePlan(in, &p).isOk());
    ASSERT_EQ(p.conns.size(), 2u);
    const auto* c02 = p.find(0, 2);
    ASSERT_NE(c02, nullptr);
    EXPECT_EQ(c02, p.find(2, 0));
    EXPECT_EQ(c02->a, 0);
    EXPECT_EQ(c02->b, 2);
    EXPECT_DOUBLE_EQ(c02->bytesAB, 0);
    EXPECT_DOUBLE_EQ(c02->bytesBA, 8 * kMiB);
    const auto* c13 = p.find(3, 1);
    ASSERT_NE(c13, nullptr);
    EXPECT_EQ(c13, p.find(1, 3));
    EXPECT_DOUBLE_EQ(c13->bytesAB, 1 * kMiB);
    EXPECT_DOUBLE_EQ(c13->bytesBA, 4 * kMiB);
    EXPECT_EQ(p.find(0, 1), nullptr);
    EXPECT_EQ(p.find(0, 0), nullptr);
  }
  // No flows: no connections, nothing loaded.
  in.flows.clear();
  Plan empty;
  ASSERT_TRUE(makePlan(in, &empty).isOk());
  EXPECT_TRUE(empty.conns.empty());
  EXPECT_EQ(empty.maxLinkSeconds(t), 0);
  EXPECT_EQ(empty.bottleneck(t), -1);
}

TEST(PlannerTest, Errors) {
  const Topology t = Topology::leafSpine(4, 2, 2, 2, 1e9, 1e9);
  auto fails = [&](PlanInput in, const std::vector<std::string>& expect) {
    Plan p;
    c4::Status st = makePlan(in, &p);
    ASSERT_FALSE(st.isOk());
    for (const std::string& s : expect) EXPECT_NE(st.message().find(s), std::string::npos) << st.message();
    for (Mode m : {Mode::kEcmp, Mode::kOff}) {
      in.mode = m;
      EXPECT_FALSE(makePlan(in, &p).isOk()) << modeName(m);
    }
    in.mode = Mode::kC4p;
    EXPECT_FALSE(exhaustivePlan(in, &p).isOk());
  };
  PlanInput good = input(t, onePerHost(t), ringFlows(4, kMiB), 2);
  Plan p;
  ASSERT_TRUE(makePlan(good, &p).isOk());

  PlanInput in = good;
  in.ranks[2].host = -1;
  fails(in, {"rank 2", "no host"});
  in = good;
  in.ranks[3].host = 4;
  fails(in, {"rank 3", "no host"});
  in = good;
  in.ranks[1].ports.clear();
  fails(in, {"rank 1", "no NIC port"});
  in = good;
  in.ranks[1].ports = {0, 2};
  fails(in, {"rank 1", "port 2", "h1"});
  in = good;
  in.flows.push_back(Flow{1, 4, kMiB});
  fails(in, {"rank 1 to rank 4", "4 ranks"});
  in = good;
  in.flows.push_back(Flow{-1, 0, kMiB});
  fails(in, {"rank -1"});
  in = good;
  in.lanes = 0;
  fails(in, {"0 lanes"});
  in = good;
  in.topo = nullptr;
  fails(in, {"no topology"});

  // Too many combinations for the exhaustive search.
  Plan q;
  c4::Status st = exhaustivePlan(good, &q, 100);
  ASSERT_FALSE(st.isOk());
  EXPECT_NE(st.message().find("limit 100"), std::string::npos) << st.message();
}

TEST(PlannerTest, ModeNames) {
  Mode m = Mode::kOff;
  for (Mode x : {Mode::kOff, Mode::kEcmp, Mode::kC4p}) {
    ASSERT_TRUE(c4::plan::parseMode(c4::plan::modeName(x), &m));
    EXPECT_EQ(m, x);
  }
  EXPECT_STREQ(c4::plan::modeName(Mode::kC4p), "c4p");
  EXPECT_FALSE(c4::plan::parseMode("C4P", &m));
  EXPECT_FALSE(c4::plan::parseMode("", &m));
}

TEST(PlannerTest, DescribeAndLoad) {
  Topology t;
  ASSERT_TRUE(Topology::parse(c4test::kNetlabTopo, "netlab.json", &t).isOk());
  // Rank 0 on h0 -> rank 1 on h2 (other leaf), 2 lanes of 50 MB; rank 1 -> rank 0 10 MB.
  std::vector<RankPlace> ranks = {{0, {0, 1}, {}}, {2, {0, 1}, {}}};
  PlanInput in = input(t, ranks, {Flow{0, 1, 100e6}, Flow{1, 0, 20e6}}, 2);
  Plan p;
  ASSERT_TRUE(makePlan(in, &p).isOk());
  const std::string d = p.describe(in);
  EXPECT_NE(d.find("rank 0 <-> rank 1 lane 0: h0p"), std::string::npos) << d;
  EXPECT_NE(d.find("rank 0 <-> rank 1 lane 1: h0p"), std::string::npos) << d;
  EXPECT_NE(d.find(" -> h2p"), std::string::npos) << d;
  EXPECT_NE(d.find(" via spine"), std::string::npos) << d;
  EXPECT_NE(d.find("sport 2"), std::string::npos) << d;  // a steering port, 20000-29999
  EXPECT_NE(d.find("50.00 MB"), std::string::npos) << d;
  EXPECT_NE(d.find("10.00 MB"), std::string::npos) << d;
  EXPECT_EQ(std::count(d.begin(), d.end(), '\n'), 2);
  // The two lanes take different ports and spines: every loaded link carries one lane.
  const std::string l = p.describeLoad(t);
  EXPECT_EQ(std::count(l.begin(), l.end(), '\n'), 16) << l;  // 2 lanes x 4 links x 2 directions
  const std::string first = l.substr(0, l.find('\n'));
  EXPECT_NE(first.find("50.00 MB"), std::string::npos) << l;
  EXPECT_NE(first.find("400.00 ms"), std::string::npos) << l;
  EXPECT_NE(first.find("100%"), std::string::npos) << l;
  EXPECT_NE(l.find(" 20%"), std::string::npos) << l;  // the 10 MB direction
  const std::string two = p.describeLoad(t, 2);
  EXPECT_EQ(std::count(two.begin(), two.end(), '\n'), 2) << two;
  const int b = p.bottleneck(t);
  ASSERT_GE(b, 0);
  EXPECT_DOUBLE_EQ(p.maxLinkSeconds(t), 50e6 * 8 / 1e9);
  EXPECT_EQ(l.rfind(t.link(b).name, 0), 0u) << l;  // the bottleneck is the first line
  EXPECT_DOUBLE_EQ(p.hostBoundSeconds(t, in), 100e6 * 8 / 2e9);

  // The host bound counts what a host receives too, over the ports its ranks use: h2 receives
  // 2 x 64 MB over its port 1 only (rank 2 lists just that one).
  const Topology ls = Topology::leafSpine(4, 2, 2, 2, 1e9, 1e9);
  std::vector<RankPlace> r3 = {{0, {0, 1}, {}}, {1, {0, 1}, {}}, {2, {1}, {}}};
  PlanInput fanIn = input(ls, r3, {Flow{0, 2, 64e6}, Flow{1, 2, 64e6}}, 2);
  Plan q;
  ASSERT_TRUE(makePlan(fanIn, &q).isOk());
  EXPECT_DOUBLE_EQ(q.hostBoundSeconds(ls, fanIn), 128e6 * 8 / 1e9);
  EXPECT_DOUBLE_EQ(q.maxLinkSeconds(ls), 128e6 * 8 / 1e9);
  EXPECT_EQ(ls.link(q.bottleneck(ls)).name, "leaf1->h2p1");
}

}  // namespace

// Failover and rebalancing (core/lane_planner.cc) re-plan one lane: a retired lane carries nothing,
// its replacement avoids the links marked, and a spare path is one no other lane loads.
TEST(PlannerTest, ReplaceLaneAvoidsTheFailedLinks) {
  Topology t;
  ASSERT_TRUE(Topology::parse(c4test::kNetlabTopo, "netlab.json", &t).isOk());
  PlanInput in = input(t, onePerHost(t), ringFlows(4, 64 * kMiB), 2);
  Plan p;
  ASSERT_TRUE(makePlan(in, &p).isOk());
  // Ring 0 -> 1 -> 2 -> 3 -> 0 with hosts 0, 1 on leaf0: connection (1, 2) crosses the spines, one
  // lane on each.
  const c4::plan::PlannedConn* c = p.find(1, 2);
  ASSERT_NE(c, nullptr);
  ASSERT_EQ(c->lanes.size(), 2u);
  int viaSpine1 = -1;
  for (int i = 0; i < 2; ++i)
    if (lanePath(in, p, 1, 2, i).find("spine1") != std::string::npos) viaSpine1 = i;
  ASSERT_GE(viaSpine1, 0) << p.describe(in);
  const std::string path = lanePath(in, p, 1, 2, viaSpine1);
  EXPECT_NE(path.find(" -> leaf0 -> spine1 -> leaf1 -> "), std::string::npos) << path;
  EXPECT_EQ(path.rfind("h1p", 0), 0u) << path;

  std::vector<char> avoid;
  markLaneLinks(in, p, 1, 2, viaSpine1, &avoid);
  ASSERT_EQ(avoid.size(), static_cast<size_t>(t.numLinks()));
  for (const char* name : {"leaf0->spine1", "spine1->leaf1", "leaf1->spine1", "spine1->leaf0"})
    EXPECT_TRUE(avoid[static_cast<size_t>(t.findLink(name))]) << name;
  EXPECT_FALSE(avoid[static_cast<size_t>(t.findLink("leaf0->spine0"))]);
  EXPECT_FALSE(avoid[static_cast<size_t>(t.findLink("h1p0->leaf0"))]) << "host ports are not the fabric's";

  // No spare path: the other spine carries the connection's other lane.
  Plan trial = p;
  bool found = true;
  LaneChoice lc;
  ASSERT_TRUE(replaceLane(in, &trial, 1, 2, viaSpine1, avoid, true, &found, &lc).isOk());
  EXPECT_FALSE(found);
  EXPECT_TRUE(trial.find(1, 2)->lanes[static_cast<size_t>(viaSpine1)].retired);

  // Failover: the replacement goes through spine0 and the retired lane carries nothing.
  const double before = p.load[static_cast<size_t>(t.findLink("leaf0->spine1"))];
  EXPECT_GT(before, 0);
  ASSERT_TRUE(replaceLane(in, &p, 1, 2, viaSpine1, avoid, false, &found, &lc).isOk());
  ASSERT_TRUE(found);
  c = p.find(1, 2);
  ASSERT_EQ(c->lanes.size(), 3u);
  EXPECT_TRUE(c->lanes[static_cast<size_t>(viaSpine1)].retired);
  EXPECT_NE(lanePath(in, p, 1, 2, 2).find("spine0"), std::string::npos) << lanePath(in, p, 1, 2, 2);
  EXPECT_GE(lc.sourcePort, 20000);
  EXPECT_LE(lc.sourcePort, 24999);  // spine0's steering range
  EXPECT_EQ(p.load[static_cast<size_t>(t.findLink("leaf0->spine1"))], 0.0) << p.describeLoad(t);
  // The connection's bytes now ride its two live lanes, both through spine0.
  EXPECT_DOUBLE_EQ(p.load[static_cast<size_t>(t.findLink("leaf0->spine0"))], c->bytesAB);

  // Errors.
  EXPECT_FALSE(replaceLane(in, &p, 0, 2, 0, avoid, false, &found, &lc).isOk()) << "no such connection";
  EXPECT_FALSE(replaceLane(in, &p, 1, 2, 7, avoid, false, &found, &lc).isOk()) << "no such lane";
}
