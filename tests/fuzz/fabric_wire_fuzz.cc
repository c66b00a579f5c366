// Fuzz target: the fabric service's wire (planner/fabric_wire.hpp), as c4-fabricd reads a job and a
// job reads the service. The first byte picks the reader: a request (the service's side: JSON
// from an authenticated frame), a reply (the job's side), a greeting and a frame header with its
// MAC check, or what a job's ranks tell each other (a lane report to rank 0, the moves from it).
// What parses must encode back to text that parses to the same encoding.
#include <string>
#include <vector>

#include "fuzz_util.hpp"
#include "planner/fabric_wire.hpp"

using namespace c4;  // NOLINT(google-build-using-namespace): a fuzz target's own translation unit
namespace wire = c4::plan::wire;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const uint8_t mode = data[0] % 5;
  const std::string text(reinterpret_cast<const char*>(data + 1), size - 1);
  if (mode == 0) {
    wire::Request r;
    Status st = wire::parseRequest(text, &r);
    if (!st.isOk()) {
      C4_FUZZ_CHECK(st.message().rfind("fabric service: ", 0) == 0, "an error without its prefix: %s",
                    st.message().c_str());
      return 0;
    }
    const std::string once = wire::encodeRequest(r);
    wire::Request again;
    st = wire::parseRequest(once, &again);
    C4_FUZZ_CHECK(st.isOk(), "an encoded request does not parse: %s", st.message().c_str());
    C4_FUZZ_CHECK(wire::encodeRequest(again) == once, "a request changes on its way back: %s", once.c_str());
  } else if (mode == 1) {
    wire::Reply r;
    Status st = wire::parseReply(text, &r);
    if (!st.isOk()) return 0;
    const std::string once = wire::encodeReply(r);
    wire::Reply again;
    st = wire::parseReply(once, &again);
    C4_FUZZ_CHECK(st.isOk(), "an encoded reply does not parse: %s", st.message().c_str());
    C4_FUZZ_CHECK(wire::encodeReply(again) == once, "a reply changes on its way back: %s", once.c_str());
  } else if (mode == 3) {
    wire::JobReport r;
    if (!wire::parseJobReport(text, &r).isOk()) return 0;
    const std::string once = wire::encodeJobReport(r);
    wire::JobReport again;
    Status st = wire::parseJobReport(once, &again);
    C4_FUZZ_CHECK(st.isOk(), "an encoded report does not parse: %s", st.message().c_str());
    C4_FUZZ_CHECK(wire::encodeJobReport(again) == once, "a report changes on its way back: %s", once.c_str());
  } else if (mode == 4) {
    std::vector<wire::LaneMove> m;
    std::string why;
    if (!wire::parseMoves(text, &m, &why).isOk()) return 0;
    const std::string once = wire::encodeMoves(m, why);
    std::vector<wire::LaneMove> again;
    Status st = wire::parseMoves(once, &again, &why);
    C4_FUZZ_CHECK(st.isOk(), "encoded moves do not parse: %s", st.message().c_str());
    C4_FUZZ_CHECK(wire::encodeMoves(again, why) == once, "moves change on their way back: %s", once.c_str());
  } else {
    wire::Greeting g;
    if (text.size() >= wire::kGreetingBytes) (void)wire::parseGreeting(text.data(), wire::kGreetingBytes, &g);
    if (text.size() < wire::kGreetingBytes + wire::kHeaderBytes) return 0;
    wire::FrameHeader h;
    const char* hdr = text.data() + wire::kGreetingBytes;
    if (!wire::parseFrameHeader(hdr, wire::kHeaderBytes, 4096, &h).isOk()) return 0;
    C4_FUZZ_CHECK(h.length <= 4096, "a header past the limit was accepted: %u", h.length);
    const size_t body = wire::kGreetingBytes + wire::kHeaderBytes;
    if (text.size() - body < h.length) return 0;
    wire::Session s;
    s.key.k[0] = 1;
    s.key.k[1] = 2;
    s.serviceNonce = g.nonce;
    const std::string payload = text.substr(body, h.length);
    const bool ok = wire::frameAuthentic(s, wire::Dir::kToService, h.seq, h, payload.data());
    // A frame sealed with this session's key over the same bytes is the one authentic form.
    const std::string sealed = wire::sealFrame(s, wire::Dir::kToService, h.seq, payload);
    wire::FrameHeader h2;
    C4_FUZZ_CHECK(wire::parseFrameHeader(sealed.data(), wire::kHeaderBytes, 4096, &h2).isOk(), "a sealed frame");
    C4_FUZZ_CHECK(wire::frameAuthentic(s, wire::Dir::kToService, h.seq, h2, payload.data()), "a sealed frame fails");
    C4_FUZZ_CHECK(ok == (h2.mac == h.mac), "authentic without the key's MAC");
  }
  return 0;
}
