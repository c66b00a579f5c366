// The observers a communicator attaches at init (core/observer.hpp), and their order:
//   1. fault injection (C4_FAULT; only when set): before anything else sees the call start;
//   2. the watchdog: the clock of "no progress for C4_TIMEOUT", whose verdict the next ones read;
//   3. C4D: telemetry of every call, stall reports, the diagnosis of a hang, the failure's
//      explanation and the notice to the peers, the rates the heartbeats carry;
//   4. the tracer: the op events (open as a call starts, completed in place as it ends), and the
//      communicator's error;
//   5. C4P (only when it planned lanes): rebalancing between calls.
// C4D comes before the tracer so that a diagnosis drained at a call's end lands in the trace
// before the call's completion; C4P last, so that its rebalancing never delays what the others
// stamp.
// They are CallObservers::Builtins (core/call_observers.cc), attached by
// CallObservers::attachBuiltins.
#pragma once

#include "core/observer.hpp"
