// The planner's problem relaxed to a linear program, solved with GLPK: a lower bound on the most
// loaded link's seconds that any plan (any lanes, any split) can reach.
#pragma once

#include <string>

#include "planner/planner.hpp"

namespace c4test {

struct LpBound {
  bool ok = false;
  std::string error;   // why not, when !ok
  double seconds = 0;  // the optimum t
  int vars = 0, rows = 0;
};

/// minimize t subject to: the bytes of each connection (ranks a < b, flows summed per direction
/// as the planner does) are split over its candidates (a's port, b's port, path between them) in
/// fractions x >= 0 summing to 1; the a->b bytes ride the path, the b->a bytes the same links
/// reversed (Link::reverse); and every directed link's load * 8 / bps <= t.
LpBound lpLowerBound(const c4::plan::PlanInput& in);

}  // namespace c4test
