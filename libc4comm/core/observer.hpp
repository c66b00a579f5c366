// Call observers: what watches the calls a communicator runs (the watchdog, C4_FAULT's fault
// injection, C4D, the tracer, C4P's rebalancing) implements one interface and is attached at init
// (core/call_observers.hpp says which, in which order); the driving loop names none of them.
//
// The driving thread calls every hook. A call is started, then polled: the polls that moved
// anything are `progressed`, the rounds where nothing moved are `idle`, and the call ends
// `finished`, or the communicator fails (`explain`, then `failed`, once per communicator).
// Each observer says which of these it takes (events()). Hot path: started, progressed and
// finished run on every call.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "c4comm/status.hpp"

namespace c4 {

struct PreparedCall;
struct Comm;

class CallObserver {
 public:
  enum Event : unsigned {
    kStarted = 1u << 0,
    kProgressed = 1u << 1,
    kIdle = 1u << 2,
    kFinished = 1u << 3,
    kFailed = 1u << 4,  // explain and failed
  };
  virtual ~CallObserver() = default;
  /// The events it takes: a mask of Event.
  virtual unsigned events() const = 0;

  /// The call starts (before its path starts it; for a no-op call too).
  virtual void started(PreparedCall&) {}
  /// A poll of the call moved something.
  virtual void progressed(const PreparedCall&) {}
  /// A round where nothing moved. `verdict` is what the observers before said (Ok, or an error:
  /// the call is stuck); returns the verdict after this one (an error fails the communicator).
  virtual Status idle(const PreparedCall&, Status verdict) { return verdict; }
  /// The call ended at `endTicks` (trace clock; 0: not timed, a one-shot call the tracer skips).
  virtual void finished(PreparedCall&, uint64_t /*endTicks*/) {}
  /// The communicator is about to fail with `st` from a cause outside this rank's control (not an
  /// abort): returns `st`, or `st` with an explanation (C4D's diagnosis).
  virtual Status explain(const Status& st) { return st; }
  /// The communicator failed with `st` (once), before its transports tell the peers.
  virtual void failed(const Status&) {}
};

/// A communicator's observers. The built-in ones (core/call_observers.hpp: fault injection, the
/// watchdog, C4D, the tracer, C4P) are attached at init and called first, in that order, by their
/// concrete (final) types: no virtual call, and their bodies inline into the dispatch, so a call
/// costs what the same code written in place would. Observers added with add() (a test, a
/// profiler) follow, in the order added, through the interface; none costs a vector's empty check.
class CallObservers {
 public:
  CallObservers();
  ~CallObservers();
  CallObservers(const CallObservers&) = delete;
  CallObservers& operator=(const CallObservers&) = delete;

  /// Attaches the built-in observers of `comm` (its init, once its services are up).
  void attachBuiltins(Comm* comm);
  void add(std::unique_ptr<CallObserver> o);
  /// Observers attached: the built-in ones and those added.
  size_t size() const;

  void started(PreparedCall& p);
  void progressed(const PreparedCall& p);
  Status idle(const PreparedCall& p);
  void finished(PreparedCall& p, uint64_t endTicks);
  Status explain(Status st);
  void failed(const Status& st);

 private:
  struct Builtins;
  std::unique_ptr<Builtins> b_;
  std::vector<std::unique_ptr<CallObserver>> owned_;
  std::vector<CallObserver*> started_, progressed_, idle_, finished_, failed_;
};

}  // namespace c4
