// One registry of environment parameters. Define a parameter anywhere with
//   C4_PARAM_INT(Name, "C4_ENV", "NCCL_ENV" or nullptr, default, lo, hi, flags, "help")
//   C4_PARAM_STR(Name, "C4_ENV", "NCCL_ENV" or nullptr, "default", check, flags, "help")
// which gives `int64_t paramName()` / `std::string paramName()`. The C4_ name wins over the NCCL_
// name. Values are read from the environment at each call: read them once at communicator init, not
// on a hot path. `c4-perf --list-params` prints allParams(); docs/params.md documents them.
//
// One rule for settings: every parameter says what it accepts (an integer range, a list of
// choices, or a syntax check) and whether it must be the same on every rank (kParamSameOnAllRanks).
// A value it does not accept is never silently ignored: the getter warns once at the default log
// level and uses the default, and communicator init fails on it (core/settings.hpp) when it was set
// through the C4_ name (an NCCL_ alias may carry a value only NVIDIA's library knows: a warning).
// Settings that must agree are compared across ranks at init.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace c4 {

/// ParamInfo::flags.
enum ParamFlags : uint32_t {
  kParamNone = 0,
  /// Shapes the schedules or the wire: every rank must set it alike (checked at communicator init).
  kParamSameOnAllRanks = 1u << 0,
  /// Integers: 0 is accepted too (off, or chosen automatically) besides the range.
  kParamZeroToo = 1u << 1,
};

/// A string parameter's syntax check: true if `value` is acceptable, else false with `why` set.
using ParamCheckFn = bool (*)(const std::string& value, std::string* why);

/// What a string parameter accepts: one of the '|'-separated `choices` (exactly), or what
/// `fn` accepts; neither: any text.
struct StrCheck {
  const char* choices = nullptr;
  ParamCheckFn fn = nullptr;
  constexpr StrCheck() = default;
  constexpr StrCheck(const char* c) : choices(c) {}  // NOLINT: implicit on purpose (registry syntax)
  constexpr StrCheck(ParamCheckFn f) : fn(f) {}      // NOLINT
};

struct ParamInfo {
  const char* name;
  const char* env;
  const char* ncclEnv;  // may be null
  const char* defaultText;
  const char* help;
  bool isString;
  int64_t lo = 0, hi = 0;  // integers: the accepted range (with 0 when kParamZeroToo)
  StrCheck check;          // strings
  uint32_t flags = kParamNone;
};

/// All parameters registered so far, sorted by env name.
std::vector<const ParamInfo*> allParams();
/// The registered parameter named `env` (its C4_ or its NCCL_ name), or null.
const ParamInfo* findParam(const char* env);
/// Raw lookup: the C4 value, else the NCCL value, else nullptr. `from` (optional) gets the name
/// that supplied it.
const char* paramRaw(const ParamInfo& info, const char** from = nullptr);
/// The variable that supplies info's value (C4_ or NCCL_ name); the C4_ name when neither is set.
inline const char* setByOf(const ParamInfo& info) {
  const char* from = info.env;
  (void)paramRaw(info, &from);
  return from;
}
/// Why `value` is not acceptable for `info` ("" if it is). Integers accept decimal, 0x hex and the
/// suffixes K, M, G (powers of 1024).
std::string paramProblem(const ParamInfo& info, const char* value);
/// What `info` accepts, for people: "1..3600", "0 or 4096..1073741824", "0|op|step", "" (any text),
/// or "as described" for strings with a syntax check (their help says it).
std::string paramRangeText(const ParamInfo& info);
/// The value in effect, as text: the parsed integer, the string, or the default when unset or not
/// acceptable. What ranks compare for kParamSameOnAllRanks.
std::string paramEffective(const ParamInfo& info);

/// A setting whose value is not accepted.
struct ParamIssue {
  const ParamInfo* info;
  std::string setBy;  ///< the variable that was set (the C4_ or the NCCL_ name)
  std::string value;
  std::string why;
  bool fatal;  ///< set by its C4_ name: init fails; by the NCCL_ alias: a warning only
};
/// Every registered setting that is set to a value it does not accept.
std::vector<ParamIssue> invalidParams();
/// "C4_TIMEOUT=0: out of range 1..31536000 (docs/params.md)".
std::string describe(const ParamIssue& issue);
/// Warns "ignoring <issue>; using the default ..." once per variable and value, whatever C4_DEBUG
/// says (the getters do this for the values they refuse).
void warnRefused(const ParamIssue& issue);

class IntParam {
 public:
  IntParam(const char* name, const char* env, const char* ncclEnv, int64_t def, int64_t lo, int64_t hi, uint32_t flags,
           const char* help);
  /// The value; a value out of range or not an integer warns once (whatever C4_DEBUG says) and
  /// yields the default.
  int64_t get() const;
  /// True if the environment sets it (the C4 or the NCCL name).
  bool isSet() const { return paramRaw(info_) != nullptr; }
  /// The variable that sets it (the C4 or the NCCL name); the C4 name when unset. For messages.
  const char* setBy() const { return setByOf(info_); }

 private:
  ParamInfo info_;
  int64_t default_;
  std::string defaultText_;  // info_.defaultText points into it
};

class StrParam {
 public:
  StrParam(const char* name, const char* env, const char* ncclEnv, const char* def, StrCheck check, uint32_t flags,
           const char* help);
  /// The value; one the check refuses warns once (whatever C4_DEBUG says) and yields the default.
  std::string get() const;
  /// The variable that sets it (the C4 or the NCCL name); the C4 name when unset. For messages.
  const char* setBy() const { return setByOf(info_); }

 private:
  ParamInfo info_;
};

namespace detail {
/// Parses an integer setting ("4096", "0x10", "64K"); false if it is not one.
bool parseIntParam(const char* text, int64_t* out);
}  // namespace detail

}  // namespace c4

#define C4_PARAM_INT(Name, env, ncclEnv, def, lo, hi, flags, help)                           \
  inline const ::c4::IntParam kC4Param##Name{#Name, env, ncclEnv, def, lo, hi, flags, help}; \
  inline int64_t param##Name() { return kC4Param##Name.get(); }
#define C4_PARAM_STR(Name, env, ncclEnv, def, check, flags, help)                           \
  inline const ::c4::StrParam kC4Param##Name{#Name, env, ncclEnv, def, check, flags, help}; \
  inline std::string param##Name() { return kC4Param##Name.get(); }
