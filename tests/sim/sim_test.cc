// c4-sim (tools/c4-sim, docs/c4-sim.md): predicted times checked against hand-computed alpha-beta
// values, contention on shared links, oversubscribed uplinks, C4P against ECMP, schedule files,
// and the command line's errors.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "planner/topology.hpp"
#include "sched/schedule.hpp"
#include "sim/sim_cli.hpp"
#include "sim/sim_model.hpp"

namespace c4::sim {
namespace {

using sched::BufId;
using sched::Step;
using sched::StepKind;

Step send(int peer, size_t bytes, std::vector<int32_t> deps = {}) {
  Step s;
  s.kind = StepKind::kSend;
  s.peer = peer;
  s.src = sched::Span{BufId::kInput, 0, bytes};
  s.deps = std::move(deps);
  return s;
}

Step recv(int peer, size_t bytes, std::vector<int32_t> deps = {}) {
  Step s;
  s.kind = StepKind::kRecv;
  s.peer = peer;
  s.dst = sched::Span{BufId::kOutput, 0, bytes};
  s.deps = std::move(deps);
  return s;
}

Program program(std::vector<Step> steps) {
  sched::Schedule s;
  s.steps = std::move(steps);
  return compile(s);
}

CostModel model(double alpha) {
  CostModel m;
  m.alpha = alpha;
  m.alphaIntra = alpha / 2;
  return m;
}

SimResult run(const plan::Topology& t, const std::vector<int>& hostOf, const std::vector<Program>& progs,
              const CostModel& m, plan::Mode mode = plan::Mode::kC4p, int lanes = 1, uint64_t seed = 1) {
  Fabric f;
  Status st = Fabric::build(t, hostOf, mode, lanes, seed, flowsOf(progs), &f);
  EXPECT_TRUE(st.isOk()) << st.toString();
  SimResult r;
  st = simulate(progs, f, m, &r);
  EXPECT_TRUE(st.isOk()) << st.toString();
  return r;
}

// Every rank's schedule of one collective from the built-in generators.
std::vector<Program> generated(sched::Algo algo, Coll coll, int n, size_t count, size_t chunkBytes,
                               const std::vector<int>& hostOf = {}) {
  std::vector<Program> progs;
  sched::CollArgs a;
  a.coll = coll;
  a.nranks = n;
  a.count = count;
  a.reduces = coll == Coll::kAllReduce || coll == Coll::kReduceScatter || coll == Coll::kReduce;
  a.chunkBytes = chunkBytes;
  a.aliased = false;
  for (int h : hostOf) a.hostOf.push_back(h);
  for (int r = 0; r < n; ++r) {
    a.rank = r;
    Result<sched::Schedule> s = sched::generate(algo, a);
    EXPECT_TRUE(s.isOk()) << s.status().toString();
    progs.push_back(compile(s.value()));
  }
  return progs;
}

std::vector<int> oneRankPerHost(int n) {
  std::vector<int> h;
  for (int r = 0; r < n; ++r) h.push_back(r);
  return h;
}

constexpr double kGbit = 1e9;

TEST(Sim, OneMessageCostsAlphaPlusBytesOverBandwidth) {
  const plan::Topology t = plan::Topology::flat({1, 1}, 10 * kGbit);
  const size_t bytes = 3 << 20;
  const double alpha = 7e-6;
  const SimResult r = run(t, {0, 1}, {program({send(1, bytes)}), program({recv(0, bytes)})}, model(alpha));
  const double expect = alpha + bytes / (10 * kGbit / 8);
  EXPECT_NEAR(r.seconds, expect, expect * 1e-12);
  EXPECT_EQ(r.messages, 1u);
  EXPECT_EQ(r.interBytes, static_cast<double>(bytes));
  // Both of the path's links carried it, all the time but alpha.
  ASSERT_GE(r.busiestLink, 0);
  EXPECT_NEAR(r.busiestUtil, (expect - alpha) / expect, 1e-9);
}

TEST(Sim, OneMessageWithinAHostCostsAlphaIntraPlusBytesOverIntraBandwidth) {
  const plan::Topology t = plan::Topology::flat({1}, 10 * kGbit);
  const size_t bytes = 1 << 20;
  CostModel m = model(4e-6);
  m.intraBytesPerSec = 20e9;
  const SimResult r = run(t, {0, 0}, {program({send(1, bytes)}), program({recv(0, bytes)})}, m);
  const double expect = m.alphaIntra + bytes / 20e9;
  EXPECT_NEAR(r.seconds, expect, expect * 1e-12);
  EXPECT_EQ(r.intraBytes, static_cast<double>(bytes));
  EXPECT_EQ(r.busiestLink, -1);  // no fabric link carried anything
}

TEST(Sim, TwoFlowsSharingALinkTakeTwiceAsLongAndDisjointOnesDoNotInterfere) {
  // Hosts 0, 1 on leaf0 and 2, 3 on leaf1, one spine: 0->2 and 1->3 share leaf0->spine0 and
  // spine0->leaf1; 0->1 and 2->3 stay on their leaves.
  const plan::Topology t = plan::Topology::leafSpine(4, 1, 2, 1, 100 * kGbit, 100 * kGbit);
  const size_t bytes = 8 << 20;
  const double alpha = 2e-6, beta = bytes / (100 * kGbit / 8);
  const std::vector<int> hosts = oneRankPerHost(4);
  const SimResult one =
      run(t, hosts, {program({send(2, bytes)}), program({}), program({recv(0, bytes)}), program({})}, model(alpha));
  EXPECT_NEAR(one.seconds, alpha + beta, 1e-12);
  const SimResult two =
      run(t, hosts,
          {program({send(2, bytes)}), program({send(3, bytes)}), program({recv(0, bytes)}), program({recv(1, bytes)})},
          model(alpha));
  EXPECT_NEAR(two.seconds, alpha + 2 * beta, 1e-12);
  EXPECT_NEAR(two.seconds - alpha, 2 * (one.seconds - alpha), 1e-12);
  ASSERT_GE(two.busiestLink, 0);
  EXPECT_GE(t.link(two.busiestLink).from, 0);  // a switch-to-switch link
  EXPECT_GE(t.link(two.busiestLink).to, 0);
  const SimResult disjoint =
      run(t, hosts,
          {program({send(1, bytes)}), program({recv(0, bytes)}), program({send(3, bytes)}), program({recv(2, bytes)})},
          model(alpha));
  EXPECT_NEAR(disjoint.seconds, alpha + beta, 1e-12);
}

TEST(Sim, LinkEfficiencyScalesTheRateBySharesAndByLinkRate) {
  // Hosts 0, 1 on leaf0 and 2, 3 on leaf1, one spine; host links 100 Gbit/s, uplinks 25.
  const plan::Topology t = plan::Topology::leafSpine(4, 1, 2, 1, 100 * kGbit, 25 * kGbit);
  const size_t bytes = 8 << 20;
  const double up = bytes / (25 * kGbit / 8), host = bytes / (100 * kGbit / 8);
  const std::vector<int> hosts = oneRankPerHost(4);
  const std::vector<Program> one = {program({send(2, bytes)}), program({}), program({recv(0, bytes)}), program({})};
  const std::vector<Program> two = {program({send(2, bytes)}), program({send(3, bytes)}), program({recv(0, bytes)}),
                                    program({recv(1, bytes)})};
  const std::vector<Program> local = {program({send(1, bytes)}), program({recv(0, bytes)}), program({}), program({})};
  CostModel m = model(0);
  LinkEfficiency uplinks;
  uplinks.bps = 25 * kGbit;
  uplinks.byShares = {0.8, 0.5};  // one transfer 80%, two 50% together
  m.efficiency = {uplinks};
  EXPECT_NEAR(run(t, hosts, one, m).seconds, up / 0.8, 1e-12);
  EXPECT_NEAR(run(t, hosts, two, m).seconds, 2 * up / 0.5, 1e-12);
  EXPECT_NEAR(run(t, hosts, local, m).seconds, host, 1e-12);  // host links have no entry: nominal
  LinkEfficiency others;
  others.byShares = {0.9};
  m.efficiency.push_back(others);  // every other link: 90% (the host links bind only in `local`)
  EXPECT_NEAR(run(t, hosts, local, m).seconds, host / 0.9, 1e-12);
  EXPECT_NEAR(run(t, hosts, one, m).seconds, up / 0.8, 1e-12);
  // Between the measured share counts the curve is geometric in log2(shares); past the last, flat.
  LinkEfficiency e;
  e.byShares = {0.9, 0.8, 0.6};
  EXPECT_DOUBLE_EQ(e.at(1), 0.9);
  EXPECT_DOUBLE_EQ(e.at(2), 0.8);
  EXPECT_NEAR(e.at(3), std::pow(0.8, 1 - std::log2(1.5)) * std::pow(0.6, std::log2(1.5)), 1e-12);
  EXPECT_DOUBLE_EQ(e.at(4), 0.6);
  EXPECT_DOUBLE_EQ(e.at(64), 0.6);
  EXPECT_DOUBLE_EQ(LinkEfficiency().at(3), 1.0);
  // The option: rates with units, fractions in (0, 1], one entry per rate.
  Options o;
  ASSERT_TRUE(
      parseOptions({"--gen", "flat:2", "--link-efficiency", "100mbit:0.86,0.81,0.76", "--link-efficiency", "0.95"}, &o)
          .isOk());
  ASSERT_EQ(o.model.efficiency.size(), 2u);
  EXPECT_EQ(o.model.efficiency[0].bps, 100e6);
  EXPECT_EQ(o.model.efficiency[0].byShares, (std::vector<double>{0.86, 0.81, 0.76}));
  EXPECT_EQ(o.model.efficiency[1].bps, 0);
  EXPECT_EQ(rateLabel(100e6), "100mbit");
  EXPECT_EQ(rateLabel(25e9), "25gbit");
  for (const char* bad : {"100:0.9", "100mbit:", "0", "1.5", "fastgbit:0.9", "0.9,x"}) {
    const Status st = parseOptions({"--gen", "flat:2", "--link-efficiency", bad}, &o);
    EXPECT_FALSE(st.isOk()) << bad;
    EXPECT_NE(st.message().find("--link-efficiency"), std::string::npos) << st.message();
  }
  const Status dup =
      parseOptions({"--gen", "flat:2", "--link-efficiency", "1gbit:0.9", "--link-efficiency", "1gbit:0.8"}, &o);
  EXPECT_NE(dup.message().find("repeats a rate"), std::string::npos) << dup.message();
}

TEST(Sim, MaxMinFairSharingGivesUnusedCapacityToTheUnconstrainedFlow) {
  // A 0->3, B 1->3, C 2->3 share host 3's down link: a third each. D 2->1 shares host 2's up link
  // with C only, so it takes the two thirds C leaves (an equal split of that link would give it a
  // half). A, B, C (1 MB) end at 3 ms, D has moved 2 of its 3 MB by then and then runs alone at the
  // full rate: 4 ms.
  const plan::Topology t = plan::Topology::flat({1, 1, 1, 1}, 8 * kGbit);  // 1 GB/s links
  const size_t mb = 1000000;
  const std::vector<Program> progs = {program({send(3, mb)}), program({send(3, mb), recv(2, 3 * mb)}),
                                      program({send(3, mb), send(1, 3 * mb)}),
                                      program({recv(0, mb), recv(1, mb), recv(2, mb)})};
  const SimResult r = run(t, oneRankPerHost(4), progs, model(0));
  EXPECT_NEAR(r.seconds, 4e-3, 1e-12);
}

TEST(Sim, RingAllGatherOnOneSwitchMatchesTheAlphaBetaFormula) {
  const int n = 8;
  const double alpha = 5e-6, bw = 100 * kGbit / 8;
  const size_t block = 1 << 20;  // bytes each rank contributes
  const plan::Topology t = plan::Topology::flat(std::vector<int>(n, 1), 100 * kGbit);
  // Unpipelined (chunk >= block): n-1 hops, each alpha + block / bw.
  {
    const auto progs = generated(sched::Algo::kRing, Coll::kAllGather, n, block / 4, block);
    const SimResult r = run(t, oneRankPerHost(n), progs, model(alpha));
    const double expect = (n - 1) * (alpha + block / bw);
    EXPECT_NEAR(r.seconds, expect, expect * 1e-9);
    EXPECT_EQ(r.messages, static_cast<size_t>(n * (n - 1)));
  }
  // Pipelined in P pieces of tau = block / P / bw: each lane streams its (n-1) P pieces back to
  // back once alpha <= (P-1) tau (a piece's next hop is ready before the lane frees), so only the
  // first alpha shows: alpha + (n-1) block / bw.
  {
    const int pieces = 4;
    ASSERT_LE(alpha, (pieces - 1) * (block / pieces / bw));
    const auto progs = generated(sched::Algo::kRing, Coll::kAllGather, n, block / 4, block / pieces);
    const SimResult r = run(t, oneRankPerHost(n), progs, model(alpha));
    const double expect = alpha + (n - 1) * block / bw;
    EXPECT_NEAR(r.seconds, expect, expect * 1e-9);
    EXPECT_EQ(r.messages, static_cast<size_t>(n * (n - 1) * pieces));
  }
}

TEST(Sim, OversubscribedUplinksSlowTheRingAndAreItsBottleneck) {
  // 8 hosts on 2 leaves, 1 spine: the ring crosses each leaf's uplink once per direction.
  const int n = 8;
  const auto progs = generated(sched::Algo::kRing, Coll::kAllReduce, n, (16 << 20) / 4, 1 << 20);
  double prev = 0;
  for (double up : {100.0, 50.0, 25.0, 10.0, 5.0}) {
    const plan::Topology t = plan::Topology::leafSpine(n, 1, 2, 1, 100 * kGbit, up * kGbit);
    const SimResult r = run(t, oneRankPerHost(n), progs, model(5e-6));
    if (up < 100) {
      EXPECT_GT(r.seconds, prev * 1.05) << "uplinks at " << up << " Gbit/s";
      ASSERT_GE(r.busiestLink, 0);
      const plan::Link& l = t.link(r.busiestLink);
      EXPECT_TRUE(l.from >= 0 && l.to >= 0) << "the busiest link is " << l.name << ", not a leaf-spine link";
      EXPECT_GT(r.busiestUtil, 0.9) << l.name;
    }
    prev = r.seconds;
  }
}

TEST(Sim, C4pPlanIsNoSlowerThanEcmpWhereHashingCollides) {
  // Two ports per host, two lanes per connection, two spines (docs/c4p.md's example): ECMP puts
  // both lanes of a cross-leaf connection on one spine for most seeds; c4p spreads them.
  const int n = 4;
  const plan::Topology t = plan::Topology::leafSpine(n, 2, 2, 2, 100 * kGbit, 100 * kGbit);
  const auto progs = generated(sched::Algo::kRing, Coll::kAllReduce, n, (64 << 20) / 4, 1 << 20);
  const SimResult c4p = run(t, oneRankPerHost(n), progs, model(5e-6), plan::Mode::kC4p, 2);
  int slower = 0;
  for (uint64_t seed = 1; seed <= 6; ++seed) {
    const SimResult e = run(t, oneRankPerHost(n), progs, model(5e-6), plan::Mode::kEcmp, 2, seed);
    EXPECT_LE(c4p.seconds, e.seconds * (1 + 1e-9)) << "seed " << seed;
    slower += e.seconds > c4p.seconds * 1.2;
  }
  EXPECT_GT(slower, 0) << "no ECMP seed collided";
  // c4p reaches the host ports' rate: 2 x 100 Gbit/s, 2 (n-1)/n of the buffer per rank.
  const double ideal = 2.0 * (n - 1) / n * (64 << 20) / (200 * kGbit / 8);
  EXPECT_LT(c4p.seconds, ideal * 1.1);
}

TEST(Sim, LanesStripePiecesRoundRobin) {
  // Two ports, two lanes on disjoint paths: a message of 3 pieces puts 2 on lane 0 and 1 on lane 1
  // (time: 2 pieces); the next message starts on lane 1 and balances it.
  const plan::Topology t = plan::Topology::flat({2, 2}, 8 * kGbit);  // 1 GB/s per port
  CostModel m = model(0);
  m.pieceBytes = 1000000;
  const SimResult one =
      run(t, {0, 1}, {program({send(1, 3000000)}), program({recv(0, 3000000)})}, m, plan::Mode::kC4p, 2);
  EXPECT_NEAR(one.seconds, 2e-3, 1e-12);
  const SimResult two =
      run(t, {0, 1}, {program({send(1, 3000000), send(1, 3000000)}), program({recv(0, 3000000), recv(0, 3000000)})}, m,
          plan::Mode::kC4p, 2);
  EXPECT_NEAR(two.seconds, 3e-3, 1e-12);
  m.pieceBytes = 0;  // equal shares
  const SimResult eq =
      run(t, {0, 1}, {program({send(1, 3000000)}), program({recv(0, 3000000)})}, m, plan::Mode::kC4p, 2);
  EXPECT_NEAR(eq.seconds, 1.5e-3, 1e-12);
}

TEST(Sim, LocalStepsCostBytesOverMemoryBandwidthOneAtATime) {
  const plan::Topology t = plan::Topology::flat({1}, kGbit);
  CostModel m = model(0);
  m.memBytesPerSec = 1e9;
  Step c1;
  c1.kind = StepKind::kCopy;
  c1.src = sched::Span{BufId::kInput, 0, 1000};
  c1.dst = sched::Span{BufId::kOutput, 0, 1000};
  Step c2 = c1;  // independent of c1, but the rank copies one at a time
  c2.dst.offset = 1000;
  Step self = c1;  // onto itself: free
  self.dst = self.src;
  const SimResult r = run(t, {0}, {program({c1, c2, self})}, m);
  EXPECT_NEAR(r.seconds, 2e-6, 1e-15);
}

TEST(Sim, ScheduleErrorsAreReported) {
  const plan::Topology t = plan::Topology::flat({1, 1}, kGbit);
  auto fails = [&](const std::vector<Program>& progs, const std::string& what) {
    Fabric f;
    ASSERT_TRUE(Fabric::build(t, {0, 1}, plan::Mode::kOff, 1, 1, flowsOf(progs), &f).isOk());
    SimResult r;
    const Status st = simulate(progs, f, model(1e-6), &r);
    EXPECT_FALSE(st.isOk());
    EXPECT_NE(st.message().find(what), std::string::npos) << st.message();
  };
  fails({program({send(1, 100)}), program({})}, "unmatched");
  fails({program({send(1, 100)}), program({recv(0, 200)})}, "size mismatch");
  fails({program({recv(1, 100), send(1, 100, {0})}), program({recv(0, 100), send(0, 100, {0})})}, "deadlock");
  fails({program({send(0, 100)}), program({})}, "peer 0 invalid");
}

TEST(Sim, BusBandwidthOfALargeRingAllReduceApproachesTheLinkRate) {
  Options o;
  ASSERT_TRUE(parseOptions({"--gen", "flat:4", "--bytes", "64M", "--alpha-us", "2"}, &o).isOk());
  plan::Topology t;
  ASSERT_TRUE(makeTopology(o, &t).isOk());
  Study s;
  Status st = runStudy(o, t, &s, nullptr);
  ASSERT_TRUE(st.isOk()) << st.toString();
  ASSERT_EQ(s.rows.size(), 1u);
  EXPECT_EQ(s.rows[0].algo, "ring");
  EXPECT_LE(s.rows[0].busbw, 12.5);
  EXPECT_GT(s.rows[0].busbw, 12.5 * 0.95);
  EXPECT_NEAR(s.rows[0].algbw * 2 * 3 / 4, s.rows[0].busbw, 1e-9);
}

TEST(Sim, StudyComparesEveryAlgorithmAndWritesJson) {
  Options o;
  ASSERT_TRUE(parseOptions({"--gen", "leafspine:8,1,2,2", "--ranks-per-host", "2", "--algo", "all", "--bytes", "64K,4M",
                            "--planner", "ecmp"},
                           &o)
                  .isOk());
  plan::Topology t;
  ASSERT_TRUE(makeTopology(o, &t).isOk());
  Study s;
  Status st = runStudy(o, t, &s, nullptr);
  ASSERT_TRUE(st.isOk()) << st.toString();
  EXPECT_EQ(s.ranks, 16);
  EXPECT_EQ(s.rows.size(), 2u * sched::kNumAlgos);  // every built-in algorithm has an allreduce
  for (const Row& r : s.rows) {
    EXPECT_GT(r.sim.seconds, 0) << r.algo;
    EXPECT_GT(r.sim.intraBytes, 0) << r.algo;  // two ranks per host
  }
  const std::string table = formatTable(o, s);
  EXPECT_NE(table.find("hier"), std::string::npos);
  EXPECT_NE(table.find(" *"), std::string::npos);  // the fastest of each size
  const nlohmann::json j = nlohmann::json::parse(formatJson(o, s));
  EXPECT_EQ(j["results"].size(), s.rows.size());
  EXPECT_EQ(j["collective"], "allreduce");
  EXPECT_GT(j["results"][0]["seconds"].get<double>(), 0);

  // Allgather: tree and hier have no schedule; --algo all skips them.
  ASSERT_TRUE(parseOptions({"--gen", "flat:4", "--algo", "all", "--coll", "allgather", "--bytes", "1M"}, &o).isOk());
  ASSERT_TRUE(makeTopology(o, &t).isOk());
  ASSERT_TRUE(runStudy(o, t, &s, nullptr).isOk());
  EXPECT_FALSE(s.skipped.empty());
  for (const Row& r : s.rows) {
    sched::Algo a;
    ASSERT_TRUE(sched::parseAlgo(r.algo, &a)) << r.algo;
    EXPECT_TRUE(sched::supports(a, Coll::kAllGather, 4)) << r.algo;
  }
}

TEST(Sim, BadInputIsRefusedClearly) {
  Options o;
  auto err = [&](std::vector<std::string> args, const std::string& what) {
    const Status st = parseOptions(args, &o);
    EXPECT_FALSE(st.isOk());
    EXPECT_EQ(st.code(), Code::kInvalidArgument);
    EXPECT_NE(st.message().find(what), std::string::npos) << st.message();
  };
  err({"--gen", "flat:4", "--algo", "bogus"}, "unknown algorithm 'bogus'");
  err({"--gen", "flat:4", "--ranks-per-host", "0"}, "--ranks-per-host");
  err({"--gen", "flat:4", "--coll", "gossip"}, "unknown collective 'gossip'");
  err({"--gen", "flat:4", "--planner", "magic"}, "unknown mode 'magic'");
  err({"--gen", "fattree:3,1,1"}, "k must be even");
  err({"--gen", "leafspine:4,1"}, "takes 4 to 6 numbers");
  err({"--gen", "torus:4"}, "unknown fabric 'torus'");
  err({"--gen", "flat:4", "--bytes", "12Q"}, "not a size");
  err({"--gen", "flat:4", "--bytes", "0"}, "not a size > 0");
  err({"--gen", "flat:4", "--frobnicate"}, "unknown option '--frobnicate'");
  err({"--gen", "flat:4", "--lanes"}, "--lanes needs a value");
  err({"--bytes", "1M"}, "no fabric");
  err({"--gen", "flat:4", "--topo", "x.json"}, "not both");

  // A topology file that does not exist parses, then fails to load, naming the file.
  ASSERT_TRUE(parseOptions({"--topo", "/nonexistent/c4-sim-topo.json"}, &o).isOk());
  plan::Topology t;
  const Status st = makeTopology(o, &t);
  EXPECT_FALSE(st.isOk());
  EXPECT_NE(st.message().find("/nonexistent/c4-sim-topo.json"), std::string::npos) << st.message();

  // An algorithm with no schedule for the collective, named explicitly.
  ASSERT_TRUE(parseOptions({"--gen", "flat:4", "--algo", "tree", "--coll", "allgather"}, &o).isOk());
  ASSERT_TRUE(makeTopology(o, &t).isOk());
  Study s;
  const Status st2 = runStudy(o, t, &s, nullptr);
  EXPECT_FALSE(st2.isOk());
  EXPECT_NE(st2.message().find("no schedule for allgather"), std::string::npos) << st2.message();

  // Through the program: exit status 2 for usage, 1 for a run that fails.
  std::vector<std::string> a1 = {"c4-sim", "--gen", "flat:2", "--algo", "nope"};
  std::vector<std::string> a2 = {"c4-sim", "--topo", "/nonexistent/t.json"};
  auto call = [](std::vector<std::string>& a) {
    std::vector<char*> argv;
    for (std::string& s : a) argv.push_back(s.data());
    return cliMain(static_cast<int>(argv.size()), argv.data());
  };
  EXPECT_EQ(call(a1), 2);
  EXPECT_EQ(call(a2), 1);
}

// A ring allgather over 3 ranks, one chunk per block, as a schedule file (docs/schedules.md).
const char* kAgRing3 = R"({
  "format": "c4comm-schedule", "version": 1, "name": "ag-ring3", "collective": "allgather",
  "nranks": 3, "chunks": 1,
  "ranks": [
    {"steps": [{"op": "send", "peer": 1, "chunk": 0}, {"op": "recv", "peer": 2, "chunk": 2},
               {"op": "send", "peer": 1, "chunk": 2}, {"op": "recv", "peer": 2, "chunk": 1}]},
    {"steps": [{"op": "recv", "peer": 0, "chunk": 0}, {"op": "send", "peer": 2, "chunk": 1},
               {"op": "send", "peer": 2, "chunk": 0}, {"op": "recv", "peer": 0, "chunk": 2}]},
    {"steps": [{"op": "recv", "peer": 1, "chunk": 1}, {"op": "send", "peer": 0, "chunk": 2},
               {"op": "send", "peer": 0, "chunk": 1}, {"op": "recv", "peer": 1, "chunk": 0}]}
  ]
})";

std::string writeTemp(const std::string& name, const std::string& text) {
  const std::string path = ::testing::TempDir() + name;
  std::ofstream(path) << text;
  return path;
}

TEST(Sim, ScheduleFilesAreSimulatedAndChecked) {
  const std::string good = writeTemp("c4sim_ag_ring3.json", kAgRing3);
  Options o;
  ASSERT_TRUE(
      parseOptions({"--gen", "flat:3", "--schedule", good, "--bytes", "3M", "--chunk-bytes", "1M", "--alpha-us", "5"},
                   &o)
          .isOk());
  plan::Topology t;
  ASSERT_TRUE(makeTopology(o, &t).isOk());
  Study s;
  Status st = runStudy(o, t, &s, nullptr);
  ASSERT_TRUE(st.isOk()) << st.toString();
  ASSERT_EQ(s.rows.size(), 1u);
  EXPECT_EQ(s.rows[0].algo, "file:ag-ring3");
  EXPECT_EQ(s.coll, Coll::kAllGather);
  // Two hops of one block (1 MiB) each, like the built-in ring.
  const double expect = 2 * (5e-6 + (1 << 20) / (100 * kGbit / 8));
  EXPECT_NEAR(s.rows[0].sim.seconds, expect, expect * 1e-9);
  // With --algo ring beside it: both, the same time.
  ASSERT_TRUE(parseOptions({"--gen", "flat:3", "--schedule", good, "--algo", "ring", "--bytes", "3M", "--chunk-bytes",
                            "1M", "--alpha-us", "5"},
                           &o)
                  .isOk());
  ASSERT_TRUE(runStudy(o, t, &s, nullptr).isOk());
  ASSERT_EQ(s.rows.size(), 2u);
  EXPECT_NEAR(s.rows[0].sim.seconds, s.rows[1].sim.seconds, expect * 1e-9);
  // The wrong rank count.
  ASSERT_TRUE(parseOptions({"--gen", "flat:4", "--schedule", good}, &o).isOk());
  ASSERT_TRUE(makeTopology(o, &t).isOk());
  st = runStudy(o, t, &s, nullptr);
  EXPECT_FALSE(st.isOk());
  EXPECT_NE(st.message().find("is for 3 ranks"), std::string::npos) << st.message();

  // c4-sim check: 0 for a good file, 1 for one the loader refuses (rank 1 forwards a chunk it
  // never received).
  std::string bad = kAgRing3;
  const std::string from = R"({"op": "send", "peer": 2, "chunk": 0})";
  bad.replace(bad.find(from), from.size(), R"({"op": "send", "peer": 2, "chunk": 2})");
  const std::string badPath = writeTemp("c4sim_ag_bad.json", bad);
  std::vector<std::string> a1 = {"c4-sim", "check", good};
  std::vector<std::string> a2 = {"c4-sim", "check", badPath};
  std::vector<std::string> a3 = {"c4-sim", "check", "/nonexistent/s.json"};
  auto call = [](std::vector<std::string>& a) {
    std::vector<char*> argv;
    for (std::string& x : a) argv.push_back(x.data());
    return cliMain(static_cast<int>(argv.size()), argv.data());
  };
  EXPECT_EQ(call(a1), 0);
  EXPECT_EQ(call(a2), 1);
  EXPECT_EQ(call(a3), 1);
}

}  // namespace
}  // namespace c4::sim
