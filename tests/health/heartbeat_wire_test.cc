// C4D's reading of a peer's heartbeat (core/heartbeat_wire.hpp), for the faults fuzzing found
// (tests/fuzz/regressions/heartbeat, docs/fuzzing.md).
#include "core/heartbeat_wire.hpp"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace c4 {
namespace {

constexpr int64_t kNow = int64_t{1000000} * 1000000000;

Status parse(const std::string& text, Heartbeat* hb, bool* heard) {
  return parseHeartbeat(text.data(), text.size(), 1, kNow, hb, heard);
}

TEST(HeartbeatWire, AHeartbeatIsRead) {
  Heartbeat hb;
  bool heard = false;
  ASSERT_TRUE(parse(R"({"v":1,"e":4,"ea":3,"l":3,"la":2,"st":5,"w":[0,2],"k":[2],"ops":[[3,1000,-1]],)"
                    R"("rates":[[0,100,200,2,0,"a -> b"]]})",
                    &hb, &heard)
                  .isOk());
  EXPECT_TRUE(heard);
  EXPECT_EQ(hb.entered, 4u);
  EXPECT_EQ(hb.enteredAtNs, kNow - 3000000);
  EXPECT_EQ(hb.stalledAtNs, kNow - 5000000);
  EXPECT_EQ(hb.waitingOn, (std::vector<int>{0, 2}));
  ASSERT_EQ(hb.ops.size(), 1u);
  EXPECT_EQ(hb.ops[0].enterNs, kNow - 1000000);
  EXPECT_EQ(hb.ops[0].gapNs, -1);
  ASSERT_EQ(hb.rates.size(), 1u);
  EXPECT_EQ(hb.rates[0].lanes, "a -> b");
}

TEST(HeartbeatWire, AVersionThatIsNotANumberIsMalformedNotAnException) {
  // j.value("v", 0) threw here, outside any try: the peer's heartbeat ended the process.
  Heartbeat hb;
  bool heard = true;
  EXPECT_FALSE(parse(R"({"v":"1"})", &hb, &heard).isOk());
  EXPECT_FALSE(heard);
  EXPECT_FALSE(parse("[1]", &hb, &heard).isOk());
  EXPECT_FALSE(parse("{", &hb, &heard).isOk());
}

TEST(HeartbeatWire, NumbersOutOfRangeAreMalformed) {
  Heartbeat hb;
  bool heard = false;
  // A float beyond uint64_t was converted to it (undefined behaviour).
  EXPECT_FALSE(parse(R"({"v":1,"e":6.7e22})", &hb, &heard).isOk());
  EXPECT_TRUE(heard);  // the peer is alive all the same
  // Ages times 10^6 overflowed.
  EXPECT_FALSE(parse(R"({"v":1,"ea":9223372036854775807})", &hb, &heard).isOk());
  EXPECT_FALSE(parse(R"({"v":1,"ops":[[1,9223372036854775807]]})", &hb, &heard).isOk());
  EXPECT_FALSE(parse(R"({"v":1,"w":[1e300]})", &hb, &heard).isOk());
  EXPECT_FALSE(parse(R"({"v":1,"rates":[[0,1,2]]})", &hb, &heard).isOk());
  EXPECT_FALSE(parse(R"({"v":1,"diag":[]})", &hb, &heard).isOk());
}

// Seen on CI: C4D.CleanNoisyRunHasNoDiagnosis found a straggler in a clean run. A heartbeat's
// times are its ages subtracted from its arrival, so a rank whose heartbeats waited longer (in the
// reporter's 50 ms tick, in queues, behind other work on a loaded machine) seemed to arrive later at
// every collective. Here every rank enters each collective within 5 ms of the others, outside
// c4comm alike; rank 2's heartbeats mostly wait 200 ms on the way, now and then 1 ms. Read as they
// arrive, rank 2 is a straggler; with HeartbeatDelay nobody is.
std::vector<Diagnosis> stragglersWithDelayedHeartbeats(bool align) {
  SlowDetector slow;
  HeartbeatDelay delay[3];
  const int64_t ms = 1000000, clock2 = 123456 * ms;  // rank 2's clock runs ahead of the reporter's
  std::vector<Diagnosis> found;
  uint64_t seq = 0;
  for (int beat = 0; beat < 60; ++beat) {
    const int64_t sent = kNow + beat * 100 * ms;  // the reporter's clock
    // Two collectives per 100 ms; rank 1 enters 2 ms, rank 2 4 ms after the reporter.
    std::string ops1, ops2;
    for (int k = 0; k < 2; ++k, ++seq) {
      const int64_t enter = sent - (50 - 50 * k) * ms;
      slow.addOp(0, seq, enter, 10 * ms);
      const std::string a1 = std::to_string((sent - enter - 2 * ms) / 1000),
                        a2 = std::to_string((sent - enter - 4 * ms) / 1000);
      ops1 += (k ? "," : "") + ("[" + std::to_string(seq) + "," + a1 + ",-1]");
      ops2 += (k ? "," : "") + ("[" + std::to_string(seq) + "," + a2 + ",-1]");
    }
    const struct {
      int rank;
      int64_t delayNs, clockNs;
      std::string ops;
    } hbs[2] = {{1, 1 * ms, 0, ops1}, {2, beat % 8 == 0 ? 1 * ms : 200 * ms, clock2, ops2}};
    for (const auto& h : hbs) {
      const std::string text =
          "{\"v\":1,\"t\":" + std::to_string((sent + h.clockNs) / 1000) + ",\"ops\":[" + h.ops + "]}";
      Heartbeat hb;
      bool heard = false;
      const int64_t arrived = sent + h.delayNs;
      EXPECT_TRUE(parseHeartbeat(text.data(), text.size(), h.rank, arrived, &hb, &heard).isOk()) << text;
      EXPECT_EQ(hb.sentNs, sent + h.clockNs);
      if (align) delay[h.rank].align(arrived, &hb);
      for (const Heartbeat::Op& op : hb.ops) slow.addOp(h.rank, op.seq, op.enterNs, op.gapNs);
    }
    for (Diagnosis& d : slow.analyze(sent + 250 * ms, {true, true, true}, {"h", "h", "h"})) found.push_back(d);
  }
  return found;
}

TEST(HeartbeatWire, DeliveryDelaysDoNotMakeAStraggler) {
  const std::vector<Diagnosis> raw = stragglersWithDelayedHeartbeats(false);
  ASSERT_FALSE(raw.empty()) << "the scenario no longer shows the fault";
  EXPECT_EQ(raw[0].kind, "noncomm_slow");
  EXPECT_EQ(raw[0].ranks, std::vector<int>{2});
  const std::vector<Diagnosis> aligned = stragglersWithDelayedHeartbeats(true);
  for (const Diagnosis& d : aligned) ADD_FAILURE() << "false diagnosis " << d.kind << ": " << d.summary;
}

TEST(HeartbeatWire, DelayIsMeasuredAgainstTheLeastSeenAndForgetsOldWindows) {
  constexpr int64_t ms = 1000000;
  HeartbeatDelay d(1000 * ms);
  auto beat = [&](int64_t sentNs, int64_t arrivedNs) {
    Heartbeat hb;
    hb.sentNs = sentNs;
    hb.enteredAtNs = arrivedNs - 7 * ms;
    hb.ops.push_back({1, arrivedNs - 3 * ms, -1});
    const int64_t extra = d.align(arrivedNs, &hb);
    EXPECT_EQ(hb.enteredAtNs, arrivedNs - 7 * ms - extra);
    EXPECT_EQ(hb.ops[0].enterNs, arrivedNs - 3 * ms - extra);
    return extra;
  };
  EXPECT_EQ(beat(0, 50 * ms), 0);                // the first sets the floor: 50 ms
  EXPECT_EQ(beat(100 * ms, 230 * ms), 80 * ms);  // 130 ms: 80 beyond it
  EXPECT_EQ(beat(200 * ms, 210 * ms), 0);        // a new floor: 10 ms
  EXPECT_EQ(beat(300 * ms, 350 * ms), 40 * ms);
  // Two windows later the old floor is forgotten (the clocks drifted 30 ms apart).
  EXPECT_EQ(beat(1300 * ms, 1340 * ms), 30 * ms);  // the previous window's floor still counts
  EXPECT_EQ(beat(2400 * ms, 2440 * ms), 0);        // floor of the last two windows: 40 ms
  EXPECT_EQ(beat(2500 * ms, 2545 * ms), 5 * ms);
  // A sender that does not say when it sent is left as it is.
  Heartbeat old;
  old.ops.push_back({1, 42, -1});
  EXPECT_EQ(d.align(3000 * ms, &old), 0);
  EXPECT_EQ(old.ops[0].enterNs, 42);
  // "t" is read, and out of range is malformed.
  bool heard = false;
  EXPECT_TRUE(parse(R"({"v":1,"t":5})", &old, &heard).isOk());
  EXPECT_EQ(old.sentNs, 5000);
  EXPECT_FALSE(parse(R"({"v":1,"t":-1})", &old, &heard).isOk());
  EXPECT_FALSE(parse(R"({"v":1,"t":9223372036854775807})", &old, &heard).isOk());
}

}  // namespace
}  // namespace c4
