// Fuzz target: the bootstrap's send/recv side channel as the progress thread reads it from a peer
// (bootwire::FrameReader, fed in pieces of the sizes a socket might give). The first two bytes
// choose the piece sizes; the rest is the stream. Checks that each frame taken carries the payload
// its header announced, and that memory follows what arrived, not what headers announce.
#include <deque>
#include <map>
#include <vector>

#include "core/bootstrap_wire.hpp"
#include "fuzz_util.hpp"

using namespace c4;  // NOLINT(google-build-using-namespace): a fuzz target's own translation unit

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  fuzz::Input in(data, size);
  uint16_t pieces = in.take<uint16_t>();
  bootwire::FrameReader reader;
  std::map<uint32_t, std::deque<std::vector<char>>> inbox;  // the progress thread's, for one peer
  size_t arrived = 0, delivered = 0;
  while (in.left() > 0) {
    size_t room = 0;
    char* to = reader.next(&room);
    C4_FUZZ_CHECK(room > 0 && to != nullptr, "nowhere to read to");
    // The next piece: 1..64 bytes, or whatever fits, per two bits of `pieces` (cycled).
    size_t want = room;
    switch (pieces & 3) {
      case 0:
        want = std::min<size_t>(room, 1);
        break;
      case 1:
        want = std::min<size_t>(room, 7);
        break;
      case 2:
        want = std::min<size_t>(room, 64);
        break;
      default:
        break;
    }
    pieces = static_cast<uint16_t>((pieces >> 2) | (pieces << 14));
    const size_t n = in.bytes(to, want);
    arrived += n;
    Status st = reader.advance(n);
    if (!st.isOk()) break;  // the stream is dropped
    if (reader.ready()) {
      uint32_t tag = 0;
      std::vector<char> payload;
      reader.take(&tag, &payload);
      delivered += payload.size();
      inbox[tag].push_back(std::move(payload));
    }
  }
  C4_FUZZ_CHECK(delivered <= arrived, "delivered %zu bytes of %zu", delivered, arrived);
  return 0;
}
