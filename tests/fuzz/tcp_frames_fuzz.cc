// Fuzz target: the frames of an established tcp lane (transports/tcp/tcp_wire.hpp). Each header is
// checked by tcpwire::checkFrame, as TcpConnection::startPiece does, and what it accepts is handled
// the way the connection's receiver relies on it: a data piece is recorded in its message's set of
// pieces (tcpwire::PieceSet, as for a message not posted yet) and indexes the bitmap its receive
// will have (sized by tcpwire::piecesOf), an acknowledgement names a piece of a message sent, a
// retirement a lane. The first byte picks the piece size (4 KiB << k, as C4_TCP_PIECE_BYTES
// allows), the second whether acknowledgements are on; then frames follow.
#include <map>
#include <string>
#include <vector>

#include "fuzz_util.hpp"
#include "transports/tcp/tcp_wire.hpp"

using namespace c4;             // NOLINT(google-build-using-namespace): a fuzz target's own translation unit
using namespace c4::transport;  // NOLINT(google-build-using-namespace)

namespace {

bool testBit(const std::vector<uint64_t>& b, uint32_t i) { return (b[i >> 6] >> (i & 63)) & 1u; }
void setBit(std::vector<uint64_t>& b, uint32_t i) { b[i >> 6] |= uint64_t{1} << (i & 63); }

// A message whose pieces arrive before its receive is posted (TcpConnection's UnexpMsg).
struct Message {
  uint64_t total = 0;
  OpSig sig{};
  tcpwire::PieceSet seen;
};

bool sameSig(const OpSig& a, const OpSig& b) {
  return a.seq == b.seq && a.count == b.count && a.root == b.root && a.coll == b.coll && a.dtype == b.dtype &&
         a.op == b.op;
}

constexpr int kLanes = 2;
constexpr uint64_t kSent = 4;  // messages this side sent, seq 0..3, of 1, 2, 3 and 4 pieces

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  fuzz::Input in(data, size);
  const size_t pb = size_t{4096} << (in.take<uint8_t>() % 15);  // 4 KiB .. 64 MiB
  const tcpwire::FrameRules rules{pb, (in.take<uint8_t>() & 1) != 0};
  std::map<uint64_t, Message> unexp;
  size_t unexpBytes = 0;
  std::vector<std::vector<uint64_t>> acked(kSent);
  for (uint64_t s = 0; s < kSent; ++s) acked[s].assign(1, 0);
  while (in.left() > 0) {
    const tcpwire::FrameHdr h = in.take<tcpwire::FrameHdr>();
    if (!in.ok()) return 0;  // a partial header: the lane waits for more
    uint32_t piece = 0;
    Status bad = tcpwire::checkFrame(h, rules, &piece);
    if (!bad.isOk()) {
      C4_FUZZ_CHECK(!bad.message().empty(), "a violation without words");
      return 0;  // the connection fails
    }
    if (h.type == tcpwire::kData) {
      const uint32_t pieces = tcpwire::piecesOf(h.total, pb);
      C4_FUZZ_CHECK(piece < pieces, "piece %u of a %u-piece message (total %llu)", piece, pieces,
                    static_cast<unsigned long long>(h.total));
      C4_FUZZ_CHECK(h.offset + h.bytes <= h.total || h.total == 0, "piece past the end");
      // startPiece on a message not posted yet; the payload is then read (pieces larger than what
      // is left of the input are as good as read: the bitmap is what is checked).
      if (unexpBytes > 0 && unexpBytes + h.bytes > (64u << 20)) return 0;  // the lane stops reading
      Message& m = unexp[h.seq];
      if (!m.seen.known) {
        m.total = h.total;
        m.sig = h.sig;
        m.seen.known = true;
      } else if (!sameSig(h.sig, m.sig) || m.total != h.total) {
        return 0;  // protocol violation: the connection fails
      }
      in.skip(h.bytes);
      unexpBytes += h.bytes;
      // finishPiece: a piece is counted once.
      if (!m.seen.has(piece)) m.seen.add(piece);
      // A receive of this size, once posted, keeps a bitmap of its pieces (irecv): the piece fits it.
      if (pieces <= 4096) {
        std::vector<uint64_t> bits((static_cast<size_t>(pieces) + 63) / 64, 0);
        if (!testBit(bits, piece)) setBit(bits, piece);
      }
      continue;
    }
    std::vector<char> payload(h.bytes);
    in.bytes(payload.data(), payload.size());
    switch (h.type) {
      case tcpwire::kAbort:
      case tcpwire::kRetire: {
        const std::string reason(payload.data(), payload.size());
        C4_FUZZ_CHECK(reason.size() <= tcpwire::kMaxReason, "a reason of %zu bytes", reason.size());
        if (h.type == tcpwire::kAbort) return 0;
        if (h.offset >= static_cast<uint64_t>(kLanes)) return 0;  // protocol violation
        break;
      }
      case tcpwire::kAck: {
        C4_FUZZ_CHECK(rules.acks && payload.size() % sizeof(tcpwire::AckEntry) == 0, "an ack of %zu bytes",
                      payload.size());
        std::vector<tcpwire::AckEntry> e(payload.size() / sizeof(tcpwire::AckEntry));
        if (!e.empty()) memcpy(static_cast<void*>(e.data()), payload.data(), payload.size());
        for (const tcpwire::AckEntry& a : e) {
          if (a.seq >= kSent) return 0;  // never sent: protocol violation
          if (a.piece >= a.seq + 1) return 0;
          setBit(acked[a.seq], a.piece);
        }
        break;
      }
      default:
        C4_FUZZ_CHECK(h.bytes == 0, "control frame 0x%08x with %u bytes", h.type, h.bytes);
        break;
    }
  }
  return 0;
}
