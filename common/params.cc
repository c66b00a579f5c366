#include "common/params.hpp"

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <set>

#include "common/logging.hpp"

namespace c4 {
namespace {
std::mutex& regMu() {
  static std::mutex* m = new std::mutex();
  return *m;
}
std::vector<const ParamInfo*>& registry() {
  static auto* r = new std::vector<const ParamInfo*>();
  return *r;
}
void registerParam(const ParamInfo* p) {
  std::lock_guard<std::mutex> g(regMu());
  for (const ParamInfo* q : registry())
    if (strcmp(q->env, p->env) == 0) return;  // same inline parameter seen from another TU
  registry().push_back(p);
}

// A refused value is reported once per variable and value, at the default log level: a setting
// that does nothing must not go unnoticed (the log level itself may be what is mistyped).
void warnOnce(const ParamInfo& info, const char* setBy, const char* value, const std::string& why) {
  static std::mutex* mu = new std::mutex();
  static auto* seen = new std::set<std::string>();
  {
    std::lock_guard<std::mutex> g(*mu);
    if (!seen->insert(std::string(setBy) + "=" + value).second) return;
  }
  // One statement of what happens: a value set by its C4_ name makes communicator init fail
  // (core/settings.cc), so "using the default" would be wrong there; an NCCL_ alias's is a warning.
  if (strncmp(setBy, "C4_", 3) == 0)
    C4_WARN_ALWAYS(kLogEnv, "refusing %s=%s: %s; communicator init fails while it is set (docs/params.md)", setBy,
                   value, why.c_str());
  else
    C4_WARN_ALWAYS(kLogEnv, "ignoring %s=%s: %s; using the default %s%s%s", setBy, value, why.c_str(),
                   info.isString ? "'" : "", info.defaultText, info.isString ? "'" : "");
}

bool isChoice(const char* choices, const std::string& v) {
  const char* p = choices;
  while (true) {
    const char* bar = strchr(p, '|');
    const size_t n = bar ? static_cast<size_t>(bar - p) : strlen(p);
    if (n == v.size() && strncmp(p, v.c_str(), n) == 0) return true;
    if (!bar) return false;
    p = bar + 1;
  }
}

}  // namespace

namespace detail {
bool parseIntParam(const char* text, int64_t* out) {
  char* end = nullptr;
  errno = 0;
  long long x = strtoll(text, &end, 0);  // skips leading blanks
  if (errno != 0 || end == text) return false;
  int shift = 0;
  if (*end == 'K' || *end == 'k')
    shift = 10, ++end;
  else if (*end == 'M' || *end == 'm')
    shift = 20, ++end;
  else if (*end == 'G' || *end == 'g')
    shift = 30, ++end;
  while (*end == ' ' || *end == '\t' || *end == '\n') ++end;  // trailing blanks too, as leading ones
  if (*end != '\0') return false;
  // The suffix must not overflow.
  if (shift > 0 && (x > (INT64_MAX >> shift) || x < (INT64_MIN >> shift))) return false;
  *out = static_cast<int64_t>(x) * (int64_t{1} << shift);
  return true;
}
}  // namespace detail

std::vector<const ParamInfo*> allParams() {
  std::lock_guard<std::mutex> g(regMu());
  std::vector<const ParamInfo*> out = registry();
  std::sort(out.begin(), out.end(), [](const ParamInfo* a, const ParamInfo* b) { return strcmp(a->env, b->env) < 0; });
  return out;
}

const ParamInfo* findParam(const char* env) {
  std::lock_guard<std::mutex> g(regMu());
  for (const ParamInfo* p : registry())
    if (strcmp(p->env, env) == 0 || (p->ncclEnv && strcmp(p->ncclEnv, env) == 0)) return p;
  return nullptr;
}

const char* paramRaw(const ParamInfo& info, const char** from) {
  const char* v = getenv(info.env);
  if (v && *v) {
    if (from) *from = info.env;
    return v;
  }
  if (info.ncclEnv) {
    v = getenv(info.ncclEnv);
    if (v && *v) {
      if (from) *from = info.ncclEnv;
      return v;
    }
  }
  return nullptr;
}

std::string paramRangeText(const ParamInfo& info) {
  if (info.isString) {
    if (info.check.choices) return info.check.choices;
    if (info.check.fn) return "as described";
    return "";
  }
  auto num = [](int64_t x) {
    if (x == INT64_MAX) return std::string("max");
    if (x == INT64_MIN) return std::string("min");
    return std::to_string(x);
  };
  std::string r = num(info.lo) + ".." + num(info.hi);
  if (info.lo == info.hi) r = num(info.lo);
  if (info.flags & kParamZeroToo) r = "0 or " + r;
  return r;
}

std::string paramProblem(const ParamInfo& info, const char* value) {
  if (info.isString) {
    const std::string v(value);
    if (info.check.choices && !isChoice(info.check.choices, v))
      return std::string("expected one of ") + info.check.choices;
    std::string why;
    if (info.check.fn && !info.check.fn(v, &why)) return why.empty() ? std::string("not accepted") : why;
    return "";
  }
  int64_t x = 0;
  if (!detail::parseIntParam(value, &x)) return "not an integer";
  if ((info.flags & kParamZeroToo) && x == 0) return "";
  if (x < info.lo || x > info.hi) return "out of range " + paramRangeText(info);
  return "";
}

std::string paramEffective(const ParamInfo& info) {
  const char* v = paramRaw(info);
  if (v == nullptr || !paramProblem(info, v).empty()) {
    v = info.defaultText;
    if (info.isString) return v;
  }
  if (info.isString) return v;
  int64_t x = 0;
  return detail::parseIntParam(v, &x) ? std::to_string(x) : std::string(v);
}

std::vector<ParamIssue> invalidParams() {
  std::vector<ParamIssue> out;
  for (const ParamInfo* p : allParams()) {
    const char* from = nullptr;
    const char* v = paramRaw(*p, &from);
    if (v == nullptr) continue;
    std::string why = paramProblem(*p, v);
    if (why.empty()) continue;
    out.push_back(ParamIssue{p, from, v, why, strcmp(from, p->env) == 0});
  }
  return out;
}

std::string describe(const ParamIssue& issue) {
  return issue.setBy + "=" + issue.value + ": " + issue.why + " (docs/params.md)";
}

void warnRefused(const ParamIssue& issue) {
  warnOnce(*issue.info, issue.setBy.c_str(), issue.value.c_str(), issue.why);
}

IntParam::IntParam(const char* name, const char* env, const char* ncclEnv, int64_t def, int64_t lo, int64_t hi,
                   uint32_t flags, const char* help)
    : default_(def), defaultText_(std::to_string(def)) {
  info_.name = name;
  info_.env = env;
  info_.ncclEnv = ncclEnv;
  info_.defaultText = defaultText_.c_str();
  info_.help = help;
  info_.isString = false;
  info_.lo = lo;
  info_.hi = hi;
  info_.flags = flags;
  registerParam(&info_);
}

int64_t IntParam::get() const {
  const char* from = nullptr;
  const char* v = paramRaw(info_, &from);
  if (!v) return default_;
  std::string why = paramProblem(info_, v);
  if (!why.empty()) {
    warnOnce(info_, from, v, why);
    return default_;
  }
  int64_t x = default_;
  detail::parseIntParam(v, &x);
  return x;
}

StrParam::StrParam(const char* name, const char* env, const char* ncclEnv, const char* def, StrCheck check,
                   uint32_t flags, const char* help) {
  info_.name = name;
  info_.env = env;
  info_.ncclEnv = ncclEnv;
  info_.defaultText = def;
  info_.help = help;
  info_.isString = true;
  info_.check = check;
  info_.flags = flags;
  registerParam(&info_);
}

std::string StrParam::get() const {
  const char* from = nullptr;
  const char* v = paramRaw(info_, &from);
  if (!v) return std::string(info_.defaultText);
  std::string why = paramProblem(info_, v);
  if (!why.empty()) {
    warnOnce(info_, from, v, why);
    return std::string(info_.defaultText);
  }
  return std::string(v);
}

}  // namespace c4
