#include "core/settings.hpp"

#include <cstring>
#include <vector>

#include "common/params.hpp"
#include "common/status.hpp"

namespace c4 {

namespace {

// Settings that shape the schedules or the wire: ranks that disagree run different plans and
// exchange messages the other does not expect (silent wrong data, or a hang). C4_TRANSPORT,
// C4_LANES, C4_PLANNER, C4_TOPO_FILE and the shm ring's slot settings are checked where they are
// used (the transports' setup, the planner). C4_ZEROCOPY may differ: the ranks agree per call
// (one rank that does not offer the path turns it off for all).
constexpr const char* kMustAgree[] = {
    "C4_ALGO",           // algorithm per collective (NCCL_ALGO too)
    "C4_CHUNK_SIZE",     // pipelining chunks: the steps of the schedule
    "C4_ONESHOT_BYTES",  // which path a small call takes
    "C4_ONESHOT_MAX_RANKS",
    "C4_TCP_PIECE_BYTES",  // tcp: the pieces messages are cut into
    "C4_TCP_ACK",          // tcp: wire v1 or v2
    "C4_TCP_EAGER_BYTES",  // tcp: eager sends
    "C4_SHM_CMA",          // shm: single copy or the ring
    "C4_SHM_CMA_THRESHOLD",
    "C4_SHM_CMA_PIECE",
    "C4_SHM_CMA_CHUNK",
    "C4_SHM_LOCAL_COPY_THRESHOLD",
};

const ParamInfo* findParam(const char* env) {
  for (const ParamInfo* p : allParams())
    if (strcmp(p->env, env) == 0) return p;
  return nullptr;
}

uint64_t fnv(uint64_t h, const std::string& s) {
  for (char ch : s) h = (h ^ static_cast<uint8_t>(ch)) * 1099511628211ull;
  return (h ^ 0xff) * 1099511628211ull;
}

}  // namespace

std::vector<std::string> settingsThatMustAgree() {
  std::vector<std::string> out;
  for (const char* e : kMustAgree) out.emplace_back(e);
  return out;
}

std::string settingValue(const char* env) {
  const ParamInfo* p = findParam(env);
  if (p == nullptr) return "(unknown)";
  const char* v = paramRaw(*p);
  return v ? std::string(v) : std::string("(unset)");
}

Status checkSettingsAgree(transport::Oob& oob, int rank, int nranks) {
  // One allGather of a hash; only when some rank differs, a second one of the values (every rank
  // sees the same hashes, so all take the second step or none).
  std::vector<std::string> mine;
  uint64_t h = 1469598103934665603ull;
  for (const char* e : kMustAgree) {
    mine.push_back(settingValue(e));
    h = fnv(h, mine.back());
  }
  std::vector<uint64_t> hashes(static_cast<size_t>(nranks), 0);
  hashes[static_cast<size_t>(rank)] = h;
  C4_CHECK(oob.allGather(hashes.data(), sizeof(uint64_t)));
  int other = -1;
  for (int r = 0; r < nranks && other < 0; ++r)
    if (hashes[static_cast<size_t>(r)] != hashes[0]) other = r;
  if (other < 0) return Status::ok();
  // The values, 64 bytes each (longer ones are compared by their start, which names them well
  // enough; the hash above caught the difference).
  constexpr size_t kVal = 64;
  const size_t per = kVal * (sizeof(kMustAgree) / sizeof(kMustAgree[0]));
  std::vector<char> all(per * static_cast<size_t>(nranks), 0);
  for (size_t i = 0; i < mine.size(); ++i)
    strncpy(all.data() + per * static_cast<size_t>(rank) + kVal * i, mine[i].c_str(), kVal - 1);
  C4_CHECK(oob.allGather(all.data(), per));
  for (int r = 1; r < nranks; ++r) {
    for (size_t i = 0; i < mine.size(); ++i) {
      const char* a = all.data() + kVal * i;
      const char* b = all.data() + per * static_cast<size_t>(r) + kVal * i;
      if (strncmp(a, b, kVal) == 0) continue;
      return makeError(Code::kInvalidUsage,
                       "rank %d: %s differs between ranks (rank 0: '%s', rank %d: '%s'); it shapes the schedules or "
                       "the wire, so every rank must set it alike (docs/params.md)",
                       rank, kMustAgree[i], a, r, b);
    }
  }
  return makeError(Code::kInvalidUsage,
                   "rank %d: the settings that must agree (docs/params.md) differ between rank 0 and rank %d beyond "
                   "their first %zu characters",
                   rank, other, kVal - 1);
}

}  // namespace c4
