// The driving loop (one): what a blocking call, groupEnd and the progress thread run. drive.cc also
// holds one call's steps on the driving thread (Comm::startPrepared, pollPrepared, watchIdle,
// finish: the paths and the observers).
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

/// Starts the prepared call `p` of `comm` and runs it to completion; on failure fails the communicator (its
/// peers are told) and returns its error.
Status runCall(Comm* comm, PreparedCall* p);

/// Runs every item to completion. Per communicator: its collectives in call order, then all its
/// point-to-point operations as one batch (posted together, so sends and receives between the
/// same ranks cannot deadlock). Different communicators progress concurrently from this thread.
/// On failure every communicator involved is failed (peers are told) and the first error returned.
Status runGroupItems(std::vector<GroupItem>& items);

}  // namespace c4
