#include "common/params.hpp"

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <mutex>

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
}  // namespace

std::vector<const ParamInfo*> allParams() {
  std::lock_guard<std::mutex> g(regMu());
  std::vector<const ParamInfo*> out = registry();
  std::sort(out.begin(), out.end(), [](const ParamInfo* a, const ParamInfo* b) { return strcmp(a->env, b->env) < 0; });
  return out;
}

const char* paramRaw(const ParamInfo& info) {
  const char* v = getenv(info.env);
  if (v && *v) return v;
  if (info.ncclEnv) {
    v = getenv(info.ncclEnv);
    if (v && *v) return v;
  }
  return nullptr;
}

IntParam::IntParam(const char* name, const char* env, const char* ncclEnv, int64_t def, const char* defText,
                   const char* help)
    : info_{name, env, ncclEnv, defText, help, false}, default_(def) {
  registerParam(&info_);
}

int64_t IntParam::get() const {
  const char* v = paramRaw(info_);
  if (!v) return default_;
  char* end = nullptr;
  errno = 0;
  long long x = strtoll(v, &end, 0);
  // Accept size suffixes K, M, G (powers of 1024) for convenience.
  if (end && (*end == 'K' || *end == 'k'))
    x <<= 10, ++end;
  else if (end && (*end == 'M' || *end == 'm'))
    x <<= 20, ++end;
  else if (end && (*end == 'G' || *end == 'g'))
    x <<= 30, ++end;
  if (errno != 0 || end == v || *end != '\0') {
    C4_WARN(kLogEnv, "ignoring %s=%s: not an integer; using default %lld", info_.env, v,
            static_cast<long long>(default_));
    return default_;
  }
  return x;
}

StrParam::StrParam(const char* name, const char* env, const char* ncclEnv, const char* def, const char* help)
    : info_{name, env, ncclEnv, def, help, true} {
  registerParam(&info_);
}

std::string StrParam::get() const {
  const char* v = paramRaw(info_);
  return v ? std::string(v) : std::string(info_.defaultText);
}

}  // namespace c4
