#include "core/settings.hpp"

#include <cstring>
#include <vector>

#include "common/hash.hpp"
#include "common/params.hpp"
#include "common/status.hpp"

namespace c4 {

namespace {

// Settings that must agree: ranks that disagree run different plans and exchange messages the
// other does not expect (silent wrong data, or a hang). C4_ZEROCOPY may differ: the ranks agree per
// call (one rank that does not offer the path turns it off for all). C4_TOPO_FILE may name
// different paths: the planner compares the files' contents.
std::vector<const ParamInfo*> mustAgree() {
  std::vector<const ParamInfo*> out;
  for (const ParamInfo* p : allParams())
    if (p->flags & kParamSameOnAllRanks) out.push_back(p);
  return out;
}

uint64_t fnv(uint64_t h, const std::string& s) { return (fnv1a(s, h) ^ 0xff) * kFnvPrime; }

struct Summary {
  uint64_t hash;     // of the values that must agree
  uint64_t refused;  // 1: this rank has a setting it refuses
};

constexpr size_t kVal = 64;       // bytes per value in the second round (longer ones: their start)
constexpr size_t kProblem = 256;  // bytes of a rank's first refused setting

}  // namespace

std::vector<std::string> settingsThatMustAgree() {
  std::vector<std::string> out;
  for (const ParamInfo* p : mustAgree()) out.emplace_back(p->env);
  return out;
}

std::string settingValue(const char* env) {
  const ParamInfo* p = findParam(env);
  return p == nullptr ? std::string("(unknown)") : paramEffective(*p);
}

Status checkSettings(transport::Oob& oob, int rank, int nranks) {
  // This rank's refused settings: those set by their C4_ name fail init; those set by an NCCL_ alias
  // (a value NVIDIA's library may know) are warnings.
  std::string problem;
  for (const ParamIssue& issue : invalidParams()) {
    if (!issue.fatal)
      warnRefused(issue);
    else if (problem.empty())
      problem = describe(issue);
  }
  const std::vector<const ParamInfo*> agree = mustAgree();
  std::vector<std::string> mine;
  Summary s{kFnvOffset, problem.empty() ? 0u : 1u};
  for (const ParamInfo* p : agree) {
    mine.push_back(paramEffective(*p));
    s.hash = fnv(s.hash, mine.back());
  }
  // One allGather of a summary; only when some rank refuses a setting or differs, a second one of the
  // texts (every rank sees the same summaries, so all take the second step or none).
  std::vector<Summary> all(static_cast<size_t>(nranks), Summary{0, 0});
  all[static_cast<size_t>(rank)] = s;
  C4_CHECK(oob.allGather(all.data(), sizeof(Summary)));
  int other = -1, refusing = -1;
  for (int r = 0; r < nranks; ++r) {
    if (other < 0 && all[static_cast<size_t>(r)].hash != all[0].hash) other = r;
    if (refusing < 0 && all[static_cast<size_t>(r)].refused) refusing = r;
  }
  if (other < 0 && refusing < 0) return Status::ok();
  const size_t per = kProblem + kVal * agree.size();
  std::vector<char> texts(per * static_cast<size_t>(nranks), 0);
  char* own = texts.data() + per * static_cast<size_t>(rank);
  strncpy(own, problem.c_str(), kProblem - 1);
  for (size_t i = 0; i < mine.size(); ++i) strncpy(own + kProblem + kVal * i, mine[i].c_str(), kVal - 1);
  C4_CHECK(oob.allGather(texts.data(), per));
  if (refusing >= 0)
    return makeError(Code::kInvalidArgument, "rank %d: a setting of rank %d is not accepted: %s", rank, refusing,
                     texts.data() + per * static_cast<size_t>(refusing));
  for (size_t i = 0; i < agree.size(); ++i) {
    const char* a = texts.data() + kProblem + kVal * i;
    for (int r = 1; r < nranks; ++r) {
      const char* b = texts.data() + per * static_cast<size_t>(r) + kProblem + kVal * i;
      if (strncmp(a, b, kVal) == 0) continue;
      return makeError(Code::kInvalidUsage,
                       "rank %d: %s differs between ranks (rank 0: '%s', rank %d: '%s'); it shapes the schedules or "
                       "the wire, so every rank must set it alike (docs/params.md)",
                       rank, agree[i]->env, a, r, b);
    }
  }
  return makeError(Code::kInvalidUsage,
                   "rank %d: the settings that must agree (docs/params.md) differ between rank 0 and rank %d beyond "
                   "their first %zu characters",
                   rank, other, kVal - 1);
}

}  // namespace c4
