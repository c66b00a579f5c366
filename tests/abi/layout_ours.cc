// ABI facts (abi_facts.inc) evaluated against our include/nccl.h, without any CUDA header.
#include C4_OUR_NCCL_H

#include <cstddef>
#include <string>
#include <typeinfo>

#include "layout_facts.hpp"

#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"

std::vector<c4abi::Fact> c4abi::ourFacts() {
  std::vector<Fact> out;
  ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
  ncclSimInfo_t sim = NCCL_SIM_INFO_INITIALIZER;
  ncclCollConfig_t coll = NCCL_COLLCONFIG_INITIALIZER;
  ncclEncryptionConfig_t enc = NCCL_ENCRYPTION_CONFIG_INITIALIZER;
#define C4_FACT(expr) out.push_back({#expr, std::to_string(static_cast<long long>(expr))});
#define C4_SIG(fn) out.push_back({"type of " #fn, typeid(decltype(&fn)).name()});
#include "abi_facts.inc"
#undef C4_FACT
#undef C4_SIG
  return out;
}

#pragma GCC diagnostic pop
