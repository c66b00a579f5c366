#include "common/siphash.hpp"

#include <cstring>

namespace c4 {
namespace {

inline uint64_t rotl(uint64_t x, int b) { return (x << b) | (x >> (64 - b)); }

inline uint64_t load64le(const uint8_t* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}

inline void sipRound(uint64_t& v0, uint64_t& v1, uint64_t& v2, uint64_t& v3) {
  v0 += v1;
  v1 = rotl(v1, 13);
  v1 ^= v0;
  v0 = rotl(v0, 32);
  v2 += v3;
  v3 = rotl(v3, 16);
  v3 ^= v2;
  v0 += v3;
  v3 = rotl(v3, 21);
  v3 ^= v0;
  v2 += v1;
  v1 = rotl(v1, 17);
  v1 ^= v2;
  v2 = rotl(v2, 32);
}

}  // namespace

SipHasher::SipHasher(const uint8_t key[16]) {
  uint64_t k0 = load64le(key);
  uint64_t k1 = load64le(key + 8);
  v0_ = k0 ^ 0x736f6d6570736575ULL;  // "somepseudorandomlygeneratedbytes"
  v1_ = k1 ^ 0x646f72616e646f6dULL;
  v2_ = k0 ^ 0x6c7967656e657261ULL;
  v3_ = k1 ^ 0x7465646279746573ULL;
}

void SipHasher::compress(uint64_t m) {
  v3_ ^= m;
  sipRound(v0_, v1_, v2_, v3_);  // c = 2 compression rounds
  sipRound(v0_, v1_, v2_, v3_);
  v0_ ^= m;
}

void SipHasher::update(const void* data, size_t len) {
  const uint8_t* p = static_cast<const uint8_t*>(data);
  total_ += len;
  if (tailLen_ > 0) {
    size_t take = 8 - tailLen_ < len ? 8 - tailLen_ : len;
    memcpy(tail_ + tailLen_, p, take);
    tailLen_ += take;
    p += take;
    len -= take;
    if (tailLen_ < 8) return;
    compress(load64le(tail_));
    tailLen_ = 0;
  }
  for (; len >= 8; p += 8, len -= 8) compress(load64le(p));
  memcpy(tail_, p, len);
  tailLen_ = len;
}

uint64_t SipHasher::finish() {
  // Last block: the remaining bytes, zero padded, with the total length (mod 256) in the top byte.
  uint64_t b = static_cast<uint64_t>(total_ & 0xff) << 56;
  for (size_t i = 0; i < tailLen_; ++i) b |= static_cast<uint64_t>(tail_[i]) << (8 * i);
  compress(b);
  v2_ ^= 0xff;
  for (int i = 0; i < 4; ++i) sipRound(v0_, v1_, v2_, v3_);  // d = 4 finalization rounds
  return v0_ ^ v1_ ^ v2_ ^ v3_;
}

uint64_t sipHash24(const uint8_t key[16], const void* data, size_t len) {
  SipHasher h(key);
  h.update(data, len);
  return h.finish();
}

}  // namespace c4
