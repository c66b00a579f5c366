// c4-fabricd's service (docs/c4p.md "The fabric service"): one thread, one poll(2) loop over the
// listener, the jobs' connections and a signalfd for SIGTERM/SIGINT. Each connection speaks
// planner/fabric_wire.hpp; each request reads or changes the FabricBook, and every change is
// written to the Store in the same step. Leases are timed on CLOCK_MONOTONIC, stored times are
// CLOCK_REALTIME.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "c4comm/status.hpp"

namespace c4::fabricd {

struct Options {
  std::string topoPath;  // --topo
  std::string fatTree;   // --fat-tree K,HOSTS_PER_LEAF,PORTS[,GBIT]: a generated fabric instead (load tests)
  std::string keyPath;   // --key-file
  std::string listen = "127.0.0.1:7471";
  std::string portFile;  // --port-file: the bound port is written there ("" none)
  std::string dbPath = "c4-fabricd.db";
  int64_t leaseMs = 30000;         // the lease of a job that asks for none
  int64_t minLeaseMs = 1000;       // asked leases are clamped to [minLeaseMs, wire::kMaxLeaseMs]
  size_t maxClients = 1024;        // connections at once; more are accepted and closed
  bool verbose = false;            // also log connections, renewals and status requests
  int64_t moveIntervalMs = 60000;  // --move-interval-ms: a job moved for a better fabric at most this often
  double moveGain = 0.10;          // --move-gain: ... when the most loaded link drops by at least this share
  int64_t linkHoldMs = 600000;     // --link-hold-ms: a link reported slow or cut is avoided this long
};

/// One line on stderr: "c4-fabricd: 2026-12-07T20:15:03.123Z <message>" (UTC).
void logLine(const char* fmt, ...) __attribute__((format(printf, 1, 2)));

class Service {
 public:
  /// Everything before serving: the topology, the key, the database (its jobs booked again, their
  /// leases restarted), the listener, the port file, the signalfd. SIGTERM and SIGINT must be
  /// blocked in every thread before this is called. Errors (a bad file, a database of another
  /// fabric, an address in use) say what to do; the caller exits with status 2.
  static Status start(const Options& o, std::unique_ptr<Service>* out);
  ~Service();
  Service(const Service&) = delete;
  Service& operator=(const Service&) = delete;
  /// Serves until SIGTERM or SIGINT, then closes every connection and the database. Returns the
  /// exit status: 0 after a clean shutdown, 1 after an error the service cannot go on from.
  int run();

 private:
  struct Impl;
  explicit Service(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace c4::fabricd
