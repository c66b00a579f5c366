// Wire format of the tcp transport (see docs/tcp-transport.md) and the pure checks of what arrives
// (tcp_wire.cc): the handshake's messages and each frame header. Shared with its tests, which
// impersonate peers, and with the fuzz targets (tests/fuzz), which run exactly these checks.
// Fields are in host byte order: every rank of a communicator must share the byte order (checked
// by the magic numbers).
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "c4comm/status.hpp"
#include "common/opsig.hpp"

namespace c4::transport::tcpwire {

constexpr uint32_t kHelloMagic = 0x70743463u;      // "c4tp"
constexpr uint32_t kChallengeMagic = 0x68633463u;  // "c4ch"
constexpr uint32_t kProofMagic = 0x72703463u;      // "c4pr"
constexpr uint32_t kProbeMagic = 0x62703463u;      // "c4pb": a liveness probe, closed right after its Hello
// 2: acknowledged pieces (kAck), lane retirement (kRetire), receiver pauses (kPause / kResume),
// lane probes (kPing / kPong).
constexpr uint32_t kVersion = 2;

/// Initiator (lower rank) -> acceptor, first bytes on a new lane.
struct Hello {
  uint32_t magic;
  uint32_t version;
  uint64_t tagHash;  // SipHash(key, commTag)
  int32_t from;      // initiator's rank
  int32_t to;        // acceptor's rank
  int32_t lane;      // index of this lane (lanes added later have indices >= nlanes)
  int32_t nlanes;    // lanes each connection opens at first (C4_LANES)
  uint64_t nonce;    // initiator's fresh nonce
};
static_assert(sizeof(Hello) == 40, "wire layout");

/// Acceptor -> initiator: its nonce and its proof of the key over (hello, nonce).
struct Challenge {
  uint32_t magic;
  uint32_t pad;
  uint64_t nonce;
  uint64_t mac;
};
static_assert(sizeof(Challenge) == 24, "wire layout");

/// Initiator -> acceptor: its proof of the key over (hello, acceptor's nonce).
struct Proof {
  uint32_t magic;
  uint32_t pad;
  uint64_t mac;
};
static_assert(sizeof(Proof) == 16, "wire layout");

enum FrameType : uint32_t {
  kData = 0x61746164u,    // "data": a piece of message `seq`
  kAbort = 0x74726261u,   // "abrt": the sender aborts; payload: reason text
  kAck = 0x6e6b6361u,     // "ackn": pieces received; payload: AckEntry[bytes / sizeof(AckEntry)]
  kRetire = 0x72746572u,  // "retr": the sender retired lane `offset`; payload: reason text
  kPause = 0x73756170u,   // "paus": the sender stopped reading this lane (no room): not a stall
  kResume = 0x6d757372u,  // "rsum": it reads this lane again
  kPing = 0x676e6970u,    // "ping": answer with kPong on this lane (is the peer reading it?)
  kPong = 0x676e6f70u,    // "pong"
};

/// One received piece of message `seq` (its index: offset / piece size). Sent back on the lane
/// the piece arrived on, so that acknowledgements also tell the sender which lanes deliver.
struct AckEntry {
  uint64_t seq;
  uint32_t piece;
  uint32_t pad;
};
static_assert(sizeof(AckEntry) == 16, "wire layout");

/// FrameHdr::flags of a data piece.
constexpr uint32_t kFlagEager = 1;  // the sender does not wait for its acknowledgement (it kept a copy)

/// Header of every frame after the handshake; `bytes` of payload follow it.
struct FrameHdr {
  uint32_t type;
  uint32_t bytes;   // payload bytes of this piece
  uint64_t seq;     // message number in this direction of the connection (0, 1, ...)
  uint64_t offset;  // where the piece goes in the message
  uint64_t total;   // message size
  OpSig sig;        // the sender's signature of the message (every piece)
  uint32_t flags;   // kFlag*
  uint32_t reserved;
};
static_assert(sizeof(FrameHdr) == 64, "wire layout");

/// The proofs: SipHash-2-4 under the 128-bit key of (role, hello, acceptor nonce).
uint64_t handshakeMac(const uint64_t key[2], bool acceptor, const Hello& hello, uint64_t acceptorNonce);
/// SipHash-2-4 of the communicator tag under the key (the hello's tagHash).
uint64_t tagHash(const uint64_t key[2], const char* tag, size_t len);

/// Longest reason text of a kAbort or kRetire frame, and most entries of one kAck frame.
constexpr size_t kMaxReason = 1024;
constexpr size_t kMaxAckEntries = 4096;

/// What the acceptor of a lane expects of its Hello.
struct HelloExpect {
  uint64_t tagHash;  // of its communicator
  int32_t rank;      // its own rank (lanes come from lower ranks)
  int32_t nlanes;    // C4_LANES
  int32_t maxLane;   // highest lane index
};
/// The acceptor's check of a Hello: "" if it opens a lane, else why the connection is dropped. A
/// liveness probe (kProbeMagic) sets *probe (it is dropped quietly).
std::string checkHello(const Hello& h, const HelloExpect& expect, bool* probe);
/// The initiator's check of the acceptor's Challenge to its `hello`: magic and proof of the key.
bool challengeValid(const uint64_t key[2], const Hello& hello, const Challenge& ch);
/// The acceptor's check of the initiator's Proof over (hello, the acceptor's nonce).
bool proofValid(const uint64_t key[2], const Hello& hello, uint64_t acceptorNonce, const Proof& pr);

/// How this rank reads frames (agreed by every rank at setup).
struct FrameRules {
  size_t pieceBytes;  // C4_TCP_PIECE_BYTES (a multiple of 4 KiB)
  bool acks;          // C4_TCP_ACK
};
/// Pieces of a message of `total` bytes (at least 1: an empty message has one empty piece), or 0
/// when there would be more than UINT32_MAX (checkFrame refuses such messages).
uint32_t piecesOf(uint64_t total, size_t pieceBytes);
/// The pieces of a message received whole before its receive was posted. A sorted list, so that
/// its memory follows the pieces that arrived: a bitmap sized by the total a header announces let
/// one 64-byte header make the receiver allocate up to 512 MiB (found by fuzzing).
struct PieceSet {
  bool known = false;           // a piece of the message arrived: its signature and size are set
  std::vector<uint32_t> whole;  // ascending
  bool has(uint32_t piece) const { return std::binary_search(whole.begin(), whole.end(), piece); }
  void add(uint32_t piece) {
    auto it = std::lower_bound(whole.begin(), whole.end(), piece);
    if (it == whole.end() || *it != piece) whole.insert(it, piece);
  }
};

/// The check of a frame header before its payload is read: a data piece must be one of the at
/// most UINT32_MAX pieces of its message (*piece gets its index); a control frame must be of a
/// known type, allowed and no longer than its type allows. The error is the protocol violation,
/// in words.
Status checkFrame(const FrameHdr& h, const FrameRules& rules, uint32_t* piece);

}  // namespace c4::transport::tcpwire
