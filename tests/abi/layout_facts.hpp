// Facts about an nccl.h, gathered by a translation unit that includes one particular header.
// This header itself must not include any nccl.h.
#pragma once

#include <string>
#include <vector>

namespace c4abi {

struct Fact {
  std::string name;   // the expression, e.g. "offsetof(ncclConfig_t, commName)"
  std::string value;  // its value, or the mangled type of a function
};

/// Facts from NVIDIA's nccl.h (layout_nvidia.cc).
std::vector<Fact> nvidiaFacts();
/// The same facts from our include/nccl.h (layout_ours.cc).
std::vector<Fact> ourFacts();

}  // namespace c4abi

/// Facts from our nccl.h compiled as C (layout_c.c): {sizeof, offsets...} in a fixed order.
extern "C" int c4AbiCFacts(long long* out, int max);
