/* Our include/nccl.h compiled as C, without CUDA headers: it must parse as C and give the same
 * layout as in C++. */
#include C4_OUR_NCCL_H

#include <stddef.h>

int c4AbiCFacts(long long* out, int max) {
  const ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
  const ncclSimInfo_t sim = NCCL_SIM_INFO_INITIALIZER;
  const long long facts[] = {
      (long long)sizeof(ncclConfig_t),
      (long long)offsetof(ncclConfig_t, netName),
      (long long)offsetof(ncclConfig_t, commName),
      (long long)offsetof(ncclConfig_t, nvlinkCentricSched),
      (long long)sizeof(ncclSimInfo_t),
      (long long)sizeof(ncclUniqueId),
      (long long)sizeof(ncclRedOp_t),
      (long long)ncclMaxRedOp,
      (long long)cfg.magic,
      (long long)cfg.version,
      (long long)cfg.blocking,
      (long long)sim.magic,
  };
  int n = (int)(sizeof(facts) / sizeof(facts[0]));
  for (int i = 0; i < n && i < max; ++i) out[i] = facts[i];
  return n;
}
