// Element codecs, reference reductions and the deterministic data that c4-perf
// and the peer benchmarks (c4-peer-mpi, c4-peer-gloo) fill their buffers with
// and verify against.
//
// Every rank fills its input with inputValue(rank, index); the expected output
// is computed on the host from the same formula, so no rank needs another
// rank's data to check its result (the nccl-tests approach). Reductions use
// small integers so that sums and products are exact in every float type that
// can hold them; fp8 sums are checked with a rounding tolerance.
#pragma once

#include <cstddef>
#include <cstdint>

#include "c4comm/types.hpp"

namespace c4 {
namespace perf {

/// The element at `p` (of type dt) as a double.
double loadElement(DataType dt, const void* p);
/// Stores `v` into the element at `p`, rounding to nearest-even (integers wrap,
/// e4m3 saturates).
void storeElement(DataType dt, void* p, double v);

/// inout[i] = op(inout[i], in[i]) for n elements. kAvg reduces like kSum
/// (callers divide after).
void reduceInto(DataType dt, RedOp op, void* inout, const void* in, size_t n);
/// Divides n elements by `divisor` in place (the second half of an average).
void divideInPlace(DataType dt, void* buf, size_t n, int divisor);

/// True for the operations that reduce (the others are copies and `op` is
/// ignored).
bool collReduces(Coll coll);

/// The input element `index` of `rank` for a collective that reduces with `op`
/// (reducing=true) or only moves data (reducing=false). Always exactly
/// representable in dt.
double inputValue(DataType dt, RedOp op, bool reducing, int rank, size_t index, int nranks);

/// Fills n elements at `buf` with inputValue(rank, firstIndex + i).
void fillInput(DataType dt, RedOp op, bool reducing, int rank, size_t firstIndex, int nranks, void* buf, size_t n);

/// Counts the elements at `got` that differ from the reduction over all ranks
/// of inputValue(r, firstIndex + i) (exact for integers and exact cases, within
/// a rounding bound for float sums and averages).
int64_t countWrongReduced(DataType dt, RedOp op, int nranks, size_t firstIndex, const void* got, size_t n);

/// Counts the elements at `got` whose bits differ from inputValue(srcRank,
/// firstIndex + i).
int64_t countWrongCopied(DataType dt, int srcRank, size_t firstIndex, int nranks, const void* got, size_t n);

}  // namespace perf
}  // namespace c4
