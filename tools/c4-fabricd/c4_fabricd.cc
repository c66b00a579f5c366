// c4-fabricd: C4P's fabric service (docs/c4p.md "The fabric service"). Keeps every job on one
// fabric and plans each new job on the links the others leave; jobs register, renew their lease
// and release over planner/fabric_wire.hpp. Its books survive restarts in SQLite (--db).
#include <signal.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>

#include "planner/fabric_wire.hpp"
#include "service.hpp"

namespace {

void usage(FILE* f) {
  fprintf(f,
          "usage: c4-fabricd --topo FILE --key-file FILE [--listen HOST:PORT] [--port-file PATH] [--db PATH]\n"
          "                  [--lease-ms N] [--min-lease-ms N] [--max-clients N] [--move-interval-ms N]\n"
          "                  [--move-gain F] [--link-hold-ms N] [-v]\n"
          "C4P's fabric service: plans every job on a fabric on what the other jobs leave.\n"
          "  --topo FILE         the fabric's topology (the C4_TOPO_FILE the jobs read)\n"
          "  --fat-tree K,HOSTS_PER_LEAF,PORTS[,GBIT]  instead of --topo: a generated k-ary fat-tree (load tests;\n"
          "                      jobs must generate the same one)\n"
          "  --key-file FILE     the shared key (at least 16 bytes; mode 600)\n"
          "  --listen HOST:PORT  where jobs connect (default 127.0.0.1:7471; port 0: any free port)\n"
          "  --port-file PATH    write the port listened on there (for scripts)\n"
          "  --db PATH           the SQLite database of jobs and events (default c4-fabricd.db)\n"
          "  --lease-ms N        the lease of a job that asks for none (default 30000)\n"
          "  --min-lease-ms N    asked leases below this are raised to it (default 1000)\n"
          "  --max-clients N     connections at once; more are closed (default 1024)\n"
          "  --move-interval-ms N  a running job is asked to move lanes for a better fabric at most this often\n"
          "                      (default 60000; moves off a link booked slow or cut are not limited)\n"
          "  --move-gain F       ... and only where its move lowers the most loaded link by this share (default 0.1)\n"
          "  --link-hold-ms N    a link the jobs' lanes found slow or cut is avoided this long (default 600000)\n"
          "  -v                  also log connections, renewals and status requests\n");
}

bool parseInt(const std::string& s, long long lo, long long hi, long long* out) {
  if (s.empty()) return false;
  char* end = nullptr;
  errno = 0;
  const long long v = strtoll(s.c_str(), &end, 10);
  if (errno != 0 || *end != '\0' || v < lo || v > hi) return false;
  *out = v;
  return true;
}

int fail(const std::string& msg) {
  fprintf(stderr, "c4-fabricd: %s\n", msg.c_str());
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  namespace fd = c4::fabricd;
  fd::Options o;
  const long long maxLease = c4::plan::wire::kMaxLeaseMs;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i], v;
    if (a == "-h" || a == "--help") return usage(stdout), 0;
    if (a == "-v" || a == "--verbose") {
      o.verbose = true;
      continue;
    }
    const size_t eq = a.find('=');
    if (a.rfind("--", 0) == 0 && eq != std::string::npos) {
      v = a.substr(eq + 1);
      a = a.substr(0, eq);
    } else if (a.rfind("--", 0) == 0) {
      if (i + 1 >= argc) return fail(a + " needs a value (--help)");
      v = argv[++i];
    } else {
      return fail("unexpected argument '" + a + "' (--help)");
    }
    long long n = 0;
    if (a == "--topo") {
      o.topoPath = v;
    } else if (a == "--fat-tree") {
      o.fatTree = v;
    } else if (a == "--key-file") {
      o.keyPath = v;
    } else if (a == "--listen") {
      o.listen = v;
    } else if (a == "--port-file") {
      o.portFile = v;
    } else if (a == "--db") {
      o.dbPath = v;
    } else if (a == "--lease-ms") {
      if (!parseInt(v, 1, maxLease, &n))
        return fail("--lease-ms " + v + ": not a number of ms in 1.." + std::to_string(maxLease));
      o.leaseMs = n;
    } else if (a == "--min-lease-ms") {
      if (!parseInt(v, 1, maxLease, &n))
        return fail("--min-lease-ms " + v + ": not a number of ms in 1.." + std::to_string(maxLease));
      o.minLeaseMs = n;
    } else if (a == "--move-interval-ms") {
      if (!parseInt(v, 0, maxLease, &n))
        return fail("--move-interval-ms " + v + ": not a number of ms in 0.." + std::to_string(maxLease));
      o.moveIntervalMs = n;
    } else if (a == "--link-hold-ms") {
      if (!parseInt(v, 1, maxLease, &n))
        return fail("--link-hold-ms " + v + ": not a number of ms in 1.." + std::to_string(maxLease));
      o.linkHoldMs = n;
    } else if (a == "--move-gain") {
      char* end = nullptr;
      const double g = strtod(v.c_str(), &end);
      if (v.empty() || *end != '\0' || !(g >= 0 && g < 1)) return fail("--move-gain " + v + ": not a share in [0, 1)");
      o.moveGain = g;
    } else if (a == "--max-clients") {
      if (!parseInt(v, 1, 1 << 20, &n)) return fail("--max-clients " + v + ": not a number in 1..1048576");
      o.maxClients = static_cast<size_t>(n);
    } else {
      return fail("unknown option '" + a + "' (--help)");
    }
  }
  if (o.topoPath.empty() == o.fatTree.empty())
    return fail("--topo FILE (the fabric's topology, as the jobs read it) or --fat-tree is required, not both");
  if (o.keyPath.empty()) return fail("--key-file FILE is required (the key the jobs share with the service)");
  if (o.dbPath.empty()) return fail("--db needs a path");
  if (o.leaseMs < o.minLeaseMs)
    return fail("--lease-ms " + std::to_string(o.leaseMs) + " is below --min-lease-ms " + std::to_string(o.minLeaseMs));

  // SIGTERM and SIGINT arrive through the service's signalfd: blocked before anything else runs.
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGINT);
  sigprocmask(SIG_BLOCK, &set, nullptr);
  signal(SIGPIPE, SIG_IGN);

  std::unique_ptr<fd::Service> service;
  c4::Status st = fd::Service::start(o, &service);
  if (!st.isOk()) return fail(st.message());
  return service->run();
}
