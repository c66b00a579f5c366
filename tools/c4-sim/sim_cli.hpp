// c4-sim's command line (docs/c4-sim.md): options, the fabric they name, the study (every algorithm
// and size asked for: schedules generated, lanes planned, time simulated) and its report.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "c4comm/status.hpp"
#include "c4comm/types.hpp"
#include "planner/planner.hpp"
#include "planner/topology.hpp"
#include "sim/sim_model.hpp"

namespace c4::sim {

struct Options {
  bool help = false;
  std::string checkFile;  // `c4-sim check FILE.json`: only load and check the schedule file
  // The fabric: a topology file or a generated one.
  std::string topoFile;
  std::string gen;  // "leafspine:H,P,L,S[,HOSTGBPS,UPGBPS]", "fattree:K,HPL,P[,GBPS]", "flat:H[,P[,GBPS]]"
  int ranksPerHost = 1;
  // What runs.
  Coll coll = Coll::kAllReduce;
  bool collGiven = false;
  std::vector<sched::Algo> algos = {sched::Algo::kRing};
  bool algoGiven = false;
  bool allAlgos = false;
  std::string scheduleFile;                        // --schedule: a schedule file, simulated as "file:NAME"
  std::vector<size_t> sizes = {size_t{64} << 20};  // nccl-tests' "size": the larger buffer, bytes
  size_t chunkBytes = 0;                           // 0: the tuner's rule
  bool inPlace = false;
  // The model.
  CostModel model;
  plan::Mode planner = plan::Mode::kC4p;
  int lanes = 0;  // 0: the most ports a host has
  uint64_t seed = 1;
  // Limits that keep big runs sane.
  size_t maxSteps = 40000000;   // all ranks' steps (about 60 bytes each); estimated from rank 0's
  size_t maxPlanConns = 65536;  // above this many connections between hosts, c4p gives way to ecmp
  // Output.
  std::string jsonOut;
  bool quiet = false;
};

/// The usage text (--help).
std::string usageText();
/// Parses the arguments after the program name. kInvalidArgument naming the option on anything
/// wrong: unknown options, bad numbers or sizes, an unknown collective, algorithm or planner mode,
/// a malformed --gen, ranks-per-host < 1, neither or both of --topo and --gen.
Status parseOptions(const std::vector<std::string>& args, Options* out);
/// Parses `--link-efficiency`'s value: [RATE:]E1[,E2,E4...] (RATE with a unit: 100mbit, 25gbit).
Status parseLinkEfficiency(const std::string& spec, LinkEfficiency* out);
/// "100mbit", "25gbit": a rate as --link-efficiency and netlab write it.
std::string rateLabel(double bps);
/// Loads or generates the fabric (a missing or bad topology file fails with its error).
Status makeTopology(const Options& o, plan::Topology* out);

/// The element count of one rank's call for a collective of nominal size `bytes` (float32):
/// bytes / 4, and for allgather, reducescatter and alltoall that over the rank count (as c4-perf
/// and nccl-tests take -b).
size_t countFor(Coll coll, size_t bytes, int nranks);
/// The bytes algbw counts (nccl-tests): count * 4, times the rank count for allgather,
/// reducescatter and alltoall.
double nominalBytes(Coll coll, size_t count, int nranks);
/// busbw / algbw (docs/benchmarks.md): 2(n-1)/n allreduce, (n-1)/n allgather, reducescatter and
/// alltoall, 1 otherwise.
double busFactor(Coll coll, int nranks);
/// The tuner's chunk for a call of `bytes` over `nranks` ranks: bytes / nranks / 4 within
/// [128 KiB, 1 MiB].
size_t defaultChunkBytes(size_t bytes, int nranks);

/// One (algorithm, size) result.
struct Row {
  std::string algo;
  size_t bytes = 0;  // nominal size
  size_t count = 0;  // per-rank count argument
  size_t chunkBytes = 0;
  double algbw = 0, busbw = 0;            // GB/s (1e9 B/s)
  std::string busiestLink;                // "" when no fabric link carried anything
  plan::Mode planner = plan::Mode::kC4p;  // the placement used (c4p gives way to ecmp above maxPlanConns)
  double planSeconds = 0, genSeconds = 0, simSeconds = 0;  // wall time of each phase
  double plannedMaxLinkSeconds = 0;                        // the plan's most loaded link: its bytes over its capacity
  SimResult sim;
};

struct Study {
  std::string topology;
  int hosts = 0, ranks = 0, lanes = 0;
  Coll coll = Coll::kAllReduce;
  std::vector<Row> rows;
  std::vector<std::string> skipped;  // algorithms --algo all left out, and why
  std::vector<std::string> notes;    // what the study changed on its own (c4p given way to ecmp)
};

/// Runs every size and algorithm of `o` on `topo`; progress lines on `progress` (may be null).
Status runStudy(const Options& o, const plan::Topology& topo, Study* out, std::FILE* progress);
/// The text table.
std::string formatTable(const Options& o, const Study& s);
/// The JSON report (docs/c4-sim.md "JSON").
std::string formatJson(const Options& o, const Study& s);

/// The program: returns its exit status (0 ok, 1 failed, 2 bad usage).
int cliMain(int argc, char** argv);

}  // namespace c4::sim
