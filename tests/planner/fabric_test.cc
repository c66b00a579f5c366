// The fabric service's wire (planner/fabric_wire.hpp) and books (planner/fabric_book.hpp): what
// c4-fabricd serves, tested without sockets. The daemon itself: fabricd_test.cc.
#include <gtest/gtest.h>

#include <algorithm>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "planner/fabric_book.hpp"
#include "planner/fabric_wire.hpp"
#include "planner/planner.hpp"
#include "planner_fixtures.hpp"

namespace {

using c4::plan::adoptPlan;
using c4::plan::exhaustivePlan;
using c4::plan::FabricBook;
using c4::plan::Flow;
using c4::plan::Plan;
using c4::plan::PlanInput;
using c4::plan::PlannedConn;
using c4::plan::RankPlace;
using c4::plan::Topology;
namespace wire = c4::plan::wire;
using c4test::ringFlows;
constexpr double kMiB = 1024.0 * 1024.0;

wire::JobSpec job(const Topology& t, std::vector<int> hosts, double bytes = 16 * kMiB, int lanes = 1) {
  wire::JobSpec j;
  j.name = "job on";
  j.topoHash = t.hash();
  for (int h : hosts) {
    RankPlace r;
    r.host = h;
    r.ports = {0};
    r.listenPorts = {static_cast<uint16_t>(4000 + h)};
    j.ranks.push_back(r);
    j.name += " h" + std::to_string(h);
  }
  j.flows = ringFlows(static_cast<int>(hosts.size()), bytes);
  j.lanes = lanes;
  return j;
}

PlanInput inputOf(const Topology& t, const wire::JobSpec& j) {
  PlanInput in;
  in.topo = &t;
  in.ranks = j.ranks;
  in.flows = j.flows;
  in.lanes = j.lanes;
  in.portSalt = j.portSalt;
  in.sourcePorts = j.sourcePorts;
  return in;
}

// ---- the wire ----

TEST(FabricWire, RequestsAndRepliesSurviveTheirEncoding) {
  const Topology t = Topology::leafSpine(4, 2, 2, 2, 1e9, 1e9);
  wire::Request reg;
  reg.op = wire::Op::kRegister;
  reg.job = job(t, {0, 2, 3}, 3 * kMiB, 2);
  reg.job.ranks[1].ports = {1, 0};
  reg.job.ranks[1].listenPorts = {4100, 4101};
  reg.job.sourcePorts = {20000, 29999};
  reg.job.portSalt = 4242;
  reg.leaseMs = 30000;
  Plan p;
  const PlanInput in = inputOf(t, reg.job);
  ASSERT_TRUE(c4::plan::makePlan(in, &p).isOk());
  reg.job.keep = p.conns;
  wire::Request back;
  ASSERT_TRUE(wire::parseRequest(wire::encodeRequest(reg), &back).isOk());
  EXPECT_EQ(back.op, wire::Op::kRegister);
  EXPECT_EQ(back.leaseMs, 30000);
  EXPECT_EQ(back.job.name, reg.job.name);
  EXPECT_EQ(back.job.topoHash, t.hash());
  EXPECT_EQ(back.job.lanes, 2);
  EXPECT_EQ(back.job.portSalt, 4242u);
  EXPECT_EQ(back.job.sourcePorts.lo, 20000);
  EXPECT_EQ(back.job.sourcePorts.hi, 29999);
  ASSERT_EQ(back.job.ranks.size(), 3u);
  EXPECT_EQ(back.job.ranks[1].ports, (std::vector<int>{1, 0}));
  EXPECT_EQ(back.job.ranks[1].listenPorts, (std::vector<uint16_t>{4100, 4101}));
  ASSERT_EQ(back.job.flows.size(), reg.job.flows.size());
  for (size_t i = 0; i < back.job.flows.size(); ++i) {
    EXPECT_EQ(back.job.flows[i].src, reg.job.flows[i].src);
    EXPECT_EQ(back.job.flows[i].dst, reg.job.flows[i].dst);
    EXPECT_EQ(back.job.flows[i].bytes, reg.job.flows[i].bytes);
  }
  // The kept plan comes back the same: adopting it gives the same load.
  Plan kept;
  ASSERT_TRUE(adoptPlan(in, back.job.keep, &kept).isOk());
  EXPECT_EQ(kept.load, p.load);
  EXPECT_EQ(kept.describe(in), p.describe(in));

  for (wire::Op op : {wire::Op::kRenew, wire::Op::kRelease, wire::Op::kStatus}) {
    wire::Request r;
    r.op = op;
    r.id = 0xFEDCBA9876543210ull;
    r.token = 0x0123456789ABCDEFull;
    r.leaseMs = op == wire::Op::kRenew ? 5000 : 0;
    wire::Request b;
    ASSERT_TRUE(wire::parseRequest(wire::encodeRequest(r), &b).isOk()) << wire::opName(op);
    EXPECT_EQ(b.op, op);
    if (op != wire::Op::kStatus) {
      EXPECT_EQ(b.id, r.id);
      EXPECT_EQ(b.token, r.token);
    }
    EXPECT_EQ(b.leaseMs, r.leaseMs);
  }

  wire::Reply rep;
  rep.ok = true;
  rep.id = 7;
  rep.token = UINT64_MAX;
  rep.leaseMs = 1234;
  rep.conns = p.conns;
  rep.fabricSeconds = 0.25;
  rep.soloSeconds = 0.125;
  rep.status = R"({"jobs": [], "fabric_s": 0})";
  wire::Reply rb;
  ASSERT_TRUE(wire::parseReply(wire::encodeReply(rep), &rb).isOk());
  EXPECT_TRUE(rb.ok);
  EXPECT_EQ(rb.id, 7u);
  EXPECT_EQ(rb.token, UINT64_MAX);
  EXPECT_EQ(rb.leaseMs, 1234);
  EXPECT_EQ(rb.conns.size(), p.conns.size());
  EXPECT_EQ(rb.fabricSeconds, 0.25);
  EXPECT_EQ(rb.soloSeconds, 0.125);
  EXPECT_EQ(nlohmann::json::parse(rb.status), nlohmann::json::parse(rep.status));
  wire::Reply no;
  no.error = "why not";
  no.unknownJob = true;
  ASSERT_TRUE(wire::parseReply(wire::encodeReply(no), &rb).isOk());
  EXPECT_FALSE(rb.ok);
  EXPECT_TRUE(rb.unknownJob);
  EXPECT_EQ(rb.error, "why not");
}

TEST(FabricWire, FramesCarryTheKeysSignature) {
  wire::Key key, other;
  ASSERT_TRUE(wire::keyFromSecret("correct horse battery staple", &key).isOk());
  ASSERT_TRUE(wire::keyFromSecret("correct horse battery stapl3", &other).isOk());
  EXPECT_NE(key.k[0], other.k[0]);
  wire::Session s{key, 11, 22};
  const std::string payload = R"({"op":"status"})";
  const std::string f = wire::sealFrame(s, wire::Dir::kToService, 3, payload);
  ASSERT_EQ(f.size(), wire::kHeaderBytes + payload.size());
  wire::FrameHeader h;
  ASSERT_TRUE(wire::parseFrameHeader(f.data(), wire::kHeaderBytes, wire::kMaxFrameBytes, &h).isOk());
  EXPECT_EQ(h.length, payload.size());
  EXPECT_EQ(h.seq, 3u);
  const char* body = f.data() + wire::kHeaderBytes;
  EXPECT_TRUE(wire::frameAuthentic(s, wire::Dir::kToService, 3, h, body));
  // Each of: another place in the sequence (a replay), the other direction, another key, another
  // connection's nonces, one payload bit changed.
  EXPECT_FALSE(wire::frameAuthentic(s, wire::Dir::kToService, 4, h, body));
  EXPECT_FALSE(wire::frameAuthentic(s, wire::Dir::kToJob, 3, h, body));
  EXPECT_FALSE(wire::frameAuthentic(wire::Session{other, 11, 22}, wire::Dir::kToService, 3, h, body));
  EXPECT_FALSE(wire::frameAuthentic(wire::Session{key, 11, 23}, wire::Dir::kToService, 3, h, body));
  EXPECT_FALSE(wire::frameAuthentic(wire::Session{key, 12, 22}, wire::Dir::kToService, 3, h, body));
  std::string tampered(body, payload.size());
  tampered[5] ^= 1;
  EXPECT_FALSE(wire::frameAuthentic(s, wire::Dir::kToService, 3, h, tampered.data()));
  // The header's own checks.
  std::string bad = f.substr(0, wire::kHeaderBytes);
  bad[0] ^= 1;
  EXPECT_FALSE(wire::parseFrameHeader(bad.data(), bad.size(), wire::kMaxFrameBytes, &h).isOk());
  const uint32_t huge = 0xFFFFFFFFu;
  bad = f.substr(0, wire::kHeaderBytes);
  memcpy(&bad[4], &huge, 4);
  c4::Status st = wire::parseFrameHeader(bad.data(), bad.size(), wire::kMaxFrameBytes, &h);
  ASSERT_FALSE(st.isOk());
  EXPECT_NE(st.message().find("4294967295 bytes"), std::string::npos) << st.message();
  EXPECT_FALSE(wire::parseFrameHeader(f.data(), wire::kHeaderBytes - 1, wire::kMaxFrameBytes, &h).isOk());
  // Greetings.
  wire::Greeting g;
  g.nonce = 99;
  const std::string gb = wire::encodeGreeting(g);
  ASSERT_EQ(gb.size(), wire::kGreetingBytes);
  wire::Greeting gb2;
  ASSERT_TRUE(wire::parseGreeting(gb.data(), gb.size(), &gb2).isOk());
  EXPECT_EQ(gb2.nonce, 99u);
  std::string v2 = gb;
  v2[4] = 2;
  st = wire::parseGreeting(v2.data(), v2.size(), &gb2);
  ASSERT_FALSE(st.isOk());
  EXPECT_NE(st.message().find("version 2"), std::string::npos) << st.message();
  const std::string http = "GET / HTTP/1.1\r\n";
  EXPECT_FALSE(wire::parseGreeting(http.data(), http.size(), &gb2).isOk());
}

TEST(FabricWire, KeysComeFromSecretsOfSixteenBytesOrMore) {
  wire::Key a, b;
  EXPECT_FALSE(wire::keyFromSecret("short secret", &a).isOk());
  EXPECT_FALSE(wire::keyFromSecret("   \n\t  ", &a).isOk());
  ASSERT_TRUE(wire::keyFromSecret("0123456789abcdef", &a).isOk());
  ASSERT_TRUE(wire::keyFromSecret("  0123456789abcdef\n", &b).isOk());  // a file's newline
  EXPECT_EQ(a.k[0], b.k[0]);
  EXPECT_EQ(a.k[1], b.k[1]);
}

TEST(FabricWire, BadMessagesAreClearErrors) {
  const std::string job =
      R"("job":{"topo":1,"lanes":1,"ranks":[{"host":0,"ports":[0]},{"host":1,"ports":[0]}],"flows":[[0,1,5]]})";
  wire::Request base;
  ASSERT_TRUE(wire::parseRequest(R"({"op":"register",)" + job + "}", &base).isOk());  // the base case parses
  struct Case {
    std::string text, says;
  };
  const std::vector<Case> cases = {
      {"", "not JSON"},
      {"{\"op\":", "not JSON"},
      {"[1,2]", "not a JSON object"},
      {R"({"op":"steal"})", "unknown op \"steal\""},
      {R"({"op":7})", "missing field \"op\""},
      {R"({"op":"renew","id":1})", "missing field \"token\""},
      {R"({"op":"renew","id":-1,"token":2})", "\"id\" is not a non-negative integer"},
      {R"({"op":"release","id":"1","token":2})", "\"id\" is not a non-negative integer"},
      {R"({"op":"renew","id":1,"token":2,"lease_ms":-5})", "lease_ms"},
      {R"({"op":"register"})", "missing field \"job\""},
      {R"({"op":"register","job":[]})", "not an object"},
      {R"({"op":"register","job":{"topo":1,"lanes":0,"ranks":[],"flows":[]}})", "field \"lanes\" is 0"},
      {R"({"op":"register","job":{"topo":1,"lanes":1,"ranks":[],"flows":[]}})", "no ranks"},
      {R"({"op":"register","job":{"topo":1,"lanes":1,"ranks":[{"host":0,"ports":[]}],"flows":[]}})", "no NIC port"},
      {R"({"op":"register","job":{"topo":1,"lanes":1,"ranks":[{"host":0,"ports":[0]}],"flows":[[0,1,5]]}})",
       "flows[0][1] (a rank) is 1"},
      {R"({"op":"register","job":{"topo":1,"lanes":1,"ranks":[{"host":0,"ports":[0]},{"host":1,"ports":[0]}],"flows":[[0,0,5]]}})",
       "to itself"},
      {R"({"op":"register","job":{"topo":1,"lanes":1,"ranks":[{"host":0,"ports":[0]},{"host":1,"ports":[0]}],"flows":[[0,1,-5]]}})",
       "not a byte count"},
      {R"({"op":"register","job":{"topo":1,"lanes":1,"ranks":[{"host":0,"ports":[0]},{"host":1,"ports":[0]}],"flows":[[0,1,1e300]]}})",
       "not a byte count"},
      {R"({"op":"register","job":{"topo":1,"lanes":1,"ranks":[{"host":0,"ports":[0],"listen":[1,2]}],"flows":[]}})",
       "differ in length"},
      {R"({"op":"register","job":{"topo":1,"lanes":1,"ranks":[{"host":0,"ports":[0]}],"flows":[],"sport":[9,3]}})",
       "low end"},
      {R"({"op":"register","job":{"name":5,"topo":1,"lanes":1,"ranks":[{"host":0,"ports":[0]}],"flows":[]}})",
       "\"name\" is not a string"},
      {R"({"op":"register","job":{"topo":1,"lanes":1,"ranks":[{"host":0,"ports":[0]},{"host":1,"ports":[0]}],"flows":[],"keep":[{"a":1,"b":0,"ab":0,"ba":0,"lanes":[]}]}})",
       "lower rank first"},
      {R"({"op":"register","job":{"topo":1,"lanes":1,"ranks":[{"host":0,"ports":[0]},{"host":1,"ports":[0]}],"flows":[],"keep":[{"a":0,"b":1,"ab":0,"ba":0,"lanes":[[0,0,0]]}]}})",
       "not an array of 8 integers"},
      {R"({"op":"register","job":{"topo":1,"lanes":1,"ranks":[{"host":0,"ports":[0]},{"host":1,"ports":[0]}],"flows":[],"keep":[{"a":0,"b":5,"ab":0,"ba":0,"lanes":[]}]}})",
       "a connection to rank 5 of a 2-rank job"},
  };
  for (const Case& c : cases) {
    wire::Request r;
    c4::Status st = wire::parseRequest(c.text, &r);
    ASSERT_FALSE(st.isOk()) << c.text;
    EXPECT_NE(st.message().find(c.says), std::string::npos) << c.text << " -> " << st.message();
  }
  // Counts past the limits are refused by their size (nothing is built for them).
  std::string many = R"({"op":"register","job":{"topo":1,"lanes":1,"ranks":[)";
  for (size_t i = 0; i <= wire::kMaxPortsPerRank; ++i) many += "0,";
  many.pop_back();
  wire::Request r;
  c4::Status st = wire::parseRequest(R"({"op":"register","job":{"topo":1,"lanes":1,"ranks":[{"host":0,"ports":[)" +
                                         many.substr(many.find('[') + 1) + "]}],\"flows\":[]}}",
                                     &r);
  ASSERT_FALSE(st.isOk());
  EXPECT_NE(st.message().find("at most 16"), std::string::npos) << st.message();
  wire::Reply rep;
  EXPECT_FALSE(wire::parseReply(R"({"id":1})", &rep).isOk());
  EXPECT_FALSE(wire::parseReply(R"({"ok":true,"conns":{}})", &rep).isOk());
  ASSERT_TRUE(wire::parseReply(R"({"ok":false})", &rep).isOk());
  EXPECT_EQ(rep.error, "the service gave no reason");
}

// ---- the books ----

// Two 2-rank jobs on a 2-leaf, 2-spine fabric, each from one leaf to the other: planned alone,
// both take the same spine; booked together, the second takes the other spine, as the optimum does.
TEST(FabricBook, ASecondJobTakesWhatTheFirstLeaves) {
  const Topology t = Topology::leafSpine(4, 1, 2, 2, 1e9, 1e9);  // h0, h1 on leaf0; h2, h3 on leaf1
  FabricBook book(t);
  const wire::JobSpec a = job(t, {0, 2}), b = job(t, {1, 3});
  Plan aloneA, aloneB;
  ASSERT_TRUE(c4::plan::makePlan(inputOf(t, a), &aloneA).isOk());
  ASSERT_TRUE(c4::plan::makePlan(inputOf(t, b), &aloneB).isOk());
  const double solo = aloneA.maxLinkSeconds(t);
  std::vector<double> both = aloneA.load;
  for (size_t l = 0; l < both.size(); ++l) both[l] += aloneB.load[l];
  double collided = 0;
  for (size_t l = 0; l < both.size(); ++l) collided = std::max(collided, both[l] * 8 / t.link(static_cast<int>(l)).bps);
  ASSERT_NEAR(collided, 2 * solo, 1e-12) << "planned alone, the jobs should share a spine";
  const c4::plan::BookedJob* ja = nullptr;
  const c4::plan::BookedJob* jb = nullptr;
  ASSERT_TRUE(book.add(1, 11, a, 0, 1000, &ja).isOk());
  ASSERT_TRUE(book.add(2, 22, b, 0, 1000, &jb).isOk());
  EXPECT_NEAR(book.fabricSeconds(), solo, 1e-12) << book.statusJson(0);
  EXPECT_NE(c4::plan::lanePath(ja->input, ja->plan, 0, 1, 0), c4::plan::lanePath(jb->input, jb->plan, 0, 1, 0));
  // The status names both jobs and their paths.
  const nlohmann::json st = nlohmann::json::parse(book.statusJson(0));
  ASSERT_EQ(st["jobs"].size(), 2u);
  EXPECT_EQ(st["jobs"][0]["name"], "job on h0 h2");
  EXPECT_EQ(st["jobs"][0]["lanes"].size(), 1u);  // the 2-rank ring's one connection, one lane
  EXPECT_NEAR(st["fabric_s"].get<double>(), solo, 1e-12);
  for (const auto& l : st["links"]) EXPECT_EQ(l["jobs"], 1) << st.dump(1);
}

// Jobs arriving one by one on random small fabrics: each placement against the exhaustive
// optimum of that job on what the others leave.
TEST(FabricBook, EachJobIsPlacedNearTheOptimumOnWhatTheOthersLeave) {
  std::mt19937 rng(38);
  int placed = 0, optimal = 0;
  double worst = 1;
  for (int it = 0; it < 60; ++it) {
    const int hosts = 4 + static_cast<int>(rng() % 3), leaves = 2, spines = 2 + static_cast<int>(rng() % 2);
    const Topology t = Topology::leafSpine(hosts, 1 + static_cast<int>(rng() % 2), leaves, spines, 1e9, 1e9);
    FabricBook book(t);
    for (int k = 0; k < 3; ++k) {
      std::vector<int> hs;
      for (int h = 0; h < hosts; ++h)
        if (rng() % 2) hs.push_back(h);
      if (hs.size() < 2) continue;
      wire::JobSpec j = job(t, hs, static_cast<double>(1 + rng() % 16) * kMiB, 1 + static_cast<int>(rng() % 2));
      for (RankPlace& r : j.ranks)
        if (t.host(r.host).ports.size() > 1) r.ports = {0, 1}, r.listenPorts = {4000, 4001};
      PlanInput in = inputOf(t, j);
      in.background = book.load();
      Plan opt;
      if (!exhaustivePlan(in, &opt, 300000).isOk()) continue;
      const uint64_t id = static_cast<uint64_t>(it * 10 + k + 1);
      const c4::plan::BookedJob* b = nullptr;
      ASSERT_TRUE(book.add(id, id, j, 0, 1000, &b).isOk());
      const double best = c4::plan::fabricSeconds(in, opt), got = c4::plan::fabricSeconds(in, b->plan);
      EXPECT_GE(got, best * (1 - 1e-9));
      EXPECT_NEAR(book.fabricSeconds(), got, 1e-9 * got);
      worst = std::max(worst, got / best);
      ++placed;
      optimal += got <= best * (1 + 1e-9);
    }
  }
  ASSERT_GT(placed, 60);
  EXPECT_LE(worst, 1.1);
  EXPECT_GE(optimal, placed * 9 / 10) << optimal << " of " << placed << " placements optimal";
  RecordProperty("placements", placed);
  RecordProperty("optimal", optimal);
}

TEST(FabricBook, LeasesRenewalsAndReleases) {
  const Topology t = Topology::leafSpine(4, 1, 2, 2, 1e9, 1e9);
  FabricBook book(t);
  ASSERT_TRUE(book.add(1, 11, job(t, {0, 2}), 1000, 500, nullptr).isOk());
  ASSERT_TRUE(book.add(2, 22, job(t, {1, 3}), 1000, 5000, nullptr).isOk());
  EXPECT_FALSE(book.add(2, 33, job(t, {1, 2}), 1000, 5000, nullptr).isOk()) << "an id taken twice";
  EXPECT_FALSE(book.add(0, 33, job(t, {1, 2}), 1000, 5000, nullptr).isOk()) << "id 0";
  bool unknown = true;
  EXPECT_FALSE(book.renew(1, 12, 1200, 500, &unknown).isOk()) << "a wrong token renews nothing";
  EXPECT_FALSE(unknown);
  ASSERT_TRUE(book.renew(1, 11, 1400, 0, &unknown).isOk());  // 0: the lease it had
  EXPECT_EQ(book.find(1)->leaseUntilMs, 1900);
  EXPECT_TRUE(book.expire(1899).empty());
  EXPECT_EQ(book.expire(1900), std::vector<uint64_t>{1});
  EXPECT_EQ(book.find(1), nullptr);
  EXPECT_FALSE(book.renew(1, 11, 2000, 500, &unknown).isOk());
  EXPECT_TRUE(unknown) << "an expired job is unknown: it registers again";
  c4::Status st = book.release(2, 23, &unknown);
  EXPECT_FALSE(st.isOk());
  EXPECT_FALSE(unknown);
  EXPECT_NE(st.message().find("not released"), std::string::npos) << st.message();
  ASSERT_NE(book.find(2), nullptr) << "a wrong token releases nothing";
  ASSERT_TRUE(book.release(2, 22, &unknown).isOk());
  EXPECT_TRUE(book.jobs().empty());
  EXPECT_EQ(book.fabricSeconds(), 0);
  EXPECT_FALSE(book.release(2, 22, &unknown).isOk());
  EXPECT_TRUE(unknown);
}

TEST(FabricBook, AKeptPlanIsBookedAsItIsOrRefused) {
  const Topology t = Topology::leafSpine(4, 1, 2, 2, 1e9, 1e9);
  FabricBook book(t);
  wire::JobSpec a = job(t, {0, 2});
  ASSERT_TRUE(book.add(1, 11, a, 0, 1000, nullptr).isOk());
  // Job b re-registers with the plan it runs, on the same spine as a: booked as it is (nothing
  // moves on a restart), although the book would have placed it elsewhere.
  wire::JobSpec b = job(t, {1, 3});
  Plan alone;
  ASSERT_TRUE(c4::plan::makePlan(inputOf(t, b), &alone).isOk());
  b.keep = alone.conns;
  const c4::plan::BookedJob* jb = nullptr;
  ASSERT_TRUE(book.add(2, 22, b, 0, 1000, &jb).isOk());
  EXPECT_EQ(jb->plan.describe(jb->input), alone.describe(inputOf(t, b)));
  EXPECT_NEAR(book.fabricSeconds(), 2 * alone.maxLinkSeconds(t), 1e-12);
  // What does not fit the job is refused and leaves the books as they were.
  const double before = book.fabricSeconds();
  struct Bad {
    const char* says;
    void (*spoil)(std::vector<PlannedConn>*);
  };
  const std::vector<Bad> bad = {
      {"path 7", [](std::vector<PlannedConn>* c) { (*c)[0].lanes[0].path = 7; }},
      {"ports 3 and 0", [](std::vector<PlannedConn>* c) { (*c)[0].lanes[0].localPort = 3; }},
      {"no lane in service", [](std::vector<PlannedConn>* c) { (*c)[0].lanes[0].retired = true; }},
      {"ranks 0 and 5 of 3", [](std::vector<PlannedConn>* c) { (*c)[0].b = 5; }},
      {"twice", [](std::vector<PlannedConn>* c) { (*c)[1] = (*c)[0]; }},
      {"4 connection(s), the job's flows need 3", [](std::vector<PlannedConn>* c) { c->push_back((*c)[0]); }},
  };
  for (const Bad& x : bad) {
    wire::JobSpec c = job(t, {1, 2, 3});
    Plan p;
    ASSERT_TRUE(c4::plan::makePlan(inputOf(t, c), &p).isOk());
    c.keep = p.conns;
    x.spoil(&c.keep);
    c4::Status st = book.add(3, 33, c, 0, 1000, nullptr);
    ASSERT_FALSE(st.isOk()) << x.says;
    EXPECT_NE(st.message().find(x.says), std::string::npos) << st.message();
    EXPECT_EQ(book.find(3), nullptr);
    EXPECT_EQ(book.fabricSeconds(), before);
  }
  Plan none;
  c4::Status nst = adoptPlan(inputOf(t, job(t, {1, 2})), {}, &none);
  ASSERT_FALSE(nst.isOk());
  EXPECT_NE(nst.message().find("0 connection(s), the job's flows need 1"), std::string::npos) << nst.message();
  // Another fabric's job, ranks off the fabric.
  wire::JobSpec other = job(t, {0, 1});
  other.topoHash ^= 1;
  c4::Status st = book.add(3, 33, other, 0, 1000, nullptr);
  ASSERT_FALSE(st.isOk());
  EXPECT_NE(st.message().find("same C4_TOPO_FILE"), std::string::npos) << st.message();
  wire::JobSpec off = job(t, {0, 1});
  off.ranks[1].host = 9;
  EXPECT_FALSE(book.add(3, 33, off, 0, 1000, nullptr).isOk());
  off = job(t, {0, 1});
  off.ranks[1].ports = {4};
  EXPECT_FALSE(book.add(3, 33, off, 0, 1000, nullptr).isOk());
  EXPECT_EQ(book.jobs().size(), 2u);
}

// ---- what running jobs report, and the moves they are asked for ----

TEST(FabricWire, ReportsAndMovesSurviveTheirEncoding) {
  wire::Request r;
  r.op = wire::Op::kRenew;
  r.id = 7;
  r.token = 8;
  PlannedConn c;
  c.a = 0;
  c.b = 3;
  c.bytesAB = 5;
  c.lanes.resize(3);
  c.lanes[1].retired = true;
  c.lanes[2].path = 2;
  c.lanes[2].sourcePort = 40001;
  r.report.lanes = {c};
  r.report.samples = {{0, 3, 2, false, 1.25e8, 0.31, wire::LaneSample::Verdict::kSlow},
                      {0, 3, 0, true, 0, -1, wire::LaneSample::Verdict::kFailed}};
  wire::Request back;
  ASSERT_TRUE(wire::parseRequest(wire::encodeRequest(r), &back).isOk());
  ASSERT_EQ(back.report.lanes.size(), 1u);
  EXPECT_EQ(back.report.lanes[0].lanes.size(), 3u);
  EXPECT_TRUE(back.report.lanes[0].lanes[1].retired);
  EXPECT_EQ(back.report.lanes[0].lanes[2].sourcePort, 40001);
  ASSERT_EQ(back.report.samples.size(), 2u);
  EXPECT_FALSE(back.report.samples[0].fromA);
  EXPECT_EQ(back.report.samples[0].lane, 2);
  EXPECT_DOUBLE_EQ(back.report.samples[0].ratio, 0.31);
  EXPECT_EQ(back.report.samples[0].verdict, wire::LaneSample::Verdict::kSlow);
  EXPECT_EQ(back.report.samples[1].verdict, wire::LaneSample::Verdict::kFailed);
  // The same report within a job, and the moves both ways.
  wire::JobReport jr;
  ASSERT_TRUE(wire::parseJobReport(wire::encodeJobReport(r.report), &jr).isOk());
  EXPECT_EQ(jr.samples.size(), 2u);
  wire::Reply rep;
  rep.ok = true;
  rep.moves = {{0, 3, 1, c.lanes[2]}};
  rep.moveWhy = "off leaf0->spine1 (slow)";
  wire::Reply rb;
  ASSERT_TRUE(wire::parseReply(wire::encodeReply(rep), &rb).isOk());
  ASSERT_EQ(rb.moves.size(), 1u);
  EXPECT_EQ(rb.moves[0].lane, 1);
  EXPECT_EQ(rb.moves[0].choice.path, 2);
  EXPECT_EQ(rb.moveWhy, rep.moveWhy);
  std::vector<wire::LaneMove> mv;
  std::string why;
  ASSERT_TRUE(wire::parseMoves(wire::encodeMoves(rep.moves, "why"), &mv, &why).isOk());
  EXPECT_EQ(mv.size(), 1u);
  EXPECT_EQ(why, "why");
  // Bad reports and moves are clear errors.
  struct Case {
    std::string text, says;
  };
  const std::vector<Case> reports = {
      {R"({"samples":{}})", "\"samples\" is not an array"},
      {R"({"samples":[[0,1,0,0,5,1]]})", "is not [a, b, lane, dir, bytes/s, ratio, verdict]"},
      {R"({"samples":[[1,0,0,0,5,1,0]]})", "lower rank first"},
      {R"({"samples":[[0,1,0,2,5,1,0]]})", "[3] (the direction) is 2"},
      {R"({"samples":[[0,1,0,0,5,1,3]]})", "[6] (the verdict) is 3"},
      {R"({"samples":[[0,1,5000,0,5,1,0]]})", "[2] (a lane) is 5000"},
      {R"({"samples":[[0,1,0,0,-5,1,0]]})", "(bytes/s) is not a byte count"},
      {R"({"samples":[[0,1,0,0,5,"x",0]]})", "(the ratio) is not a number"},
      {R"({"samples":[[0,1,0,0,5,-7,0]]})", "(the ratio) is not a number"},
      {R"({"lanes":[{"a":0,"b":1,"ab":0,"ba":0,"lanes":[[0,0,0,-1,0,0,0,2]]}]})", "lanes[0].lanes[0][7] is 2"},
  };
  for (const Case& x : reports) {
    wire::JobReport out;
    c4::Status st = wire::parseJobReport(x.text, &out);
    ASSERT_FALSE(st.isOk()) << x.text;
    EXPECT_NE(st.message().find(x.says), std::string::npos) << x.text << " -> " << st.message();
    wire::Request req;
    st = wire::parseRequest(R"({"op":"renew","id":1,"token":2,"report":)" + x.text + "}", &req);
    EXPECT_FALSE(st.isOk()) << x.text;
  }
  EXPECT_FALSE(wire::parseRequest(R"({"op":"renew","id":1,"token":2,"report":[]})", &back).isOk());
  const std::vector<Case> moves = {
      {R"({"moves":[{"a":0,"b":1,"lane":0}]})", "missing \"to\""},
      {R"({"moves":[{"a":0,"b":1,"lane":0,"to":[0,0,0,-1,0,0,0,1]}]})", "a retired lane"},
      {R"({"moves":[{"a":0,"b":1,"lane":-1,"to":[0,0,0,-1,0,0,0,0]}]})", "\"lane\" is -1"},
      {R"({"moves":[{"a":2,"b":1,"lane":0,"to":[0,0,0,-1,0,0,0,0]}]})", "lower rank first"},
      {R"({"moves":[],"why":5})", "\"why\" is not a string"},
  };
  for (const Case& x : moves) {
    std::vector<wire::LaneMove> out;
    c4::Status st = wire::parseMoves(x.text, &out, &why);
    ASSERT_FALSE(st.isOk()) << x.text;
    EXPECT_NE(st.message().find(x.says), std::string::npos) << x.text << " -> " << st.message();
  }
  // A connection's lanes past the limit: refused by their count.
  std::string lanes;
  for (size_t i = 0; i <= wire::kMaxLaneSlots; ++i) lanes += "[0,0,0,-1,0,0,0,1],";
  lanes.pop_back();
  wire::JobReport out;
  c4::Status st = wire::parseJobReport(R"({"lanes":[{"a":0,"b":1,"ab":0,"ba":0,"lanes":[)" + lanes + "]}]}", &out);
  ASSERT_FALSE(st.isOk());
  EXPECT_NE(st.message().find("at most 1024"), std::string::npos) << st.message();
}

// The spine a job's lane crosses ("spine0", ...), from its path.
std::string spineOf(const c4::plan::BookedJob& j, int a, int b, int lane) {
  const std::string p = c4::plan::lanePath(j.input, j.plan, a, b, lane);
  const size_t at = p.find("spine");
  return at == std::string::npos ? p : p.substr(at, 6);
}

// A job booked with the plan given (as a re-registration books it): its lanes on the spines named
// by path index.
wire::JobSpec keptOn(const Topology& t, std::vector<int> hosts, std::vector<int> paths) {
  wire::JobSpec j = job(t, hosts, 16 * kMiB, static_cast<int>(paths.size()));
  Plan p;
  EXPECT_TRUE(c4::plan::makePlan(inputOf(t, j), &p).isOk());
  for (PlannedConn& c : p.conns)
    for (size_t l = 0; l < c.lanes.size(); ++l) c.lanes[l].path = paths[l], c.lanes[l].backPath = -1;
  j.keep = p.conns;
  return j;
}

TEST(FabricBook, ReportedLanesReplaceTheBooksOrAreRefused) {
  const Topology t = Topology::leafSpine(4, 1, 2, 3, 1e9, 1e9);
  FabricBook book(t);
  const c4::plan::BookedJob* a = nullptr;
  ASSERT_TRUE(book.add(1, 11, keptOn(t, {0, 2}, {0, 1}), 0, 1000, &a).isOk());
  ASSERT_EQ(spineOf(*a, 0, 1, 1), "spine1");
  // The job replaced lane 1 by a lane 2 on spine 2 (its own failover): the books follow.
  wire::JobReport r;
  r.lanes = a->plan.conns;
  r.lanes[0].lanes[1].retired = true;
  c4::plan::LaneChoice moved = r.lanes[0].lanes[0];
  moved.path = 2;
  r.lanes[0].lanes.push_back(moved);
  std::vector<int> changed;
  ASSERT_TRUE(book.report(1, 11, r, 0, 1000, &changed).isOk());
  EXPECT_TRUE(changed.empty());
  ASSERT_EQ(a->plan.conns[0].lanes.size(), 3u);
  EXPECT_EQ(spineOf(*a, 0, 1, 2), "spine2");
  const int s1 = t.findLink("leaf0->spine1"), s2 = t.findLink("leaf0->spine2");
  ASSERT_GE(s1, 0);
  ASSERT_GE(s2, 0);
  EXPECT_EQ(a->plan.load[static_cast<size_t>(s1)], 0);
  EXPECT_GT(a->plan.load[static_cast<size_t>(s2)], 0);
  // Refused, the books unchanged: a wrong token, another job, lanes that do not fit, a connection
  // the job does not have.
  const std::string before = a->plan.describe(a->input);
  EXPECT_FALSE(book.report(1, 12, r, 0, 1000, &changed).isOk());
  EXPECT_FALSE(book.report(2, 11, r, 0, 1000, &changed).isOk());
  wire::JobReport bad = r;
  bad.lanes[0].lanes[2].localPort = 3;
  c4::Status st = book.report(1, 11, bad, 0, 1000, &changed);
  ASSERT_FALSE(st.isOk());
  EXPECT_NE(st.message().find("ports 3 and 0"), std::string::npos) << st.message();
  bad = r;
  for (auto& l : bad.lanes[0].lanes) l.retired = true;
  EXPECT_FALSE(book.report(1, 11, bad, 0, 1000, &changed).isOk());
  bad = r;
  bad.lanes[0].b = 5;
  st = book.report(1, 11, bad, 0, 1000, &changed);
  ASSERT_FALSE(st.isOk());
  EXPECT_NE(st.message().find("which its flows do not connect"), std::string::npos) << st.message();
  EXPECT_EQ(a->plan.describe(a->input), before);
}

// Three spines; job A (h0 -> h2) has lanes on spines 0 and 1, job B (h1 -> h3) one lane on spine 1.
// A finds its spine-1 lane slow: the links it alone crossed are booked slow for every job, B is
// moved off them too, and a new job does not go there; the belief lapses after the hold.
TEST(FabricBook, ALinkSlowForOneJobIsAvoidedForAll) {
  const Topology t = Topology::leafSpine(4, 1, 2, 3, 1e9, 1e9);
  FabricBook book(t);
  const c4::plan::BookedJob* a = nullptr;
  const c4::plan::BookedJob* b = nullptr;
  ASSERT_TRUE(book.add(1, 11, keptOn(t, {0, 2}, {0, 1}), 0, 60000, &a).isOk());
  ASSERT_TRUE(book.add(2, 22, keptOn(t, {1, 3}, {1}), 0, 60000, &b).isOk());
  ASSERT_EQ(spineOf(*b, 0, 1, 0), "spine1");
  wire::JobReport r;
  r.samples = {{0, 1, 1, true, 3e7, 0.3, wire::LaneSample::Verdict::kSlow},
               {0, 1, 0, true, 1e8, 1.0, wire::LaneSample::Verdict::kOk},
               {0, 1, 5, true, 1e8, 0.1, wire::LaneSample::Verdict::kSlow}};  // no lane 5: skipped
  std::vector<int> changed;
  ASSERT_TRUE(book.report(1, 11, r, 1000, 30000, &changed).isOk());
  std::vector<std::string> names;
  for (int l : changed) names.push_back(t.link(l).name);
  std::sort(names.begin(), names.end());
  EXPECT_EQ(names, (std::vector<std::string>{"leaf0->spine1", "spine1->leaf1"}));
  ASSERT_EQ(book.linkHealth().size(), 2u);
  for (const auto& [l, h] : book.linkHealth()) {
    EXPECT_EQ(h.state, c4::plan::LinkHealth::State::kSlow);
    EXPECT_DOUBLE_EQ(h.capacity, 0.3);
    EXPECT_EQ(h.untilMs, 31000);
  }
  // The same report again changes nothing; both jobs move their spine-1 lanes, at once (no rate
  // limit for a bad link), and not again.
  ASSERT_TRUE(book.report(1, 11, r, 1000, 30000, &changed).isOk());
  EXPECT_TRUE(changed.empty());
  c4::plan::MovePolicy policy;
  std::vector<uint64_t> moved = book.planMoves(1000, policy);
  std::sort(moved.begin(), moved.end());
  EXPECT_EQ(moved, (std::vector<uint64_t>{1, 2}));
  std::string why;
  std::vector<wire::LaneMove> ma = book.takeMoves(1, &why), mb = book.takeMoves(2, &why);
  ASSERT_EQ(ma.size(), 1u);
  EXPECT_EQ(ma[0].lane, 1);
  ASSERT_EQ(mb.size(), 1u);
  EXPECT_EQ(mb[0].lane, 0);
  EXPECT_NE(why.find("leaf0->spine1 (slow)"), std::string::npos) << why;
  EXPECT_TRUE(book.takeMoves(2, &why).empty());
  EXPECT_NE(spineOf(*a, 0, 1, 2), "spine1");
  EXPECT_NE(spineOf(*b, 0, 1, 1), "spine1");
  EXPECT_TRUE(book.planMoves(1000, policy).empty());
  // A new job from leaf 0 to leaf 1 is placed off spine 1.
  const c4::plan::BookedJob* c = nullptr;
  ASSERT_TRUE(book.add(3, 33, job(t, {0, 3}), 2000, 60000, &c).isOk());
  EXPECT_NE(spineOf(*c, 0, 1, 0), "spine1");
  const nlohmann::json st = nlohmann::json::parse(book.statusJson(2000));
  ASSERT_EQ(st["health"].size(), 2u);
  EXPECT_EQ(st["health"][0]["state"], "slow");
  EXPECT_EQ(st["health"][0]["by"], "job on h0 h2");
  // Held until 31000, then believed well again.
  book.expire(30999);
  EXPECT_EQ(book.linkHealth().size(), 2u);
  book.expire(31000);
  EXPECT_TRUE(book.linkHealth().empty());
}

TEST(FabricBook, ABrokenLaneBooksItsLinksCutAndHealthyLanesClearTheirs) {
  const Topology t = Topology::leafSpine(4, 1, 2, 3, 1e9, 1e9);
  FabricBook book(t);
  ASSERT_TRUE(book.add(1, 11, keptOn(t, {0, 2}, {1, 1, 0}), 0, 60000, nullptr).isOk());
  // Lane 1 broke but lane 0 runs well over the same spine: the fabric links are not to blame.
  wire::JobReport r;
  r.samples = {{0, 1, 1, true, 0, -1, wire::LaneSample::Verdict::kFailed},
               {0, 1, 0, true, 1e8, 0.9, wire::LaneSample::Verdict::kOk}};
  std::vector<int> changed;
  ASSERT_TRUE(book.report(1, 11, r, 0, 1000, &changed).isOk());
  EXPECT_TRUE(changed.empty());
  EXPECT_TRUE(book.linkHealth().empty());
  // A sample without a comparison (one lane measured: ratio -1) clears nothing.
  r.samples[1].ratio = -1;
  ASSERT_TRUE(book.report(1, 11, r, 0, 1000, &changed).isOk());
  ASSERT_EQ(changed.size(), 2u);
  for (const auto& [l, h] : book.linkHealth()) {
    EXPECT_EQ(h.state, c4::plan::LinkHealth::State::kCut);
    EXPECT_LT(h.capacity, 0.01);
  }
  // The way back was not measured: not booked.
  EXPECT_EQ(book.linkHealth().count(t.findLink("spine1->leaf0")), 0u);
  // Slow after cut stays cut.
  r.samples = {{0, 1, 0, true, 1e7, 0.2, wire::LaneSample::Verdict::kSlow}};
  ASSERT_TRUE(book.report(1, 11, r, 0, 1000, &changed).isOk());
  EXPECT_TRUE(changed.empty());
  for (const auto& [l, h] : book.linkHealth()) EXPECT_EQ(h.state, c4::plan::LinkHealth::State::kCut);
}

// Two jobs that share a spine (both booked as they ran, as after a restart): the service moves one
// of them once the rate limit allows, which halves the most loaded link (the optimum: each job
// alone), and then leaves both where they are.
TEST(FabricBook, RunningJobsAreMovedForABetterFabricAtMostSoOften) {
  const Topology t = Topology::leafSpine(4, 1, 2, 2, 1e9, 1e9);
  FabricBook book(t);
  const c4::plan::BookedJob* a = nullptr;
  const c4::plan::BookedJob* b = nullptr;
  ASSERT_TRUE(book.add(1, 11, keptOn(t, {0, 2}, {0}), 0, 600000, &a).isOk());
  ASSERT_TRUE(book.add(2, 22, keptOn(t, {1, 3}, {0}), 500, 600000, &b).isOk());
  const double solo = a->plan.maxLinkSeconds(t);
  ASSERT_NEAR(book.fabricSeconds(), 2 * solo, 1e-12);
  c4::plan::MovePolicy policy;
  policy.minIntervalMs = 1000;
  EXPECT_TRUE(book.planMoves(999, policy).empty()) << "both jobs are younger than the interval";
  // At 1000 only A may move (B registered at 500).
  EXPECT_EQ(book.planMoves(1000, policy), std::vector<uint64_t>{1});
  EXPECT_NEAR(book.fabricSeconds(), solo, 1e-12);
  EXPECT_NE(spineOf(*a, 0, 1, 1), spineOf(*b, 0, 1, 0));
  std::string why;
  const std::vector<wire::LaneMove> m = book.takeMoves(1, &why);
  ASSERT_EQ(m.size(), 1u);
  EXPECT_EQ(m[0].lane, 0);
  EXPECT_NE(why.find("most loaded link the move changes, leaf0->spine0"), std::string::npos) << why;
  for (int64_t now : {1000, 5000, 100000}) EXPECT_TRUE(book.planMoves(now, policy).empty()) << now;
  // A gain below the policy's share moves nothing (here moving either job halves the link).
  FabricBook again(t);
  ASSERT_TRUE(again.add(1, 11, keptOn(t, {0, 2}, {0}), 0, 600000, nullptr).isOk());
  ASSERT_TRUE(again.add(2, 22, keptOn(t, {1, 3}, {0}), 0, 600000, nullptr).isOk());
  policy.minGain = 0.6;
  EXPECT_TRUE(again.planMoves(1000, policy).empty());
  policy.minGain = 0.4;
  EXPECT_EQ(again.planMoves(1000, policy).size(), 1u);
}

// Two jobs from one host (its port link carries both: the most loaded link, which no move relieves)
// share a spine while another spine is free: one of them moves there all the same.
TEST(FabricBook, JobsMoveOffABusySpineWhenAHostLinkIsTheBottleneck) {
  const Topology t = Topology::leafSpine(4, 1, 2, 2, 1e9, 1e9);
  FabricBook book(t);
  const c4::plan::BookedJob* a = nullptr;
  const c4::plan::BookedJob* b = nullptr;
  ASSERT_TRUE(book.add(1, 11, keptOn(t, {0, 2}, {0}), 0, 600000, &a).isOk());
  ASSERT_TRUE(book.add(2, 22, keptOn(t, {0, 3}, {0}), 0, 600000, &b).isOk());
  const double before = book.fabricSeconds();
  c4::plan::MovePolicy policy;
  policy.minIntervalMs = 0;
  EXPECT_EQ(book.planMoves(0, policy).size(), 1u);
  EXPECT_NE(spineOf(*a, 0, 1, a->plan.conns[0].lanes.size() - 1), spineOf(*b, 0, 1, b->plan.conns[0].lanes.size() - 1));
  EXPECT_NEAR(book.fabricSeconds(), before, 1e-12) << "h0's port link stays the most loaded";
  EXPECT_TRUE(book.planMoves(0, policy).empty());
}

}  // namespace
