#include "sched/schedule_file.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <functional>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <utility>

#include "common/hash.hpp"
#include "common/logging.hpp"
#include "common/params.hpp"
#include "common/status.hpp"
#include "sched/builder.hpp"
#include "sched/simulate.hpp"

namespace c4::sched {

C4_PARAM_INT(ScheduleFileMaxBytes, "C4_SCHEDULE_FILE_MAX_BYTES", nullptr, int64_t{64} << 20, 1024, int64_t{1} << 40,
             kParamNone, "Largest schedule file (C4_SCHEDULE_FILE) read, in bytes; a larger one is an error")

namespace {

// The hazard check of one simulation run costs the sum over ranks of steps^2 (about 5 ns each here);
// beyond this it checks a spread of ranks (SimOptions::maxHazardWork), so that a file of thousands of
// ranks is checked in seconds, not minutes.
constexpr size_t kHazardWorkPerRun = size_t{60} << 20;

using json = nlohmann::json;
using detail::Range;

constexpr int kFormatVersion = 1;
constexpr int kMaxRanks = 65536;
constexpr int kMaxChunks = 1024;
constexpr size_t kMaxRegistered = 0xfb - kNumAlgos + 1;  // ids up to 0xfb: the tracer codes 0xfc.. (trace.hpp)

bool validName(const std::string& s) {
  if (s.empty() || s.size() > 48) return false;
  for (char c : s)
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '.' || c == '+' || c == '-')) return false;
  return true;
}

bool parseOp(const std::string& s, FileStep::Op* op) {
  static const struct {
    const char* name;
    FileStep::Op op;
  } kOps[] = {{"send", FileStep::Op::kSend},
              {"recv", FileStep::Op::kRecv},
              {"send-partial", FileStep::Op::kSendPartial},
              {"recv-reduce", FileStep::Op::kRecvReduce}};
  for (const auto& o : kOps)
    if (s == o.name) {
      *op = o.op;
      return true;
    }
  return false;
}

// An int field in [lo, hi]; false with `why` otherwise.
bool intField(const json& j, const char* key, int64_t lo, int64_t hi, int64_t* out, std::string* why) {
  auto it = j.find(key);
  if (it == j.end()) {
    *why = strFormat("\"%s\" is missing", key);
    return false;
  }
  if (!it->is_number_integer()) {
    *why = strFormat("\"%s\" must be an integer", key);
    return false;
  }
  int64_t v = it->get<int64_t>();
  if (v < lo || v > hi) {
    *why = strFormat("\"%s\" is %lld, outside %lld..%lld", key, static_cast<long long>(v), static_cast<long long>(lo),
                     static_cast<long long>(hi));
    return false;
  }
  *out = v;
  return true;
}

bool onlyKeys(const json& j, std::initializer_list<const char*> keys, std::string* why) {
  for (auto it = j.begin(); it != j.end(); ++it) {
    bool known = false;
    for (const char* k : keys) known = known || it.key() == k;
    if (!known) {
      *why = strFormat("unknown key \"%s\"", it.key().c_str());
      return false;
    }
  }
  return true;
}

// Blocks of a file's collective: nranks, or nranks * nranks for alltoall (block s * nranks + d:
// what rank s sends to rank d).
int numBlocks(const ScheduleFile& f) { return f.coll == Coll::kAlltoAll ? f.nranks * f.nranks : f.nranks; }

std::string chunkName(const ScheduleFile& f, int c) {
  const int blk = c / f.chunks;
  if (f.coll == Coll::kAlltoAll)
    return strFormat("chunk %d (block %d: rank %d to rank %d, part %d)", c, blk, blk / f.nranks, blk % f.nranks,
                     c % f.chunks);
  return strFormat("chunk %d (block %d part %d)", c, blk, c % f.chunks);
}

// Orders one rank's steps so that every explicit dependency comes first (stable: the file's order
// where the deps allow it) and rewrites the deps to the new order; `order[i]` is the file's index of
// the i-th step. Fails naming a cycle.
Status orderSteps(const ScheduleFile& f, int rank, std::vector<FileStep>& steps, std::vector<int>* order) {
  const int n = static_cast<int>(steps.size());
  std::vector<std::vector<int>> users(static_cast<size_t>(n));
  std::vector<int> pending(static_cast<size_t>(n), 0);
  for (int i = 0; i < n; ++i) {
    std::set<int32_t> uniq(steps[static_cast<size_t>(i)].deps.begin(), steps[static_cast<size_t>(i)].deps.end());
    for (int32_t d : uniq) {
      if (d == i)
        return makeError(Code::kInvalidUsage, "schedule file %s: rank %d step %d depends on itself", f.source.c_str(),
                         rank, i);
      users[static_cast<size_t>(d)].push_back(i);
      ++pending[static_cast<size_t>(i)];
    }
  }
  std::set<int> ready;
  for (int i = 0; i < n; ++i)
    if (pending[static_cast<size_t>(i)] == 0) ready.insert(i);
  std::vector<int> newIndex(static_cast<size_t>(n), -1);
  order->clear();
  while (!ready.empty()) {
    int i = *ready.begin();
    ready.erase(ready.begin());
    newIndex[static_cast<size_t>(i)] = static_cast<int>(order->size());
    order->push_back(i);
    for (int u : users[static_cast<size_t>(i)])
      if (--pending[static_cast<size_t>(u)] == 0) ready.insert(u);
  }
  if (static_cast<int>(order->size()) < n) {
    // Walk back along unfinished deps from an unfinished step until a step repeats.
    int cur = 0;
    while (newIndex[static_cast<size_t>(cur)] >= 0) ++cur;
    std::vector<int> path;
    std::map<int, size_t> seen;
    while (seen.find(cur) == seen.end()) {
      seen[cur] = path.size();
      path.push_back(cur);
      for (int32_t d : steps[static_cast<size_t>(cur)].deps)
        if (newIndex[static_cast<size_t>(d)] < 0) {
          cur = d;
          break;
        }
    }
    std::string cyc;
    for (size_t k = seen[cur]; k < path.size(); ++k) cyc += std::to_string(path[k]) + " -> ";
    cyc += std::to_string(cur);
    return makeError(Code::kInvalidUsage, "schedule file %s: rank %d step %d: dependency cycle %s", f.source.c_str(),
                     rank, cur, cyc.c_str());
  }
  std::vector<FileStep> sorted;
  sorted.reserve(static_cast<size_t>(n));
  for (int i : *order) {
    FileStep s = steps[static_cast<size_t>(i)];
    for (int32_t& d : s.deps) d = newIndex[static_cast<size_t>(d)];
    sorted.push_back(std::move(s));
  }
  steps = std::move(sorted);
  return Status::ok();
}

// The data-availability rules of docs/schedules.md, walking each rank's steps in order.
// `fileIndex[r][i]` maps a sorted step back to its index in the file, for messages.
Status checkAvailability(const ScheduleFile& f, const std::vector<std::vector<int>>& fileIndex) {
  const int n = f.nranks, nc = numBlocks(f) * f.chunks;
  const bool a2a = f.coll == Coll::kAlltoAll;
  for (int r = 0; r < n; ++r) {
    const auto& steps = f.ranks[static_cast<size_t>(r)];
    std::vector<char> held(static_cast<size_t>(nc), 0), partialSent(static_cast<size_t>(nc), 0),
        finalSent(static_cast<size_t>(nc), 0);
    if (f.coll == Coll::kAllGather)
      for (int p = 0; p < f.chunks; ++p) held[static_cast<size_t>(r * f.chunks + p)] = 1;
    // AllToAll: rank r starts with its blocks to every other rank (its block to itself is copied
    // locally and never travels).
    if (a2a)
      for (int d = 0; d < n; ++d)
        for (int p = 0; p < f.chunks && d != r; ++p) held[static_cast<size_t>((r * n + d) * f.chunks + p)] = 1;
    for (size_t i = 0; i < steps.size(); ++i) {
      const FileStep& s = steps[i];
      const int c = s.chunk, owner = a2a ? -1 : c / f.chunks;
      const bool mine = owner == r;
      const int at = fileIndex[static_cast<size_t>(r)][i];
      auto fail = [&](const char* what) {
        return makeError(Code::kInvalidUsage, "schedule file %s: rank %d step %d (%s %s, peer %d): %s",
                         f.source.c_str(), r, at, fileOpName(s.op), chunkName(f, c).c_str(), s.peer, what);
      };
      if (a2a && c / f.chunks / n == c / f.chunks % n)
        return fail("names a block a rank sends itself, which the executor copies locally and never sends");
      switch (s.op) {
        case FileStep::Op::kSend:
          if ((f.coll == Coll::kAllGather || a2a) && !held[static_cast<size_t>(c)])
            return fail("sends data the rank does not have at that point (never received before this step)");
          if (f.coll == Coll::kAllReduce) {
            if (!mine && !held[static_cast<size_t>(c)])
              return fail("sends a final value the rank does not have at that point (never received before this step)");
            if (mine) finalSent[static_cast<size_t>(c)] = 1;
          }
          break;
        case FileStep::Op::kRecv:
          if (mine && f.coll == Coll::kAllReduce) return fail("receives the final value of a block the rank owns");
          if (a2a && c / f.chunks / n == r) return fail("receives a chunk of the rank's own input");
          if (held[static_cast<size_t>(c)]) return fail("receives a chunk the rank already has");
          if (f.coll == Coll::kAllReduce && !partialSent[static_cast<size_t>(c)])
            return fail("receives the final value before sending its own partial, which then never counts");
          held[static_cast<size_t>(c)] = 1;
          break;
        case FileStep::Op::kSendPartial:
          if (mine) return fail("sends a partial of a block the rank owns (the owner only receives partials)");
          if (partialSent[static_cast<size_t>(c)]) return fail("sends the chunk's partial a second time");
          partialSent[static_cast<size_t>(c)] = 1;
          break;
        case FileStep::Op::kRecvReduce:
          if (!mine && partialSent[static_cast<size_t>(c)])
            return fail("receives a partial after the rank's own partial of the chunk left, so it is lost");
          if (mine && finalSent[static_cast<size_t>(c)])
            return fail("reduces into the chunk after its final value was sent");
          break;
      }
    }
    if (a2a) {
      for (int s2 = 0; s2 < n; ++s2)
        for (int p = 0; p < f.chunks && s2 != r; ++p) {
          const int c = (s2 * n + r) * f.chunks + p;
          if (!held[static_cast<size_t>(c)])
            return makeError(Code::kInvalidUsage, "schedule file %s: rank %d ends without %s", f.source.c_str(), r,
                             chunkName(f, c).c_str());
        }
      continue;
    }
    for (int c = 0; c < nc; ++c) {
      const bool mine = c / f.chunks == r;
      if ((f.coll == Coll::kAllGather || (f.coll == Coll::kAllReduce && !mine)) && !held[static_cast<size_t>(c)])
        return makeError(Code::kInvalidUsage, "schedule file %s: rank %d ends without %s", f.source.c_str(), r,
                         chunkName(f, c).c_str());
      if (f.coll != Coll::kAllGather && !mine && f.nranks > 1 && !partialSent[static_cast<size_t>(c)])
        return makeError(Code::kInvalidUsage,
                         "schedule file %s: rank %d never sends its partial of %s, so block %d's owner misses it",
                         f.source.c_str(), r, chunkName(f, c).c_str(), c / f.chunks);
    }
  }
  return Status::ok();
}

// Runs all ranks' schedules on the simulator with int32 sums and compares every output with the
// collective's definition. Fills the file's cost-model figures (depth from the first run).
Status simulateFile(ScheduleFile& f, int64_t deadlineNs) {
  const int n = f.nranks;
  const size_t nc = static_cast<size_t>(numBlocks(f)) * static_cast<size_t>(f.chunks);
  const bool a2a = f.coll == Coll::kAlltoAll;
  // Uneven parts (every chunk at least two elements): the split is exercised.
  const size_t count = f.coll == Coll::kAllReduce ? 2 * nc + 3 : 2 * static_cast<size_t>(f.chunks) + 1;
  const ReduceFn sum = [](void* dst, const void* a, const void* b, size_t bytes) {
    const size_t k = bytes / sizeof(uint32_t);
    for (size_t i = 0; i < k; ++i) {
      uint32_t x, y;
      std::memcpy(&x, static_cast<const uint8_t*>(a) + i * 4, 4);
      std::memcpy(&y, static_cast<const uint8_t*>(b) + i * 4, 4);
      x += y;
      std::memcpy(static_cast<uint8_t*>(dst) + i * 4, &x, 4);
    }
  };
  CollArgs a;
  a.coll = f.coll;
  a.nranks = n;
  a.count = count;
  a.dtype = DataType::kInt32;
  a.reduces = f.coll == Coll::kAllReduce || f.coll == Coll::kReduceScatter;
  const size_t inElems = inputBytes(a) / 4, outElems = outputBytes(a) / 4;
  auto value = [](int r, size_t i) { return static_cast<uint32_t>(r) * 1000003u + static_cast<uint32_t>(i) * 7u + 1u; };
  // Fine pieces on small files exercise pipelining; big ones run whole chunks (the hazard check
  // grows with the square of the steps).
  const bool small = static_cast<size_t>(n) * nc <= 4096;
  const struct {
    bool inPlace;
    size_t chunkBytes;
    uint64_t seed;
  } runs[] = {
      {false, 0, 1}, {true, 0, 2}, {false, small ? size_t{4} : size_t{0}, 3}, {true, small ? size_t{4} : size_t{0}, 4}};
  for (const auto& run : runs) {
    // AllToAll has no in-place form (the communicator works from a copy of an aliased input).
    if (a2a && run.inPlace) continue;
    // Without pieces, the third and fourth runs would repeat the first two (another seed only).
    if (!small && run.seed > 2) continue;
    a.aliased = run.inPlace;
    a.chunkBytes = run.chunkBytes;
    std::vector<Schedule> scheds;
    std::vector<std::vector<uint32_t>> in(static_cast<size_t>(n)), out(static_cast<size_t>(n));
    std::vector<SimBuffers> bufs(static_cast<size_t>(n));
    for (int r = 0; r < n; ++r) {
      a.rank = r;
      Result<Schedule> s = buildFromFile(f, a);
      if (!s.isOk()) return s.status();
      scheds.push_back(std::move(s.value()));
      auto& I = in[static_cast<size_t>(r)];
      auto& O = out[static_cast<size_t>(r)];
      SimBuffers& b = bufs[static_cast<size_t>(r)];
      if (run.inPlace) {
        // The in-place aliasing NCCL defines: AllReduce same pointer; AllGather input = output +
        // rank*count; ReduceScatter output = input + rank*count.
        size_t big = std::max(inElems, outElems);
        O.assign(big, 0);
        size_t inOff = f.coll == Coll::kAllGather ? static_cast<size_t>(r) * count : 0;
        size_t outOff = f.coll == Coll::kReduceScatter ? static_cast<size_t>(r) * count : 0;
        for (size_t i = 0; i < inElems; ++i) O[inOff + i] = value(r, i);
        b.input = O.data() + inOff;
        b.output = O.data() + outOff;
      } else {
        I.resize(inElems);
        for (size_t i = 0; i < inElems; ++i) I[i] = value(r, i);
        O.assign(outElems, 0xdeadbeefu);
        b.input = I.data();
        b.output = O.data();
      }
      b.inputBytes = inElems * 4;
      b.outputBytes = outElems * 4;
    }
    SimOptions opts;
    opts.seed = run.seed;
    opts.maxHazardWork = kHazardWorkPerRun;
    opts.deadlineNs = deadlineNs;
    SimStats stats;
    Status st = simulate(scheds, bufs, sum, opts, &stats);
    if (st.code() == Code::kTimeout)
      return makeError(Code::kInvalidUsage,
                       "schedule file %s: checking it (%d ranks, %zu steps) takes longer than this communicator's "
                       "init may wait (half of C4_TIMEOUT); raise C4_TIMEOUT or use a smaller schedule",
                       f.source.c_str(), n, [&] {
                         size_t k = 0;
                         for (const auto& rs : f.ranks) k += rs.size();
                         return k;
                       }());
    if (!st.isOk())
      return makeError(Code::kInvalidUsage, "schedule file %s: the schedule simulator refuses it (%s): %s",
                       f.source.c_str(), run.inPlace ? "in place" : "out of place", st.message().c_str());
    for (int r = 0; r < n; ++r) {
      const uint32_t* o = static_cast<const uint32_t*>(bufs[static_cast<size_t>(r)].output);
      for (size_t i = 0; i < outElems; ++i) {
        uint32_t want = 0;
        if (f.coll == Coll::kAllGather) {
          want = value(static_cast<int>(i / count), i % count);
        } else if (a2a) {
          want = value(static_cast<int>(i / count), static_cast<size_t>(r) * count + i % count);
        } else {
          const size_t src = f.coll == Coll::kReduceScatter ? static_cast<size_t>(r) * count + i : i;
          for (int q = 0; q < n; ++q) want += value(q, src);
        }
        if (o[i] != want) {
          size_t blockLen = f.coll == Coll::kAllReduce ? 0 : count;
          int blk = 0;
          if (f.coll == Coll::kAllReduce) {
            for (int q = 0; q < n; ++q) {
              Range br = detail::splitRange(count, n, q);
              if (i >= br.off && i < br.end()) blk = q;
            }
          } else {
            blk = f.coll == Coll::kAllGather ? static_cast<int>(i / blockLen)
                  : a2a                      ? static_cast<int>(i / blockLen) * n + r
                                             : r;
          }
          return makeError(Code::kInvalidUsage,
                           "schedule file %s: wrong result (%s): rank %d ends with element %zu (block %d) = %u, the "
                           "collective's definition gives %u",
                           f.source.c_str(), run.inPlace ? "in place" : "out of place", r, i, blk, o[i], want);
        }
      }
    }
    if (!run.inPlace && run.chunkBytes == 0) {
      f.depth = stats.hops;
      // Every chunk is 1 / (nranks * chunks) of the collective's nominal size (nccl-tests': the
      // output of allgather, the input of reducescatter and alltoall, the vector of allreduce).
      const double per = 1.0 / (static_cast<double>(n) * f.chunks);
      for (const auto& steps : f.ranks) {
        double sent = 0, red = 0;
        for (const FileStep& fs : steps) {
          if (fs.op == FileStep::Op::kSend || fs.op == FileStep::Op::kSendPartial) sent += per;
          if (fs.op == FileStep::Op::kRecvReduce) red += per;
        }
        f.sendFraction = std::max(f.sendFraction, sent);
        f.reduceFraction = std::max(f.reduceFraction, red);
      }
    }
  }
  return Status::ok();
}

// The bytes of a schedule file: a regular file of at most C4_SCHEDULE_FILE_MAX_BYTES (a FIFO would
// block init, /dev/zero never end, a directory is no file). `head` > 0: its first `head` bytes only.
Result<std::string> readFile(const std::string& path, size_t head = 0) {
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
  if (fd < 0)
    return makeError(Code::kInvalidUsage, "schedule file %s: cannot open it: %s", path.c_str(), strerror(errno));
  struct stat st;
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    const char* what = S_ISDIR(st.st_mode)    ? "a directory"
                       : S_ISFIFO(st.st_mode) ? "a FIFO"
                       : S_ISCHR(st.st_mode)  ? "a character device"
                       : S_ISBLK(st.st_mode)  ? "a block device"
                       : S_ISSOCK(st.st_mode) ? "a socket"
                                              : "not a regular file";
    close(fd);
    return makeError(Code::kInvalidUsage, "schedule file %s: is %s, not a regular file", path.c_str(), what);
  }
  const uint64_t cap = static_cast<uint64_t>(paramScheduleFileMaxBytes());
  if (head == 0 && static_cast<uint64_t>(st.st_size) > cap) {
    close(fd);
    return makeError(Code::kInvalidUsage, "schedule file %s: %lld bytes, more than C4_SCHEDULE_FILE_MAX_BYTES=%llu",
                     path.c_str(), static_cast<long long>(st.st_size), static_cast<unsigned long long>(cap));
  }
  // Read what is there now, at most the cap (a file that grows meanwhile is cut there).
  const size_t want =
      head > 0 ? std::min<size_t>(head, static_cast<size_t>(st.st_size)) : static_cast<size_t>(st.st_size);
  std::string text(want, '\0');
  size_t got = 0;
  while (got < want) {
    const ssize_t k = read(fd, &text[got], want - got);
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0) break;
    got += static_cast<size_t>(k);
  }
  const int e = errno;
  close(fd);
  if (got < want && head == 0)
    return makeError(Code::kInvalidUsage, "schedule file %s: read error after %zu of %zu bytes: %s", path.c_str(), got,
                     want, strerror(e));
  text.resize(got);
  return text;
}

struct Registry {
  std::mutex mu;
  std::vector<std::shared_ptr<const ScheduleFile>> files;   // id kNumAlgos + i
  std::map<std::string, std::pair<uint64_t, Algo>> byPath;  // path -> (content hash, id)
};
Registry& registry() {
  static Registry* r = new Registry();  // never destroyed: ids outlive every communicator
  return *r;
}

}  // namespace

const char* fileOpName(FileStep::Op op) {
  switch (op) {
    case FileStep::Op::kSend:
      return "send";
    case FileStep::Op::kRecv:
      return "recv";
    case FileStep::Op::kSendPartial:
      return "send-partial";
    case FileStep::Op::kRecvReduce:
      return "recv-reduce";
  }
  return "?";
}

Status parseScheduleFile(const std::string& text, const std::string& source, ScheduleFile* out, int64_t deadlineNs) {
  ScheduleFile f;
  f.source = source;
  f.hash = fnv1a(text);
  json j;
  try {
    j = json::parse(text);
  } catch (const std::exception& e) {
    return makeError(Code::kInvalidUsage, "schedule file %s: not JSON: %s", source.c_str(), e.what());
  }
  std::string why;
  auto bad = [&](const std::string& w) {
    return makeError(Code::kInvalidUsage, "schedule file %s: %s", source.c_str(), w.c_str());
  };
  if (!j.is_object()) return bad("the top level must be an object");
  if (!onlyKeys(j, {"format", "version", "name", "collective", "nranks", "chunks", "topology", "info", "ranks"}, &why))
    return bad(why);
  if (!j.contains("format") || !j["format"].is_string() || j["format"].get<std::string>() != "c4comm-schedule")
    return bad("\"format\" must be \"c4comm-schedule\"");
  int64_t v = 0;
  if (!intField(j, "version", kFormatVersion, kFormatVersion, &v, &why))
    return bad(why + " (this library reads version 1)");
  if (!j.contains("name") || !j["name"].is_string() || !validName(j["name"].get<std::string>()))
    return bad("\"name\" must be 1-48 characters of [A-Za-z0-9_.+-]");
  f.name = j["name"].get<std::string>();
  f.label = "file:" + f.name;
  std::string coll = j.contains("collective") && j["collective"].is_string() ? j["collective"].get<std::string>() : "";
  if (coll == "allgather") {
    f.coll = Coll::kAllGather;
  } else if (coll == "reducescatter") {
    f.coll = Coll::kReduceScatter;
  } else if (coll == "allreduce") {
    f.coll = Coll::kAllReduce;
  } else if (coll == "alltoall") {
    f.coll = Coll::kAlltoAll;
  } else {
    return bad("\"collective\" must be \"allgather\", \"reducescatter\", \"allreduce\" or \"alltoall\"");
  }
  if (!intField(j, "nranks", 1, kMaxRanks, &v, &why)) return bad(why);
  f.nranks = static_cast<int>(v);
  if (!intField(j, "chunks", 1, kMaxChunks, &v, &why)) return bad(why);
  f.chunks = static_cast<int>(v);
  // In 64 bits: an alltoall of 65536 ranks has 2^32 blocks (numBlocks is an int once this passed).
  const int64_t blocks = f.coll == Coll::kAlltoAll ? int64_t{f.nranks} * f.nranks : int64_t{f.nranks};
  if (blocks * f.chunks > (int64_t{1} << 22))
    return bad(strFormat("%lld blocks x %d chunks is more chunks than a schedule may have (4194304)",
                         static_cast<long long>(blocks), f.chunks));
  if (j.contains("topology")) {
    const json& t = j["topology"];
    if (!t.is_object() || !onlyKeys(t, {"hash", "hosts"}, &why))
      return bad("\"topology\": " + (why.empty() ? std::string("must be an object") : why));
    if (!t.contains("hash") || !t["hash"].is_string())
      return bad("\"topology\": \"hash\" must be a string (\"0x\" + 16 hex)");
    const std::string h = t["hash"].get<std::string>();
    char* end = nullptr;
    if (h.size() != 18 || h.compare(0, 2, "0x") != 0)
      return bad("\"topology\": \"hash\" must be \"0x\" + 16 hex digits");
    f.topologyHash = std::strtoull(h.c_str() + 2, &end, 16);
    if (end != h.c_str() + h.size()) return bad("\"topology\": \"hash\" must be \"0x\" + 16 hex digits");
    f.hasTopology = true;
    if (t.contains("hosts")) {
      if (!t["hosts"].is_array() || t["hosts"].size() != static_cast<size_t>(f.nranks))
        return bad(strFormat("\"topology\": \"hosts\" must list one host name per rank (%d)", f.nranks));
      for (const json& h2 : t["hosts"]) {
        if (!h2.is_string()) return bad("\"topology\": \"hosts\" must hold strings");
        f.hosts.push_back(h2.get<std::string>());
      }
    }
  }
  if (!j.contains("ranks") || !j["ranks"].is_array()) return bad("\"ranks\" must be an array with one entry per rank");
  if (j["ranks"].size() != static_cast<size_t>(f.nranks))
    return bad(strFormat("\"ranks\" has %zu entries for \"nranks\" %d", j["ranks"].size(), f.nranks));
  const int nc = numBlocks(f) * f.chunks;
  for (int r = 0; r < f.nranks; ++r) {
    const json& jr = j["ranks"][static_cast<size_t>(r)];
    if (!jr.is_object() || !onlyKeys(jr, {"steps"}, &why) || !jr.contains("steps") || !jr["steps"].is_array())
      return bad(
          strFormat("rank %d: must be an object with a \"steps\" array%s%s", r, why.empty() ? "" : ": ", why.c_str()));
    std::vector<FileStep> steps;
    const json& js = jr["steps"];
    for (size_t i = 0; i < js.size(); ++i) {
      const json& s = js[i];
      auto stepBad = [&](const std::string& w) { return bad(strFormat("rank %d step %zu: %s", r, i, w.c_str())); };
      if (!s.is_object()) return stepBad("must be an object");
      if (!onlyKeys(s, {"op", "peer", "chunk", "deps"}, &why)) return stepBad(why);
      FileStep fs;
      if (!s.contains("op") || !s["op"].is_string() || !parseOp(s["op"].get<std::string>(), &fs.op))
        return stepBad("\"op\" must be \"send\", \"recv\", \"send-partial\" or \"recv-reduce\"");
      const bool partial = fs.op == FileStep::Op::kSendPartial || fs.op == FileStep::Op::kRecvReduce;
      if (((f.coll == Coll::kAllGather || f.coll == Coll::kAlltoAll) && partial) ||
          (f.coll == Coll::kReduceScatter && !partial))
        return stepBad(strFormat("%s schedules have no \"%s\" steps", coll.c_str(), fileOpName(fs.op)));
      if (!intField(s, "peer", 0, f.nranks - 1, &v, &why)) return stepBad(why);
      fs.peer = static_cast<int32_t>(v);
      if (fs.peer == r) return stepBad("\"peer\" is the rank itself");
      if (!intField(s, "chunk", 0, nc - 1, &v, &why)) return stepBad(why);
      fs.chunk = static_cast<int32_t>(v);
      if (s.contains("deps")) {
        if (!s["deps"].is_array()) return stepBad("\"deps\" must be an array of step indices");
        for (const json& d : s["deps"]) {
          if (!d.is_number_integer() || d.get<int64_t>() < 0 || d.get<int64_t>() >= static_cast<int64_t>(js.size()))
            return stepBad(
                strFormat("\"deps\" names a step that does not exist (rank %d has %zu steps)", r, js.size()));
          fs.deps.push_back(static_cast<int32_t>(d.get<int64_t>()));
        }
      }
      steps.push_back(std::move(fs));
    }
    f.ranks.push_back(std::move(steps));
  }
  // Explicit deps first (cycles are errors), then what each step may read, then real data.
  std::vector<std::vector<int>> fileIndex(static_cast<size_t>(f.nranks));
  for (int r = 0; r < f.nranks; ++r)
    C4_CHECK(orderSteps(f, r, f.ranks[static_cast<size_t>(r)], &fileIndex[static_cast<size_t>(r)]));
  C4_CHECK(checkAvailability(f, fileIndex));
  C4_CHECK(simulateFile(f, deadlineNs));
  *out = std::move(f);
  return Status::ok();
}

Status loadScheduleFile(const std::string& path, ScheduleFile* out) {
  C4_ASSIGN_OR_RETURN(std::string text, readFile(path));
  return parseScheduleFile(text, path, out);
}

namespace {

// Explicit deps of a file's step onto the steps emitted for it.
void addFileDeps(detail::Builder& b, const FileStep& s, const std::vector<std::vector<int>>& emitted,
                 const std::vector<int>& mine) {
  std::vector<int32_t> extra;
  for (int32_t d : s.deps)
    extra.insert(extra.end(), emitted[static_cast<size_t>(d)].begin(), emitted[static_cast<size_t>(d)].end());
  if (!extra.empty())
    for (int idx : mine) b.addDeps(idx, extra);
}

// AllToAll: block s * n + d lives at rank s's input offset d * count and rank d's output offset
// s * count; a chunk a rank relays (a block neither from nor to it) waits in scratch, one slot per
// relayed chunk.
Schedule buildAlltoAll(const ScheduleFile& f, const CollArgs& args) {
  detail::Builder b(args);
  const int r = args.rank, n = f.nranks;
  const size_t count = args.count;
  std::map<int, size_t> slot;  // relayed chunk -> scratch element offset
  size_t scratchEnd = 0;
  const auto& steps = f.ranks[static_cast<size_t>(r)];
  std::vector<std::vector<int>> emitted(steps.size());
  for (size_t i = 0; i < steps.size(); ++i) {
    const FileStep& s = steps[i];
    const int blk = s.chunk / f.chunks, from = blk / n, to = blk % n;
    const Range part = detail::splitRange(count, f.chunks, s.chunk % f.chunks);
    // Where this rank keeps the chunk, as a function of an element range inside it.
    std::function<Span(Range)> at;
    if (from == r) {
      at = [&, to](Range x) { return b.in(Range{static_cast<size_t>(to) * count + x.off, x.len}); };
    } else if (to == r) {
      at = [&, from](Range x) { return b.out(Range{static_cast<size_t>(from) * count + x.off, x.len}); };
    } else {
      auto it = slot.find(s.chunk);
      if (it == slot.end()) {
        it = slot.emplace(s.chunk, scratchEnd).first;
        scratchEnd += part.len;
      }
      const size_t base = it->second;
      at = [&, base, part](Range x) { return b.scratch(Range{base + (x.off - part.off), x.len}); };
    }
    for (Range p : b.piecesOf(part)) {
      const int idx = s.op == FileStep::Op::kSend ? b.send(s.peer, at(p)) : b.recv(s.peer, at(p));
      if (idx >= 0) emitted[i].push_back(idx);
    }
    addFileDeps(b, s, emitted, emitted[i]);
  }
  const Range own{static_cast<size_t>(r) * count, count};
  b.copy(b.in(own), b.out(own));
  return b.finish(static_cast<Algo>(kNumAlgos));
}

}  // namespace

Result<Schedule> buildFromFile(const ScheduleFile& f, const CollArgs& args) {
  if (args.coll != f.coll || args.nranks != f.nranks)
    return makeError(Code::kInvalidArgument, "schedule file %s is a %s of %d ranks, not a %s of %d", f.source.c_str(),
                     collName(f.coll), f.nranks, collName(args.coll), args.nranks);
  if (f.coll == Coll::kAlltoAll) return buildAlltoAll(f, args);
  detail::Builder b(args);
  const int r = args.rank, n = f.nranks;
  const size_t count = args.count;
  // Element range of chunk c in the collective's index space: the output's for allgather, the
  // input's for reducescatter, the vector's for allreduce.
  auto chunkRange = [&](int c) {
    const int blk = c / f.chunks, part = c % f.chunks;
    Range br =
        f.coll == Coll::kAllReduce ? detail::splitRange(count, n, blk) : Range{static_cast<size_t>(blk) * count, count};
    Range p = detail::splitRange(br.len, f.chunks, part);
    return Range{br.off + p.off, p.len};
  };
  // Where this rank's partial of a chunk accumulates: the owner's output, else scratch at the
  // chunk's offset in the input's index space.
  auto accSpan = [&](Range x, int owner) -> Span {
    if (owner != r) return b.scratch(x);
    if (f.coll == Coll::kReduceScatter) return b.out(Range{x.off - static_cast<size_t>(r) * count, x.len});
    return b.out(x);
  };
  auto inSpan = [&](Range x) {
    if (f.coll == Coll::kAllGather) return b.in(Range{x.off - static_cast<size_t>(r) * count, x.len});
    return b.in(x);
  };
  const int nc = n * f.chunks;
  std::vector<char> acc(static_cast<size_t>(nc), 0);
  const auto& steps = f.ranks[static_cast<size_t>(r)];
  std::vector<std::vector<int>> emitted(steps.size());
  for (size_t i = 0; i < steps.size(); ++i) {
    const FileStep& s = steps[i];
    const int owner = s.chunk / f.chunks;
    const Range whole = chunkRange(s.chunk);
    for (Range p : b.piecesOf(whole)) {
      int idx = -1;
      switch (s.op) {
        case FileStep::Op::kSend:
          idx = b.send(s.peer, f.coll == Coll::kAllGather && owner == r ? inSpan(p) : b.out(p));
          break;
        case FileStep::Op::kRecv:
          idx = b.recv(s.peer, b.out(p));
          break;
        case FileStep::Op::kSendPartial:
          idx = b.sendToReduce(s.peer, acc[static_cast<size_t>(s.chunk)] ? accSpan(p, owner) : inSpan(p));
          break;
        case FileStep::Op::kRecvReduce:
          idx = b.recvReduce(s.peer, acc[static_cast<size_t>(s.chunk)] ? accSpan(p, owner) : inSpan(p),
                             accSpan(p, owner));
          break;
      }
      if (idx >= 0) emitted[i].push_back(idx);
    }
    if (s.op == FileStep::Op::kRecvReduce) acc[static_cast<size_t>(s.chunk)] = 1;
    addFileDeps(b, s, emitted, emitted[i]);
  }
  // The rank's own data: allgather copies its block into place; an owner whose chunk got no
  // partial (one rank) copies its input.
  if (f.coll == Coll::kAllGather) {
    b.copy(b.in(Range{0, count}), b.out(Range{static_cast<size_t>(r) * count, count}));
  } else {
    for (int part = 0; part < f.chunks; ++part) {
      const int c = r * f.chunks + part;
      if (!acc[static_cast<size_t>(c)]) {
        Range x = chunkRange(c);
        b.copy(inSpan(x), accSpan(x, r));
      }
    }
  }
  // generate() stamps the registered id.
  return b.finish(static_cast<Algo>(kNumAlgos));
}

Result<Algo> registerSchedule(std::shared_ptr<const ScheduleFile> f) {
  Registry& reg = registry();
  std::lock_guard<std::mutex> lk(reg.mu);
  for (size_t i = 0; i < reg.files.size(); ++i)
    if (reg.files[i]->hash == f->hash) return static_cast<Algo>(kNumAlgos + static_cast<int>(i));
  if (reg.files.size() >= kMaxRegistered)
    return makeError(Code::kInvalidUsage,
                     "schedule file %s: %zu schedules are registered already (the most a process "
                     "may hold)",
                     f->source.c_str(), kMaxRegistered);
  reg.files.push_back(std::move(f));
  return static_cast<Algo>(kNumAlgos + static_cast<int>(reg.files.size()) - 1);
}

std::shared_ptr<const ScheduleFile> registeredSchedule(Algo a) {
  const int i = static_cast<int>(a) - kNumAlgos;
  if (i < 0) return nullptr;
  Registry& reg = registry();
  std::lock_guard<std::mutex> lk(reg.mu);
  return static_cast<size_t>(i) < reg.files.size() ? reg.files[static_cast<size_t>(i)] : nullptr;
}

int numRegisteredSchedules() {
  Registry& reg = registry();
  std::lock_guard<std::mutex> lk(reg.mu);
  return static_cast<int>(reg.files.size());
}

namespace {

// Reads a schedule file's top-level "nranks" and "collective" without building the document: stops
// once it has both (writers put them before "ranks"), else goes through the whole text.
class HeaderSax : public nlohmann::json_sax<json> {
 public:
  int64_t nranks = -1;
  std::string coll;
  bool done() const { return nranks >= 0 && !coll.empty(); }
  bool null() override { return true; }
  bool boolean(bool) override { return true; }
  bool number_integer(number_integer_t v) override { return take(static_cast<int64_t>(v)); }
  bool number_unsigned(number_unsigned_t v) override {
    return take(v > static_cast<number_unsigned_t>(INT64_MAX) ? INT64_MAX : static_cast<int64_t>(v));
  }
  bool number_float(number_float_t, const string_t&) override { return true; }
  bool string(string_t& v) override {
    if (depth_ == 1 && key_ == "collective") coll = v;
    key_.clear();
    return !done();
  }
  bool binary(binary_t&) override { return true; }
  bool start_object(std::size_t) override {
    ++depth_;
    key_.clear();
    return true;
  }
  bool end_object() override {
    --depth_;
    return true;
  }
  bool start_array(std::size_t) override {
    ++depth_;
    key_.clear();
    return true;
  }
  bool end_array() override {
    --depth_;
    return true;
  }
  bool key(string_t& k) override {
    if (depth_ == 1) key_ = k;
    return true;
  }
  bool parse_error(std::size_t, const std::string&, const nlohmann::detail::exception&) override { return false; }

 private:
  bool take(int64_t v) {
    if (depth_ == 1 && key_ == "nranks") nranks = v;
    key_.clear();
    return !done();
  }
  int depth_ = 0;
  std::string key_;
};

}  // namespace

Status peekScheduleFile(const std::string& path, int* nranks, std::string* collective) {
  HeaderSax sax;
  // Most files say it in their first bytes; read the rest only when they do not.
  for (size_t head : {size_t{65536}, size_t{0}}) {
    C4_ASSIGN_OR_RETURN(std::string text, readFile(path, head));
    sax = HeaderSax();
    (void)json::sax_parse(text, &sax);
    if (sax.done() || head == 0 || text.size() < head) break;
  }
  if (sax.nranks < 1 || sax.nranks > INT32_MAX)
    return makeError(Code::kInvalidUsage,
                     "schedule file %s: no valid \"nranks\" at its top level (not a schedule file?)", path.c_str());
  *nranks = static_cast<int>(sax.nranks);
  *collective = sax.coll;
  return Status::ok();
}

Result<Algo> loadAndRegister(const std::string& path, int64_t deadlineNs) {
  C4_ASSIGN_OR_RETURN(std::string text, readFile(path));
  const uint64_t h = fnv1a(text);
  {
    Registry& reg = registry();
    std::lock_guard<std::mutex> lk(reg.mu);
    auto it = reg.byPath.find(path);
    if (it != reg.byPath.end() && it->second.first == h) return it->second.second;
  }
  auto f = std::make_shared<ScheduleFile>();
  C4_CHECK(parseScheduleFile(text, path, f.get(), deadlineNs));
  C4_INFO(kLogSched, "schedule file %s: %s of %d ranks, %d chunk(s) per block, %lld messages deep", path.c_str(),
          collName(f->coll), f->nranks, f->chunks, static_cast<long long>(f->depth));
  C4_ASSIGN_OR_RETURN(Algo id, registerSchedule(f));
  Registry& reg = registry();
  std::lock_guard<std::mutex> lk(reg.mu);
  reg.byPath[path] = std::make_pair(h, id);
  return id;
}

}  // namespace c4::sched
