// Writes the seed corpora of the binary fuzz targets from the real wire structs (so their layout,
// padding included, is the library's): make_seeds DIR writes DIR/<target>/<seed>. scripts/fuzz.sh
// --seeds runs it into tests/fuzz/seeds; the heartbeat, topology and trace seeds are text files
// kept there by hand (or, for the trace, written by trace_fuzz.py --seeds).
#include <arpa/inet.h>
#include <sys/stat.h>

#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "core/bootstrap_wire.hpp"
#include "transports/tcp/tcp_wire.hpp"

using namespace c4;            // NOLINT(google-build-using-namespace): a program of its own
using namespace c4::bootwire;  // NOLINT(google-build-using-namespace)
namespace tcpwire = c4::transport::tcpwire;

namespace {

std::string gDir;

class Seed {
 public:
  template <typename T>
  Seed& add(const T& v) {
    const char* p = reinterpret_cast<const char*>(&v);
    bytes_.insert(bytes_.end(), p, p + sizeof(v));
    return *this;
  }
  Seed& raw(const void* p, size_t n) {
    bytes_.insert(bytes_.end(), static_cast<const char*>(p), static_cast<const char*>(p) + n);
    return *this;
  }
  void write(const std::string& target, const std::string& name) const {
    const std::string dir = gDir + "/" + target;
    mkdir(dir.c_str(), 0755);
    const std::string path = dir + "/" + name;
    FILE* f = fopen(path.c_str(), "wb");
    if (!f || fwrite(bytes_.data(), 1, bytes_.size(), f) != bytes_.size()) {
      perror(path.c_str());
      exit(1);
    }
    fclose(f);
  }

 private:
  std::vector<char> bytes_;
};

detail::SockAddr addr(const char* hostPort) {
  detail::SockAddr a;
  if (!detail::parseHostPort(hostPort, &a).isOk()) {
    fprintf(stderr, "bad address %s\n", hostPort);
    exit(1);
  }
  return a;
}

RankInfo info(int r) {
  RankInfo i;
  i.hostId = 0x1000 + static_cast<uint64_t>(r);
  i.clockId = 7;
  i.pid = 4000 + r;
  i.localRankHint = r;
  snprintf(i.hostname, sizeof(i.hostname), "node%d", r);
  return i;
}

const Secret kSecret = {{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16}};
const uint8_t kNonceS[16] = {0xa0, 0xa1, 0xa2, 0xa3, 0xa4, 0xa5, 0xa6, 0xa7,
                             0xa8, 0xa9, 0xaa, 0xab, 0xac, 0xad, 0xae, 0xaf};
const uint8_t kNonceC[16] = {0xc0, 0xc1, 0xc2, 0xc3, 0xc4, 0xc5, 0xc6, 0xc7,
                             0xc8, 0xc9, 0xca, 0xcb, 0xcc, 0xcd, 0xce, 0xcf};

void uniqueIds() {
  const uint8_t tag[8] = {1, 2, 3, 4, 5, 6, 7, 8};
  const char* ids[][2] = {{"127.0.0.1:29500", "v4-loopback"}, {"[::1]:4000", "v6-loopback"}, {"10.1.0.2:65535", "v4"}};
  for (const auto& a : ids) {
    UniqueId id;
    encodeId(addr(a[0]), kSecret, tag, &id);
    Seed().raw(id.bytes, sizeof(id.bytes)).write("unique_id", a[1]);
  }
}

void bootstrapMsgs() {
  Challenge ch{kChallengeMagic, kProtoVersion, {0}};
  memcpy(ch.nonce, kNonceS, 16);
  AuthResp resp{kAuthMagic, 0, proofMac(kSecret, true, ch.nonce, kRoleRoot, 3, kNonceC)};
  Seed().add(uint8_t{0}).add(uint8_t{0}).add(ch).add(resp).write("bootstrap_msgs", "connector");
  AuthReq req;
  memset(static_cast<void*>(&req), 0, sizeof(req));
  req.magic = kAuthMagic;
  req.role = kRoleP2p;
  req.rank = 2;
  req.version = kProtoVersion;
  memcpy(req.nonce, kNonceC, 16);
  req.mac = proofMac(kSecret, false, kNonceS, req.role, req.rank, req.nonce);
  Seed().add(uint8_t{1}).add(uint8_t{0}).add(uint8_t{5}).add(req).write("bootstrap_msgs", "acceptor");
  Seed root;
  root.add(uint8_t{2}).add(uint8_t{0});
  for (int r : {1, 0, 2}) {
    RegisterMsg m;
    memset(static_cast<void*>(&m), 0, sizeof(m));
    m.magic = kRegisterMagic;
    m.rank = r;
    m.nranks = 3;
    m.remainingMs = 30000;
    m.info = info(r);
    m.listen = detail::toWire(addr(("127.0.0.1:" + std::to_string(40000 + r)).c_str()));
    root.add(m);
  }
  root.write("bootstrap_msgs", "root");
  std::vector<TableEntry> table(2);
  memset(static_cast<void*>(table.data()), 0, table.size() * sizeof(TableEntry));
  for (int r = 0; r < 2; ++r) {
    table[static_cast<size_t>(r)].info = info(r);
    table[static_cast<size_t>(r)].addr = detail::toWire(addr(r ? "[::1]:40001" : "127.0.0.1:40000"));
  }
  ReplyHdr ok{kReplyMagic, 0, static_cast<uint32_t>(table.size() * sizeof(TableEntry)), 0};
  Seed()
      .add(uint8_t{3})
      .add(uint8_t{0})
      .add(uint16_t{1})
      .add(ok)
      .raw(table.data(), ok.bytes)
      .write("bootstrap_msgs", "rank-table");
  const std::string msg = "bootstrap root: rank 1 joined twice";
  ReplyHdr err{kReplyMagic, static_cast<int32_t>(Code::kInvalidUsage), static_cast<uint32_t>(msg.size()), 0};
  Seed()
      .add(uint8_t{3})
      .add(uint8_t{0})
      .add(uint16_t{1})
      .add(err)
      .raw(msg.data(), msg.size())
      .write("bootstrap_msgs", "rank-error");
  RingHdr ring{kRingMagic, 1, 7, 64};
  Seed()
      .add(uint8_t{4})
      .add(uint8_t{0})
      .add(uint8_t{0})
      .add(uint64_t{7})
      .add(uint64_t{64})
      .add(ring)
      .write("bootstrap_msgs", "ring");
}

void bootstrapStream() {
  Seed s;
  s.add(uint16_t{0x1b6c});
  const char* texts[] = {"", "{\"v\":1,\"hb\":3}", "ping"};
  uint32_t tag = 0xC4D00001u;
  for (const char* t : texts) {
    FrameHdr h{kFrameMagic, tag++, strlen(t)};
    s.add(h).raw(t, strlen(t));
  }
  s.write("bootstrap_stream", "frames");
  std::vector<char> big(3000, 'x');
  FrameHdr h{kFrameMagic, 0xC10C0000u, big.size()};
  Seed().add(uint16_t{0xffff}).add(h).raw(big.data(), big.size()).write("bootstrap_stream", "large");
}

void tcpHandshake() {
  const uint64_t key[2] = {0x0123456789abcdefull, 0xfedcba9876543210ull};
  tcpwire::Hello h{tcpwire::kHelloMagic, tcpwire::kVersion, tcpwire::tagHash(key, "fuzz", 4), 1, 3, 0, 2, 99};
  const uint64_t nonce = 0x5555aaaa5555aaaaull;
  tcpwire::Proof pr{tcpwire::kProofMagic, 0, tcpwire::handshakeMac(key, false, h, nonce)};
  Seed()
      .add(uint8_t{0})
      .add(uint8_t{0})
      .add(int32_t{3})
      .add(int32_t{2})
      .add(h)
      .add(pr)
      .write("tcp_handshake", "acceptor");
  tcpwire::Hello probe{tcpwire::kProbeMagic, tcpwire::kVersion, h.tagHash, 1, 3, -1, 2, 0};
  Seed().add(uint8_t{0}).add(uint8_t{0}).add(int32_t{3}).add(int32_t{2}).add(probe).write("tcp_handshake", "probe");
  tcpwire::Challenge ch{tcpwire::kChallengeMagic, 0, 77, tcpwire::handshakeMac(key, true, h, 77)};
  Seed().add(uint8_t{1}).add(uint8_t{0}).add(h).add(ch).write("tcp_handshake", "initiator");
}

void tcpFrames() {
  Seed s;
  s.add(uint8_t{0}).add(uint8_t{1});  // 4 KiB pieces, acknowledgements on
  std::vector<char> piece(4096, 'd');
  // Message 0: one eager piece of 100 bytes; message 2: the last piece of two (6000 bytes).
  for (uint64_t seq : {uint64_t{0}, uint64_t{2}}) {
    tcpwire::FrameHdr h{};
    h.type = tcpwire::kData;
    h.seq = seq;
    h.total = seq ? 6000 : 100;
    h.offset = seq ? 4096 : 0;
    h.bytes = static_cast<uint32_t>(h.total - h.offset);
    h.flags = seq ? 0 : tcpwire::kFlagEager;
    s.add(h).raw(piece.data(), h.bytes);
  }
  tcpwire::AckEntry acks[2] = {{0, 0, 0}, {1, 1, 0}};
  tcpwire::FrameHdr a{};
  a.type = tcpwire::kAck;
  a.bytes = sizeof(acks);
  s.add(a).raw(acks, sizeof(acks));
  for (uint32_t t : {tcpwire::kPing, tcpwire::kPong, tcpwire::kPause, tcpwire::kResume}) {
    tcpwire::FrameHdr c{};
    c.type = t;
    s.add(c);
  }
  const std::string why = "stalled";
  tcpwire::FrameHdr r{};
  r.type = tcpwire::kRetire;
  r.bytes = static_cast<uint32_t>(why.size());
  r.offset = 1;
  s.add(r).raw(why.data(), why.size());
  tcpwire::FrameHdr e{};
  e.type = tcpwire::kData;  // an empty message
  e.seq = 1;
  s.add(e);
  s.write("tcp_frames", "lane");
  const std::string reason = "rank 1 aborted";
  tcpwire::FrameHdr ab{};
  ab.type = tcpwire::kAbort;
  ab.bytes = static_cast<uint32_t>(reason.size());
  Seed().add(uint8_t{3}).add(uint8_t{0}).add(ab).raw(reason.data(), reason.size()).write("tcp_frames", "abort");
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    fprintf(stderr, "usage: %s DIR\n", argv[0]);
    return 2;
  }
  gDir = argv[1];
  mkdir(gDir.c_str(), 0755);
  uniqueIds();
  bootstrapMsgs();
  bootstrapStream();
  tcpHandshake();
  tcpFrames();
  return 0;
}
