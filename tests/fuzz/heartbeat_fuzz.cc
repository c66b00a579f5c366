// Fuzz target: C4D's heartbeats as a rank receives them from its peers over the bootstrap's side
// channel (core/heartbeat_wire.hpp). The input is up to 8 heartbeats separated by NUL bytes, from
// ranks 1, 2, 3 in turn, a second apart; rank 0 receives them. Each is read by
// parseHeartbeat and applied the way HealthMonitor::receive and viewOf do; then what the monitor
// does with the peers' word runs too: the slowdown detector (SlowDetector), the classifiers
// (classifyHang, classifyFailure) and the record of an adopted diagnosis (diagnosisJson).
#include <climits>
#include <cstring>
#include <string>
#include <vector>

#include "core/diagnose.hpp"
#include "core/heartbeat_wire.hpp"
#include "fuzz_util.hpp"

using namespace c4;  // NOLINT(google-build-using-namespace): a fuzz target's own translation unit

namespace {

constexpr int kRanks = 4;
constexpr int64_t kStartNs = int64_t{1000000} * 1000000000;  // a steady clock a while after boot

// What HealthMonitor keeps per peer.
struct Peer {
  RankView v;
  int64_t lastHeardNs = 0, enteredAtNs = 0, leftAtNs = 0, stalledAtNs = 0;
};

// now - t must not overflow for the times the monitor keeps (viewOf subtracts them from now).
void checkTime(int64_t now, int64_t t, const char* what) {
  int64_t d;
  C4_FUZZ_CHECK(!__builtin_sub_overflow(now, t, &d), "%s = %lld: now - %s overflows", what, static_cast<long long>(t),
                what);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::vector<Peer> peers(kRanks);
  SlowDetector slow;
  SlowDetector::Config cfg;
  cfg.confirmations = 1;  // one look finds what three would
  slow.configure(cfg);
  int64_t now = kStartNs;
  // This rank's own arrivals (the reporter analyses them too).
  for (uint64_t s = 30; s < 40; ++s) slow.addOp(0, s, now - static_cast<int64_t>(40 - s) * 50000000, 1000000);
  std::vector<Diagnosis> adopted;
  const char* p = reinterpret_cast<const char*>(data);
  const char* end = p + size;
  bool applied = false;
  for (int i = 0; p <= end && i < 8; ++i) {
    const char* q = static_cast<const char*>(memchr(p, 0, static_cast<size_t>(end - p)));
    if (q == nullptr) q = end;
    const int from = 1 + i % (kRanks - 1);
    now += 1000000000;
    Heartbeat hb;
    bool heard = false;
    const Status st = parseHeartbeat(p, static_cast<size_t>(q - p), from, now, &hb, &heard);
    p = q + 1;
    if (!heard) continue;
    Peer& peer = peers[static_cast<size_t>(from)];
    peer.lastHeardNs = now;
    peer.v.known = true;
    if (!st.isOk() || hb.bye) {
      peer.v.leftInOrder |= hb.bye;
      continue;
    }
    applied = true;
    checkTime(now, hb.enteredAtNs, "enteredAtNs");
    checkTime(now, hb.leftAtNs, "leftAtNs");
    checkTime(now, hb.stalledAtNs, "stalledAtNs");
    peer.v.entered = hb.entered;
    peer.v.left = hb.left;
    peer.enteredAtNs = hb.enteredAtNs;
    peer.leftAtNs = hb.leftAtNs;
    peer.v.inP2p = hb.inP2p;
    peer.stalledAtNs = hb.stalledAtNs;
    peer.v.waitingOn = hb.waitingOn;
    peer.v.stuckTo = hb.stuckTo;
    if (hb.hasFailed) peer.v.failed = hb.failed;
    for (const Heartbeat::Op& op : hb.ops) {
      checkTime(now, op.enterNs, "an op's enterNs");
      slow.addOp(from, op.seq, op.enterNs, op.gapNs);
    }
    if (hb.hasRates) slow.addRates(from, now, hb.rates);
    if (hb.hasDiag) {
      if (hb.failing) peer.v.failed = hb.diag.kind + ": " + hb.diag.summary;
      (void)diagnosisJson(hb.diag, "0123456789abcdef", 0, kRanks);
      adopted.push_back(hb.diag);
    }
  }
  if (!applied) return 0;  // the monitor's state is what it was: nothing more to ask of it
  // viewOf, then what the monitor asks of the views.
  std::vector<RankView> views;
  auto ago = [now](int64_t t) { return t > 0 ? (now - t) / 1000000 : 0; };
  for (int r = 0; r < kRanks; ++r) {
    RankView v = peers[static_cast<size_t>(r)].v;
    v.rank = r;
    v.host = "host" + std::to_string(r % 2);
    v.pid = 100 + r;
    const Peer& pr = peers[static_cast<size_t>(r)];
    if (r == 0) {
      v.known = true;
      v.entered = 40;
      v.left = 39;
    } else {
      v.silentMs = ago(pr.lastHeardNs ? pr.lastHeardNs : kStartNs);
      v.enteredAgoMs = ago(pr.enteredAtNs);
      v.leftAgoMs = ago(pr.leftAtNs);
      v.stalledMs = pr.stalledAtNs ? ago(pr.stalledAtNs) : 0;
      v.unresponsive = !v.gone && !v.leftInOrder && v.silentMs > 10000;
    }
    views.push_back(v);
  }
  HangInput hang;
  hang.self = 0;
  hang.nranks = kRanks;
  hang.seq = 39;
  hang.what = "AllReduce seq 39";
  hang.waitingOn = {1};
  hang.states = {"lanes up"};
  hang.ranks = views;
  hang.heartbeatTimeoutMs = 10000;
  (void)classifyHang(hang);
  (void)classifyFailure(0, "tcp: rank 1 closed the connection", views);
  const std::vector<bool> live(kRanks, true);
  const std::vector<std::string> hosts = {"host0", "host1", "host0", "host1"};
  for (const Diagnosis& d : slow.analyze(now, live, hosts)) (void)diagnosisJson(d, "0123456789abcdef", 0, kRanks);
  return 0;
}
