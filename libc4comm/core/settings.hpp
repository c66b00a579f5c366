// One rule for settings (issue 22): the environment settings that shape the schedules or the wire
// must be the same on every rank. They are listed in one place (settings.cc) and checked at init
// with one allGather; a difference is an error naming the setting, two ranks and their values.
// docs/params.md marks them "same on every rank".
#pragma once

#include <string>
#include <vector>

#include "c4comm/status.hpp"
#include "transports/transport.hpp"

namespace c4 {

/// The env names of the settings that must agree across ranks.
std::vector<std::string> settingsThatMustAgree();
/// The raw value of a registered setting ("(unset)" if not set).
std::string settingValue(const char* env);
/// Collective over `oob`: ok when every rank has the same values; else kInvalidUsage on every rank.
Status checkSettingsAgree(transport::Oob& oob, int rank, int nranks);

}  // namespace c4
