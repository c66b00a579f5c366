// ABI layout test: sizes, offsets, initializer values, macros, enum values and function types of
// our include/nccl.h must equal those of NVIDIA's nccl.h. Each header is compiled in its own
// translation unit (layout_nvidia.cc, layout_ours.cc, layout_c.c); this one compares the numbers.
#include <cstdio>
#include <map>
#include <string>

#include "layout_facts.hpp"

int main() {
  const std::vector<c4abi::Fact> nv = c4abi::nvidiaFacts();
  const std::vector<c4abi::Fact> ours = c4abi::ourFacts();
  int bad = 0;
  if (nv.size() != ours.size() || nv.empty()) {
    fprintf(stderr, "FAIL: %zu facts from NVIDIA's header, %zu from ours\n", nv.size(), ours.size());
    return 1;
  }
  std::map<std::string, std::string> ourByName;
  for (size_t i = 0; i < nv.size(); ++i) {
    ourByName[ours[i].name] = ours[i].value;
    const bool same = nv[i].name == ours[i].name && nv[i].value == ours[i].value;
    printf("%-4s %-50s nvidia=%-24s ours=%s\n", same ? "ok" : "FAIL", nv[i].name.c_str(), nv[i].value.c_str(),
           ours[i].value.c_str());
    if (!same) ++bad;
  }

  // Our header compiled as C must agree with itself compiled as C++.
  static const char* kCNames[] = {"sizeof(ncclConfig_t)",
                                  "offsetof(ncclConfig_t, netName)",
                                  "offsetof(ncclConfig_t, commName)",
                                  "offsetof(ncclConfig_t, nvlinkCentricSched)",
                                  "sizeof(ncclSimInfo_t)",
                                  "sizeof(ncclUniqueId)",
                                  "sizeof(ncclRedOp_t)",
                                  "ncclMaxRedOp",
                                  "cfg.magic",
                                  "cfg.version",
                                  "cfg.blocking",
                                  "sim.magic"};
  constexpr int kNumC = sizeof(kCNames) / sizeof(kCNames[0]);
  long long cFacts[kNumC];
  if (c4AbiCFacts(cFacts, kNumC) != kNumC) {
    fprintf(stderr, "FAIL: layout_c.c and layout_main.cc disagree on the list of C facts\n");
    return 1;
  }
  for (int i = 0; i < kNumC; ++i) {
    const std::string cxx = ourByName.count(kCNames[i]) ? ourByName[kCNames[i]] : "<missing>";
    const bool same = cxx == std::to_string(cFacts[i]);
    printf("%-4s C: %-47s c=%-29lld c++=%s\n", same ? "ok" : "FAIL", kCNames[i], cFacts[i], cxx.c_str());
    if (!same) ++bad;
  }
  if (bad) {
    fprintf(stderr, "%d mismatch(es)\n", bad);
    return 1;
  }
  printf("PASS: %zu facts agree\n", nv.size() + kNumC);
  return 0;
}
