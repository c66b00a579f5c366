// Wire format of the bootstrap (core/bootstrap.cc) and the pure functions that decode and check
// the bytes that come from outside: the UniqueId, the handshake, the root's registration and reply,
// the ring's step headers and the stream of send/recv frames. bootstrap.cc does the socket I/O and
// calls these; they depend on c4_common only, so the fuzz targets (tests/fuzz, docs/fuzzing.md)
// run exactly this code. All integers are in host byte order (ranks of one communicator share an
// architecture).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "c4comm/c4comm.hpp"
#include "c4comm/status.hpp"
#include "common/socket.hpp"

namespace c4 {

/// What each rank tells the others at bootstrap.
struct RankInfo {
  uint64_t hostId = 0;         // see localHostId()
  uint64_t clockId = 0;        // see localClockId()
  int32_t pid = 0;             // in the rank's own pid namespace: see visiblePid()
  int32_t localRankHint = -1;  // from the launcher, if known
  uint64_t process = 0;        // processToken(): equal only for ranks of one process
  uint64_t pidNs = 0;          // pidNamespaceId()
  char hostname[64] = {0};     // NUL-terminated once decoded (decodeReply)
};

/// `peer`'s pid as this process can use it (/proc/<pid>, pidfd, CMA): its pid where both are on one
/// host and in one pid namespace, else 0 (its pid would name another process here, or none).
inline int32_t visiblePid(const RankInfo& me, const RankInfo& peer) {
  return peer.hostId == me.hostId && peer.pidNs != 0 && peer.pidNs == me.pidNs ? peer.pid : 0;
}

}  // namespace c4

namespace c4::bootwire {

constexpr char kIdMagic[4] = {'c', '4', 'B', 'S'};
constexpr uint16_t kIdVersion = 1;
constexpr uint32_t kProtoVersion = 1;
constexpr uint32_t kChallengeMagic = 0x63344348;  // "HC4c"
constexpr uint32_t kAuthMagic = 0x63344155;       // "UA4c"
constexpr uint32_t kRegisterMagic = 0x63345247;   // "GR4c"
constexpr uint32_t kReplyMagic = 0x63345052;      // "RP4c"
constexpr uint32_t kRingMagic = 0x6334474e;       // "NG4c"
constexpr uint32_t kFrameMagic = 0x63344d46;      // "FM4c"
/// Largest send/recv frame and largest reply body the bootstrap accepts.
constexpr uint64_t kMaxFrameBytes = 1ull << 36;
constexpr uint32_t kMaxReplyBytes = 64u << 20;
/// The most ranks a communicator may have (as the API checks, core/api.cc): the root keeps a table
/// of nranks entries, sized by the first registration.
constexpr int kMaxRanks = 1 << 24;

enum Role : uint32_t { kRoleRoot = 1, kRoleRing = 2, kRoleP2p = 3 };
/// "root", "ring", "send/recv" or "unknown".
const char* roleName(uint32_t role);

/// The first bytes of a UniqueId.
struct IdLayout {
  char magic[4];
  uint16_t version;
  uint16_t reserved;
  detail::WireAddr root;
  uint8_t secret[16];
  uint8_t tag[8];
};
static_assert(sizeof(IdLayout) <= sizeof(UniqueId), "UniqueId layout");

/// Acceptor -> connector, first on every connection.
struct Challenge {
  uint32_t magic;
  uint32_t version;
  uint8_t nonce[16];
};

/// Connector -> acceptor: who it is and its proof of the secret.
struct AuthReq {
  uint32_t magic;
  uint32_t role;
  int32_t rank;
  uint32_t version;
  uint8_t nonce[16];
  uint64_t mac;
};

/// Acceptor -> connector: the acceptor's proof.
struct AuthResp {
  uint32_t magic;
  uint32_t reserved;
  uint64_t mac;
};

/// Rank -> root after the handshake.
struct RegisterMsg {
  uint32_t magic;
  int32_t rank;
  int32_t nranks;
  uint32_t remainingMs;
  RankInfo info;
  detail::WireAddr listen;
};

/// Root -> rank: the answer to a registration.
struct ReplyHdr {
  uint32_t magic;
  int32_t code;    // 0: ok, table follows; else a Code, message text follows
  uint32_t bytes;  // bytes that follow
  uint32_t reserved;
};

/// One rank's row of the root's table.
struct TableEntry {
  RankInfo info;
  detail::WireAddr addr;
};

/// Header of each ring step.
struct RingHdr {
  uint32_t magic;
  uint32_t op;  // 1 allGather, 2 barrier
  uint64_t seq;
  uint64_t bytes;
};

/// Header of each send/recv frame; `bytes` of payload follow.
struct FrameHdr {
  uint32_t magic;
  uint32_t tag;
  uint64_t bytes;
};

/// The 128-bit secret of a UniqueId.
struct Secret {
  uint8_t key[16];
};

/// SipHash(secret, "c4-server"|"c4-client" nonceS role rank nonceC): the handshake's proofs.
uint64_t proofMac(const Secret& s, bool server, const uint8_t nonceS[16], uint32_t role, int32_t rank,
                  const uint8_t nonceC[16]);
/// Compares two proofs without an early exit.
bool macEqual(uint64_t a, uint64_t b);
/// "host pid N" of a rank's info (the hostname need not be NUL-terminated).
std::string describeRank(const RankInfo& info);

/// The root address and the secret of `id`; kInvalidArgument if it is not a c4 UniqueId.
/// `secret` may be null.
Status decodeId(const UniqueId& id, detail::SockAddr* root, Secret* secret);
void encodeId(const detail::SockAddr& root, const Secret& secret, const uint8_t tag[8], UniqueId* id);

/// The connector's check of the acceptor's challenge; errors name `who`.
Status checkChallenge(const Challenge& ch, const std::string& who);
/// The acceptor's check of the first `have` bytes of an AuthReq (fails as soon as the magic is
/// wrong, before the rest arrives).
Status checkAuthReqPrefix(const AuthReq& req, size_t have);
/// The acceptor's check of a whole AuthReq: protocol version and the proof of the secret over its
/// own nonce `nonceS`.
Status checkAuthReq(const AuthReq& req, const Secret& secret, const uint8_t nonceS[16]);
/// The connector's check of the acceptor's proof; errors name `who`.
Status checkAuthResp(const AuthResp& resp, const Secret& secret, const uint8_t nonceS[16], uint32_t role, int32_t rank,
                     const uint8_t nonceC[16], const std::string& who);

/// The root's check of a registration. `nranks` is -1 until the first rank registered (then
/// `firstRank` said it); `registered(r)` is the info of rank r if it registered already, else null
/// (called only for 0 <= r < nranks). Returns "" when the registration is good, else why not.
std::string checkRegistration(const RegisterMsg& r, int nranks, int firstRank,
                              const std::function<const RankInfo*(int)>& registered);

/// The rank's check of the root's reply header; errors name `who` (the root) after `pfx`.
Status checkReplyHdr(const ReplyHdr& rh, const char* pfx, const std::string& who);
/// The rank's reading of the reply body after a good header: an error reply becomes its Status;
/// a table of `nranks` entries becomes `infos` (every hostname NUL-terminated) and `addrs`.
Status decodeReply(const ReplyHdr& rh, const std::vector<char>& body, int nranks, const char* pfx,
                   std::vector<RankInfo>* infos, std::vector<detail::SockAddr>* addrs);

/// The check of ring step `seq` of op `op` ("allGather" / "barrier" is `opName`) with
/// `bytesPerRank`, against what rank `prev` sent; errors start with `prefix`.
Status checkRingHdr(const RingHdr& in, uint32_t op, const char* opName, uint64_t seq, size_t bytesPerRank,
                    const std::string& prefix, int prev);

/// The incoming send/recv stream of one peer: FrameHdr + payload, repeated. The caller reads the
/// socket straight into next() and reports what arrived with advance(). A payload's buffer grows
/// with the bytes that arrived, not with what its header announces (up to kMaxFrameBytes), so a
/// bad or hostile header cannot make the rank allocate memory it was never sent.
class FrameReader {
 public:
  /// Where the next bytes of the stream go and at most how many (*room > 0). Not while ready().
  char* next(size_t* room);
  /// `n` (<= room) bytes were written at next(). A bad header fails the stream for good.
  Status advance(size_t n);
  /// A whole frame arrived: take() it before the next call to next().
  bool ready() const { return ready_; }
  void take(uint32_t* tag, std::vector<char>* payload);

 private:
  FrameHdr hdr_{};
  size_t hdrHave_ = 0;
  bool inPayload_ = false;
  bool ready_ = false;
  std::vector<char> payload_;
  size_t payHave_ = 0;
};

}  // namespace c4::bootwire
