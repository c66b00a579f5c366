// Fuzz target: the UniqueId a rank receives from its launcher or application (128 bytes; anything
// may arrive there, e.g. an id of another library or a corrupted broadcast). Runs
// bootwire::decodeId, which Bootstrap::create and uniqueIdRootAddress call, and checks that what
// it accepts encodes back to the same address.
#include <cstring>

#include "core/bootstrap_wire.hpp"
#include "fuzz_util.hpp"

using namespace c4;  // NOLINT(google-build-using-namespace): a fuzz target's own translation unit

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  UniqueId id;
  memset(id.bytes, 0, sizeof(id.bytes));
  memcpy(id.bytes, data, size < sizeof(id.bytes) ? size : sizeof(id.bytes));
  detail::SockAddr root;
  bootwire::Secret secret;
  Status st = bootwire::decodeId(id, &root, &secret);
  if (!st.isOk()) {
    C4_FUZZ_CHECK(!st.message().empty(), "an error without a reason");
    return 0;
  }
  C4_FUZZ_CHECK(root.valid(), "accepted an id without an address");
  const std::string text = root.toString();
  // What was accepted round-trips: encode it again and decode that.
  bootwire::IdLayout layout;
  memcpy(&layout, id.bytes, sizeof(layout));
  uint8_t tag[8];
  memcpy(tag, layout.tag, sizeof(tag));
  UniqueId again;
  bootwire::encodeId(root, secret, tag, &again);
  detail::SockAddr root2;
  bootwire::Secret secret2;
  st = bootwire::decodeId(again, &root2, &secret2);
  C4_FUZZ_CHECK(st.isOk(), "a re-encoded id fails: %s", st.message().c_str());
  C4_FUZZ_CHECK(root2.toString() == text, "%s became %s", text.c_str(), root2.toString().c_str());
  C4_FUZZ_CHECK(memcmp(secret.key, secret2.key, 16) == 0, "the secret changed");
  return 0;
}
