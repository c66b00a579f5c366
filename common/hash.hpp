// FNV-1a, 64 bit, as c4comm hashes what ranks and files must agree on (topology files, schedule
// files, settings, exclude sets). The offset basis is 1469598103934665603 (one digit short of the
// published 14695981039346656037): every hash c4comm has written uses it (c4-plan's and c4-synth's
// topology hashes in schedule files too), so it stays.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace c4 {

constexpr uint64_t kFnvOffset = 1469598103934665603ull;
constexpr uint64_t kFnvPrime = 1099511628211ull;

/// FNV-1a of `n` bytes, continuing from `h`.
inline uint64_t fnv1a(const void* data, size_t n, uint64_t h = kFnvOffset) {
  const auto* p = static_cast<const uint8_t*>(data);
  for (size_t i = 0; i < n; ++i) h = (h ^ p[i]) * kFnvPrime;
  return h;
}

inline uint64_t fnv1a(const std::string& s, uint64_t h = kFnvOffset) { return fnv1a(s.data(), s.size(), h); }

}  // namespace c4
