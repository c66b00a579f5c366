// The collective matrix over real processes (fork per rank) and over threads (ranks in one
// process), for 1, 2, 3, 4 and 8 ranks.
#include <gtest/gtest.h>

#include "tests/coll/coll_matrix.hpp"

namespace c4test {
namespace {

Failures matrixBody(int rank, int nranks, const c4::UniqueId& id, const MatrixOptions& opt) {
  c4::Comm* comm = nullptr;
  c4::Status st = c4::commInitRank(&comm, nranks, id, rank);
  if (!st.isOk()) return {"commInitRank: " + st.toString()};
  MatrixRunner runner(comm, rank, nranks);
  Failures f = runner.run(opt);
  st = c4::commDestroy(comm);
  if (!st.isOk()) f.push_back("commDestroy: " + st.toString());
  return f;
}

class ForkedMatrix : public ::testing::TestWithParam<int> {};

TEST_P(ForkedMatrix, AllCollectivesTypesOpsCounts) {
  int n = GetParam();
  MatrixOptions opt;
  if (n >= 8) {
    // Eight processes share two cores: keep the small-count matrix whole, trim movement types.
    opt.allTypesForMovement = false;
  }
  auto outs = runForked(n, [&](int r, int nr, const c4::UniqueId& id) { return matrixBody(r, nr, id, opt); });
  std::string s = summarize(outs);
  EXPECT_TRUE(s.empty()) << s;
}

INSTANTIATE_TEST_SUITE_P(Ranks, ForkedMatrix, ::testing::Values(1, 2, 3, 4, 8),
                         [](const ::testing::TestParamInfo<int>& i) { return "np" + std::to_string(i.param); });

class ThreadMatrix : public ::testing::TestWithParam<int> {};

TEST_P(ThreadMatrix, AllCollectivesTypesOpsCounts) {
  int n = GetParam();
  MatrixOptions opt;
  opt.counts = {0, 1, 1009, 70001};
  opt.bigBytes = 1u << 20;
  auto outs = runThreads(n, [&](int r, int nr, const c4::UniqueId& id) { return matrixBody(r, nr, id, opt); });
  std::string s = summarize(outs);
  EXPECT_TRUE(s.empty()) << s;
}

INSTANTIATE_TEST_SUITE_P(Ranks, ThreadMatrix, ::testing::Values(2, 3),
                         [](const ::testing::TestParamInfo<int>& i) { return "threads" + std::to_string(i.param); });

}  // namespace
}  // namespace c4test
