// One registry of environment parameters. Define a parameter anywhere with
//   C4_PARAM_INT(Name, "C4_ENV", "NCCL_ENV" or nullptr, default, "help")
//   C4_PARAM_STR(Name, "C4_ENV", "NCCL_ENV" or nullptr, "default", "help")
// which gives `int64_t paramName()` / `std::string paramName()`. The C4_ name wins over the NCCL_
// name. Values are read from the environment at each call: read them once at communicator init, not
// on a hot path. `c4-perf --list-params` prints allParams(); docs/params.md documents them.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace c4 {

struct ParamInfo {
  const char* name;
  const char* env;
  const char* ncclEnv;  // may be null
  const char* defaultText;
  const char* help;
  bool isString;
};

/// All parameters registered so far, sorted by env name.
std::vector<const ParamInfo*> allParams();
/// Raw lookup: the C4 value, else the NCCL value, else nullptr.
const char* paramRaw(const ParamInfo& info);

class IntParam {
 public:
  IntParam(const char* name, const char* env, const char* ncclEnv, int64_t def, const char* defText, const char* help);
  /// The value; an unparsable value logs a warning once and yields the default.
  int64_t get() const;
  /// True if the environment sets it (the C4 or the NCCL name).
  bool isSet() const { return paramRaw(info_) != nullptr; }

 private:
  ParamInfo info_;
  int64_t default_;
};

class StrParam {
 public:
  StrParam(const char* name, const char* env, const char* ncclEnv, const char* def, const char* help);
  std::string get() const;

 private:
  ParamInfo info_;
};

}  // namespace c4

#define C4_PARAM_INT(Name, env, ncclEnv, def, help)                                 \
  inline const ::c4::IntParam kC4Param##Name{#Name, env, ncclEnv, def, #def, help}; \
  inline int64_t param##Name() { return kC4Param##Name.get(); }
#define C4_PARAM_STR(Name, env, ncclEnv, def, help)                           \
  inline const ::c4::StrParam kC4Param##Name{#Name, env, ncclEnv, def, help}; \
  inline std::string param##Name() { return kC4Param##Name.get(); }
