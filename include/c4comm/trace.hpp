// c4comm's built-in event tracer: the public C++ API.
//
// Every communicator records fixed-size binary events into its own ring in memory (no allocation,
// lock or system call per event): one event per operation at level `op` (the default), plus one per
// transport step (send/receive/local copy or reduce) at level `step`. The ring is written to
// C4_TRACE_DIR when the communicator is finalized, destroyed or aborted, on a fatal signal, on
// SIGUSR2 and on flush(). `tools/c4-trace/c4-trace` merges the ranks' files into a report and a
// Chrome/Perfetto timeline. docs/tracing.md describes the levels, the file format and the costs.
//
// Threading: like every call on a communicator, the calls below that take a Comm* are made by the
// thread that currently uses that communicator (one thread at a time); now() and ticksToNs() may be
// called from any thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "c4comm/export.hpp"
#include "c4comm/status.hpp"

namespace c4 {

struct Comm;

namespace trace {

/// How much a communicator records (C4_TRACE=0|op|step).
enum class Level : int { kOff = 0, kOp = 1, kStep = 2 };

/// What an event describes.
enum class EventType : uint8_t {
  kOp = 1,     ///< one operation: t0 = begin, t1 = end (collective, or one send/recv of a batch)
  kStep = 2,   ///< one step of an operation (level step): t0 = posted, t1 = completed
  kError = 3,  ///< the communicator failed: t0 = t1 = when; bytes = status code; name = message
  kDiag = 4,   ///< a diagnosis or note (addNote); name = text
  kSpan = 5,   ///< a span added by the application or a binding (addSpan); name = its name
  kPlan = 6,   ///< C4P (docs/c4p.md): Event::redop is a PlanEvent; name = its text
};

/// What a kPlan event records (Event::redop).
enum class PlanEvent : uint8_t {
  kPlan = 0,     ///< the plan made at init; t0 = t1; name = its summary
  kReplan = 1,   ///< a lane replaced or moved; t0 = t1; peer; lane = the new lane; name = what happened
  kWeights = 2,  ///< striping weights changed; t0 = t1; peer; name = the weights
  /// What one lane sent between two looks of the rebalancer: [t0, t1] the window, bytes, peer,
  /// lane; name = its way from this rank ("h1p1 -> leaf0 -> spine1 -> leaf1 -> h2p1"), so a
  /// reader adds the bytes to each hop: per-link load over time.
  kLaneSample = 3,
};

/// Algorithm codes in Event::algo: sched::Algo values (0 ring, 1 tree, 2 rhd, 3 direct, 4 hier; 5..0xfb
/// schedules loaded from files, in the order the process registered them), or:
constexpr uint8_t kAlgoZeroCopy = 0xfc;  ///< the zero-copy path (shareable buffers, one host)
constexpr uint8_t kAlgoOneShot = 0xfd;   ///< the shared-memory one-shot path (small messages, one host)
constexpr uint8_t kAlgoP2p = 0xfe;       ///< a point-to-point batch
constexpr uint8_t kAlgoNone = 0xff;      ///< nothing ran (count 0) or not applicable

/// Step kinds in Event::redop for kStep events (Event::coll is the operation's collective).
enum class StepKind : uint8_t { kSend = 0, kRecv = 1, kRecvReduce = 2, kCopy = 3, kReduce = 4 };

/// Event::lane of a step whose message was striped over several lanes of its connection.
constexpr uint8_t kLaneStriped = 0xff;

/// Bits of Event::flags.
constexpr uint8_t kFlagInPlace = 1;  ///< kOp: sendbuff == recvbuff
constexpr uint8_t kFlagNoop = 2;     ///< kOp: count 0, nothing moved
/// kOp: the end was not timed (t1 == t0). One-shot calls end as soon as the last rank has arrived,
/// so c4-trace takes the latest t0 of the call over the ranks as every rank's end; a second clock
/// read would cost a tenth of an 8-byte AllReduce. Their t0 is when the rank published its input.
constexpr uint8_t kFlagNoEnd = 4;
/// kOp: the operation has not ended (yet): it is recorded when it starts and completed in place when
/// it ends, so a trace dumped during a hang (signal, abort, timeout) shows the operation every rank
/// is in. t1 == t0 while the flag is set.
constexpr uint8_t kFlagOpen = 8;

/// One event, exactly as stored in the ring and in trace files (40 bytes, little-endian).
/// Timestamps are trace-clock ticks in the ring and in files; readEvents() converts them to ns.
struct Event {
  uint64_t t0 = 0;     ///< begin (ticks, or ns after readEvents)
  uint64_t t1 = 0;     ///< end (same unit); t1 == t0 for instants
  uint64_t bytes = 0;  ///< kOp: nominal bytes (as nccl-tests counts them); kStep: bytes moved
  uint32_t seq = 0;    ///< kOp/kStep: operation sequence number (low 32 bits); kError/kDiag/kSpan: name id
  int32_t peer = -1;   ///< kOp: root (rooted collectives) or peer (send/recv), else -1; kStep: peer or -1
  EventType type = EventType::kOp;
  uint8_t coll = 0;   ///< c4::Coll value
  uint8_t dtype = 0;  ///< c4::DataType value
  uint8_t redop = 0;  ///< kOp: c4::RedOp (0xff: PreMulSum); kStep: StepKind
  uint8_t algo = kAlgoNone;
  uint8_t lane = 0;  ///< kStep: the lane it went over, or kLaneStriped (trace files before version 2: the transport)
  uint8_t flags = 0;
  uint8_t transport = 0;  ///< kStep: index of the transport in the communicator's list (FileHeader names them)
};
static_assert(sizeof(Event) == 40, "trace::Event is the 40-byte on-disk record");

/// Sets how much `comm` records from now on (kOff stops recording; what was recorded stays).
C4_API Status setLevel(Comm* comm, Level level);
/// The level `comm` records at.
C4_API Status getLevel(const Comm* comm, Level* level);
/// Writes `comm`'s trace file now (the same file the finalize dump replaces); *path (optional)
/// receives its name. Blocking (file I/O).
C4_API Status flush(Comm* comm, std::string* path = nullptr);
/// Copies the events still in `comm`'s ring, oldest first, timestamps converted to ns on the
/// trace clock (CLOCK_MONOTONIC-based; see now()). *dropped (optional) receives how many older
/// events the ring has overwritten.
C4_API Status readEvents(const Comm* comm, std::vector<Event>* out, uint64_t* dropped = nullptr);
/// The trace clock now, in ticks (the unit of Event timestamps in the ring). Any thread; cheap.
C4_API uint64_t now();
/// Converts trace-clock ticks to ns (the unit of readEvents()).
C4_API int64_t ticksToNs(uint64_t ticks);
/// Records a span [beginTicks, endTicks] (from now()) named `name` on `comm`'s trace, e.g. a
/// training step or a bucket a binding is about to reduce. `bytes` is free for the caller.
C4_API Status addSpan(Comm* comm, const char* name, uint64_t beginTicks, uint64_t endTicks, uint64_t bytes = 0);
/// Records a note (a diagnosis, a phase marker) at now().
C4_API Status addNote(Comm* comm, const char* text);
/// The trace directory this process writes to (C4_TRACE_DIR, or the default under $TMPDIR/c4trace-<uid>).
C4_API std::string directory();

}  // namespace trace
}  // namespace c4
