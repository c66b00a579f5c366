// c4-soak's data: deterministic inputs that every rank can compute for every rank, and references
// that are exact for every (collective, dtype, op).
//
// Data-movement collectives move a byte pattern that is a pure function of (seed, byte offset), so
// a receiver computes what any block should hold without the sender's buffer.
//
// Reductions pick, for each element, one value per rank such that the result does not depend on
// the order in which the library combines the ranks:
//   - integers: sums, averages and pre-multiplied sums stay inside the type's range (no wrap-around),
//     products of small factors cannot overflow, min and max use the whole range;
//   - floating point (half, bfloat16, fp8 included): sum, prod, avg and premul-sum draw per-element
//     tuples (one value per rank) from a table of tuples for which every value the library can
//     form on the way is exactly representable: each rank's scaled input (x * 1/n for avg, x * its
//     scalar for premul-sum) and the sum (or product) over every subset of ranks. Whatever the
//     algorithm, every partial result is then exact, so the final one is too and is compared for
//     equality. Min and max use random finite bit patterns (no NaN, no -0).
// The element codecs are c4-perf's (bench/perf/perf_data.hpp), which share no code with the
// library.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "c4comm/types.hpp"

namespace c4 {
namespace soak {

/// SplitMix64's finalizer: a good 64-bit mix of x.
inline uint64_t mix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}
/// A hash of (a, b), not symmetric.
inline uint64_t hash2(uint64_t a, uint64_t b) { return mix64(a ^ mix64(b + 0x632be59bd9b4e019ull)); }

/// Writes bytes [off, off + len) of the byte pattern of `seed` to dst.
void patternBytes(uint64_t seed, size_t off, size_t len, void* dst);

/// The reduction performed by a call: a built-in op, or kPreMulSum with one scalar per rank.
constexpr int kPreMulSum = kNumBuiltinOps;

/// Inputs and references of one reduction (all ranks construct the same object from the same
/// arguments).
class ReduceData {
 public:
  /// `op`: 0..4 (RedOp) or kPreMulSum; `scalarIdx` (premul only): per rank, an index into
  /// premulScalars(dt). `seed` selects the values.
  ReduceData(DataType dt, int op, int nranks, const std::vector<int>& scalarIdx, uint64_t seed);
  ~ReduceData();

  /// Fills `count` elements of rank `rank`'s input, element indices [first, first + count).
  void fill(int rank, size_t first, size_t count, void* dst) const;
  /// The expected result at element index i, encoded as the type stores it (dataTypeSize bytes).
  void expected(size_t i, unsigned char* out) const;
  /// True when `got` (one element) is the expected result at i (-0 equals +0).
  bool matches(size_t i, const unsigned char* got) const;
  /// The element `p` as text (a number; integers exactly).
  std::string format(const unsigned char* p) const;

  /// The scalar of the premul-sum of rank r, encoded in dt (dataTypeSize bytes).
  void scalar(int rank, unsigned char* out) const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

/// Builds the reference tables of every float type, op and rank count in [minRanks, maxRanks]
/// (about 2.3 MB for 2..4 ranks). Called before the ranks fork, so that they share them and their
/// heaps do not grow as they meet new combinations (the leak check watches the heap).
void prebuildTables(int minRanks, int maxRanks);

/// How many premul-sum scalars dt offers (indices for ReduceData's scalarIdx).
int premulScalarCount(DataType dt);

/// Element p of dt as text.
std::string formatElement(DataType dt, const void* p);

}  // namespace soak
}  // namespace c4
