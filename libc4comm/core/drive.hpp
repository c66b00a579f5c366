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

/// The calls of one thread's open group (groupStart .. groupEnd), queued until groupEnd.
struct GroupQueue {
  std::vector<GroupItem> items;
  /// A call of the group threw (out of memory) after it may have queued part of its work: the group
  /// runs nothing. A flag, not a Status: making one needs memory.
  bool threw = false;
  /// Appends `op` to comm's calls (core/route.cc). An exception (out of memory) marks the group and
  /// goes on to the caller.
  void add(Comm* comm, const OpDesc& op);
};

/// While it lives, this thread drives a communicator without a progress thread (Comm::markDriven).
class BusyScope {
 public:
  explicit BusyScope(Comm* c) : c_(c) { c_->markDriven(true); }
  ~BusyScope() { c_->markDriven(false); }
  BusyScope(const BusyScope&) = delete;
  BusyScope& operator=(const BusyScope&) = delete;

 private:
  Comm* c_;
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
