// The bootstrap's checks of what arrives (core/bootstrap_wire.hpp), for the faults fuzzing found
// (tests/fuzz/regressions/bootstrap_msgs, docs/fuzzing.md).
#include "core/bootstrap_wire.hpp"

#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

namespace c4 {
namespace {

using namespace bootwire;  // NOLINT(google-build-using-namespace): the names under test

RegisterMsg registration(int rank, int nranks) {
  RegisterMsg m;
  memset(static_cast<void*>(&m), 0, sizeof(m));
  m.magic = kRegisterMagic;
  m.rank = rank;
  m.nranks = nranks;
  return m;
}

TEST(BootstrapWire, RootRefusesMoreRanksThanACommunicatorMayHave) {
  auto none = [](int) -> const RankInfo* { return nullptr; };
  EXPECT_EQ(checkRegistration(registration(0, kMaxRanks), -1, -1, none), "");
  // The first registration sizes the root's table: 2^31 - 1 ranks made it allocate 16 GiB.
  const std::string err = checkRegistration(registration(0, 0x7fffffff), -1, -1, none);
  EXPECT_NE(err.find("more than a communicator may have"), std::string::npos) << err;
  EXPECT_NE(checkRegistration(registration(3, 2), -1, -1, none), "");
}

TEST(BootstrapWire, TableHostnamesAreTerminated) {
  TableEntry e;
  memset(static_cast<void*>(&e), 0, sizeof(e));
  memset(e.info.hostname, 'h', sizeof(e.info.hostname));  // no NUL in all 64 bytes
  e.addr.family = 4;
  e.addr.port = 5;
  ReplyHdr rh{kReplyMagic, 0, sizeof(e), 0};
  std::vector<char> body(sizeof(e));
  memcpy(body.data(), &e, sizeof(e));
  std::vector<RankInfo> infos;
  std::vector<detail::SockAddr> addrs;
  ASSERT_TRUE(decodeReply(rh, body, 1, "rank", &infos, &addrs).isOk());
  EXPECT_EQ(strnlen(infos[0].hostname, sizeof(infos[0].hostname)), sizeof(infos[0].hostname) - 1);
  EXPECT_FALSE(decodeReply(rh, body, 2, "rank", &infos, &addrs).isOk());  // the wrong size
}

TEST(BootstrapWire, FrameReaderGrowsWithWhatArrivesNotWithTheHeader) {
  FrameReader r;
  FrameHdr h{kFrameMagic, 7, 1ull << 35};  // 32 GiB announced, a few bytes sent
  size_t room = 0;
  memcpy(r.next(&room), &h, sizeof(h));
  ASSERT_EQ(room, sizeof(h));
  ASSERT_TRUE(r.advance(sizeof(h)).isOk());
  r.next(&room);
  EXPECT_LE(room, size_t{64} << 10);
  // Frames arrive whole, in any pieces.
  FrameReader s;
  const std::string text = "hello";
  std::vector<char> stream(sizeof(FrameHdr) + text.size());
  FrameHdr t{kFrameMagic, 9, text.size()};
  memcpy(stream.data(), &t, sizeof(t));
  memcpy(stream.data() + sizeof(t), text.data(), text.size());
  for (char c : stream) {
    ASSERT_FALSE(s.ready());
    *s.next(&room) = c;
    ASSERT_TRUE(s.advance(1).isOk());
  }
  ASSERT_TRUE(s.ready());
  uint32_t tag = 0;
  std::vector<char> payload;
  s.take(&tag, &payload);
  EXPECT_EQ(tag, 9u);
  EXPECT_EQ(std::string(payload.begin(), payload.end()), text);
  FrameHdr bad{kFrameMagic + 1, 0, 0};
  FrameReader b;
  memcpy(b.next(&room), &bad, sizeof(bad));
  EXPECT_FALSE(b.advance(sizeof(bad)).isOk());
}

}  // namespace
}  // namespace c4
