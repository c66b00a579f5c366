#include "core/heartbeat_wire.hpp"

#include <algorithm>
#include <exception>
#include <limits>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "common/status.hpp"

namespace c4 {

namespace {

using json = nlohmann::json;

// Times a peer reports are ages: at most this many ms / us (about 31 years), so that converting
// them to this rank's clock cannot overflow.
constexpr int64_t kMaxAgeMs = 1000000000000;
constexpr int64_t kMaxAgeUs = kMaxAgeMs * 1000;

// A field that is not what the sender writes (std::exception: caught with nlohmann's own).
struct Malformed : std::exception {
  explicit Malformed(std::string w) : what_(std::move(w)) {}
  const char* what() const noexcept override { return what_.c_str(); }
  std::string what_;
};

// An integer of type T. Every sender writes integers: a float, or a value T cannot hold, is
// malformed (nlohmann's get<T>() would convert it, undefined for floats out of T's range).
template <typename T>
T integer(const json& v, const char* what) {
  if (v.is_number_unsigned()) {
    const uint64_t u = v.get<uint64_t>();
    if (u <= static_cast<uint64_t>(std::numeric_limits<T>::max())) return static_cast<T>(u);
  } else if (v.is_number_integer()) {
    const int64_t i = v.get<int64_t>();
    if (std::numeric_limits<T>::is_signed ? i >= static_cast<int64_t>(std::numeric_limits<T>::min()) &&
                                                i <= static_cast<int64_t>(std::numeric_limits<T>::max())
                                          : i >= 0)
      return static_cast<T>(i);
  }
  throw Malformed(std::string("\"") + what + "\" is not an integer of its range: " + v.dump());
}

// Field `key` of object `o` as an integer, or `def` when absent.
template <typename T>
T integerField(const json& o, const char* key, T def) {
  auto it = o.find(key);
  return it == o.end() ? def : integer<T>(*it, key);
}

// An age (ms or us) within +-limit.
int64_t age(const json& v, const char* what, int64_t limit) {
  const int64_t a = integer<int64_t>(v, what);
  if (a < -limit || a > limit) throw Malformed(std::string("\"") + what + "\" is out of range: " + v.dump());
  return a;
}
int64_t ageField(const json& o, const char* key, int64_t limit) {
  auto it = o.find(key);
  return it == o.end() ? 0 : age(*it, key, limit);
}

std::vector<int> ranks(const json& o, const char* key) {
  std::vector<int> out;
  auto it = o.find(key);
  if (it == o.end()) return out;
  if (!it->is_array()) throw Malformed(std::string("\"") + key + "\" is not an array");
  for (const json& r : *it) out.push_back(integer<int>(r, key));
  return out;
}

const json& element(const json& a, size_t i, const char* what) {
  if (!a.is_array() || a.size() <= i) throw Malformed(std::string(what) + " is not an array of its fields");
  return a[i];
}

}  // namespace

Status parseHeartbeat(const char* data, size_t bytes, int from, int64_t nowNs, Heartbeat* out, bool* heard) {
  *heard = false;
  *out = Heartbeat();
  json j = json::parse(data, data + bytes, nullptr, false);
  // Not j.value("v", 0): it throws when "v" is not a number, and nothing caught that (found by
  // fuzzing: {"v":"1"} from a peer ended the process).
  const auto v = j.is_object() ? j.find("v") : j.end();
  if (j.is_discarded() || !j.is_object() || v == j.end() || !v->is_number() || *v != 1)
    return makeError(Code::kRemoteError, "a malformed heartbeat");
  *heard = true;
  if (j.contains("bye")) {
    out->bye = true;
    return Status::ok();
  }
  Heartbeat& h = *out;
  // Integers are read as integers of their range and ages bounded (found by fuzzing: a float
  // such as 6.7e22 for "e" was converted to uint64_t, which is undefined, and an age times 10^6
  // overflowed).
  try {
    h.hasState = j.contains("e");
    h.entered = integerField<uint64_t>(j, "e", 0);
    h.left = integerField<uint64_t>(j, "l", 0);
    h.enteredAtNs = nowNs - ageField(j, "ea", kMaxAgeMs) * 1000000;
    h.leftAtNs = nowNs - ageField(j, "la", kMaxAgeMs) * 1000000;
    h.inP2p = j.value("p2p", false);
    if (j.contains("in")) {
      if (!j["in"].is_string() || j["in"].get_ref<const std::string&>().size() > 64)
        throw Malformed("\"in\" is not a short string");
      h.inside = j["in"].get<std::string>();
    }
    if (j.contains("t")) {
      const int64_t t = integer<int64_t>(j["t"], "t");
      if (t < 0 || t > kMaxAgeUs) throw Malformed("\"t\" is out of range: " + j["t"].dump());
      h.sentNs = t * 1000;
    }
    const int64_t st = ageField(j, "st", kMaxAgeMs);
    h.stalledAtNs = st > 0 ? nowNs - st * 1000000 : 0;
    h.waitingOn = ranks(j, "w");
    h.stuckTo = ranks(j, "k");
    if (j.contains("fail")) {
      h.hasFailed = true;
      h.failed = j["fail"].get<std::string>();
    }
    if (j.contains("ops"))
      for (const json& op : j["ops"]) {
        // [seq, age of its entry in us, time outside c4comm before it in us (-1: unknown)]
        const uint64_t seq = integer<uint64_t>(element(op, 0, "an op"), "op seq");
        const int64_t ageUs = age(element(op, 1, "an op"), "op age", kMaxAgeUs);
        const int64_t gapUs = op.size() > 2 ? age(op[2], "op gap", kMaxAgeUs) : -1;
        h.ops.push_back({seq, nowNs - ageUs * 1000, gapUs >= 0 ? gapUs * 1000 : -1});
      }
    if (j.contains("rates")) {
      h.hasRates = true;
      for (const json& x : j["rates"]) {
        PeerRate pr;
        pr.peer = integer<int>(element(x, 0, "a rate"), "rate peer");
        pr.bytes = integer<uint64_t>(element(x, 1, "a rate"), "rate bytes");
        pr.ns = integer<uint64_t>(element(x, 2, "a rate"), "rate ns");
        pr.lanesUp = integer<int>(element(x, 3, "a rate"), "rate lanes up");
        pr.lanesRetired = integer<int>(element(x, 4, "a rate"), "rate lanes retired");
        pr.lanes = element(x, 5, "a rate").get<std::string>();
        h.rates.push_back(pr);
      }
    }
    if (j.contains("diag")) {
      h.hasDiag = true;
      const json& dj = j["diag"];
      if (!dj.is_object()) throw Malformed("\"diag\" is not an object");
      Diagnosis& d = h.diag;
      d.kind = dj.value("class", std::string());
      d.reporter = integerField<int>(dj, "reporter", from);
      d.seq = integerField<int64_t>(dj, "seq", -1);
      d.summary = dj.value("summary", std::string());
      d.evidence = dj.value("evidence", std::string());
      d.confidence = dj.value("confidence", 0.0);
      if (dj.contains("culprit")) {
        const json& c = dj["culprit"];
        if (!c.is_object()) throw Malformed("\"culprit\" is not an object");
        d.ranks = ranks(c, "ranks");
        d.hosts = c.value("hosts", std::vector<std::string>{});
        auto links = c.find("links");
        if (links != c.end()) {
          if (!links->is_array()) throw Malformed("\"links\" is not an array");
          for (const json& l : *links)
            d.links.push_back(
                {integer<int>(element(l, 0, "a link"), "link"), integer<int>(element(l, 1, "a link"), "link")});
        }
        d.lateMs = c.value("late_ms", 0.0);
      }
      d.json = dj.dump();
      h.failing = j.value("failing", false);
    }
  } catch (const std::exception& e) {
    return makeError(Code::kRemoteError, "%s", e.what());
  }
  return Status::ok();
}

int64_t HeartbeatDelay::align(int64_t arrivedNs, Heartbeat* hb) {
  if (hb->sentNs < 0) return 0;
  if (arrivedNs - windowStartNs_ >= windowNs_) {  // a new window: the floor follows clock drift
    leastBefore_ = least_;
    least_ = INT64_MAX;
    windowStartNs_ = arrivedNs;
  }
  const int64_t lag = arrivedNs - hb->sentNs;  // clock offset + this heartbeat's delay
  least_ = std::min(least_, lag);
  const int64_t extra = lag - std::min(least_, leastBefore_);
  if (extra <= 0) return 0;
  auto shift = [extra](int64_t* t) {
    if (*t != 0) *t -= extra;
  };
  shift(&hb->enteredAtNs);
  shift(&hb->leftAtNs);
  shift(&hb->stalledAtNs);
  for (Heartbeat::Op& op : hb->ops) op.enterNs -= extra;
  return extra;
}

}  // namespace c4
