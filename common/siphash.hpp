// SipHash-2-4 (Aumasson & Bernstein): a keyed 64-bit pseudo-random function. The bootstrap uses it
// to prove knowledge of the UniqueId secret (challenge-response) and to derive ids from seeds.
#pragma once

#include <cstddef>
#include <cstdint>

namespace c4 {

/// SipHash-2-4 of `len` bytes at `data` under the 16-byte `key` (k0 = key[0..7], k1 = key[8..15],
/// little endian, as in the reference implementation). Pure function; thread-safe.
uint64_t sipHash24(const uint8_t key[16], const void* data, size_t len);

/// Incremental form of sipHash24: update() any number of times, then finish(). Feeding the same
/// bytes in any split gives the same value as sipHash24.
class SipHasher {
 public:
  explicit SipHasher(const uint8_t key[16]);
  void update(const void* data, size_t len);
  /// Returns the hash; the hasher must not be used afterwards.
  uint64_t finish();

 private:
  void compress(uint64_t m);
  uint64_t v0_, v1_, v2_, v3_;
  uint8_t tail_[8] = {0};
  size_t tailLen_ = 0;
  uint64_t total_ = 0;
};

}  // namespace c4
