#include "core/tuner.hpp"

#include <strings.h>

#include <algorithm>
#include <cmath>
#include <map>

#include "common/clock.hpp"
#include "common/hash.hpp"
#include "common/logging.hpp"
#include "common/params.hpp"
#include "common/status.hpp"
#include "sched/schedule_file.hpp"

namespace c4 {

namespace {
bool parseColl(const std::string& s, Coll* out) {
  static const struct {
    const char* name;
    Coll c;
  } kNames[] = {{"allreduce", Coll::kAllReduce}, {"allgather", Coll::kAllGather},
                {"broadcast", Coll::kBroadcast}, {"reducescatter", Coll::kReduceScatter},
                {"reduce", Coll::kReduce},       {"alltoall", Coll::kAlltoAll},
                {"gather", Coll::kGather},       {"scatter", Coll::kScatter}};
  for (auto& n : kNames)
    if (strcasecmp(s.c_str(), n.name) == 0) {
      *out = n.c;
      return true;
    }
  return false;
}
std::string trim(const std::string& s) {
  size_t a = s.find_first_not_of(" \t"), b = s.find_last_not_of(" \t");
  return a == std::string::npos ? std::string() : s.substr(a, b - a + 1);
}
// C4_ALGO: "ring" for every collective, or "allreduce:rhd,broadcast:tree" (',' or ';' between
// items). Fills `forced` (indexed by Coll; -1: the tuner chooses); false with `why` on an unknown
// algorithm or collective.
bool parseAlgoSpec(const std::string& spec, std::array<int, kNumColls>* forced, std::string* why) {
  forced->fill(-1);
  size_t pos = 0;
  while (pos < spec.size()) {
    size_t end = spec.find_first_of(",;", pos);
    if (end == std::string::npos) end = spec.size();
    std::string item = trim(spec.substr(pos, end - pos));
    pos = end + 1;
    if (item.empty()) continue;
    size_t colon = item.find(':');
    std::string algoName = colon == std::string::npos ? item : trim(item.substr(colon + 1));
    sched::Algo a;
    if (!sched::parseAlgo(algoName, &a)) {
      *why = "unknown algorithm '" + algoName + "' (known: ring, tree, rhd, direct, hier)";
      return false;
    }
    if (colon == std::string::npos) {
      forced->fill(static_cast<int>(a));
      continue;
    }
    Coll c;
    if (!parseColl(trim(item.substr(0, colon)), &c)) {
      *why = "unknown collective in '" + item + "'";
      return false;
    }
    (*forced)[static_cast<int>(c)] = static_cast<int>(a);
  }
  return true;
}

bool checkAlgoSpec(const std::string& spec, std::string* why) {
  std::array<int, kNumColls> forced;
  return parseAlgoSpec(spec, &forced, why);
}
}  // namespace

C4_PARAM_STR(Algo, "C4_ALGO", "NCCL_ALGO", "", checkAlgoSpec, kParamSameOnAllRanks,
             "Force the algorithm: ring, tree, rhd, direct or hier, for all collectives or per collective "
             "(\"allreduce:rhd,broadcast:tree\"); unsupported choices fall back to the tuner's")
C4_PARAM_INT(ChunkSize, "C4_CHUNK_SIZE", nullptr, 0, 4096, int64_t{1} << 30, kParamSameOnAllRanks | kParamZeroToo,
             "Pipelining chunk size in bytes (0: chosen by the tuner)")

C4_PARAM_STR(ScheduleFile, "C4_SCHEDULE_FILE", nullptr, "", {}, kParamSameOnAllRanks,
             "Schedule files to use (comma separated; docs/schedules.md): each replaces the tuner's algorithm for "
             "its collective on communicators of its rank count (and topology, if it names one)")

Status Tuner::loadSchedules(bool haveTopo, uint64_t topoHash, int64_t timeoutMs) {
  schedules_.clear();
  // The checks of the files may take at most half the time the peers wait for this rank.
  const int64_t deadlineNs = detail::nowNs() + std::max<int64_t>(1, timeoutMs / 2) * 1000000;
  const std::string list = paramScheduleFile();
  size_t pos = 0;
  while (pos < list.size()) {
    size_t end = list.find(',', pos);
    if (end == std::string::npos) end = list.size();
    const std::string path = trim(list.substr(pos, end - pos));
    pos = end + 1;
    if (path.empty()) continue;
    // A file for another size of communicator costs only a look at its header.
    int fileRanks = 0;
    std::string fileColl;
    Status peek = sched::peekScheduleFile(path, &fileRanks, &fileColl);
    if (!peek.isOk()) return makeError(peek.code(), "C4_SCHEDULE_FILE: %s", peek.message().c_str());
    if (fileRanks != nranks_) {
      C4_INFO(kLogTuning, "schedule file %s (%s of %d ranks) not used: this communicator has %d ranks", path.c_str(),
              fileColl.c_str(), fileRanks, nranks_);
      continue;
    }
    Result<sched::Algo> id = sched::loadAndRegister(path, deadlineNs);
    if (!id.isOk()) return makeError(id.status().code(), "C4_SCHEDULE_FILE: %s", id.status().message().c_str());
    std::shared_ptr<const sched::ScheduleFile> f = sched::registeredSchedule(id.value());
    if (f->nranks != nranks_) {
      C4_INFO(kLogTuning, "schedule file %s (%s of %d ranks) not used: this communicator has %d ranks", path.c_str(),
              collName(f->coll), f->nranks, nranks_);
      continue;
    }
    if (f->hasTopology && (!haveTopo || f->topologyHash != topoHash)) {
      C4_WARN(
          kLogTuning,
          "schedule file %s not used: it was made for the topology with hash 0x%016llx, and this communicator %s",
          path.c_str(), static_cast<unsigned long long>(f->topologyHash),
          haveTopo
              ? strFormat("runs on C4_TOPO_FILE with hash 0x%016llx", static_cast<unsigned long long>(topoHash)).c_str()
              : "has no C4_TOPO_FILE");
      continue;
    }
    bool dup = false;
    for (const ScheduleChoice& c : schedules_) {
      if (c.coll == f->coll) {
        C4_WARN(kLogTuning, "schedule file %s not used: %s already uses %s for %s", path.c_str(), "C4_SCHEDULE_FILE",
                c.path.c_str(), collName(f->coll));
        dup = true;
      }
    }
    if (dup) continue;
    schedules_.push_back(ScheduleChoice{id.value(), f->coll, path});
  }
  return Status::ok();
}

void Tuner::checkScheduleHosts(const std::vector<std::string>& rankHosts) {
  if (rankHosts.empty()) return;
  for (size_t i = 0; i < schedules_.size();) {
    std::shared_ptr<const sched::ScheduleFile> f = sched::registeredSchedule(schedules_[i].algo);
    size_t bad = f->hosts.size();
    for (size_t r = 0; r < f->hosts.size() && r < rankHosts.size(); ++r)
      if (f->hosts[r] != rankHosts[r]) {
        bad = r;
        break;
      }
    if (bad < f->hosts.size()) {
      C4_WARN(kLogTuning, "schedule file %s not used: it puts rank %zu on host %s, and C4P found it on %s",
              schedules_[i].path.c_str(), bad, f->hosts[bad].c_str(), rankHosts[bad].c_str());
      schedules_.erase(schedules_.begin() + static_cast<std::ptrdiff_t>(i));
    } else {
      ++i;
    }
  }
}

uint64_t Tuner::schedulesHash() const {
  uint64_t h = 0;
  for (const ScheduleChoice& c : schedules_) h = h * kFnvPrime + sched::registeredSchedule(c.algo)->hash;
  return h;
}

const ScheduleChoice* Tuner::scheduleFor(Coll coll) const {
  // On every call's plan lookup: no registry lock.
  for (const ScheduleChoice& c : schedules_)
    if (c.coll == coll) return &c;
  return nullptr;
}

Status Tuner::init(int nranks, int nhosts, const transport::Caps& caps) {
  nranks_ = nranks;
  nhosts_ = nhosts;
  caps_ = caps;
  chunkOverride_ = static_cast<size_t>(paramChunkSize());
  // A refused C4_ALGO was reported by paramAlgo() (and fails init: core/settings.hpp); the default
  // parses.
  std::string why;
  if (!parseAlgoSpec(paramAlgo(), &forced_, &why)) forced_.fill(-1);
  return Status::ok();
}

void Tuner::setHosts(const std::vector<int32_t>& hostOf, const transport::Caps& intra, const transport::Caps& inter) {
  hostOf_ = hostOf;
  intra_ = intra;
  inter_ = inter;
  std::map<int32_t, int> sizes;
  for (int32_t h : hostOf) ++sizes[h];
  nhosts_ = static_cast<int>(sizes.size());
  ranksPerHost_ = sizes.empty() ? 0 : sizes.begin()->second;
  for (const auto& kv : sizes)
    if (kv.second != ranksPerHost_) ranksPerHost_ = 0;
}

double Tuner::hierAllReduceUs(size_t bytes) const {
  // Phases run one after the other. Between hosts a host's ranks share its NIC(s), so the
  // network term is what one host sends: 2 (H-1)/H of the vector with L equal ranks per host
  // (each of L rings carries 1/L), or the whole leader ring's share otherwise.
  const double b = static_cast<double>(bytes);
  const double H = nhosts_;
  const double red = kReduceGBps * 1e3;
  const double bi = intra_.bwGBps * 1e3, bn = inter_.bwGBps * 1e3;
  const double net = 2 * (H - 1) * inter_.latencyUs + 2 * (H - 1) / H * b / bn;
  if (ranksPerHost_ > 0) {
    // Reduce-scatter + allgather inside the host, then each rank reduces 1/L of the vector's share.
    const double L = ranksPerHost_;
    return 2 * (L - 1) * intra_.latencyUs + 2 * (L - 1) / L * b / bi + (L - 1) / L * b / red + net +
           (H - 1) / H * b / L / red;
  }
  // Chain reduce and chain broadcast inside the largest host (pipelined), the leaders' ring.
  int most = 0;
  std::map<int32_t, int> sizes;
  for (int32_t h : hostOf_) most = std::max(most, ++sizes[h]);
  const double L = most;
  return 2 * (L - 1) * intra_.latencyUs + 2 * b / bi + b / red + net + (H - 1) / H * b / red;
}

double Tuner::estimateUs(sched::Algo algo, Coll coll, size_t bytes) const {
  // Alpha-beta-gamma model: hops on the critical path x latency, bytes through the busiest rank /
  // transport bandwidth, and bytes that rank reduces / reduction bandwidth. Pipelined chains pay
  // the hop latency once per stage, not per chunk. Reduction runs at about memory speed: two
  // streams in, one out.
  const double n = nranks_;
  const double lat = caps_.latencyUs;
  const double net = caps_.bwGBps * 1e3;  // bytes per us
  const double red = kReduceGBps * 1e3;
  const double b = static_cast<double>(bytes);
  const double lg = std::ceil(std::log2(std::max(2.0, n)));
  const bool pow2 = (nranks_ & (nranks_ - 1)) == 0;
  const double part = (n - 1) / n * b;  // what a rank sends (or reduces) in one reduce-scatter
  if (static_cast<int>(algo) >= sched::kNumAlgos) {
    // A schedule file: its critical path in messages, and the most one rank sends and reduces
    // (measured when it was loaded).
    std::shared_ptr<const sched::ScheduleFile> f = sched::registeredSchedule(algo);
    if (!f || !sched::supports(algo, coll, nranks_)) return 1e30;
    return static_cast<double>(f->depth) * lat + f->sendFraction * b / net + f->reduceFraction * b / red;
  }
  switch (coll) {
    case Coll::kAllReduce:
      switch (algo) {
        case sched::Algo::kRing:
          return 2 * (n - 1) * lat + 2 * part / net + part / red;
        case sched::Algo::kRhd:
          return (2 * lg + (pow2 ? 0 : 2)) * lat + 2 * part / net + part / red;
        case sched::Algo::kTree:
          return 2 * lg * lat + 2 * b / net + b / red;
        // Every rank receives and reduces the whole vector from every peer.
        case sched::Algo::kDirect:
          return lat + (n - 1) * b / net + (n - 1) * b / red;
        case sched::Algo::kHier:
          return nhosts_ > 1 && !hostOf_.empty() ? hierAllReduceUs(bytes) : 1e30;
      }
      break;
    case Coll::kReduceScatter:
      switch (algo) {
        case sched::Algo::kRing:
          return (n - 1) * lat + part / net + part / red;
        case sched::Algo::kRhd:
          return (lg + (pow2 ? 0 : 2)) * lat + part / net + part / red;
        case sched::Algo::kDirect:
          return lat + part / net + part / red;
        default:
          return 1e30;
      }
    case Coll::kAllGather:
      switch (algo) {
        case sched::Algo::kRing:
          return (n - 1) * lat + part / net;
        case sched::Algo::kRhd:
          return (lg + (pow2 ? 0 : 2)) * lat + part / net;
        case sched::Algo::kDirect:
          return lat + part / net;
        default:
          return 1e30;
      }
    case Coll::kBroadcast:
      switch (algo) {
        case sched::Algo::kRing:
          return (n - 1) * lat + b / net;
        case sched::Algo::kTree:
          return lg * lat + 2 * b / net;  // inner nodes forward to two children
        case sched::Algo::kDirect:
          return lat + (n - 1) * b / net;
        default:
          return 1e30;
      }
    case Coll::kReduce:
      switch (algo) {
        case sched::Algo::kRing:
          return (n - 1) * lat + b / net + b / red;
        case sched::Algo::kTree:
          return lg * lat + 2 * b / net + 2 * b / red;
        case sched::Algo::kDirect:
          return lat + (n - 1) * b / net + (n - 1) * b / red;
        default:
          return 1e30;
      }
    default:
      return algo == sched::Algo::kDirect ? lat + b / net : 1e30;
  }
  return 1e30;
}

const char* pathName(PathKind k) {
  switch (k) {
    case PathKind::kMessages:
      return "messages";
    case PathKind::kOneShot:
      return "one-shot";
    case PathKind::kZeroCopy:
      return "zero-copy";
  }
  return "?";
}

TuneResult Tuner::choose(Coll coll, size_t bytes) const {
  TuneResult r;
  int forced = forced_[static_cast<int>(coll)];
  if (forced >= 0 && sched::supports(static_cast<sched::Algo>(forced), coll, nranks_)) {
    r.algo = static_cast<sched::Algo>(forced);
    r.why = "forced by C4_ALGO";
  } else if (const ScheduleChoice* sc = forced < 0 ? scheduleFor(coll) : nullptr) {
    r.algo = sc->algo;
    r.why = "schedule file " + sc->path + " (C4_SCHEDULE_FILE)";
  } else {
    double best = 1e300;
    bool any = false;
    // The built-in generators; a loaded schedule is taken above, where it fits.
    for (int a = 0; a < sched::kNumAlgos; ++a) {
      auto algo = static_cast<sched::Algo>(a);
      if (!sched::supports(algo, coll, nranks_)) continue;
      double t = estimateUs(algo, coll, bytes);
      if (!any || t < best) {
        best = t;
        r.algo = algo;
        any = true;
      }
    }
    r.why = strFormat("lowest modelled time %.1f us (latency %.2f us, %.1f GB/s, %d ranks on %d hosts)%s", best,
                      caps_.latencyUs, caps_.bwGBps, nranks_, nhosts_,
                      forced >= 0 ? "; C4_ALGO choice not supported for this collective" : "");
  }
  if (chunkOverride_ > 0) {
    r.chunkBytes = chunkOverride_;
  } else {
    // Pipeline in chunks big enough to amortize per-step overhead (~a few us) yet small enough
    // that the chain fills quickly and pieces stay cache-resident.
    size_t per = bytes / static_cast<size_t>(std::max(1, nranks_));
    r.chunkBytes = std::min<size_t>(std::max<size_t>(per / 4, 128 << 10), 1 << 20);
  }
  // Single copy (the receiver reads the sender's buffer) where it measured faster than streaming
  // through the transport's buffers: data movement that is not forwarded down a chain. Broadcast
  // pipelines through a chain, where the sender's half of a streamed copy overlaps the receiver's,
  // and reductions stream so that the receiver reduces straight out of shared memory
  // (docs/shm-transport.md has the measurements).
  r.singleCopy = coll == Coll::kAllGather || coll == Coll::kAlltoAll || coll == Coll::kGather || coll == Coll::kScatter;
  if (r.singleCopy && chunkOverride_ == 0 && r.chunkBytes > caps_.singleCopyBytes) {
    // Each chunk then costs a handshake and stages nothing: send whole blocks. (2 ranks, 64 MiB
    // AllGather: 1 MiB chunks took 1.4x as long as whole blocks.)
    r.chunkBytes = std::max<size_t>(bytes / static_cast<size_t>(std::max(1, nranks_)), r.chunkBytes);
  }
  return r;
}

}  // namespace c4
