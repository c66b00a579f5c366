// C4D's classifiers on made-up views of the ranks (core/diagnose.hpp), and C4_FAULT's parser.
#include "core/diagnose.hpp"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "core/health.hpp"

namespace c4 {
namespace {

std::vector<RankView> ranks(int n) {
  std::vector<RankView> v(static_cast<size_t>(n));
  for (int r = 0; r < n; ++r) {
    v[r].rank = r;
    v[r].host = "h" + std::to_string(r);
    v[r].pid = 100 + r;
    v[r].known = true;
    v[r].entered = 6;  // in collective seq 5
    v[r].left = 5;
  }
  return v;
}

HangInput hang(int n, int self, std::vector<int> waitingOn) {
  HangInput in;
  in.self = self;
  in.nranks = n;
  in.seq = 5;
  in.what = "AllReduce seq 5";
  in.waitingOn = std::move(waitingOn);
  in.ranks = ranks(n);
  in.ranks[self].waitingOn = in.waitingOn;
  return in;
}

TEST(Diagnose, RankThatNeverEnteredIsANonCommunicationHang) {
  HangInput in = hang(4, 0, {3});
  in.ranks[2].entered = 5;  // still in seq 4's aftermath: never entered seq 5
  in.ranks[2].left = 5;
  in.ranks[2].leftAgoMs = 7000;
  Diagnosis d = classifyHang(in);
  EXPECT_EQ(d.kind, "noncomm_hang");
  EXPECT_EQ(d.ranks, std::vector<int>({2}));
  EXPECT_EQ(d.hosts, std::vector<std::string>({"h2"}));
  EXPECT_NE(d.summary.find("never entered collective seq 5"), std::string::npos) << d.summary;
  EXPECT_NE(d.summary.find("left 7.0 s ago"), std::string::npos) << d.summary;
  EXPECT_NE(d.summary.find("alive"), std::string::npos) << d.summary;
}

// Two ranks, a cut link: rank 1's last send of seq 4 went out and it moved on to seq 5, but the data
// never reached rank 0, which is still inside seq 4 waiting on rank 1 with a send that does not
// move. That is the link, not rank 0 "busy outside c4comm" (netlab_c4d_cut saw this race).
TEST(Diagnose, RankStillInsideAnEarlierCollectiveIsACommunicationHang) {
  HangInput in = hang(2, 1, {0});
  in.ranks[0].entered = 5;  // in collective seq 4, which rank 1 left
  in.ranks[0].left = 4;
  in.ranks[0].waitingOn = {1};
  in.ranks[0].stuckTo = {1};
  Diagnosis d = classifyHang(in);
  EXPECT_EQ(d.kind, "comm_hang") << d.summary;
  ASSERT_EQ(d.links.size(), 1u);
  EXPECT_EQ(d.links[0], std::make_pair(0, 1));
  EXPECT_NE(d.summary.find("still in seq 4, which this rank left"), std::string::npos) << d.summary;
  EXPECT_NE(d.summary.find("no data moves on the link between rank 0"), std::string::npos) << d.summary;
  // Silent, its last heartbeat from inside that earlier collective: that heartbeat may predate its
  // leaving it (a rank stopped between collectives), so it stays a non-communication hang.
  in.ranks[0].unresponsive = true;
  in.ranks[0].silentMs = 5000;
  EXPECT_EQ(classifyHang(in).kind, "noncomm_hang");
}

TEST(Diagnose, SilentRankOutsideTheOperationIsStillANonCommunicationHang) {
  HangInput in = hang(3, 0, {1});
  in.ranks[1].entered = 5;
  in.ranks[1].unresponsive = true;
  in.ranks[1].silentMs = 4000;
  Diagnosis d = classifyHang(in);
  EXPECT_EQ(d.kind, "noncomm_hang");
  EXPECT_EQ(d.ranks, std::vector<int>({1}));
  EXPECT_NE(d.summary.find("heartbeat stopped"), std::string::npos) << d.summary;
}

TEST(Diagnose, GoneRankIsDeadWhateverElseIsTrue) {
  HangInput in = hang(3, 0, {1});
  in.ranks[1].entered = 5;  // also never entered
  in.ranks[2].gone = true;
  in.ranks[2].goneWhy = "its side-channel link closed without a goodbye";
  Diagnosis d = classifyHang(in);
  EXPECT_EQ(d.kind, "dead_rank");
  EXPECT_EQ(d.ranks, std::vector<int>({2}));
  EXPECT_GE(d.confidence, 0.9);
}

TEST(Diagnose, RankSilentInsideTheOperationIsDead) {
  HangInput in = hang(3, 0, {1});
  in.ranks[1].unresponsive = true;
  in.ranks[1].silentMs = 12000;
  Diagnosis d = classifyHang(in);
  EXPECT_EQ(d.kind, "dead_rank");
  EXPECT_EQ(d.ranks, std::vector<int>({1}));
  EXPECT_NE(d.summary.find("stopped answering inside the operation"), std::string::npos) << d.summary;
}

TEST(Diagnose, MutualWaitIsTheCulpritLinkNotTheRanksDownstream) {
  // Ring 0 -> 1 -> 2 -> 3 -> 0 with the link between 1 and 2 dead: 2 waits on 1 for data, 1 waits
  // on 2 for acknowledgements; 3 waits on 2 and 0 on 3 downstream.
  HangInput in = hang(4, 0, {3});
  in.ranks[1].waitingOn = {2};
  in.ranks[2].waitingOn = {1};
  in.ranks[3].waitingOn = {2};
  in.states = {"lane 0 up, 3 pieces pending"};
  Diagnosis d = classifyHang(in);
  EXPECT_EQ(d.kind, "comm_hang");
  ASSERT_EQ(d.links.size(), 1u);
  EXPECT_EQ(d.links[0], std::make_pair(1, 2));
  EXPECT_EQ(d.ranks, std::vector<int>({1, 2}));
  EXPECT_NE(d.summary.find("rank 1 (host h1) and rank 2 (host h2)"), std::string::npos) << d.summary;
  EXPECT_NE(d.evidence.find("3 pieces pending"), std::string::npos) << d.evidence;
}

TEST(Diagnose, WithoutAMutualWaitTheLinksThisRankWaitsOnAreNamedWithLowConfidence) {
  HangInput in = hang(3, 0, {2});
  Diagnosis d = classifyHang(in);
  EXPECT_EQ(d.kind, "comm_hang");
  ASSERT_EQ(d.links.size(), 1u);
  EXPECT_EQ(d.links[0], std::make_pair(0, 2));
  EXPECT_LT(d.confidence, 0.7);
}

TEST(Diagnose, PointToPointWaitOnAnIdleRankIsANonCommunicationHang) {
  HangInput in = hang(2, 0, {1});
  in.seq = -1;
  in.what = "Recv from rank 1";
  in.ranks[1].entered = in.ranks[1].left = 6;  // idle
  Diagnosis d = classifyHang(in);
  EXPECT_EQ(d.kind, "noncomm_hang");
  EXPECT_EQ(d.ranks, std::vector<int>({1}));
  EXPECT_NE(d.summary.find("matching send/receive"), std::string::npos) << d.summary;
}

TEST(Diagnose, AFailureIsExplainedOnlyByAGoneRank) {
  std::vector<RankView> v = ranks(3);
  EXPECT_TRUE(classifyFailure(0, "connection reset", v).kind.empty());
  v[1].gone = true;
  v[1].goneWhy = "process 101 no longer exists";
  Diagnosis d = classifyFailure(0, "rank 1 died", v);
  EXPECT_EQ(d.kind, "dead_rank");
  EXPECT_EQ(d.ranks, std::vector<int>({1}));
  EXPECT_NE(d.evidence.find("process 101 no longer exists"), std::string::npos);
}

TEST(Diagnose, RecordIsOneLineOfJsonWithTheFields) {
  HangInput in = hang(4, 0, {3});
  in.ranks[2].entered = 5;
  Diagnosis d = classifyHang(in);
  d.reporter = 0;
  const std::string j = diagnosisJson(d, "abcd", 0, 4);
  EXPECT_EQ(j.find('\n'), std::string::npos);
  auto p = nlohmann::json::parse(j);
  EXPECT_EQ(p["c4d"], 1);
  EXPECT_EQ(p["class"], "noncomm_hang");
  EXPECT_EQ(p["comm"], "abcd");
  EXPECT_EQ(p["seq"], 5);
  EXPECT_EQ(p["culprit"]["ranks"], nlohmann::json::array({2}));
  EXPECT_EQ(p["culprit"]["hosts"], nlohmann::json::array({"h2"}));
  EXPECT_TRUE(p["time"].is_string());
  EXPECT_GT(p["confidence"].get<double>(), 0.5);
}

// ---- slowdowns ----

constexpr int64_t kMs = 1000000;

SlowDetector::Config quick() {
  SlowDetector::Config c;
  c.confirmations = 1;
  return c;
}

TEST(SlowDetect, RankArrivingLateAtMostCollectivesIsAStraggler) {
  SlowDetector s;
  s.configure(quick());
  const int64_t t0 = 1000 * kMs;
  for (int k = 0; k < 12; ++k) {
    const int64_t at = t0 + k * 300 * kMs;
    s.addOp(0, k, at + (k % 3) * kMs);  // a few ms of noise
    s.addOp(1, k, at + ((k + 1) % 3) * kMs);
    s.addOp(2, k, at + 150 * kMs);
  }
  auto out = s.analyze(t0 + 4000 * kMs, {true, true, true}, {"a", "b", "c"});
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].kind, "noncomm_slow");
  EXPECT_EQ(out[0].ranks, std::vector<int>({2}));
  EXPECT_NEAR(out[0].lateMs, 149, 3);
  // Reported once, not again at the next look.
  EXPECT_TRUE(s.analyze(t0 + 4100 * kMs, {true, true, true}, {"a", "b", "c"}).empty());
}

TEST(SlowDetect, RankLateOnlyBecauseItsLastCollectiveEndedLateIsNoStraggler) {
  // Rank 2 enters 150 ms after the others every time, but it left the collective before 150 ms
  // after them too (the last hop of a ring): its time outside c4comm is the same as theirs.
  SlowDetector s;
  s.configure(quick());
  const int64_t t0 = 1000 * kMs;
  for (int k = 0; k < 12; ++k) {
    const int64_t at = t0 + k * 300 * kMs;
    s.addOp(0, k, at, 2 * kMs);
    s.addOp(1, k, at + kMs, 2 * kMs);
    s.addOp(2, k, at + 150 * kMs, 3 * kMs);
  }
  EXPECT_TRUE(s.analyze(t0 + 4000 * kMs, {true, true, true}, {"a", "b", "c"}).empty());
  // The same arrivals with rank 2 computing 148 ms longer than the others: a straggler.
  SlowDetector t;
  t.configure(quick());
  for (int k = 0; k < 12; ++k) {
    const int64_t at = t0 + k * 300 * kMs;
    t.addOp(0, k, at, 2 * kMs);
    t.addOp(1, k, at + kMs, 2 * kMs);
    t.addOp(2, k, at + 150 * kMs, 150 * kMs);
  }
  auto out = t.analyze(t0 + 4000 * kMs, {true, true, true}, {"a", "b", "c"});
  ASSERT_EQ(out.size(), 1u);
  EXPECT_NEAR(out[0].lateMs, 148, 1);
}

TEST(SlowDetect, NoisyArrivalsAreNoStraggler) {
  SlowDetector s;
  s.configure(quick());
  const int64_t t0 = 1000 * kMs;
  for (int k = 0; k < 30; ++k)
    for (int r = 0; r < 4; ++r) s.addOp(r, k, t0 + k * 200 * kMs + ((k * 7 + r * 13) % 40) * kMs);  // 0..39 ms
  EXPECT_TRUE(s.analyze(t0 + 7000 * kMs, {true, true, true, true}, {"a", "b", "c", "d"}).empty());
}

TEST(SlowDetect, FewCollectivesSayNothing) {
  SlowDetector s;
  s.configure(quick());
  for (int k = 0; k < 5; ++k) {
    s.addOp(0, k, k * 1000 * kMs);
    s.addOp(1, k, k * 1000 * kMs + 500 * kMs);
  }
  EXPECT_TRUE(s.analyze(6000 * kMs, {true, true}, {"a", "b"}).empty());
}

// Receiver r's cumulative rates from each sender, as the heartbeats carry them.
void rates(SlowDetector& s, int64_t now, int r, const std::vector<std::pair<int, double>>& mbps, double secs) {
  std::vector<PeerRate> v;
  for (auto& p : mbps) {
    PeerRate pr;
    pr.peer = p.first;
    pr.ns = static_cast<uint64_t>(secs * 1e9);
    pr.bytes = static_cast<uint64_t>(p.second * 1e6 * secs);
    pr.lanes = "10.0.0." + std::to_string(r) + ":1 <- 10.0.0." + std::to_string(p.first) + ":2";
    v.push_back(pr);
  }
  s.addRates(r, now, v);
}

// A ring 0 -> 1 -> 2 -> 3 -> 0 whose hop r -> r+1 runs at mbps[r] for 5 looks 2 s apart; analyzed.
std::vector<Diagnosis> ring4(const std::vector<double>& mbps) {
  SlowDetector s;
  s.configure(quick());
  for (int step = 0; step <= 5; ++step)
    for (int r = 0; r < 4; ++r) rates(s, step * 2000 * kMs, (r + 1) % 4, {{r, mbps[r]}}, step * 1.0);
  return s.analyze(10000 * kMs, {true, true, true, true}, {"a", "b", "c", "d"});
}

TEST(SlowDetect, OneSlowPairIsASlowLink) {
  auto out = ring4({1000, 100, 1000, 1000});  // the link 1 -> 2 at 10%
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].kind, "comm_slow");
  ASSERT_EQ(out[0].links.size(), 1u);
  EXPECT_EQ(out[0].links[0], std::make_pair(1, 2));
  EXPECT_EQ(out[0].hosts, std::vector<std::string>({"b", "c"}));
  EXPECT_NE(out[0].evidence.find("10.0.0.2:1 <- 10.0.0.1:2"), std::string::npos) << out[0].evidence;
}

TEST(SlowDetect, AllPairsOfOneRankSlowIsASlowNode) {
  auto out = ring4({1000, 90, 110, 1000});  // rank 2's NIC slow both ways: 1 -> 2 and 2 -> 3
  ASSERT_EQ(out.size(), 1u) << (out.size() > 1 ? out[1].summary : "");
  EXPECT_EQ(out[0].kind, "comm_slow");
  EXPECT_EQ(out[0].ranks, std::vector<int>({2}));
  EXPECT_TRUE(out[0].links.empty());
  EXPECT_NE(out[0].summary.find("node or NIC"), std::string::npos);
}

TEST(SlowDetect, EvenRatesAndTransientDipsAreNotSlow) {
  SlowDetector::Config c;
  c.confirmations = 3;
  SlowDetector s;
  s.configure(c);
  uint64_t b[4] = {0, 0, 0, 0};
  for (int step = 0; step <= 20; ++step) {
    const int64_t now = step * 1000 * kMs;
    for (int r = 0; r < 4; ++r) {
      // A dip to 30% in one look of one pair: not three looks in a row.
      const double mbps = (step == 7 && r == 2) ? 300 : 900 + 50 * ((step + r) % 3);
      b[r] += static_cast<uint64_t>(mbps * 1e6 * 0.5);
      PeerRate pr;
      pr.peer = (r + 3) % 4;
      pr.bytes = b[r];
      pr.ns = static_cast<uint64_t>(step) * 500000000ull;
      s.addRates(r, now, {pr});
    }
    auto out = s.analyze(now, {true, true, true, true}, {"a", "b", "c", "d"});
    EXPECT_TRUE(out.empty()) << "step " << step << ": " << out[0].summary;
  }
}

// ---- C4_FAULT ----

TEST(Faults, ParsesEveryKind) {
  std::vector<FaultSpec> f;
  ASSERT_TRUE(parseFaults("delay:rank=1,from=3,ms=150;kill:rank=2,op=7;stop:op=4;stall:rank=0,peer=1,op=3,lane=0;"
                          "drop:rank=1,peer=0,op=9",
                          &f)
                  .isOk());
  ASSERT_EQ(f.size(), 5u);
  EXPECT_EQ(f[0].kind, FaultSpec::kDelay);
  EXPECT_EQ(f[0].rank, 1);
  EXPECT_EQ(f[0].op, -1);
  EXPECT_EQ(f[0].from, 3);
  EXPECT_EQ(f[0].ms, 150);
  EXPECT_EQ(f[1].kind, FaultSpec::kKill);
  EXPECT_EQ(f[1].op, 7);
  EXPECT_EQ(f[2].rank, -1);
  EXPECT_EQ(f[3].kind, FaultSpec::kStall);
  EXPECT_EQ(f[3].peer, 1);
  EXPECT_EQ(f[3].lane, 0);
  EXPECT_EQ(f[4].kind, FaultSpec::kDrop);
  EXPECT_TRUE(parseFaults("", &f).isOk());
  EXPECT_TRUE(f.empty());
}

TEST(Faults, BadSpecsAreClearErrors) {
  std::vector<FaultSpec> f;
  for (const char* bad :
       {"explode:op=1", "kill:rank=1", "delay:rank=1", "kill:op=x", "kill:op=-1", "kill:op=2,color=3", "stall:peer"}) {
    Status st = parseFaults(bad, &f);
    EXPECT_EQ(st.code(), Code::kInvalidArgument) << bad;
    EXPECT_NE(st.message().find("C4_FAULT"), std::string::npos) << st.message();
  }
}

}  // namespace
}  // namespace c4
