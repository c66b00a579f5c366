// One rule for settings, enforced at communicator init: every rank's settings must be
// acceptable (the parameter registry knows each one's range, choices or syntax: common/params.hpp)
// and those that shape the schedules or the wire (kParamSameOnAllRanks) must be the same on every
// rank. Both are checked with one allGather; a problem on any rank fails init on every rank with an
// error naming the setting, the rank(s) and the value(s). docs/params.md lists each setting's range
// and whether it must agree.
#pragma once

#include <string>
#include <vector>

#include "c4comm/status.hpp"
#include "transports/transport.hpp"

namespace c4 {

/// The env names of the settings that must agree across ranks (kParamSameOnAllRanks).
std::vector<std::string> settingsThatMustAgree();
/// The value in effect of a registered setting, as ranks compare it ("(unknown)" if not registered).
std::string settingValue(const char* env);
/// Collective over `oob`: ok when every rank's settings are acceptable and agree; else an error on
/// every rank (kInvalidArgument for a refused value, kInvalidUsage for a disagreement).
Status checkSettings(transport::Oob& oob, int rank, int nranks);

}  // namespace c4
