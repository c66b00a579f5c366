// The transports built into this library. Core creates transports through this list only, so it
// names none of them; an optional transport (ucx, ibverbs) joins the list when its
// dependency is found at configure time (transports/CMakeLists.txt generates the list).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "c4comm/status.hpp"
#include "transports/transport.hpp"

namespace c4::transport {

/// One registered transport.
struct TransportEntry {
  const char* name = "";      ///< what C4_TRANSPORT calls it ("shm", "tcp")
  bool sameHostOnly = false;  ///< reaches only ranks of this host (Caps::sameHostOnly)
  /// Creates it for ctx.rank. Collective over the communicator (ctx.oob): every rank creates the
  /// same transports in the same order. Blocking (setup only).
  Status (*create)(const Context& ctx, std::unique_ptr<Transport>* out) = nullptr;
  /// Under C4_TRANSPORT=auto: tried before the other network transports because where it works it
  /// is the fastest between hosts (RDMA), but optional: where it cannot be created (its setup tells
  /// every rank every rank's outcome, so all fail together), the next network transport is used.
  bool autoFirst = false;
  /// What to call it in the fallback's log line ("RDMA").
  const char* autoLabel = "";
  /// Whether auto tries it at all (its own switch, such as C4_IB_DISABLE); null: always.
  bool (*autoEnabled)() = nullptr;
};

/// Every transport of this build, in preference order: a peer is reached through the first one
/// of the communicator's transports that can connect to it.
const std::vector<TransportEntry>& transportRegistry();

/// The entry named `name`, or nullptr.
const TransportEntry* findTransport(const std::string& name);

/// The names of the registry, comma-separated ("shm,tcp").
std::string transportNames();

}  // namespace c4::transport
