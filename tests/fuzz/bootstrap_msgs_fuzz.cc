// Fuzz target: the bootstrap's messages other than the send/recv stream (core/bootstrap_wire.hpp),
// each checked the way bootstrap.cc checks it. The first byte picks the side:
//   0 connector: the acceptor's Challenge, then its AuthResp;
//   1 acceptor: the connector's AuthReq, arriving in pieces;
//   2 root: a run of RegisterMsg, against the root's table of registered ranks as rootMain keeps it
//     (and, once every rank is in, the table it sends, read back by decodeReply);
//   3 rank: the root's ReplyHdr and body, read by a rank of `nranks`;
//   4 ring: a RingHdr against the step a rank is in.
// The second byte's bit 0 makes the harness put the correct proof into a handshake message (the
// fuzzer cannot forge SipHash; this way what follows a valid proof is reached too).
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "common/status.hpp"
#include "core/bootstrap_wire.hpp"
#include "fuzz_util.hpp"

using namespace c4;            // NOLINT(google-build-using-namespace): a fuzz target's own translation unit
using namespace c4::bootwire;  // NOLINT(google-build-using-namespace)

namespace {

const Secret kSecret = {{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16}};
const uint8_t kNonceS[16] = {0xa0, 0xa1, 0xa2, 0xa3, 0xa4, 0xa5, 0xa6, 0xa7,
                             0xa8, 0xa9, 0xaa, 0xab, 0xac, 0xad, 0xae, 0xaf};
const uint8_t kNonceC[16] = {0xc0, 0xc1, 0xc2, 0xc3, 0xc4, 0xc5, 0xc6, 0xc7,
                             0xc8, 0xc9, 0xca, 0xcb, 0xcc, 0xcd, 0xce, 0xcf};

void checkHostnames(const std::vector<RankInfo>& infos) {
  for (const RankInfo& i : infos) {
    C4_FUZZ_CHECK(strnlen(i.hostname, sizeof(i.hostname)) < sizeof(i.hostname), "a hostname without its NUL");
    // As comm.cc and health.cc print it.
    (void)strFormat("%s", i.hostname);
    (void)describeRank(i);
  }
}

void connector(fuzz::Input& in, bool patch) {
  const Challenge ch = in.take<Challenge>();
  if (!in.ok()) return;  // the acceptor closed early: recvAll fails
  Status st = checkChallenge(ch, "the bootstrap root at 127.0.0.1:1");
  if (!st.isOk()) return;
  AuthResp resp = in.take<AuthResp>();
  if (!in.ok()) return;
  if (patch) resp.mac = proofMac(kSecret, true, ch.nonce, kRoleRoot, 3, kNonceC);
  st = checkAuthResp(resp, kSecret, ch.nonce, kRoleRoot, 3, kNonceC, "the bootstrap root at 127.0.0.1:1");
  C4_FUZZ_CHECK(!patch || resp.magic != kAuthMagic || st.isOk(), "a correct proof refused: %s", st.message().c_str());
}

void acceptor(fuzz::Input& in, bool patch) {
  const uint8_t chunk = in.take<uint8_t>();
  AuthReq req;
  memset(static_cast<void*>(&req), 0, sizeof(req));
  size_t have = 0;
  // serverAuthStep: read what came, check the magic as soon as it is there.
  while (have < sizeof(req)) {
    size_t want = sizeof(req) - have;
    if (chunk) want = std::min<size_t>(want, chunk % 16 + 1);
    const size_t n = in.bytes(reinterpret_cast<char*>(&req) + have, want);
    if (n == 0) return;  // nothing more: the connection times out
    have += n;
    if (!checkAuthReqPrefix(req, have).isOk()) return;
  }
  if (patch) req.mac = proofMac(kSecret, false, kNonceS, req.role, req.rank, req.nonce);
  Status st = checkAuthReq(req, kSecret, kNonceS);
  C4_FUZZ_CHECK(!patch || req.version != kProtoVersion || st.isOk(), "a correct proof refused: %s",
                st.message().c_str());
  if (st.isOk()) (void)roleName(req.role);
}

void root(fuzz::Input& in) {
  int nranks = -1, firstRank = -1, arrived = 0;
  // rootMain's table: a vector of nranks entries there (sized by the first registration), a map
  // here, so that each input does not allocate up to kMaxRanks entries; the size is checked instead.
  std::map<int, std::unique_ptr<RegisterMsg>> registered;
  while (in.left() > 0) {
    const RegisterMsg r = in.take<RegisterMsg>();
    if (!in.ok()) return;  // a partial registration: dropped at its deadline
    const std::string err = checkRegistration(r, nranks, firstRank, [&](int k) -> const RankInfo* {
      C4_FUZZ_CHECK(k >= 0 && k < nranks, "asked for rank %d of %d", k, nranks);
      auto it = registered.find(k);
      return it != registered.end() ? &it->second->info : nullptr;
    });
    if (!err.empty()) continue;  // an error reply; the root goes on
    if (nranks < 0) {
      nranks = r.nranks;
      firstRank = r.rank;
      // The root allocates a table of this many entries.
      C4_FUZZ_CHECK(nranks <= kMaxRanks, "the first registration sizes the root's table to %d ranks", nranks);
    }
    C4_FUZZ_CHECK(r.rank >= 0 && r.rank < nranks, "accepted rank %d of %d", r.rank, nranks);
    registered[r.rank] = std::make_unique<RegisterMsg>(r);
    if (++arrived < nranks) continue;
    // Every rank is in: the table the root sends, as each rank reads it.
    std::vector<TableEntry> table(static_cast<size_t>(nranks));
    memset(static_cast<void*>(table.data()), 0, table.size() * sizeof(TableEntry));
    for (int k = 0; k < nranks; ++k) {
      table[static_cast<size_t>(k)].info = registered[k]->info;
      table[static_cast<size_t>(k)].addr = registered[k]->listen;
    }
    ReplyHdr rh{kReplyMagic, 0, static_cast<uint32_t>(table.size() * sizeof(TableEntry)), 0};
    if (!checkReplyHdr(rh, "rank", "the root").isOk()) return;  // more than a reply may carry
    std::vector<char> body(rh.bytes);
    memcpy(body.data(), table.data(), body.size());
    std::vector<RankInfo> infos;
    std::vector<detail::SockAddr> addrs;
    if (decodeReply(rh, body, nranks, "rank", &infos, &addrs).isOk()) {
      checkHostnames(infos);
      for (const detail::SockAddr& a : addrs) (void)a.toString();
    }
    return;
  }
}

void rank(fuzz::Input& in) {
  const int nranks = in.take<uint16_t>() % 1024 + 1;  // Bootstrap::create checked it
  const ReplyHdr rh = in.take<ReplyHdr>();
  if (!in.ok()) return;
  if (!checkReplyHdr(rh, "bootstrap rank 0/1", "the root").isOk()) return;
  if (in.left() < rh.bytes) return;  // the root closed before the body: recvAll fails
  std::vector<char> body(rh.bytes);
  in.bytes(body.data(), body.size());
  std::vector<RankInfo> infos;
  std::vector<detail::SockAddr> addrs;
  Status st = decodeReply(rh, body, nranks, "bootstrap rank 0/1", &infos, &addrs);
  if (!st.isOk()) return;
  C4_FUZZ_CHECK(infos.size() == static_cast<size_t>(nranks) && addrs.size() == infos.size(), "a table of %zu",
                infos.size());
  checkHostnames(infos);
  for (const detail::SockAddr& a : addrs) (void)a.toString();
}

void ring(fuzz::Input& in) {
  const uint32_t op = in.take<uint8_t>() % 2 + 1;
  const uint64_t seq = in.take<uint64_t>();
  const uint64_t bytes = in.take<uint64_t>();
  const RingHdr h = in.take<RingHdr>();
  (void)checkRingHdr(h, op, op == 1 ? "allGather" : "barrier", seq, static_cast<size_t>(bytes), "bootstrap rank 1/2",
                     0);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  fuzz::Input in(data, size);
  const uint8_t mode = in.take<uint8_t>();
  const bool patch = in.take<uint8_t>() & 1;
  switch (mode % 5) {
    case 0:
      connector(in, patch);
      break;
    case 1:
      acceptor(in, patch);
      break;
    case 2:
      root(in);
      break;
    case 3:
      rank(in);
      break;
    default:
      ring(in);
      break;
  }
  return 0;
}
