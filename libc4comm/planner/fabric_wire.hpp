// The wire of C4P's fabric service (docs/c4p.md "The fabric service"): how a job and the service
// (tools/c4-fabricd) talk over one TCP connection. Every function here is pure (no I/O, no clock),
// so that the parsers can be fuzzed (tests/fuzz/fabric_wire_fuzz.cc) and the service and the job
// share one definition.
//
// A connection: the service greets first (kGreetingBytes: magic, version, its nonce), the job
// answers with its own greeting (its nonce); then the job sends requests and the service one reply
// to each, every one a frame: a header (kHeaderBytes: magic, payload length, sequence number, MAC)
// and a JSON payload. The MAC is SipHash-2-4 under the shared key over the direction, both nonces,
// the sequence number and the payload: a stranger without the key, a frame replayed on another
// connection (other nonces) or out of order on this one (sequence numbers count from 0 in each
// direction) is refused.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "c4comm/status.hpp"
#include "planner/planner.hpp"

namespace c4::plan::wire {

constexpr uint32_t kVersion = 1;
constexpr uint32_t kGreetingMagic = 0x47663443u;  // "C4fG" little endian
constexpr uint32_t kFrameMagic = 0x46663443u;     // "C4fF"
constexpr size_t kGreetingBytes = 16;             // magic u32, version u32, nonce u64
constexpr size_t kHeaderBytes = 24;               // magic u32, payload length u32, sequence u64, MAC u64
constexpr size_t kMaxFrameBytes = 16u << 20;      // no request or reply is larger

// What a job may announce (larger is refused before anything is allocated for it).
constexpr size_t kMaxRanks = 1u << 16;
constexpr size_t kMaxPortsPerRank = 16;
constexpr size_t kMaxFlows = 1u << 20;
constexpr int kMaxLanes = 64;
constexpr size_t kMaxNameBytes = 256;
constexpr int64_t kMaxLeaseMs = 24LL * 3600 * 1000;
constexpr size_t kMaxLaneSlots = 1024;    // lanes a connection has had (retired ones stay, numbered)
constexpr size_t kMaxSamples = 1u << 16;  // lane samples in one report
constexpr size_t kMaxMoves = 1u << 16;    // lane moves in one reply

/// The shared key (128 bits).
struct Key {
  uint64_t k[2] = {0, 0};
};
/// The key from a secret of at least 16 bytes (the key file's contents; surrounding whitespace is
/// ignored): two SipHash-2-4 values of it under fixed keys.
Status keyFromSecret(const std::string& secret, Key* out);

/// Which way a frame goes.
enum class Dir : uint8_t { kToService = 1, kToJob = 2 };

struct Greeting {
  uint32_t version = kVersion;
  uint64_t nonce = 0;
};
std::string encodeGreeting(const Greeting& g);
/// Exactly kGreetingBytes at `p`. Errors: another magic (not a fabric service or job), another version.
Status parseGreeting(const void* p, size_t n, Greeting* out);

/// A connection's keys: the shared key and both greetings' nonces.
struct Session {
  Key key;
  uint64_t serviceNonce = 0, jobNonce = 0;
};

struct FrameHeader {
  uint32_t length = 0;
  uint64_t seq = 0;
  uint64_t mac = 0;
};
/// The frame carrying `payload` (at most kMaxFrameBytes) as the `seq`-th frame of direction `d`.
std::string sealFrame(const Session& s, Dir d, uint64_t seq, const std::string& payload);
/// Exactly kHeaderBytes at `p`. Errors: another magic, a length above `maxBytes`.
Status parseFrameHeader(const void* p, size_t n, size_t maxBytes, FrameHeader* out);
/// Whether the frame (header and its `h.length` payload bytes) was sealed with this session's key
/// as frame `expectSeq` of direction `d`.
bool frameAuthentic(const Session& s, Dir d, uint64_t expectSeq, const FrameHeader& h, const void* payload);

/// What a job registers: where its ranks sit on the service's fabric, the bytes its ranks send
/// each other, its lanes, and (re-registering with a service that restarted) the plan it runs.
struct JobSpec {
  std::string name;       // who the job is, for people ("slurm 4242 rank 0 on h0, pid 77")
  uint64_t topoHash = 0;  // plan::Topology::hash of the fabric the job read (must be the service's)
  std::vector<RankPlace> ranks;
  std::vector<Flow> flows;
  int lanes = 2;
  uint32_t portSalt = 0;
  PortRange sourcePorts;
  std::vector<PlannedConn> keep;  // non-empty: book this plan as it is (a re-registration)
};

/// What a job measured of one lane over its last looks (docs/c4p.md "Fabric health across jobs"):
/// the sender's side of one direction.
struct LaneSample {
  enum class Verdict { kOk, kSlow, kFailed };
  int a = 0, b = 0, lane = 0;      // the connection (a < b) and the lane's index in it
  bool fromA = true;               // the direction measured: a -> b, else b -> a
  double bytesPerSec = 0;          // its throughput while busy (median of the last looks)
  double ratio = -1;               // over its connection's fastest lane's in that direction; -1: not compared
  Verdict verdict = Verdict::kOk;  // kSlow: well below its peers look after look; kFailed: it broke
};

/// What a job tells the service between registrations: the lanes of the connections that changed
/// since it last said (every lane of each, retired ones included, as the job numbers them: its
/// own replacements, and the moves the service asked for once made), and its lane samples.
struct JobReport {
  std::vector<PlannedConn> lanes;
  std::vector<LaneSample> samples;
  bool empty() const { return lanes.empty() && samples.empty(); }
};

/// A lane the service asks a job to move: lane `lane` of (a, b) leaves service, `choice` replaces it.
struct LaneMove {
  int a = 0, b = 0, lane = 0;
  LaneChoice choice;
};

enum class Op { kRegister, kRenew, kRelease, kStatus };
const char* opName(Op op);

struct Request {
  Op op = Op::kStatus;
  JobSpec job;          // kRegister
  int64_t leaseMs = 0;  // kRegister, kRenew: how long the service keeps the job without a renewal
  uint64_t id = 0;      // kRenew, kRelease: the job's id and token, as the registration gave them
  uint64_t token = 0;
  JobReport report;  // kRenew
};

struct Reply {
  bool ok = false;
  std::string error;        // !ok: why
  bool unknownJob = false;  // kRenew, kRelease: the service has no such job (it restarted): register again
  uint64_t id = 0, token = 0;
  int64_t leaseMs = 0;
  std::vector<PlannedConn> conns;  // kRegister: the job's plan
  double fabricSeconds = 0;        // kRegister: the fabric's most loaded link with the job, in seconds
  double soloSeconds = 0;          // kRegister: the job's own most loaded link
  std::string status;              // kStatus: the service's view (JSON text, docs/c4p.md)
  std::vector<LaneMove> moves;     // kRenew: lanes to move at the next operation boundary
  std::string moveWhy;             // why (for the job's log)
};

/// JSON text of a request / reply (finite numbers only).
std::string encodeRequest(const Request& r);
std::string encodeReply(const Reply& r);
/// The reverse. Errors name what is wrong: not JSON, an unknown op, a field of the wrong type, a
/// count or size past the limits above, a negative or non-finite number of bytes. Pure.
Status parseRequest(const std::string& text, Request* out);
Status parseReply(const std::string& text, Reply* out);

/// Within a job (over its bootstrap, to the rank that talks to the service, and back): a report,
/// and the moves the service asked for. JSON text; the parsers are pure and bounded as above.
std::string encodeJobReport(const JobReport& r);
Status parseJobReport(const std::string& text, JobReport* out);
std::string encodeMoves(const std::vector<LaneMove>& moves, const std::string& why);
Status parseMoves(const std::string& text, std::vector<LaneMove>* moves, std::string* why);

}  // namespace c4::plan::wire
