// The three ways a prepared call runs (docs/architecture.md, "paths"), behind one interface: the
// executor over the transports (messages), the shared arena of small calls (one-shot), and the
// shared buffers of ncclMemAlloc (zero-copy, falling back to messages when a peer does not offer).
// The router chooses (core/route.hpp, Comm::choosePath); the driving loop only calls start/poll.
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "c4comm/status.hpp"
#include "core/tuner.hpp"

namespace c4 {

struct PreparedCall;
class OneShot;
class ZeroCopy;

class ExecPath {
 public:
  virtual ~ExecPath() = default;
  virtual PathKind kind() const = 0;
  /// Starts the prepared call.
  virtual Status start(PreparedCall* p) = 0;
  /// Advances it; *done once its result is complete, *progressed if anything moved.
  virtual Status poll(PreparedCall* p, bool* done, bool* progressed) = 0;
  /// Whom it waits for (the watchdog's error).
  virtual std::string waitingOn(const PreparedCall* p) const = 0;
  /// The same as ranks, each with its connection's state where known (C4D).
  virtual std::vector<std::pair<int, std::string>> waitingRanks(const PreparedCall* p) const = 0;
};

/// The paths (core/paths.cc): the executor over the transports; the one-shot arena; zero-copy,
/// which falls back to `messages` when a peer does not offer its buffers.
std::unique_ptr<ExecPath> makeMessagePath();
std::unique_ptr<ExecPath> makeOneShotPath(OneShot* oneShot);
std::unique_ptr<ExecPath> makeZeroCopyPath(ZeroCopy* zeroCopy, ExecPath* messages);

}  // namespace c4
