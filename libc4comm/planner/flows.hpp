// The flows a collective's schedules put between ranks (planner input): bytes each rank sends each
// other rank in one call, summed over every rank's generated schedule.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "c4comm/status.hpp"
#include "c4comm/types.hpp"
#include "planner/planner.hpp"
#include "sched/schedule.hpp"

namespace c4::plan {

/// One call of `coll` with `bytes` of float32 data per rank (the count NCCL's API takes) run with
/// `algo` over `nranks` ranks; `hostOf` numbers the ranks' hosts (the hierarchical schedules read
/// it; may be empty). Falls back to ring when `algo` does not support the call (*used says which ran).
Status scheduleFlows(sched::Algo algo, Coll coll, int nranks, size_t bytes, const std::vector<int32_t>& hostOf,
                     std::vector<Flow>* out, sched::Algo* used = nullptr);

/// Adds `more` to `flows`: a pair in both gets the sum of its bytes (the order of `flows` is kept,
/// new pairs follow in `more`'s order).
void addFlows(const std::vector<Flow>& more, std::vector<Flow>* flows);

}  // namespace c4::plan
