#include "transports/tcp/tcp_wire.hpp"

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "common/siphash.hpp"
#include "common/status.hpp"

namespace c4::transport::tcpwire {

namespace {
void keyBytes(const uint64_t key[2], uint8_t out[16]) {
  for (int i = 0; i < 8; ++i) {
    out[i] = static_cast<uint8_t>(key[0] >> (8 * i));
    out[8 + i] = static_cast<uint8_t>(key[1] >> (8 * i));
  }
}
}  // namespace

uint64_t handshakeMac(const uint64_t key[2], bool acceptor, const Hello& hello, uint64_t acceptorNonce) {
  uint8_t k[16];
  keyBytes(key, k);
  SipHasher h(k);
  const char* role = acceptor ? "c4tcp-acceptor" : "c4tcp-initiator";
  h.update(role, strlen(role) + 1);
  h.update(&hello, sizeof(hello));
  h.update(&acceptorNonce, sizeof(acceptorNonce));
  return h.finish();
}

uint64_t tagHash(const uint64_t key[2], const char* tag, size_t len) {
  uint8_t k[16];
  keyBytes(key, k);
  SipHasher h(k);
  h.update("c4tcp-tag", 10);
  h.update(tag, len);
  return h.finish();
}

std::string checkHello(const Hello& h, const HelloExpect& e, bool* probe) {
  *probe = false;
  if (h.magic == kProbeMagic) {
    *probe = true;
    return strFormat("liveness probe from rank %d", h.from);
  }
  if (h.magic != kHelloMagic) return "not a c4comm tcp lane (bad magic)";
  if (h.version != kVersion) return strFormat("protocol version %u, this rank speaks %u", h.version, kVersion);
  if (h.tagHash != e.tagHash) return "for another communicator (or a different key)";
  if (h.to != e.rank || h.from < 0 || h.from >= e.rank || h.lane < 0 || h.lane > e.maxLane || h.nlanes != e.nlanes)
    return strFormat("bad lane identity (from rank %d to rank %d, lane %d of %d)", h.from, h.to, h.lane, h.nlanes);
  return std::string();
}

bool challengeValid(const uint64_t key[2], const Hello& hello, const Challenge& ch) {
  return ch.magic == kChallengeMagic && ch.mac == handshakeMac(key, true, hello, ch.nonce);
}

bool proofValid(const uint64_t key[2], const Hello& hello, uint64_t acceptorNonce, const Proof& pr) {
  return pr.magic == kProofMagic && pr.mac == handshakeMac(key, false, hello, acceptorNonce);
}

uint32_t piecesOf(uint64_t total, size_t pieceBytes) {
  const uint64_t n = total == 0 ? 1 : (total - 1) / pieceBytes + 1;
  return n > UINT32_MAX ? 0 : static_cast<uint32_t>(n);
}

Status checkFrame(const FrameHdr& h, const FrameRules& rules, uint32_t* piece) {
  const size_t pb = rules.pieceBytes;
  size_t limit = 0;
  switch (h.type) {
    case kData: {
      const bool shape = h.total == 0 ? h.offset == 0 && h.bytes == 0
                                      : h.offset < h.total && h.offset % pb == 0 &&
                                            h.bytes == std::min<uint64_t>(pb, h.total - h.offset);
      if (!shape)
        return makeError(
            Code::kInvalidUsage, "piece [%llu, +%u) of a %llu-byte message is not one of its %zu-byte pieces",
            static_cast<unsigned long long>(h.offset), h.bytes, static_cast<unsigned long long>(h.total), pb);
      // Found by fuzzing: the receiver sizes a message's bitmap of pieces by piecesOf (32 bits); a
      // total with more pieces wrapped it to a bitmap too small for the piece index (out of bounds).
      if ((h.total - (h.total > 0)) / pb >= UINT32_MAX)
        return makeError(Code::kInvalidUsage, "a %llu-byte message has more than %u pieces of %zu bytes",
                         static_cast<unsigned long long>(h.total), UINT32_MAX, pb);
      *piece = static_cast<uint32_t>(h.offset / pb);
      return Status::ok();
    }
    case kAbort:
    case kRetire:
      limit = kMaxReason;
      break;
    case kAck:
      if (!rules.acks)
        return makeError(Code::kInvalidUsage, "an acknowledgement, but the ranks agreed on C4_TCP_ACK=0");
      limit = kMaxAckEntries * sizeof(AckEntry);
      if (h.bytes % sizeof(AckEntry) != 0) return makeError(Code::kInvalidUsage, "acknowledgement of a partial entry");
      break;
    case kPause:
    case kResume:
    case kPing:
    case kPong:
      limit = 0;
      break;
    default:
      return makeError(Code::kInvalidUsage, "unknown frame type 0x%08x", h.type);
  }
  if (h.bytes > limit)
    return makeError(Code::kInvalidUsage, "control frame 0x%08x of %u bytes (at most %zu)", h.type, h.bytes, limit);
  return Status::ok();
}

}  // namespace c4::transport::tcpwire
