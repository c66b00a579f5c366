// The signature every message carries so that ranks which disagree on an operation get a clear
// error naming the mismatch instead of a hang or silent corruption.
#pragma once

#include <cstdint>
#include <string>

#include "c4comm/types.hpp"

namespace c4 {

struct OpSig {
  uint64_t seq = 0;    // collective sequence number (per communicator), or per-peer p2p sequence
  uint64_t count = 0;  // element count as passed by the caller
  int32_t root = -1;   // root rank, or -1
  uint8_t coll = 0;    // Coll
  uint8_t dtype = 0;   // DataType
  uint8_t op = 0;      // RedOp for builtins; 0xff for a user PreMulSum op (scalars may differ per rank)
  uint8_t pad = 0;
};
static_assert(sizeof(OpSig) == 24, "OpSig travels on the wire");

/// True if a message sent under `sent` may be received under `expected`: equal fields, where a
/// Send matches a Recv.
bool sigMatches(const OpSig& sent, const OpSig& expected);
/// "AllReduce seq 7 count 1024 float sum" (root shown where it matters).
std::string describeSig(const OpSig& sig);
/// A one-line account of how two signatures differ, e.g. "count 1024 vs 2048; dtype float vs half".
std::string diffSigs(const OpSig& a, const OpSig& b);

}  // namespace c4
