// The tcp transport's checks of what arrives (transports/tcp/tcp_wire.hpp), for the faults fuzzing
// found (tests/fuzz/regressions/tcp_frames, docs/fuzzing.md).
#include "transports/tcp/tcp_wire.hpp"

#include <gtest/gtest.h>

#include <cstdint>

namespace c4::transport {
namespace {

tcpwire::FrameHdr piece(uint64_t offset, uint32_t bytes, uint64_t total) {
  tcpwire::FrameHdr h{};
  h.type = tcpwire::kData;
  h.offset = offset;
  h.bytes = bytes;
  h.total = total;
  return h;
}

TEST(TcpWire, MessagesOfMoreThan2To32PiecesAreRefused) {
  const tcpwire::FrameRules rules{4096, true};
  uint32_t index = 0;
  // The last of UINT32_MAX pieces is fine.
  const uint64_t most = uint64_t{UINT32_MAX} * 4096;
  ASSERT_TRUE(tcpwire::checkFrame(piece(most - 4096, 4096, most), rules, &index).isOk());
  EXPECT_EQ(index, UINT32_MAX - 1);
  EXPECT_EQ(tcpwire::piecesOf(most, 4096), UINT32_MAX);
  // One more piece wrapped the receiver's 32-bit count of pieces to 0 (a bitmap of no words).
  EXPECT_FALSE(tcpwire::checkFrame(piece(0, 4096, most + 1), rules, &index).isOk());
  EXPECT_EQ(tcpwire::piecesOf(most + 1, 4096), 0u);
  EXPECT_FALSE(tcpwire::checkFrame(piece(0, 4096, ~uint64_t{0}), rules, &index).isOk());
  EXPECT_TRUE(tcpwire::checkFrame(piece(0, 0, 0), rules, &index).isOk());
  EXPECT_FALSE(tcpwire::checkFrame(piece(4096, 10, 4106 + 1), rules, &index).isOk());  // not its last piece's size
}

TEST(TcpWire, PieceSetHoldsOnlyWhatArrived) {
  tcpwire::PieceSet s;
  EXPECT_FALSE(s.has(UINT32_MAX - 1));
  s.add(UINT32_MAX - 1);
  s.add(3);
  s.add(3);
  EXPECT_TRUE(s.has(3));
  EXPECT_TRUE(s.has(UINT32_MAX - 1));
  EXPECT_FALSE(s.has(4));
  EXPECT_EQ(s.whole.size(), 2u);
}

TEST(TcpWire, ControlFrames) {
  uint32_t index = 0;
  tcpwire::FrameHdr h{};
  h.type = tcpwire::kAck;
  h.bytes = 2 * sizeof(tcpwire::AckEntry);
  EXPECT_TRUE(tcpwire::checkFrame(h, {4096, true}, &index).isOk());
  EXPECT_FALSE(tcpwire::checkFrame(h, {4096, false}, &index).isOk());
  h.bytes = 17;
  EXPECT_FALSE(tcpwire::checkFrame(h, {4096, true}, &index).isOk());
  h.type = tcpwire::kPing;
  h.bytes = 1;
  EXPECT_FALSE(tcpwire::checkFrame(h, {4096, true}, &index).isOk());
  h.type = 0x12345678;
  h.bytes = 0;
  EXPECT_FALSE(tcpwire::checkFrame(h, {4096, true}, &index).isOk());
}

}  // namespace
}  // namespace c4::transport
