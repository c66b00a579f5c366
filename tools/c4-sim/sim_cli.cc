#include "sim/sim_cli.hpp"

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdarg>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>

#include "common/status.hpp"
#include "sched/schedule_file.hpp"

namespace c4::sim {

namespace {

constexpr double kDefaultGbps = 100;

Status bad(const char* fmt, ...) __attribute__((format(printf, 1, 2)));
Status bad(const char* fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  std::string m = strFormatV(fmt, ap);
  va_end(ap);
  return Status(Code::kInvalidArgument, m);
}

bool parseDouble(const std::string& s, double* out) {
  if (s.empty() || std::isspace(static_cast<unsigned char>(s[0]))) return false;
  char* end = nullptr;
  errno = 0;
  const double v = strtod(s.c_str(), &end);
  if (end != s.c_str() + s.size() || errno != 0 || !std::isfinite(v)) return false;
  *out = v;
  return true;
}

bool parseInt(const std::string& s, long long lo, long long hi, long long* out) {
  if (s.empty() || std::isspace(static_cast<unsigned char>(s[0]))) return false;
  char* end = nullptr;
  errno = 0;
  const long long v = strtoll(s.c_str(), &end, 10);
  if (end != s.c_str() + s.size() || errno != 0 || v < lo || v > hi) return false;
  *out = v;
  return true;
}

// "4096", "64K", "1M", "1.5G", "64MiB", "2MB": binary multiples.
bool parseSize(const std::string& s, size_t* out) {
  size_t i = 0;
  while (i < s.size() && (std::isdigit(static_cast<unsigned char>(s[i])) || s[i] == '.')) ++i;
  double v;
  if (i == 0 || !parseDouble(s.substr(0, i), &v)) return false;
  std::string suf = s.substr(i);
  double mult = 1;
  if (!suf.empty()) {
    switch (std::toupper(static_cast<unsigned char>(suf[0]))) {
      case 'K':
        mult = 1024.0;
        break;
      case 'M':
        mult = 1024.0 * 1024;
        break;
      case 'G':
        mult = 1024.0 * 1024 * 1024;
        break;
      case 'T':
        mult = 1024.0 * 1024 * 1024 * 1024;
        break;
      case 'B':
        break;
      default:
        return false;
    }
    if (mult > 1) suf = suf.substr(1);
    if (!(suf.empty() || suf == "B" || suf == "b" || suf == "iB")) return false;
  }
  const double b = v * mult;
  if (b < 0 || b > 1e18 || b != std::floor(b)) return false;
  *out = static_cast<size_t>(b);
  return true;
}

std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> out;
  size_t p = 0;
  while (true) {
    const size_t q = s.find(sep, p);
    out.push_back(s.substr(p, q == std::string::npos ? std::string::npos : q - p));
    if (q == std::string::npos) break;
    p = q + 1;
  }
  return out;
}

bool parseCollName(const std::string& s, Coll* out) {
  static const struct {
    const char* name;
    Coll coll;
  } kColls[] = {
      {"allreduce", Coll::kAllReduce}, {"allgather", Coll::kAllGather}, {"reducescatter", Coll::kReduceScatter},
      {"broadcast", Coll::kBroadcast}, {"reduce", Coll::kReduce},       {"alltoall", Coll::kAlltoAll}};
  std::string l;
  for (char c : s) l.push_back(static_cast<char>(std::tolower(static_cast<unsigned char>(c))));
  for (const auto& c : kColls)
    if (l == c.name) {
      *out = c.coll;
      return true;
    }
  return false;
}

const char* collLabel(Coll c) {
  switch (c) {
    case Coll::kAllReduce:
      return "allreduce";
    case Coll::kAllGather:
      return "allgather";
    case Coll::kReduceScatter:
      return "reducescatter";
    case Coll::kBroadcast:
      return "broadcast";
    case Coll::kReduce:
      return "reduce";
    case Coll::kAlltoAll:
      return "alltoall";
    default:
      return "unsupported";
  }
}

// The numbers of a --gen spec after its "kind:".
Status genNumbers(const std::string& kind, const std::string& rest, size_t minN, size_t maxN,
                  std::vector<double>* out) {
  out->clear();
  for (const std::string& f : split(rest, ',')) {
    double v;
    if (!parseDouble(f, &v) || !(v > 0)) return bad("--gen %s: '%s' is not a positive number", kind.c_str(), f.c_str());
    out->push_back(v);
  }
  if (out->size() < minN || out->size() > maxN)
    return bad("--gen %s takes %zu to %zu numbers, got %zu", kind.c_str(), minN, maxN, out->size());
  return Status::ok();
}

Status checkInt(const std::string& kind, const char* what, double v, double lo, double hi) {
  if (v != std::floor(v) || v < lo || v > hi)
    return bad("--gen %s: %s must be a whole number in [%g, %g], got %g", kind.c_str(), what, lo, hi, v);
  return Status::ok();
}

// Parses and checks --gen; builds the topology when `out` is given.
Status genTopology(const std::string& spec, plan::Topology* out) {
  const size_t colon = spec.find(':');
  if (colon == std::string::npos)
    return bad("--gen %s: expected leafspine:H,P,L,S[,HOSTGBPS,UPGBPS], fattree:K,HPL,P[,GBPS] or flat:H[,P[,GBPS]]",
               spec.c_str());
  const std::string kind = spec.substr(0, colon), rest = spec.substr(colon + 1);
  std::vector<double> v;
  if (kind == "leafspine" || kind == "leaf-spine") {
    C4_CHECK(genNumbers(kind, rest, 4, 6, &v));
    C4_CHECK(checkInt(kind, "hosts", v[0], 1, 1 << 20));
    C4_CHECK(checkInt(kind, "ports per host", v[1], 1, 64));
    C4_CHECK(checkInt(kind, "leaves", v[2], 1, v[0]));
    C4_CHECK(checkInt(kind, "spines", v[3], 1, 4096));
    const double host = v.size() > 4 ? v[4] : kDefaultGbps, up = v.size() > 5 ? v[5] : host;
    if (out != nullptr)
      *out = plan::Topology::leafSpine(static_cast<int>(v[0]), static_cast<int>(v[1]), static_cast<int>(v[2]),
                                       static_cast<int>(v[3]), host * 1e9, up * 1e9);
    return Status::ok();
  }
  if (kind == "fattree" || kind == "fat-tree") {
    C4_CHECK(genNumbers(kind, rest, 3, 4, &v));
    C4_CHECK(checkInt(kind, "k", v[0], 2, 256));
    if (static_cast<int>(v[0]) % 2 != 0) return bad("--gen %s: k must be even, got %g", kind.c_str(), v[0]);
    C4_CHECK(checkInt(kind, "hosts per leaf", v[1], 1, 4096));
    C4_CHECK(checkInt(kind, "ports per host", v[2], 1, 64));
    if (v[0] * v[0] / 2 * v[1] > (1 << 20)) return bad("--gen %s: more than 2^20 hosts", kind.c_str());
    const double gbps = v.size() > 3 ? v[3] : kDefaultGbps;
    if (out != nullptr)
      *out =
          plan::Topology::fatTree(static_cast<int>(v[0]), static_cast<int>(v[1]), static_cast<int>(v[2]), gbps * 1e9);
    return Status::ok();
  }
  if (kind == "flat") {
    C4_CHECK(genNumbers(kind, rest, 1, 3, &v));
    C4_CHECK(checkInt(kind, "hosts", v[0], 1, 1 << 20));
    if (v.size() > 1) C4_CHECK(checkInt(kind, "ports per host", v[1], 1, 64));
    const int ports = v.size() > 1 ? static_cast<int>(v[1]) : 1;
    const double gbps = v.size() > 2 ? v[2] : kDefaultGbps;
    if (out != nullptr) *out = plan::Topology::flat(std::vector<int>(static_cast<size_t>(v[0]), ports), gbps * 1e9);
    return Status::ok();
  }
  return bad("--gen: unknown fabric '%s' (leafspine, fattree, flat)", kind.c_str());
}

std::string human(double bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  while (bytes >= 1024 && u < 4) {
    bytes /= 1024;
    ++u;
  }
  return u == 0 || bytes != std::floor(bytes) ? strFormat("%.4g %s", bytes, units[u])
                                              : strFormat("%.0f %s", bytes, units[u]);
}

void note(std::FILE* f, const char* fmt, ...) __attribute__((format(printf, 2, 3)));
void note(std::FILE* f, const char* fmt, ...) {
  if (f == nullptr) return;
  va_list ap;
  va_start(ap, fmt);
  const std::string m = strFormatV(fmt, ap);
  va_end(ap);
  fprintf(f, "c4-sim: %s\n", m.c_str());
  fflush(f);
}

double secondsSince(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

std::string usageText() {
  return "usage: c4-sim (--topo FILE.json | --gen SPEC) [options]\n"
         "       c4-sim check FILE.json\n"
         "Predicts the time of a collective's schedules on a fabric: a discrete-event alpha-beta simulation with\n"
         "per-link max-min fair sharing, lanes placed by C4P (docs/c4-sim.md).\n"
         "\n"
         "Fabric:\n"
         "  --topo FILE.json          a C4P topology (the JSON tools/netlab writes; C4_TOPO_FILE)\n"
         "  --gen leafspine:H,P,L,S[,HOSTGBPS,UPGBPS]   H hosts x P ports, L leaves, S spines (Gbit/s; default 100,\n"
         "                            uplinks as hosts)\n"
         "  --gen fattree:K,HPL,P[,GBPS]   3-tier k-ary fat-tree, HPL hosts per leaf, P ports (k^2/2*HPL hosts)\n"
         "  --gen flat:H[,P[,GBPS]]   H hosts x P ports on one non-blocking switch\n"
         "  --ranks-per-host R        ranks per host (default 1): rank r runs on host r / R\n"
         "What runs:\n"
         "  --coll NAME               allreduce (default), allgather, reducescatter, broadcast, reduce, alltoall\n"
         "  --algo LIST|all           ring (default), tree, rhd, direct, hier, comma-separated; all: every one\n"
         "                            that supports the collective\n"
         "  --schedule FILE.json      a schedule file (docs/schedules.md), simulated as file:NAME\n"
         "  --bytes LIST              sizes, e.g. 1M,64M (default 64M): nccl-tests' size (the larger buffer; per\n"
         "                            rank count = size/4, over the ranks for allgather, reducescatter, alltoall)\n"
         "  --chunk-bytes B           pipelining chunk (default: the tuner's, size/ranks/4 in [128K, 1M])\n"
         "  --in-place                in-place buffers (default out of place)\n"
         "Model:\n"
         "  --alpha-us A              per message between hosts, microseconds (default 5)\n"
         "  --alpha-intra-us A        per message within a host (default 1)\n"
         "  --intra-gbps G            each rank's intra-host send and receive rate, Gbit/s (default 200)\n"
         "  --mem-gbps G              local copy and reduce rate, Gbit/s (default 400)\n"
         "  --link-efficiency [R:]E1[,E2,E4..]  fraction of a link's rate its transfers get with 1, 2, 4, ...\n"
         "                            sharing it (geometric in between), for links of rate R (100mbit, 25gbit) or\n"
         "                            every other link; repeatable (default 1: bench/sim/calibrate.sh measures it)\n"
         "  --piece-bytes B           striping piece over lanes (default 512K, C4_TCP_PIECE_BYTES; 0: equal shares)\n"
         "  --planner c4p|ecmp|off    lane placement (default c4p)\n"
         "  --lanes N                 lanes per connection (default 2, C4_LANES's, or the ports of a host if more)\n"
         "  --seed S                  ECMP's random source ports (default 1)\n"
         "  --slack F                 capacity transfers free on a link is re-shared once above F of it\n"
         "                            (default 0.05; 0: always)\n"
         "  --exact-limit N           exact max-min unless the affected set holds N more transfers than the\n"
         "                            changed links (default 4096; 0: always exact)\n"
         "Limits:\n"
         "  --max-steps N             refuse (--algo all: skip) runs of more steps, all ranks (default 40000000,\n"
         "                            about 60 bytes each)\n"
         "  --max-plan-conns N        above N connections between hosts c4p gives way to ecmp (default 65536)\n"
         "Output:\n"
         "  --json OUT                also write the results as JSON\n"
         "  --quiet                   no progress on stderr\n"
         "\n"
         "check FILE.json: load a schedule file with every check of the loader; exit 0, or print the error\n"
         "and exit 1.\n";
}

std::string rateLabel(double bps) {
  if (bps >= 1e9 && std::fmod(bps, 1e9) == 0) return strFormat("%ggbit", bps / 1e9);
  if (bps >= 1e6 && std::fmod(bps, 1e6) == 0) return strFormat("%gmbit", bps / 1e6);
  return strFormat("%gbit", bps);
}

Status parseLinkEfficiency(const std::string& spec, LinkEfficiency* out) {
  auto bad = [&](const char* why) {
    return makeError(Code::kInvalidArgument,
                     "--link-efficiency: '%s': %s ([RATE:]E1[,E2,E4...], e.g. 100mbit:0.86,0.81)", spec.c_str(), why);
  };
  LinkEfficiency e;
  std::string list = spec;
  const size_t colon = spec.find(':');
  if (colon != std::string::npos) {
    const std::string rate = spec.substr(0, colon);
    list = spec.substr(colon + 1);
    static const struct {
      const char* unit;
      double mult;
    } kUnits[] = {{"gbit", 1e9}, {"mbit", 1e6}, {"kbit", 1e3}, {"bit", 1}};
    bool ok = false;
    for (const auto& u : kUnits) {
      const size_t ul = strlen(u.unit);
      if (rate.size() > ul && rate.compare(rate.size() - ul, ul, u.unit) == 0) {
        double v;
        ok = parseDouble(rate.substr(0, rate.size() - ul), &v) && v > 0;
        e.bps = v * u.mult;
        break;
      }
    }
    if (!ok) return bad("the rate must be a number with a unit (bit, kbit, mbit, gbit)");
  }
  for (const std::string& f : split(list, ',')) {
    double v;
    if (!parseDouble(f, &v) || !(v > 0) || v > 1) return bad("each efficiency must be a number in (0, 1]");
    e.byShares.push_back(v);
  }
  if (e.byShares.empty()) return bad("no efficiency given");
  *out = std::move(e);
  return Status::ok();
}

Status parseOptions(const std::vector<std::string>& args, Options* out) {
  Options o;
  bool sawBytes = false;
  for (size_t i = 0; i < args.size(); ++i) {
    std::string a = args[i], val;
    bool hasVal = false;
    if (a.rfind("--", 0) == 0) {
      const size_t eq = a.find('=');
      if (eq != std::string::npos) {
        val = a.substr(eq + 1);
        a = a.substr(0, eq);
        hasVal = true;
      }
    }
    auto value = [&](std::string* v) -> Status {
      if (hasVal) {
        *v = val;
        return Status::ok();
      }
      if (i + 1 >= args.size()) return bad("%s needs a value", a.c_str());
      *v = args[++i];
      return Status::ok();
    };
    auto intArg = [&](long long lo, long long hi, long long* v) -> Status {
      std::string s;
      C4_CHECK(value(&s));
      if (!parseInt(s, lo, hi, v))
        return bad("%s: '%s' is not a whole number in [%lld, %lld]", a.c_str(), s.c_str(), lo, hi);
      return Status::ok();
    };
    auto numArg = [&](double lo, double* v) -> Status {
      std::string s;
      C4_CHECK(value(&s));
      if (!parseDouble(s, v) || *v < lo) return bad("%s: '%s' is not a number >= %g", a.c_str(), s.c_str(), lo);
      return Status::ok();
    };
    auto posArg = [&](double* v) -> Status {
      std::string s;
      C4_CHECK(value(&s));
      if (!parseDouble(s, v) || !(*v > 0)) return bad("%s: '%s' is not a number > 0", a.c_str(), s.c_str());
      return Status::ok();
    };
    auto sizeArg = [&](size_t* v) -> Status {
      std::string s;
      C4_CHECK(value(&s));
      if (!parseSize(s, v)) return bad("%s: '%s' is not a size (4096, 64K, 1M, 1G)", a.c_str(), s.c_str());
      return Status::ok();
    };
    if (!hasVal && (a == "-h" || a == "--help")) {
      o.help = true;
    } else if (a == "--topo") {
      C4_CHECK(value(&o.topoFile));
      if (o.topoFile.empty()) return bad("--topo: empty file name");
    } else if (a == "--gen") {
      C4_CHECK(value(&o.gen));
      C4_CHECK(genTopology(o.gen, nullptr));
    } else if (a == "--ranks-per-host") {
      long long v;
      C4_CHECK(intArg(1, 1 << 16, &v));
      o.ranksPerHost = static_cast<int>(v);
    } else if (a == "--coll") {
      std::string s;
      C4_CHECK(value(&s));
      if (!parseCollName(s, &o.coll))
        return bad("--coll: unknown collective '%s' (allreduce, allgather, reducescatter, broadcast, reduce, alltoall)",
                   s.c_str());
      o.collGiven = true;
    } else if (a == "--algo") {
      std::string s;
      C4_CHECK(value(&s));
      o.algos.clear();
      o.allAlgos = false;
      o.algoGiven = true;
      for (const std::string& name : split(s, ',')) {
        if (name == "all") {
          o.allAlgos = true;
          continue;
        }
        sched::Algo al;
        if (!sched::parseAlgo(name, &al))
          return bad("--algo: unknown algorithm '%s' (ring, tree, rhd, direct, hier, all)", name.c_str());
        if (std::find(o.algos.begin(), o.algos.end(), al) == o.algos.end()) o.algos.push_back(al);
      }
    } else if (a == "--schedule") {
      C4_CHECK(value(&o.scheduleFile));
      if (o.scheduleFile.empty()) return bad("--schedule: empty file name");
    } else if (a == "--bytes") {
      std::string s;
      C4_CHECK(value(&s));
      if (!sawBytes) o.sizes.clear();
      sawBytes = true;
      for (const std::string& f : split(s, ',')) {
        size_t b;
        if (!parseSize(f, &b) || b == 0) return bad("--bytes: '%s' is not a size > 0 (4096, 64K, 1M, 1G)", f.c_str());
        o.sizes.push_back(b);
      }
    } else if (a == "--chunk-bytes") {
      C4_CHECK(sizeArg(&o.chunkBytes));
      if (o.chunkBytes < 4) return bad("--chunk-bytes: at least one element (4 bytes)");
    } else if (a == "--in-place") {
      o.inPlace = true;
    } else if (a == "--alpha-us") {
      double v;
      C4_CHECK(numArg(0, &v));
      o.model.alpha = v * 1e-6;
    } else if (a == "--alpha-intra-us") {
      double v;
      C4_CHECK(numArg(0, &v));
      o.model.alphaIntra = v * 1e-6;
    } else if (a == "--intra-gbps") {
      double v;
      C4_CHECK(posArg(&v));
      o.model.intraBytesPerSec = v * 1e9 / 8;
    } else if (a == "--mem-gbps") {
      double v;
      C4_CHECK(posArg(&v));
      o.model.memBytesPerSec = v * 1e9 / 8;
    } else if (a == "--link-efficiency") {
      std::string s;
      C4_CHECK(value(&s));
      LinkEfficiency e;
      C4_CHECK(parseLinkEfficiency(s, &e));
      for (const LinkEfficiency& q : o.model.efficiency)
        if (q.bps == e.bps) return bad("--link-efficiency: '%s' repeats a rate given before", s.c_str());
      o.model.efficiency.push_back(std::move(e));
    } else if (a == "--piece-bytes") {
      C4_CHECK(sizeArg(&o.model.pieceBytes));
    } else if (a == "--slack") {
      double v;
      C4_CHECK(numArg(0, &v));
      if (v >= 1) return bad("--slack: a fraction of a link in [0, 1), got %g", v);
      o.model.slack = v;
    } else if (a == "--exact-limit") {
      long long v;
      C4_CHECK(intArg(0, 1LL << 40, &v));
      o.model.exactLimit = static_cast<size_t>(v);
    } else if (a == "--max-steps") {
      long long v;
      C4_CHECK(intArg(1, 1LL << 40, &v));
      o.maxSteps = static_cast<size_t>(v);
    } else if (a == "--max-plan-conns") {
      long long v;
      C4_CHECK(intArg(0, 1LL << 40, &v));
      o.maxPlanConns = static_cast<size_t>(v);
    } else if (a == "--planner") {
      std::string s;
      C4_CHECK(value(&s));
      if (!plan::parseMode(s, &o.planner)) return bad("--planner: unknown mode '%s' (c4p, ecmp, off)", s.c_str());
    } else if (a == "--lanes") {
      long long v;
      C4_CHECK(intArg(1, 64, &v));
      o.lanes = static_cast<int>(v);
    } else if (a == "--seed") {
      long long v;
      C4_CHECK(intArg(0, INT64_MAX, &v));
      o.seed = static_cast<uint64_t>(v);
    } else if (a == "--json") {
      C4_CHECK(value(&o.jsonOut));
      if (o.jsonOut.empty()) return bad("--json: empty file name");
    } else if (!hasVal && a == "--quiet") {
      o.quiet = true;
    } else if (a.rfind("-", 0) == 0) {
      return bad("unknown option '%s'", args[i].c_str());
    } else {
      return bad("unexpected argument '%s' (the subcommand 'check' comes first)", a.c_str());
    }
  }
  if (!o.help) {
    if (o.topoFile.empty() == o.gen.empty())
      return bad(o.topoFile.empty() ? "no fabric: give --topo FILE.json or --gen SPEC"
                                    : "give either --topo or --gen, not both");
    if (o.algos.empty() && !o.allAlgos && o.scheduleFile.empty()) return bad("--algo: no algorithm given");
    if (o.coll != Coll::kAllReduce && o.coll != Coll::kAllGather && o.coll != Coll::kReduceScatter &&
        o.coll != Coll::kAlltoAll && !o.scheduleFile.empty() && o.collGiven)
      return bad("--schedule: schedule files hold allgather, reducescatter, allreduce or alltoall, not --coll %s",
                 collLabel(o.coll));
  }
  *out = std::move(o);
  return Status::ok();
}

Status makeTopology(const Options& o, plan::Topology* out) {
  if (!o.topoFile.empty()) {
    const Status st = plan::Topology::load(o.topoFile, out);
    return st.isOk() ? st : Status(st.code(), "--topo: " + st.message());
  }
  return genTopology(o.gen, out);
}

size_t countFor(Coll coll, size_t bytes, int nranks) {
  const size_t elems = bytes / 4;
  switch (coll) {
    case Coll::kAllGather:
    case Coll::kReduceScatter:
    case Coll::kAlltoAll:
      return elems / static_cast<size_t>(std::max(1, nranks));
    default:
      return elems;
  }
}

double nominalBytes(Coll coll, size_t count, int nranks) {
  double b = static_cast<double>(count) * 4;
  if (coll == Coll::kAllGather || coll == Coll::kReduceScatter || coll == Coll::kAlltoAll) b *= nranks;
  return b;
}

double busFactor(Coll coll, int n) {
  switch (coll) {
    case Coll::kAllReduce:
      return 2.0 * (n - 1) / n;
    case Coll::kAllGather:
    case Coll::kReduceScatter:
    case Coll::kAlltoAll:
      return static_cast<double>(n - 1) / n;
    default:
      return 1;
  }
}

size_t defaultChunkBytes(size_t bytes, int nranks) {
  const size_t per = bytes / static_cast<size_t>(std::max(1, nranks));
  return std::min<size_t>(std::max<size_t>(per / 4, 128 << 10), 1 << 20);
}

Status runStudy(const Options& o, const plan::Topology& topo, Study* out, std::FILE* progress) {
  Study st;
  const int hosts = topo.numHosts();
  if (hosts < 1) return bad("topology %s has no hosts", topo.source().c_str());
  if (static_cast<int64_t>(hosts) * o.ranksPerHost > (1 << 20))
    return bad("%d hosts x %d ranks per host: more than 2^20 ranks", hosts, o.ranksPerHost);
  const int n = hosts * o.ranksPerHost;
  st.topology = topo.source();
  st.hosts = hosts;
  st.ranks = n;
  std::vector<int32_t> hostOf(static_cast<size_t>(n));
  for (int r = 0; r < n; ++r) hostOf[static_cast<size_t>(r)] = r / o.ranksPerHost;
  int maxPorts = 1;
  for (int h = 0; h < hosts; ++h) maxPorts = std::max(maxPorts, static_cast<int>(topo.host(h).ports.size()));
  st.lanes = o.lanes > 0 ? o.lanes : std::max(2, maxPorts);  // the tcp transport's C4_LANES default

  Coll coll = o.coll;
  std::shared_ptr<sched::ScheduleFile> file;
  if (!o.scheduleFile.empty()) {
    file = std::make_shared<sched::ScheduleFile>();
    C4_CHECK(sched::loadScheduleFile(o.scheduleFile, file.get()));
    if (o.collGiven && file->coll != coll)
      return bad("--schedule %s holds a %s schedule, not --coll %s", o.scheduleFile.c_str(), collLabel(file->coll),
                 collLabel(coll));
    coll = file->coll;
    if (file->nranks != n)
      return bad("--schedule %s is for %d ranks; the fabric runs %d (%d hosts x %d ranks per host)",
                 o.scheduleFile.c_str(), file->nranks, n, hosts, o.ranksPerHost);
  }
  st.coll = coll;
  // The algorithms: a file alone unless --algo names others too.
  struct Candidate {
    std::string name;
    sched::Algo algo = sched::Algo::kRing;
    bool isFile = false;
  };
  std::vector<Candidate> cands;
  if (file == nullptr || o.algoGiven) {
    std::vector<sched::Algo> algos = o.algos;
    if (o.allAlgos) {
      algos.clear();
      for (int a = 0; a < sched::kNumAlgos; ++a) algos.push_back(static_cast<sched::Algo>(a));
    }
    for (sched::Algo a : algos) {
      if (!sched::supports(a, coll, n)) {
        if (!o.allAlgos)
          return bad("algorithm %s has no schedule for %s over %d ranks", sched::algoName(a), collLabel(coll), n);
        st.skipped.push_back(strFormat("%s: no schedule for %s", sched::algoName(a), collLabel(coll)));
        continue;
      }
      cands.push_back(Candidate{sched::algoName(a), a, false});
    }
  }
  if (file != nullptr) cands.push_back(Candidate{file->label, sched::Algo::kRing, true});

  std::FILE* const prog = o.quiet ? nullptr : progress;

  for (size_t bytes : o.sizes) {
    const size_t count = countFor(coll, bytes, n);
    if (count == 0)
      return bad("--bytes %zu: too small for %s over %d ranks (at least %zu bytes)", bytes, collLabel(coll), n,
                 coll == Coll::kAllGather || coll == Coll::kReduceScatter || coll == Coll::kAlltoAll
                     ? 4 * static_cast<size_t>(n)
                     : size_t{4});
    const size_t chunk = o.chunkBytes > 0 ? o.chunkBytes : defaultChunkBytes(bytes, n);
    for (const Candidate& c : cands) {
      Row row;
      row.algo = c.name;
      row.bytes = bytes;
      row.count = count;
      row.chunkBytes = chunk;
      const std::string what = c.name + " " + human(static_cast<double>(bytes));
      // Every rank's schedule, compacted as it is made.
      auto t0 = std::chrono::steady_clock::now();
      auto lastSay = t0;
      sched::CollArgs args;
      args.coll = coll;
      args.nranks = n;
      args.count = count;
      args.dtype = DataType::kFloat32;
      args.root = 0;
      args.reduces = coll == Coll::kAllReduce || coll == Coll::kReduceScatter || coll == Coll::kReduce;
      args.chunkBytes = chunk;
      args.aliased = o.inPlace;
      args.hostOf = hostOf;
      std::vector<Program> progs(static_cast<size_t>(n));
      bool tooBig = false;
      for (int r = 0; r < n && !tooBig; ++r) {
        args.rank = r;
        Result<sched::Schedule> s = c.isFile ? sched::buildFromFile(*file, args) : sched::generate(c.algo, args);
        if (!s.isOk())
          return Status(s.status().code(),
                        strFormat("%s: rank %d's schedule: %s", what.c_str(), r, s.status().message().c_str()));
        progs[static_cast<size_t>(r)] = compile(s.value());
        if (r == 0 && progs[0].steps.size() * static_cast<size_t>(n) > o.maxSteps) {
          const std::string why = strFormat(
              "%s over %d ranks makes about %zu steps (rank 0 has %zu), above --max-steps %zu (about 60 bytes a step)",
              what.c_str(), n, progs[0].steps.size() * static_cast<size_t>(n), progs[0].steps.size(), o.maxSteps);
          if (!o.allAlgos) return bad("%s: use a larger --chunk-bytes or raise --max-steps", why.c_str());
          st.skipped.push_back(why);
          tooBig = true;
        }
        if (prog != nullptr && (r & 63) == 63 && std::chrono::steady_clock::now() - lastSay > std::chrono::seconds(1)) {
          lastSay = std::chrono::steady_clock::now();
          note(prog, "%s: schedules %d/%d ranks", what.c_str(), r + 1, n);
        }
      }
      if (tooBig) continue;
      row.genSeconds = secondsSince(t0);
      // Lanes planned for these schedules' flows. c4p's candidates cost memory and time per
      // connection: all-to-all traffic over a thousand hosts gets ECMP's hashing instead (what the
      // library's transports do for connections the plan does not cover).
      t0 = std::chrono::steady_clock::now();
      std::vector<plan::Flow> flows = flowsOf(progs);
      row.planner = o.planner;
      if (o.planner == plan::Mode::kC4p) {
        std::vector<uint64_t> conns;
        for (const plan::Flow& f : flows)
          if (hostOf[static_cast<size_t>(f.src)] != hostOf[static_cast<size_t>(f.dst)])
            conns.push_back(static_cast<uint64_t>(std::min(f.src, f.dst)) << 32 |
                            static_cast<uint32_t>(std::max(f.src, f.dst)));
        std::sort(conns.begin(), conns.end());
        const size_t nc = static_cast<size_t>(std::unique(conns.begin(), conns.end()) - conns.begin());
        if (nc > o.maxPlanConns) {
          row.planner = plan::Mode::kEcmp;
          st.notes.push_back(
              strFormat("%s: %zu connections between hosts, above --max-plan-conns %zu: lanes placed "
                        "by ecmp, not c4p",
                        what.c_str(), nc, o.maxPlanConns));
          note(prog, "%s", st.notes.back().c_str());
        }
      }
      Fabric fab;
      C4_CHECK(Fabric::build(topo, hostOf, row.planner, o.lanes, o.seed, std::move(flows), &fab));
      row.plannedMaxLinkSeconds = fab.plan().maxLinkSeconds(topo);
      row.planSeconds = secondsSince(t0);
      // Time.
      t0 = std::chrono::steady_clock::now();
      Status ss = simulate(progs, fab, o.model, &row.sim, [&](double done) {
        note(prog, "%s: simulating, %.0f%% of the steps done", what.c_str(), done * 100);
      });
      if (!ss.isOk()) return Status(ss.code(), what + ": " + ss.message());
      row.simSeconds = secondsSince(t0);
      if (row.sim.seconds > 0) {
        row.algbw = nominalBytes(coll, count, n) / row.sim.seconds / 1e9;
        row.busbw = row.algbw * busFactor(coll, n);
      }
      if (row.sim.busiestLink >= 0) row.busiestLink = topo.link(row.sim.busiestLink).name;
      note(prog, "%s: %.3f ms predicted; schedules %.2f s, plan %.2f s, simulation %.2f s (%zu messages, %zu events)",
           what.c_str(), row.sim.seconds * 1e3, row.genSeconds, row.planSeconds, row.simSeconds, row.sim.messages,
           row.sim.events);
      st.rows.push_back(std::move(row));
    }
  }
  *out = std::move(st);
  return Status::ok();
}

std::string formatTable(const Options& o, const Study& s) {
  std::string t;
  t += strFormat("# c4-sim: %s; %d hosts x %d rank(s) = %d ranks; %s; planner %s, %d lane(s) per connection\n",
                 s.topology.c_str(), s.hosts, o.ranksPerHost, s.ranks, collLabel(s.coll), plan::modeName(o.planner),
                 s.lanes);
  t += strFormat("# model: alpha %g us (intra-host %g us), intra-host %g Gbit/s, memory %g Gbit/s, pieces %s%s\n",
                 o.model.alpha * 1e6, o.model.alphaIntra * 1e6, o.model.intraBytesPerSec * 8 / 1e9,
                 o.model.memBytesPerSec * 8 / 1e9,
                 o.model.pieceBytes > 0 ? human(static_cast<double>(o.model.pieceBytes)).c_str() : "off (equal shares)",
                 o.inPlace ? ", in place" : "");
  for (const LinkEfficiency& e : o.model.efficiency) {
    std::string v;
    for (double x : e.byShares) v += (v.empty() ? "" : ",") + strFormat("%g", x);
    t += strFormat("# link efficiency %s: %s (1, 2, 4, ... transfers sharing a link)\n",
                   e.bps > 0 ? strFormat("at %s", rateLabel(e.bps).c_str()).c_str() : "of the other links", v.c_str());
  }
  t += strFormat("%14s  %-14s %10s %14s %11s %11s  %-24s %6s %10s\n", "size(B)", "algorithm", "chunk(B)", "time(us)",
                 "algbw(GB/s)", "busbw(GB/s)", "busiest link", "util", "messages");
  for (size_t i = 0; i < s.rows.size(); ++i) {
    const Row& r = s.rows[i];
    // The fastest of its size is marked when several algorithms ran.
    bool best = true, several = false;
    for (const Row& q : s.rows)
      if (&q != &r && q.bytes == r.bytes) {
        several = true;
        if (q.sim.seconds < r.sim.seconds) best = false;
      }
    const std::string name = r.algo + (several && best ? " *" : "");
    t += strFormat("%14zu  %-14s %10zu %14.2f %11.3f %11.3f  %-24s %5.1f%% %10zu\n", r.bytes, name.c_str(),
                   r.chunkBytes, r.sim.seconds * 1e6, r.algbw, r.busbw,
                   r.busiestLink.empty() ? "-" : r.busiestLink.c_str(), r.sim.busiestUtil * 100, r.sim.messages);
  }
  for (const std::string& k : s.skipped) t += "# skipped " + k + "\n";
  for (const std::string& k : s.notes) t += "# note: " + k + "\n";
  return t;
}

std::string formatJson(const Options& o, const Study& s) {
  nlohmann::json j;
  j["topology"] = s.topology;
  j["hosts"] = s.hosts;
  j["ranks_per_host"] = o.ranksPerHost;
  j["ranks"] = s.ranks;
  j["collective"] = collLabel(s.coll);
  j["planner"] = plan::modeName(o.planner);
  j["lanes"] = s.lanes;
  j["in_place"] = o.inPlace;
  j["model"] = {{"alpha_us", o.model.alpha * 1e6},
                {"alpha_intra_us", o.model.alphaIntra * 1e6},
                {"intra_gbps", o.model.intraBytesPerSec * 8 / 1e9},
                {"mem_gbps", o.model.memBytesPerSec * 8 / 1e9},
                {"piece_bytes", o.model.pieceBytes},
                {"slack", o.model.slack},
                {"exact_limit", o.model.exactLimit}};
  for (const LinkEfficiency& e : o.model.efficiency)
    j["model"]["link_efficiency"].push_back({{"rate_bps", e.bps}, {"by_shares", e.byShares}});
  nlohmann::json rows = nlohmann::json::array();
  for (const Row& r : s.rows) {
    nlohmann::json x;
    x["algorithm"] = r.algo;
    x["bytes"] = r.bytes;
    x["count"] = r.count;
    x["chunk_bytes"] = r.chunkBytes;
    x["seconds"] = r.sim.seconds;
    x["algbw_GBps"] = r.algbw;
    x["busbw_GBps"] = r.busbw;
    x["busiest_link"] = r.busiestLink.empty() ? nlohmann::json(nullptr) : nlohmann::json(r.busiestLink);
    x["busiest_link_utilization"] = r.sim.busiestUtil;
    x["busiest_link_bytes"] = r.sim.busiestLink >= 0 ? r.sim.linkBytes[static_cast<size_t>(r.sim.busiestLink)] : 0.0;
    x["planner"] = plan::modeName(r.planner);
    x["planned_max_link_seconds"] = r.plannedMaxLinkSeconds;
    x["steps"] = r.sim.steps;
    x["messages"] = r.sim.messages;
    x["transfers"] = r.sim.transfers;
    x["inter_host_bytes"] = r.sim.interBytes;
    x["intra_host_bytes"] = r.sim.intraBytes;
    x["events"] = r.sim.events;
    x["refills"] = r.sim.refills;
    x["bounded_refills"] = r.sim.boundedRefills;
    x["refilled_transfers"] = r.sim.refilledTransfers;
    x["wall_seconds"] = {{"schedules", r.genSeconds}, {"plan", r.planSeconds}, {"simulation", r.simSeconds}};
    rows.push_back(std::move(x));
  }
  j["results"] = std::move(rows);
  j["skipped"] = s.skipped;
  j["notes"] = s.notes;
  return j.dump(2) + "\n";
}

int cliMain(int argc, char** argv) {
  std::vector<std::string> args(argv + 1, argv + argc);
  if (!args.empty() && args[0] == "check") {
    if (args.size() != 2 || args[1].rfind("-", 0) == 0) {
      fprintf(stderr, "usage: c4-sim check FILE.json\n");
      return 2;
    }
    sched::ScheduleFile f;
    Status st = sched::loadScheduleFile(args[1], &f);
    if (!st.isOk()) {
      fprintf(stderr, "c4-sim: %s\n", st.message().c_str());
      return 1;
    }
    size_t steps = 0;
    for (const auto& r : f.ranks) steps += r.size();
    printf("%s: ok: %s, %s over %d ranks, %d chunk(s) per block, %zu steps, critical path %lld messages\n",
           args[1].c_str(), f.label.c_str(), collLabel(f.coll), f.nranks, f.chunks, steps,
           static_cast<long long>(f.depth));
    return 0;
  }
  Options o;
  Status st = parseOptions(args, &o);
  if (!st.isOk()) {
    fprintf(stderr, "c4-sim: %s\n(c4-sim --help for usage)\n", st.message().c_str());
    return 2;
  }
  if (o.help) {
    printf("%s", usageText().c_str());
    return 0;
  }
  plan::Topology topo;
  st = makeTopology(o, &topo);
  if (!st.isOk()) {
    fprintf(stderr, "c4-sim: %s\n", st.message().c_str());
    return 1;
  }
  Study s;
  st = runStudy(o, topo, &s, stderr);
  if (!st.isOk()) {
    fprintf(stderr, "c4-sim: %s\n", st.message().c_str());
    return 1;
  }
  printf("%s", formatTable(o, s).c_str());
  if (!o.jsonOut.empty()) {
    std::ofstream f(o.jsonOut);
    f << formatJson(o, s);
    f.close();
    if (!f) {
      fprintf(stderr, "c4-sim: cannot write %s: %s\n", o.jsonOut.c_str(), strerror(errno));
      return 1;
    }
  }
  return 0;
}

}  // namespace c4::sim
