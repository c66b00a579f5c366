// Fuzz target: the fabric's topology file (C4_TOPO_FILE, docs/c4p.md), read by
// plan::Topology::parse as the planner reads it, then asked what the planner asks of a topology:
// the paths between host ports, their links and names, the steering ranges and the ECMP rule's
// path of a connection.
#include <string>
#include <vector>

#include "fuzz_util.hpp"
#include "planner/topology.hpp"

using namespace c4;  // NOLINT(google-build-using-namespace): a fuzz target's own translation unit

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  plan::Topology t;
  Status st = plan::Topology::parse(text, "fuzz.json", &t);
  if (!st.isOk()) {
    C4_FUZZ_CHECK(st.message().rfind("C4_TOPO_FILE fuzz.json: ", 0) == 0, "an error that names no file: %s",
                  st.message().c_str());
    return 0;
  }
  // Every port of the first hosts against every other (bounded: a large file is no slower to parse
  // than to query).
  std::vector<plan::HostPort> ports;
  for (int h = 0; h < t.numHosts() && ports.size() < 16; ++h)
    for (int p = 0; p < static_cast<int>(t.host(h).ports.size()) && ports.size() < 16; ++p) ports.push_back({h, p});
  std::vector<int> links;
  for (const plan::HostPort& a : ports) {
    plan::HostPort found;
    C4_FUZZ_CHECK(t.findAddr(t.port(a).addr, &found), "the address of a port is not found");
    for (const plan::HostPort& b : ports) {
      const int n = t.numPaths(a, b);
      C4_FUZZ_CHECK(n >= 1, "%d paths", n);
      for (int i = 0; i < n && i < 8; ++i) {
        t.pathLinks(a, b, i, &links);
        for (int l : links) {
          C4_FUZZ_CHECK(l >= 0 && l < t.numLinks(), "link %d of %d", l, t.numLinks());
          C4_FUZZ_CHECK(t.findLink(t.link(l).name) == l, "link %s is not found by its name", t.link(l).name.c_str());
        }
        (void)t.pathName(a, b, i);
        (void)t.steeringRanges(a, b, i);
      }
      for (uint16_t sport : {uint16_t{1}, uint16_t{20000}, uint16_t{65535}}) {
        const int path = t.pathByPorts(a, b, sport, 4000);
        C4_FUZZ_CHECK(path >= 0 && path < n, "path %d of %d", path, n);
      }
    }
  }
  return 0;
}
