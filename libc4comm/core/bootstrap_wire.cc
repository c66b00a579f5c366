#include "core/bootstrap_wire.hpp"

#include <algorithm>
#include <cstring>
#include <type_traits>

#include "common/siphash.hpp"
#include "common/status.hpp"

namespace c4::bootwire {

static_assert(std::is_trivially_copyable_v<RankInfo>, "RankInfo travels as bytes");

namespace {
// A payload's buffer starts at this size and doubles as bytes arrive.
constexpr size_t kFirstChunk = 64 * 1024;
}  // namespace

const char* roleName(uint32_t role) {
  switch (role) {
    case kRoleRoot:
      return "root";
    case kRoleRing:
      return "ring";
    case kRoleP2p:
      return "send/recv";
    default:
      return "unknown";
  }
}

uint64_t proofMac(const Secret& s, bool server, const uint8_t nonceS[16], uint32_t role, int32_t rank,
                  const uint8_t nonceC[16]) {
  SipHasher h(s.key);
  h.update(server ? "c4-server" : "c4-client", 9);
  h.update(nonceS, 16);
  h.update(&role, sizeof(role));
  h.update(&rank, sizeof(rank));
  h.update(nonceC, 16);
  return h.finish();
}

bool macEqual(uint64_t a, uint64_t b) {
  volatile uint64_t d = a ^ b;  // no early exit
  return d == 0;
}

std::string describeRank(const RankInfo& info) {
  char host[sizeof(info.hostname) + 1] = {0};
  memcpy(host, info.hostname, sizeof(info.hostname));
  return strFormat("%s pid %d", host[0] ? host : "?", info.pid);
}

Status decodeId(const UniqueId& id, detail::SockAddr* root, Secret* secret) {
  IdLayout l;
  memcpy(&l, id.bytes, sizeof(l));
  if (memcmp(l.magic, kIdMagic, 4) != 0)
    return makeError(Code::kInvalidArgument, "UniqueId was not made by c4comm (bad magic): use getUniqueId()");
  if (l.version != kIdVersion)
    return makeError(Code::kInvalidArgument, "UniqueId version %u, this library speaks %u", l.version, kIdVersion);
  C4_CHECK(detail::fromWire(l.root, root));
  if (secret) memcpy(secret->key, l.secret, 16);
  return Status::ok();
}

void encodeId(const detail::SockAddr& root, const Secret& secret, const uint8_t tag[8], UniqueId* id) {
  IdLayout l;
  memset(static_cast<void*>(&l), 0, sizeof(l));
  memcpy(l.magic, kIdMagic, 4);
  l.version = kIdVersion;
  l.root = detail::toWire(root);
  memcpy(l.secret, secret.key, 16);
  memcpy(l.tag, tag, 8);
  memset(id->bytes, 0, sizeof(id->bytes));
  memcpy(id->bytes, &l, sizeof(l));
}

Status checkChallenge(const Challenge& ch, const std::string& who) {
  if (ch.magic != kChallengeMagic)
    return makeError(Code::kRemoteError, "%s is not a c4comm bootstrap endpoint (bad challenge)", who.c_str());
  if (ch.version != kProtoVersion)
    return makeError(Code::kRemoteError, "%s speaks bootstrap protocol %u, this rank %u", who.c_str(), ch.version,
                     kProtoVersion);
  return Status::ok();
}

Status checkAuthReqPrefix(const AuthReq& req, size_t have) {
  if (have >= sizeof(uint32_t) && req.magic != kAuthMagic)
    return makeError(Code::kRemoteError, "sent garbage (not a c4comm bootstrap client)");
  return Status::ok();
}

Status checkAuthReq(const AuthReq& req, const Secret& secret, const uint8_t nonceS[16]) {
  C4_CHECK(checkAuthReqPrefix(req, sizeof(req)));
  if (req.version != kProtoVersion)
    return makeError(Code::kRemoteError, "speaks bootstrap protocol %u, not %u", req.version, kProtoVersion);
  uint64_t want = proofMac(secret, false, nonceS, req.role, req.rank, req.nonce);
  if (!macEqual(want, req.mac))
    return makeError(Code::kRemoteError, "failed the secret proof (claims rank %d, role %s): wrong UniqueId secret",
                     req.rank, roleName(req.role));
  return Status::ok();
}

Status checkAuthResp(const AuthResp& resp, const Secret& secret, const uint8_t nonceS[16], uint32_t role, int32_t rank,
                     const uint8_t nonceC[16], const std::string& who) {
  if (resp.magic != kAuthMagic || !macEqual(resp.mac, proofMac(secret, true, nonceS, role, rank, nonceC)))
    return makeError(Code::kRemoteError, "%s failed to prove the secret (impostor or stale endpoint); refusing it",
                     who.c_str());
  return Status::ok();
}

std::string checkRegistration(const RegisterMsg& r, int nranks, int firstRank,
                              const std::function<const RankInfo*(int)>& registered) {
  if (r.magic != kRegisterMagic) return "bad registration message";
  if (r.nranks <= 0 || r.rank < 0 || r.rank >= r.nranks)
    return strFormat("rank %d of nranks %d is out of range", r.rank, r.nranks);
  // Found by fuzzing: the first registration sizes the root's table, so nranks = 2^31 - 1 made it
  // allocate 16 GiB (and a failed allocation ended the process that serves the root).
  if (r.nranks > kMaxRanks)
    return strFormat("rank %d says nranks=%d, more than a communicator may have (%d)", r.rank, r.nranks, kMaxRanks);
  if (nranks >= 0 && r.nranks != nranks)
    return strFormat("rank %d says nranks=%d but rank %d (the first to join) said nranks=%d", r.rank, r.nranks,
                     firstRank, nranks);
  if (nranks >= 0) {
    const RankInfo* first = registered(r.rank);
    if (first)
      return strFormat("rank %d joined twice: first from %s, again from %s", r.rank, describeRank(*first).c_str(),
                       describeRank(r.info).c_str());
  }
  return std::string();
}

Status checkReplyHdr(const ReplyHdr& rh, const char* pfx, const std::string& who) {
  if (rh.magic != kReplyMagic || rh.bytes > kMaxReplyBytes)
    return makeError(Code::kRemoteError, "%s: %s sent a malformed reply", pfx, who.c_str());
  return Status::ok();
}

Status decodeReply(const ReplyHdr& rh, const std::vector<char>& body, int nranks, const char* pfx,
                   std::vector<RankInfo>* infos, std::vector<detail::SockAddr>* addrs) {
  if (rh.code != 0) {
    std::string msg(body.begin(), body.end());
    Code code = rh.code == static_cast<int32_t>(Code::kInvalidUsage) ? Code::kInvalidUsage : Code::kRemoteError;
    return makeError(code, "%s: %s", pfx, msg.c_str());
  }
  if (nranks < 0 || body.size() != static_cast<size_t>(nranks) * sizeof(TableEntry))
    return makeError(Code::kRemoteError, "%s: rank table has %zu bytes, expected %zu", pfx, body.size(),
                     static_cast<size_t>(std::max(nranks, 0)) * sizeof(TableEntry));
  infos->resize(static_cast<size_t>(nranks));
  addrs->resize(static_cast<size_t>(nranks));
  for (int r = 0; r < nranks; ++r) {
    TableEntry e;
    memcpy(static_cast<void*>(&e), body.data() + static_cast<size_t>(r) * sizeof(TableEntry), sizeof(e));
    // Every reader prints the hostname as a C string (logs, errors, the trace): it must end.
    e.info.hostname[sizeof(e.info.hostname) - 1] = 0;
    (*infos)[static_cast<size_t>(r)] = e.info;
    C4_CHECK(detail::fromWire(e.addr, &(*addrs)[static_cast<size_t>(r)]));
  }
  return Status::ok();
}

Status checkRingHdr(const RingHdr& in, uint32_t op, const char* opName, uint64_t seq, size_t bytesPerRank,
                    const std::string& prefix, int prev) {
  if (in.magic != kRingMagic || in.op != op || in.seq != seq || in.bytes != bytesPerRank) {
    const char* inName = in.op == 1 ? "allGather" : in.op == 2 ? "barrier" : "garbage";
    return makeError(Code::kInvalidUsage,
                     "%s: mismatched bootstrap collectives: this rank is in %s #%llu with %zu bytes per rank, rank %d "
                     "sent %s #%llu with %llu bytes per rank",
                     prefix.c_str(), opName, static_cast<unsigned long long>(seq), bytesPerRank, prev, inName,
                     static_cast<unsigned long long>(in.seq), static_cast<unsigned long long>(in.bytes));
  }
  return Status::ok();
}

char* FrameReader::next(size_t* room) {
  if (!inPayload_) {
    *room = sizeof(hdr_) - hdrHave_;
    return reinterpret_cast<char*>(&hdr_) + hdrHave_;
  }
  if (payHave_ == payload_.size())
    payload_.resize(static_cast<size_t>(std::min<uint64_t>(hdr_.bytes, std::max(kFirstChunk, 2 * payload_.size()))));
  *room = payload_.size() - payHave_;
  return payload_.data() + payHave_;
}

Status FrameReader::advance(size_t n) {
  if (!inPayload_) {
    hdrHave_ += n;
    if (hdrHave_ < sizeof(hdr_)) return Status::ok();
    if (hdr_.magic != kFrameMagic || hdr_.bytes > kMaxFrameBytes)
      return makeError(Code::kRemoteError, "protocol error (bad frame header)");
    payload_.clear();
    payHave_ = 0;
    inPayload_ = hdr_.bytes > 0;
    ready_ = hdr_.bytes == 0;
    return Status::ok();
  }
  payHave_ += n;
  if (payHave_ == hdr_.bytes) {
    inPayload_ = false;
    ready_ = true;
  }
  return Status::ok();
}

void FrameReader::take(uint32_t* tag, std::vector<char>* payload) {
  *tag = hdr_.tag;
  payload_.resize(payHave_);
  *payload = std::move(payload_);
  payload_ = std::vector<char>();
  payHave_ = 0;
  hdrHave_ = 0;
  ready_ = false;
}

}  // namespace c4::bootwire
