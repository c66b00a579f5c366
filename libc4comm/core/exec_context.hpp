// ExecContext: what the execution paths (executor, one-shot, zero-copy) need of a communicator,
// and nothing else: its connections and their capabilities, progress of its transports, staging
// memory, the watchdog and the tracer. Comm implements it; a test implements it over in-memory
// connections to run the executor without a communicator.
#pragma once

#include <cstddef>
#include <cstdint>

#include "c4comm/status.hpp"
#include "core/watchdog.hpp"
#include "trace/recorder.hpp"
#include "transports/transport.hpp"

namespace c4 {

class ExecContext {
 public:
  virtual ~ExecContext() = default;
  virtual int thisRank() const = 0;
  virtual int numRanks() const = 0;
  /// The connection to `peer` through the transport that reaches it.
  virtual Status connection(int peer, transport::Connection** out) = 0;
  /// The capabilities of the transport that reaches `peer` (memory spaces, reduction on receive).
  virtual transport::Caps capsOf(int peer) const = 0;
  /// Which transport reaches `peer` (its index in the communicator's list; the trace's
  /// Event::transport).
  virtual uint8_t transportIndexOf(int peer) const = 0;
  /// Advances every transport; fails if one did (the communicator has failed).
  virtual Status progress() = 0;
  /// A counter that grows whenever the transports move bytes (for the watchdog).
  virtual uint64_t transportProgress() const = 0;
  virtual trace::Recorder& tracer() = 0;
  virtual Watchdog& watchdog() = 0;
  /// The communicator's init was cancelled (an abort or destroy while it initializes): waits of the
  /// init phase end.
  virtual bool cancelled() const { return false; }
};

}  // namespace c4
