// The cost of C4D's always-on telemetry per collective (docs/performance.md, "C4D"): the stores
// Comm::startPrepared and Comm::finish make (Telemetry::enter / leave, core/health.hpp), with and
// without the clock read the trace would otherwise share, beside a bare clock read.
#include <benchmark/benchmark.h>

#include "core/health.hpp"
#include "trace/recorder.hpp"

namespace {

void BM_ClockRead(benchmark::State& s) {
  c4::trace::initClock();
  for (auto _ : s) benchmark::DoNotOptimize(c4::trace::ticks());
}
BENCHMARK(BM_ClockRead);

// One collective's telemetry when tracing is on (the trace's clock reads are reused).
void BM_TelemetryEnterLeave(benchmark::State& s) {
  c4::Telemetry t;
  uint64_t seq = 0, ticks = 1;
  for (auto _ : s) {
    t.enter(seq, ticks);
    t.leave(seq, ticks + 1, 8);
    ++seq;
    ticks += 2;
    benchmark::ClobberMemory();
  }
}
BENCHMARK(BM_TelemetryEnterLeave);

// The same with its own clock read at entry (tracing off; the exit's read is Comm::finish's).
void BM_TelemetryEnterLeaveWithClock(benchmark::State& s) {
  c4::trace::initClock();
  c4::Telemetry t;
  uint64_t seq = 0;
  for (auto _ : s) {
    t.enter(seq, c4::trace::ticks());
    t.leave(seq, c4::trace::ticks(), 8);
    ++seq;
    benchmark::ClobberMemory();
  }
}
BENCHMARK(BM_TelemetryEnterLeaveWithClock);

}  // namespace

BENCHMARK_MAIN();
