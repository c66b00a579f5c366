// c4-matrix: the collective test matrix as one rank of a launched job (torchrun-style variables,
// Open MPI's mpirun or Slurm; see commInitFromEnv), for runs that span hosts such as netlab fabrics.
//   RANK=0 WORLD_SIZE=2 MASTER_ADDR=... MASTER_PORT=... c4-matrix [--quick] [--big BYTES]
// Prints "c4-matrix rank R/N: OK (K cases)" or the failures (capped) and exits non-zero on any.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "c4comm/c4comm.hpp"
#include "tests/coll/coll_matrix.hpp"

int main(int argc, char** argv) {
  c4test::MatrixOptions opt;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--quick") == 0) {
      opt.counts = {0, 1, 1009};
      opt.bigBytes = 256u << 10;
      opt.allTypesForMovement = false;
    } else if (std::strcmp(argv[i], "--big") == 0 && i + 1 < argc) {
      opt.bigBytes = std::strtoull(argv[++i], nullptr, 10);
    } else {
      std::fprintf(stderr, "usage: %s [--quick] [--big BYTES]   (ranks from launcher variables)\n", argv[0]);
      return 2;
    }
  }
  c4::Comm* comm = nullptr;
  c4::Status st = c4::commInitFromEnv(&comm);
  if (!st.isOk()) {
    std::fprintf(stderr, "c4-matrix: commInitFromEnv: %s\n", st.toString().c_str());
    return 1;
  }
  int rank = 0, n = 0;
  (void)c4::commUserRank(comm, &rank);
  (void)c4::commCount(comm, &n);
  c4test::MatrixRunner runner(comm, rank, n);
  c4test::Failures f = runner.run(opt);
  st = c4::commDestroy(comm);
  if (!st.isOk()) f.push_back("commDestroy: " + st.toString());
  if (f.empty()) {
    std::printf("c4-matrix rank %d/%d: OK\n", rank, n);
    return 0;
  }
  std::printf("c4-matrix rank %d/%d: %zu failure(s)\n", rank, n, f.size());
  for (const std::string& s : f) std::printf("  %s\n", s.c_str());
  return 1;
}
