// C4D's reading of a peer's heartbeat (core/heartbeat_wire.hpp), for the faults fuzzing found
// (tests/fuzz/regressions/heartbeat, docs/fuzzing.md).
#include "core/heartbeat_wire.hpp"

#include <gtest/gtest.h>

#include <string>

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

}  // namespace
}  // namespace c4
