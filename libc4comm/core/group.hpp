// Group execution: what groupEnd runs, and how a single blocking call runs.
#pragma once

#include <vector>

#include "c4comm/status.hpp"
#include "core/comm.hpp"

namespace c4 {

/// Operations issued on one communicator, in call order.
struct GroupItem {
  Comm* comm = nullptr;
  std::vector<OpDesc> ops;
};

/// Runs every item to completion. Per communicator: its collectives in call order, then all its
/// point-to-point operations as one batch (posted together, so sends and receives between the
/// same ranks cannot deadlock). Different communicators progress concurrently from this thread.
/// On failure every communicator involved is failed (peers are told) and the first error returned.
Status runGroupItems(std::vector<GroupItem>& items);

}  // namespace c4
