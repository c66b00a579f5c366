#include "sched/schedule.hpp"

#include <cctype>
#include <cstdint>

#include "common/logging.hpp"
#include "common/status.hpp"
#include "sched/generators.hpp"
#include "sched/schedule_file.hpp"

namespace c4::sched {
namespace {

using Generator = void (*)(detail::Builder&);

/// kGenerators[coll][algo]; nullptr where the pair has no generator.
constexpr int kNumGenColls = static_cast<int>(Coll::kScatter) + 1;
const Generator kGenerators[kNumGenColls][kNumAlgos] = {
    // ring, tree, rhd, direct, hier
    {detail::ringAllReduce, detail::treeAllReduce, detail::rhdAllReduce, detail::directAllReduce,
     detail::hierAllReduce},                                                                    // AllReduce
    {detail::ringAllGather, nullptr, detail::rhdAllGather, detail::directAllGather, nullptr},   // AllGather
    {detail::ringBroadcast, detail::treeBroadcast, nullptr, detail::directBroadcast, nullptr},  // Broadcast
    {detail::ringReduceScatter, nullptr, detail::rhdReduceScatter, detail::directReduceScatter,
     nullptr},                                                                         // ReduceScatter
    {detail::ringReduce, detail::treeReduce, nullptr, detail::directReduce, nullptr},  // Reduce
    {nullptr, nullptr, nullptr, detail::directAlltoAll, nullptr},                      // AlltoAll
    {nullptr, nullptr, nullptr, detail::directGather, nullptr},                        // Gather
    {nullptr, nullptr, nullptr, detail::directScatter, nullptr},                       // Scatter
};

Generator generatorFor(Algo algo, Coll coll) {
  int c = static_cast<int>(coll), a = static_cast<int>(algo);
  if (c < 0 || c >= kNumGenColls || a < 0 || a >= kNumAlgos) return nullptr;
  return kGenerators[c][a];
}

bool isRooted(Coll c) {
  return c == Coll::kBroadcast || c == Coll::kReduce || c == Coll::kGather || c == Coll::kScatter;
}

}  // namespace

int numAlgos() { return kNumAlgos + numRegisteredSchedules(); }

const char* algoName(Algo a) {
  if (static_cast<int>(a) >= kNumAlgos) {
    std::shared_ptr<const ScheduleFile> f = registeredSchedule(a);
    return f ? f->label.c_str() : "unknown-algo";  // registered files live as long as the process
  }
  switch (a) {
    case Algo::kRing:
      return "ring";
    case Algo::kTree:
      return "tree";
    case Algo::kRhd:
      return "rhd";
    case Algo::kDirect:
      return "direct";
    case Algo::kHier:
      return "hier";
  }
  return "unknown-algo";
}

bool parseAlgo(const std::string& name, Algo* out) {
  std::string s;
  for (char ch : name) s.push_back(static_cast<char>(std::tolower(static_cast<unsigned char>(ch))));
  Algo a;
  if (s == "ring") {
    a = Algo::kRing;
  } else if (s == "tree") {
    a = Algo::kTree;
  } else if (s == "rhd" || s == "halvingdoubling") {
    a = Algo::kRhd;
  } else if (s == "direct" || s == "pat") {
    a = Algo::kDirect;
  } else if (s == "hier" || s == "hierarchical") {
    a = Algo::kHier;
  } else {
    return false;
  }
  if (out != nullptr) *out = a;
  return true;
}

bool supports(Algo algo, Coll coll, int nranks) {
  if (static_cast<int>(algo) >= kNumAlgos) {
    std::shared_ptr<const ScheduleFile> f = registeredSchedule(algo);
    return f && f->coll == coll && f->nranks == nranks;
  }
  return nranks >= 1 && generatorFor(algo, coll) != nullptr;
}

Result<Schedule> generate(Algo algo, const CollArgs& args) {
  const int n = args.nranks;
  if (n < 1 || args.rank < 0 || args.rank >= n) {
    return makeError(Code::kInvalidArgument, "schedule: rank %d out of range for %d ranks", args.rank, n);
  }
  const size_t esz = dataTypeSize(args.dtype);
  if (esz == 0)
    return makeError(Code::kInvalidArgument, "schedule: invalid data type %d", static_cast<int>(args.dtype));
  if (isRooted(args.coll) && (args.root < 0 || args.root >= n)) {
    return makeError(Code::kInvalidArgument, "schedule: root %d out of range for %d ranks", args.root, n);
  }
  Generator gen = generatorFor(algo, args.coll);
  std::shared_ptr<const ScheduleFile> file = registeredSchedule(algo);
  if (gen == nullptr && file == nullptr) {
    return makeError(Code::kInvalidArgument, "schedule: no %s algorithm for %s", algoName(algo), collName(args.coll));
  }
  if (!args.hostOf.empty() && args.hostOf.size() != static_cast<size_t>(n)) {
    return makeError(Code::kInvalidArgument, "schedule: host map has %zu entries for %d ranks", args.hostOf.size(), n);
  }
  if (args.count > SIZE_MAX / esz / static_cast<size_t>(n)) {
    return makeError(Code::kInvalidArgument, "schedule: count %zu of %zu-byte elements overflows for %d ranks",
                     args.count, esz, n);
  }
  if (file != nullptr) {
    C4_ASSIGN_OR_RETURN(Schedule fs, buildFromFile(*file, args));
    fs.algo = algo;
    C4_TRACE(kLogSched, "schedule %s/%s rank %d/%d count %zu chunk %zu: %zu steps, %zu scratch bytes",
             collName(args.coll), algoName(algo), args.rank, n, args.count, args.chunkBytes, fs.steps.size(),
             fs.scratchBytes);
    return fs;
  }
  detail::Builder b(args);
  if (args.count > 0) {
    if (n == 1) {
      // Every collective degenerates to a copy (the executor skips it when in place).
      b.copy(b.in(detail::Range{0, args.count}), b.out(detail::Range{0, args.count}));
    } else {
      gen(b);
    }
  }
  Schedule s = b.finish(algo);
  C4_TRACE(kLogSched, "schedule %s/%s rank %d/%d count %zu chunk %zu: %zu steps, %zu scratch bytes",
           collName(args.coll), algoName(algo), args.rank, n, args.count, args.chunkBytes, s.steps.size(),
           s.scratchBytes);
  return s;
}

size_t inputBytes(const CollArgs& a) {
  const size_t esz = dataTypeSize(a.dtype), n = static_cast<size_t>(a.nranks > 0 ? a.nranks : 0);
  const bool root = a.rank == a.root;
  switch (a.coll) {
    case Coll::kAllReduce:
    case Coll::kAllGather:
    case Coll::kReduce:
    case Coll::kGather:
    case Coll::kSend:
      return a.count * esz;
    case Coll::kBroadcast:
      return root ? a.count * esz : 0;
    case Coll::kReduceScatter:
    case Coll::kAlltoAll:
      return n * a.count * esz;
    case Coll::kScatter:
      return root ? n * a.count * esz : 0;
    case Coll::kRecv:
    case Coll::kBarrier:
      return 0;
  }
  return 0;
}

size_t outputBytes(const CollArgs& a) {
  const size_t esz = dataTypeSize(a.dtype), n = static_cast<size_t>(a.nranks > 0 ? a.nranks : 0);
  const bool root = a.rank == a.root;
  switch (a.coll) {
    case Coll::kAllReduce:
    case Coll::kBroadcast:
    case Coll::kReduceScatter:
    case Coll::kScatter:
    case Coll::kRecv:
      return a.count * esz;
    case Coll::kReduce:
      return root ? a.count * esz : 0;
    case Coll::kAllGather:
    case Coll::kAlltoAll:
      return n * a.count * esz;
    case Coll::kGather:
      return root ? n * a.count * esz : 0;
    case Coll::kSend:
    case Coll::kBarrier:
      return 0;
  }
  return 0;
}

}  // namespace c4::sched
