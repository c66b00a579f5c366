// Fuzz target: the tcp transport's lane handshake (transports/tcp/tcp_wire.hpp), checked the way
// transport checks it (tcp_setup.cc, tcp_recv.cc). The first byte picks the side:
//   0 acceptor (incomingStep): the expected rank and lane count, then the Hello, then the Proof;
//   1 initiator (onReadable, kWaitChallenge): the Hello it sent, then the acceptor's Challenge.
// The second byte's bit 0 makes the harness put the correct proof into the Proof or Challenge (the
// fuzzer cannot forge SipHash).
#include "fuzz_util.hpp"
#include "transports/tcp/tcp_wire.hpp"

using namespace c4::transport;  // NOLINT(google-build-using-namespace): a fuzz target's own translation unit

namespace {
const uint64_t kKey[2] = {0x0123456789abcdefull, 0xfedcba9876543210ull};
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  c4::fuzz::Input in(data, size);
  const uint8_t mode = in.take<uint8_t>();
  const bool patch = in.take<uint8_t>() & 1;
  if (mode % 2 == 0) {
    tcpwire::HelloExpect expect{tcpwire::tagHash(kKey, "fuzz", 4), in.take<int32_t>(), in.take<int32_t>(), 255};
    const tcpwire::Hello h = in.take<tcpwire::Hello>();
    if (!in.ok()) return 0;
    bool probe = false;
    const std::string why = tcpwire::checkHello(h, expect, &probe);
    C4_FUZZ_CHECK(!probe || !why.empty(), "a probe taken for a lane");
    if (!why.empty()) return 0;
    C4_FUZZ_CHECK(h.from >= 0 && h.from < expect.rank && h.lane >= 0 && h.lane <= expect.maxLane,
                  "accepted lane %d from rank %d", h.lane, h.from);
    const uint64_t nonce = 0x5555aaaa5555aaaaull;
    tcpwire::Proof pr = in.take<tcpwire::Proof>();
    if (!in.ok()) return 0;
    if (patch) pr.mac = tcpwire::handshakeMac(kKey, false, h, nonce);
    const bool valid = tcpwire::proofValid(kKey, h, nonce, pr);
    C4_FUZZ_CHECK(!patch || pr.magic != tcpwire::kProofMagic || valid, "a correct proof refused");
  } else {
    const tcpwire::Hello h = in.take<tcpwire::Hello>();
    tcpwire::Challenge ch = in.take<tcpwire::Challenge>();
    if (!in.ok()) return 0;
    if (patch) ch.mac = tcpwire::handshakeMac(kKey, true, h, ch.nonce);
    const bool valid = tcpwire::challengeValid(kKey, h, ch);
    C4_FUZZ_CHECK(!patch || ch.magic != tcpwire::kChallengeMagic || valid, "a correct challenge refused");
  }
  return 0;
}
