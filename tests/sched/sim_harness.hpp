// Test harness: runs one collective with generated schedules on the simulator and checks the
// results against a reference computed directly from the inputs.
#pragma once

#include <gtest/gtest.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "c4comm/types.hpp"
#include "sched/schedule.hpp"
#include "sched/simulate.hpp"

namespace c4::sched::test {

struct CaseSpec {
  Coll coll = Coll::kAllReduce;
  Algo algo = Algo::kRing;
  int nranks = 2;
  size_t count = 1;
  size_t chunkBytes = 1 << 20;
  bool inPlace = false;
  int root = 0;
  DataType dtype = DataType::kInt32;
  RedOp op = RedOp::kSum;
  uint64_t seed = 0;
  /// Inputs are small integers (exact in every order); false: random reals in (-1, 1) for floats,
  /// compared with a tolerance (AllReduce is still checked bitwise identical across ranks).
  bool exactValues = true;
  /// Host of every rank for the hierarchical generators (empty: one host).
  std::vector<int32_t> hostOf;
  /// CollArgs::aliased of the generated schedules: -1 as the communicator chooses (aliased exactly
  /// when the buffers are, i.e. in place), 0 or 1 to force it.
  int planAliased = -1;
};

std::string describe(const CaseSpec& c);

/// Element-wise reduction for float32/int32/int64 (integers wrap on sum/prod).
ReduceFn makeReduce(DataType dt, RedOp op);

/// Whether the collective has an in-place form.
bool hasInPlace(Coll c);
/// Whether the collective takes a root.
bool isRooted(Coll c);
/// Whether it reduces.
bool isReducing(Coll c);

/// Generates, simulates and verifies one case. `stats` receives the simulator's statistics.
::testing::AssertionResult runCase(const CaseSpec& c, SimStats* stats = nullptr);

}  // namespace c4::sched::test
