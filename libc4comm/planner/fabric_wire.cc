#include "planner/fabric_wire.hpp"

#include <cmath>
#include <cstring>
#include <nlohmann/json.hpp>

#include "common/siphash.hpp"
#include "common/status.hpp"

namespace c4::plan::wire {

using json = nlohmann::json;

namespace {

void put32(std::string* out, uint32_t v) { out->append(reinterpret_cast<const char*>(&v), sizeof(v)); }
void put64(std::string* out, uint64_t v) { out->append(reinterpret_cast<const char*>(&v), sizeof(v)); }
uint32_t get32(const uint8_t* p) {
  uint32_t v;
  memcpy(&v, p, sizeof(v));
  return v;
}
uint64_t get64(const uint8_t* p) {
  uint64_t v;
  memcpy(&v, p, sizeof(v));
  return v;
}

uint64_t frameMac(const Session& s, Dir d, uint64_t seq, uint32_t length, const void* payload) {
  uint8_t k[16];
  memcpy(k, &s.key.k[0], 8);
  memcpy(k + 8, &s.key.k[1], 8);
  SipHasher h(k);
  static const char kLabel[] = "c4-fabric-frame";
  h.update(kLabel, sizeof(kLabel));
  const uint8_t dir = static_cast<uint8_t>(d);
  h.update(&dir, 1);
  h.update(&s.serviceNonce, sizeof(s.serviceNonce));
  h.update(&s.jobNonce, sizeof(s.jobNonce));
  h.update(&seq, sizeof(seq));
  h.update(&length, sizeof(length));
  h.update(payload, length);
  return h.finish();
}

// Readers of one field of a JSON object; each error names the field.
Status fail(const std::string& what) { return makeError(Code::kInvalidArgument, "fabric service: %s", what.c_str()); }

const json* field(const json& o, const char* key) {
  auto it = o.find(key);
  return it == o.end() ? nullptr : &*it;
}

Status getU64(const json& o, const char* key, uint64_t* out, bool required = true) {
  const json* v = field(o, key);
  if (v == nullptr) return required ? fail(std::string("missing field \"") + key + "\"") : Status::ok();
  if (!v->is_number_unsigned()) return fail(std::string("field \"") + key + "\" is not a non-negative integer");
  *out = v->get<uint64_t>();
  return Status::ok();
}

Status getInt(const json& o, const char* key, int64_t lo, int64_t hi, int64_t* out, bool required = true) {
  const json* v = field(o, key);
  if (v == nullptr) return required ? fail(std::string("missing field \"") + key + "\"") : Status::ok();
  if (!v->is_number_integer()) return fail(std::string("field \"") + key + "\" is not an integer");
  const int64_t x = v->is_number_unsigned() ? (v->get<uint64_t>() > static_cast<uint64_t>(INT64_MAX)
                                                   ? INT64_MAX
                                                   : static_cast<int64_t>(v->get<uint64_t>()))
                                            : v->get<int64_t>();
  if (x < lo || x > hi)
    return fail(strFormat("field \"%s\" is %lld, outside %lld..%lld", key, static_cast<long long>(x),
                          static_cast<long long>(lo), static_cast<long long>(hi)));
  *out = x;
  return Status::ok();
}

Status getBytes(const json& v, const char* what, double* out) {
  if (!v.is_number()) return fail(std::string(what) + " is not a number");
  const double x = v.get<double>();
  if (!std::isfinite(x) || x < 0 || x > 1e18) return fail(std::string(what) + " is not a byte count (0 to 1e18)");
  *out = x;
  return Status::ok();
}

Status getArray(const json& o, const char* key, size_t maxItems, const json** out, bool required = true) {
  const json* v = field(o, key);
  *out = nullptr;
  if (v == nullptr) return required ? fail(std::string("missing field \"") + key + "\"") : Status::ok();
  if (!v->is_array()) return fail(std::string("field \"") + key + "\" is not an array");
  if (v->size() > maxItems)
    return fail(strFormat("field \"%s\" has %zu entries (at most %zu)", key, v->size(), maxItems));
  *out = v;
  return Status::ok();
}

// An integer array entry in lo..hi.
Status intAt(const json& a, size_t i, int64_t lo, int64_t hi, const std::string& what, int64_t* out) {
  if (i >= a.size() || !a[i].is_number_integer()) return fail(what + " is not an integer");
  const int64_t x = a[i].is_number_unsigned() ? (a[i].get<uint64_t>() > static_cast<uint64_t>(INT64_MAX)
                                                     ? INT64_MAX
                                                     : static_cast<int64_t>(a[i].get<uint64_t>()))
                                              : a[i].get<int64_t>();
  if (x < lo || x > hi)
    return fail(strFormat("%s is %lld, outside %lld..%lld", what.c_str(), static_cast<long long>(x),
                          static_cast<long long>(lo), static_cast<long long>(hi)));
  *out = x;
  return Status::ok();
}

json laneJson(const LaneChoice& l) {
  return {l.localPort,  l.remotePort,     l.path,           l.backPath,
          l.sourcePort, l.sourceRange.lo, l.sourceRange.hi, l.retired ? 1 : 0};
}

// [localPort, remotePort, path, backPath, sourcePort, rangeLo, rangeHi, retired], each in range.
Status parseLane(const json& l, const std::string& lw, LaneChoice* out) {
  if (!l.is_array() || l.size() != 8) return fail(lw + " is not an array of 8 integers");
  int64_t v[8];
  const int64_t lo[8] = {0, 0, 0, -1, 0, 0, 0, 0};
  const int64_t hi[8] = {kMaxPortsPerRank - 1, kMaxPortsPerRank - 1, INT32_MAX, INT32_MAX, 65535, 65535, 65535, 1};
  for (size_t j = 0; j < 8; ++j) C4_CHECK(intAt(l, j, lo[j], hi[j], strFormat("%s[%zu]", lw.c_str(), j), &v[j]));
  LaneChoice lc;
  lc.localPort = static_cast<int>(v[0]);
  lc.remotePort = static_cast<int>(v[1]);
  lc.path = static_cast<int>(v[2]);
  lc.backPath = static_cast<int>(v[3]);
  lc.sourcePort = static_cast<uint16_t>(v[4]);
  lc.sourceRange = PortRange{static_cast<uint16_t>(v[5]), static_cast<uint16_t>(v[6])};
  lc.retired = v[7] != 0;
  *out = lc;
  return Status::ok();
}

// A connection's two ranks, a < b.
Status parsePair(const json& c, const std::string& where, int* a, int* b) {
  int64_t x = 0;
  C4_CHECK(getInt(c, "a", 0, static_cast<int64_t>(kMaxRanks) - 1, &x));
  *a = static_cast<int>(x);
  C4_CHECK(getInt(c, "b", 0, static_cast<int64_t>(kMaxRanks) - 1, &x));
  *b = static_cast<int>(x);
  if (*a >= *b) return fail(where + ": a connection names its lower rank first (a < b)");
  return Status::ok();
}

json connsJson(const std::vector<PlannedConn>& conns) {
  json a = json::array();
  for (const PlannedConn& c : conns) {
    json lanes = json::array();
    for (const LaneChoice& l : c.lanes) lanes.push_back(laneJson(l));
    a.push_back({{"a", c.a}, {"b", c.b}, {"ab", c.bytesAB}, {"ba", c.bytesBA}, {"lanes", std::move(lanes)}});
  }
  return a;
}

Status parseConns(const json& o, const char* key, std::vector<PlannedConn>* out) {
  const json* a = nullptr;
  C4_CHECK(getArray(o, key, kMaxFlows, &a, false));
  out->clear();
  if (a == nullptr) return Status::ok();
  out->reserve(a->size());
  for (size_t i = 0; i < a->size(); ++i) {
    const json& c = (*a)[i];
    const std::string where = strFormat("%s[%zu]", key, i);
    if (!c.is_object()) return fail(where + " is not an object");
    PlannedConn pc;
    C4_CHECK(parsePair(c, where, &pc.a, &pc.b));
    const json* ab = field(c, "ab");
    const json* ba = field(c, "ba");
    if (ab == nullptr || ba == nullptr) return fail(where + ": missing \"ab\" or \"ba\"");
    C4_CHECK(getBytes(*ab, (where + ".ab").c_str(), &pc.bytesAB));
    C4_CHECK(getBytes(*ba, (where + ".ba").c_str(), &pc.bytesBA));
    const json* lanes = nullptr;
    C4_CHECK(getArray(c, "lanes", kMaxLaneSlots, &lanes));
    for (size_t k = 0; k < lanes->size(); ++k) {
      LaneChoice lc;
      C4_CHECK(parseLane((*lanes)[k], strFormat("%s.lanes[%zu]", where.c_str(), k), &lc));
      pc.lanes.push_back(lc);
    }
    out->push_back(std::move(pc));
  }
  return Status::ok();
}

json jobJson(const JobSpec& j) {
  json ranks = json::array();
  for (const RankPlace& r : j.ranks) ranks.push_back({{"host", r.host}, {"ports", r.ports}, {"listen", r.listenPorts}});
  json flows = json::array();
  for (const Flow& f : j.flows) flows.push_back({f.src, f.dst, f.bytes});
  json o = {{"name", j.name},
            {"topo", j.topoHash},
            {"lanes", j.lanes},
            {"salt", j.portSalt},
            {"sport", {j.sourcePorts.lo, j.sourcePorts.hi}},
            {"ranks", std::move(ranks)},
            {"flows", std::move(flows)}};
  if (!j.keep.empty()) o["keep"] = connsJson(j.keep);
  return o;
}

Status parseJob(const json& o, JobSpec* out) {
  if (!o.is_object()) return fail("field \"job\" is not an object");
  JobSpec j;
  const json* name = field(o, "name");
  if (name != nullptr) {
    if (!name->is_string()) return fail("field \"name\" is not a string");
    j.name = name->get<std::string>();
    if (j.name.size() > kMaxNameBytes)
      return fail(strFormat("the job's name has %zu bytes (at most %zu)", j.name.size(), kMaxNameBytes));
  }
  C4_CHECK(getU64(o, "topo", &j.topoHash));
  int64_t x = 0;
  C4_CHECK(getInt(o, "lanes", 1, kMaxLanes, &x));
  j.lanes = static_cast<int>(x);
  C4_CHECK(getInt(o, "salt", 0, UINT32_MAX, &x, false));
  j.portSalt = static_cast<uint32_t>(x);
  const json* sport = nullptr;
  C4_CHECK(getArray(o, "sport", 2, &sport, false));
  if (sport != nullptr) {
    int64_t lo = 0, hi = 0;
    C4_CHECK(intAt(*sport, 0, 0, 65535, "sport[0]", &lo));
    C4_CHECK(intAt(*sport, 1, 0, 65535, "sport[1]", &hi));
    if (lo > hi) return fail("sport: the range's low end is above its high end");
    j.sourcePorts = PortRange{static_cast<uint16_t>(lo), static_cast<uint16_t>(hi)};
  }
  const json* ranks = nullptr;
  C4_CHECK(getArray(o, "ranks", kMaxRanks, &ranks));
  if (ranks->empty()) return fail("a job of no ranks");
  j.ranks.reserve(ranks->size());
  for (size_t i = 0; i < ranks->size(); ++i) {
    const json& r = (*ranks)[i];
    const std::string where = strFormat("ranks[%zu]", i);
    if (!r.is_object()) return fail(where + " is not an object");
    RankPlace rp;
    C4_CHECK(getInt(r, "host", 0, INT32_MAX, &x));
    rp.host = static_cast<int>(x);
    const json* ports = nullptr;
    const json* listen = nullptr;
    C4_CHECK(getArray(r, "ports", kMaxPortsPerRank, &ports));
    C4_CHECK(getArray(r, "listen", kMaxPortsPerRank, &listen, false));
    if (ports->empty()) return fail(where + " has no NIC port");
    if (listen != nullptr && listen->size() != ports->size())
      return fail(where + ": \"listen\" and \"ports\" differ in length");
    for (size_t p = 0; p < ports->size(); ++p) {
      C4_CHECK(intAt(*ports, p, 0, INT32_MAX, strFormat("%s.ports[%zu]", where.c_str(), p), &x));
      rp.ports.push_back(static_cast<int>(x));
      int64_t l = 0;
      if (listen != nullptr) C4_CHECK(intAt(*listen, p, 0, 65535, strFormat("%s.listen[%zu]", where.c_str(), p), &l));
      rp.listenPorts.push_back(static_cast<uint16_t>(l));
    }
    j.ranks.push_back(std::move(rp));
  }
  const json* flows = nullptr;
  C4_CHECK(getArray(o, "flows", kMaxFlows, &flows));
  j.flows.reserve(flows->size());
  const int64_t last = static_cast<int64_t>(j.ranks.size()) - 1;
  for (size_t i = 0; i < flows->size(); ++i) {
    const json& f = (*flows)[i];
    const std::string where = strFormat("flows[%zu]", i);
    if (!f.is_array() || f.size() != 3) return fail(where + " is not [src, dst, bytes]");
    int64_t s = 0, d = 0;
    C4_CHECK(intAt(f, 0, 0, last, where + "[0] (a rank)", &s));
    C4_CHECK(intAt(f, 1, 0, last, where + "[1] (a rank)", &d));
    if (s == d) return fail(where + " goes from a rank to itself");
    Flow fl;
    fl.src = static_cast<int>(s);
    fl.dst = static_cast<int>(d);
    C4_CHECK(getBytes(f[2], (where + "[2]").c_str(), &fl.bytes));
    j.flows.push_back(fl);
  }
  C4_CHECK(parseConns(o, "keep", &j.keep));
  for (const PlannedConn& c : j.keep)
    if (c.b > last) return fail(strFormat("keep: a connection to rank %d of a %zu-rank job", c.b, j.ranks.size()));
  *out = std::move(j);
  return Status::ok();
}

json reportJson(const JobReport& r) {
  json o = json::object();
  if (!r.lanes.empty()) o["lanes"] = connsJson(r.lanes);
  if (!r.samples.empty()) {
    json a = json::array();
    for (const LaneSample& x : r.samples)
      a.push_back({x.a, x.b, x.lane, x.fromA ? 0 : 1, x.bytesPerSec, x.ratio, static_cast<int>(x.verdict)});
    o["samples"] = std::move(a);
  }
  return o;
}

// The report's fields of `o` (both optional).
Status parseReportFields(const json& o, JobReport* out) {
  JobReport r;
  C4_CHECK(parseConns(o, "lanes", &r.lanes));
  const json* a = nullptr;
  C4_CHECK(getArray(o, "samples", kMaxSamples, &a, false));
  if (a != nullptr) {
    r.samples.reserve(a->size());
    for (size_t i = 0; i < a->size(); ++i) {
      const json& e = (*a)[i];
      const std::string where = strFormat("samples[%zu]", i);
      if (!e.is_array() || e.size() != 7) return fail(where + " is not [a, b, lane, dir, bytes/s, ratio, verdict]");
      int64_t v[3], dir = 0, verdict = 0;
      C4_CHECK(intAt(e, 0, 0, static_cast<int64_t>(kMaxRanks) - 1, where + "[0] (a rank)", &v[0]));
      C4_CHECK(intAt(e, 1, 0, static_cast<int64_t>(kMaxRanks) - 1, where + "[1] (a rank)", &v[1]));
      C4_CHECK(intAt(e, 2, 0, static_cast<int64_t>(kMaxLaneSlots) - 1, where + "[2] (a lane)", &v[2]));
      C4_CHECK(intAt(e, 3, 0, 1, where + "[3] (the direction)", &dir));
      C4_CHECK(intAt(e, 6, 0, 2, where + "[6] (the verdict)", &verdict));
      if (v[0] >= v[1]) return fail(where + ": a connection names its lower rank first (a < b)");
      LaneSample x;
      x.a = static_cast<int>(v[0]);
      x.b = static_cast<int>(v[1]);
      x.lane = static_cast<int>(v[2]);
      x.fromA = dir == 0;
      x.verdict = static_cast<LaneSample::Verdict>(verdict);
      C4_CHECK(getBytes(e[4], (where + "[4] (bytes/s)").c_str(), &x.bytesPerSec));
      if (!e[5].is_number() || !std::isfinite(e[5].get<double>()) || e[5].get<double>() < -1 ||
          e[5].get<double>() > 1e6)
        return fail(where + "[5] (the ratio) is not a number from -1 up");
      x.ratio = e[5].get<double>();
      r.samples.push_back(x);
    }
  }
  *out = std::move(r);
  return Status::ok();
}

json movesJson(const std::vector<LaneMove>& moves) {
  json a = json::array();
  for (const LaneMove& m : moves) a.push_back({{"a", m.a}, {"b", m.b}, {"lane", m.lane}, {"to", laneJson(m.choice)}});
  return a;
}

Status parseMovesField(const json& o, std::vector<LaneMove>* out) {
  out->clear();
  const json* a = nullptr;
  C4_CHECK(getArray(o, "moves", kMaxMoves, &a, false));
  if (a == nullptr) return Status::ok();
  for (size_t i = 0; i < a->size(); ++i) {
    const json& e = (*a)[i];
    const std::string where = strFormat("moves[%zu]", i);
    if (!e.is_object()) return fail(where + " is not an object");
    LaneMove m;
    C4_CHECK(parsePair(e, where, &m.a, &m.b));
    int64_t x = 0;
    C4_CHECK(getInt(e, "lane", 0, static_cast<int64_t>(kMaxLaneSlots) - 1, &x));
    m.lane = static_cast<int>(x);
    const json* to = field(e, "to");
    if (to == nullptr) return fail(where + ": missing \"to\"");
    C4_CHECK(parseLane(*to, where + ".to", &m.choice));
    if (m.choice.retired) return fail(where + ".to: a retired lane");
    out->push_back(m);
  }
  return Status::ok();
}

Status parseWhy(const json& o, std::string* out) {
  const json* w = field(o, "why");
  if (w == nullptr) return Status::ok();
  if (!w->is_string()) return fail("field \"why\" is not a string");
  *out = w->get<std::string>().substr(0, 4096);
  return Status::ok();
}

Status parseDoc(const std::string& text, json* out) {
  if (text.size() > kMaxFrameBytes) return fail("a message above the size limit");
  *out = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (out->is_discarded()) return fail("the message is not JSON");
  if (!out->is_object()) return fail("the message is not a JSON object");
  return Status::ok();
}

}  // namespace

Status keyFromSecret(const std::string& secret, Key* out) {
  size_t b = 0, e = secret.size();
  while (b < e && isspace(static_cast<unsigned char>(secret[b]))) ++b;
  while (e > b && isspace(static_cast<unsigned char>(secret[e - 1]))) --e;
  if (e - b < 16)
    return makeError(Code::kInvalidArgument, "fabric service key: %zu bytes of secret (at least 16)", e - b);
  static const uint8_t kA[16] = {'c', '4', '-', 'f', 'a', 'b', 'r', 'i', 'c', '-', 'k', 'e', 'y', '-', '0', 0};
  static const uint8_t kB[16] = {'c', '4', '-', 'f', 'a', 'b', 'r', 'i', 'c', '-', 'k', 'e', 'y', '-', '1', 0};
  out->k[0] = sipHash24(kA, secret.data() + b, e - b);
  out->k[1] = sipHash24(kB, secret.data() + b, e - b);
  return Status::ok();
}

std::string encodeGreeting(const Greeting& g) {
  std::string out;
  put32(&out, kGreetingMagic);
  put32(&out, g.version);
  put64(&out, g.nonce);
  return out;
}

Status parseGreeting(const void* p, size_t n, Greeting* out) {
  if (n != kGreetingBytes) return fail(strFormat("a greeting of %zu bytes (%zu expected)", n, kGreetingBytes));
  const uint8_t* b = static_cast<const uint8_t*>(p);
  if (get32(b) != kGreetingMagic) return fail("the peer is not a C4P fabric service or job (wrong greeting)");
  const uint32_t v = get32(b + 4);
  if (v != kVersion) return fail(strFormat("the peer speaks version %u of the protocol (this side %u)", v, kVersion));
  out->version = v;
  out->nonce = get64(b + 8);
  return Status::ok();
}

std::string sealFrame(const Session& s, Dir d, uint64_t seq, const std::string& payload) {
  const uint32_t length = static_cast<uint32_t>(payload.size());
  std::string out;
  out.reserve(kHeaderBytes + payload.size());
  put32(&out, kFrameMagic);
  put32(&out, length);
  put64(&out, seq);
  put64(&out, frameMac(s, d, seq, length, payload.data()));
  out += payload;
  return out;
}

Status parseFrameHeader(const void* p, size_t n, size_t maxBytes, FrameHeader* out) {
  if (n != kHeaderBytes) return fail(strFormat("a frame header of %zu bytes (%zu expected)", n, kHeaderBytes));
  const uint8_t* b = static_cast<const uint8_t*>(p);
  if (get32(b) != kFrameMagic) return fail("not a fabric service frame (wrong magic)");
  const uint32_t length = get32(b + 4);
  if (length > maxBytes) return fail(strFormat("a frame of %u bytes (at most %zu)", length, maxBytes));
  out->length = length;
  out->seq = get64(b + 8);
  out->mac = get64(b + 16);
  return Status::ok();
}

bool frameAuthentic(const Session& s, Dir d, uint64_t expectSeq, const FrameHeader& h, const void* payload) {
  return h.seq == expectSeq && h.mac == frameMac(s, d, h.seq, h.length, payload);
}

const char* opName(Op op) {
  switch (op) {
    case Op::kRegister:
      return "register";
    case Op::kRenew:
      return "renew";
    case Op::kRelease:
      return "release";
    case Op::kStatus:
      return "status";
  }
  return "?";
}

std::string encodeRequest(const Request& r) {
  json o = {{"op", opName(r.op)}};
  switch (r.op) {
    case Op::kRegister:
      o["job"] = jobJson(r.job);
      o["lease_ms"] = r.leaseMs;
      break;
    case Op::kRenew:
      o["lease_ms"] = r.leaseMs;
      if (!r.report.empty()) o["report"] = reportJson(r.report);
      [[fallthrough]];
    case Op::kRelease:
      o["id"] = r.id;
      o["token"] = r.token;
      break;
    case Op::kStatus:
      break;
  }
  return o.dump();
}

Status parseRequest(const std::string& text, Request* out) {
  json o;
  C4_CHECK(parseDoc(text, &o));
  const json* op = field(o, "op");
  if (op == nullptr || !op->is_string()) return fail("missing field \"op\"");
  const std::string name = op->get<std::string>();
  Request r;
  if (name == "register")
    r.op = Op::kRegister;
  else if (name == "renew")
    r.op = Op::kRenew;
  else if (name == "release")
    r.op = Op::kRelease;
  else if (name == "status")
    r.op = Op::kStatus;
  else
    return fail("unknown op \"" + name.substr(0, 64) + "\"");
  if (r.op == Op::kRegister || r.op == Op::kRenew) C4_CHECK(getInt(o, "lease_ms", 0, kMaxLeaseMs, &r.leaseMs, false));
  if (r.op == Op::kRegister) {
    const json* job = field(o, "job");
    if (job == nullptr) return fail("missing field \"job\"");
    C4_CHECK(parseJob(*job, &r.job));
  }
  if (r.op == Op::kRenew || r.op == Op::kRelease) {
    C4_CHECK(getU64(o, "id", &r.id));
    C4_CHECK(getU64(o, "token", &r.token));
  }
  if (r.op == Op::kRenew) {
    if (const json* rep = field(o, "report")) {
      if (!rep->is_object()) return fail("field \"report\" is not an object");
      C4_CHECK(parseReportFields(*rep, &r.report));
    }
  }
  *out = std::move(r);
  return Status::ok();
}

std::string encodeReply(const Reply& r) {
  json o = {{"ok", r.ok}};
  if (!r.ok) o["error"] = r.error;
  if (r.unknownJob) o["unknown_job"] = true;
  if (r.id) o["id"] = r.id;
  if (r.token) o["token"] = r.token;
  if (r.leaseMs) o["lease_ms"] = r.leaseMs;
  if (!r.conns.empty()) o["conns"] = connsJson(r.conns);
  if (std::isfinite(r.fabricSeconds) && r.fabricSeconds > 0) o["fabric_s"] = r.fabricSeconds;
  if (std::isfinite(r.soloSeconds) && r.soloSeconds > 0) o["solo_s"] = r.soloSeconds;
  if (!r.moves.empty()) {
    o["moves"] = movesJson(r.moves);
    o["why"] = r.moveWhy;
  }
  if (!r.status.empty()) {
    json st = json::parse(r.status, nullptr, false);
    o["status"] = st.is_discarded() ? json(r.status) : std::move(st);
  }
  return o.dump();
}

Status parseReply(const std::string& text, Reply* out) {
  json o;
  C4_CHECK(parseDoc(text, &o));
  Reply r;
  const json* ok = field(o, "ok");
  if (ok == nullptr || !ok->is_boolean()) return fail("missing field \"ok\"");
  r.ok = ok->get<bool>();
  if (const json* e = field(o, "error")) {
    if (!e->is_string()) return fail("field \"error\" is not a string");
    r.error = e->get<std::string>().substr(0, 4096);
  }
  if (!r.ok && r.error.empty()) r.error = "the service gave no reason";
  if (const json* u = field(o, "unknown_job")) {
    if (!u->is_boolean()) return fail("field \"unknown_job\" is not a boolean");
    r.unknownJob = u->get<bool>();
  }
  C4_CHECK(getU64(o, "id", &r.id, false));
  C4_CHECK(getU64(o, "token", &r.token, false));
  C4_CHECK(getInt(o, "lease_ms", 0, kMaxLeaseMs, &r.leaseMs, false));
  C4_CHECK(parseConns(o, "conns", &r.conns));
  for (const char* k : {"fabric_s", "solo_s"}) {
    const json* v = field(o, k);
    if (v == nullptr) continue;
    double x = 0;
    C4_CHECK(getBytes(*v, k, &x));
    (std::string(k) == "fabric_s" ? r.fabricSeconds : r.soloSeconds) = x;
  }
  if (const json* st = field(o, "status")) r.status = st->is_string() ? st->get<std::string>() : st->dump();
  C4_CHECK(parseMovesField(o, &r.moves));
  C4_CHECK(parseWhy(o, &r.moveWhy));
  *out = std::move(r);
  return Status::ok();
}

std::string encodeJobReport(const JobReport& r) { return reportJson(r).dump(); }

Status parseJobReport(const std::string& text, JobReport* out) {
  json o;
  C4_CHECK(parseDoc(text, &o));
  return parseReportFields(o, out);
}

std::string encodeMoves(const std::vector<LaneMove>& moves, const std::string& why) {
  return json({{"moves", movesJson(moves)}, {"why", why}}).dump();
}

Status parseMoves(const std::string& text, std::vector<LaneMove>* moves, std::string* why) {
  json o;
  C4_CHECK(parseDoc(text, &o));
  why->clear();
  C4_CHECK(parseMovesField(o, moves));
  return parseWhy(o, why);
}

}  // namespace c4::plan::wire
