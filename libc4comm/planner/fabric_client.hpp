// A job's side of the fabric service's connection (planner/fabric_wire.hpp): blocking, every step
// bounded by a deadline, so that a service that is down, slow or not a fabric service costs the
// job at most the wait it allows (docs/c4p.md "The fabric service"). Also the key file both sides
// read.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "c4comm/status.hpp"
#include "planner/fabric_wire.hpp"

namespace c4::plan {

/// Reads the shared key from `path`: at least 16 bytes of secret, at most 4 KiB; refused when
/// the file can be read or written by others than its owner (chmod 600), as ssh refuses a key.
Status readKeyFile(const std::string& path, wire::Key* out);

class FabricClient {
 public:
  ~FabricClient();
  FabricClient(const FabricClient&) = delete;
  FabricClient& operator=(const FabricClient&) = delete;
  /// Connects to "host:port" (a name, an IPv4 or a bracketed IPv6 address) and exchanges the
  /// greetings, all within timeoutMs. Errors say which step failed and why.
  static Status connect(const std::string& hostPort, const wire::Key& key, int64_t timeoutMs,
                        std::unique_ptr<FabricClient>* out);
  /// Sends `req` and reads its reply within timeoutMs. A reply with ok false is not an error of
  /// this call (the caller reads reply->error). After an error the connection is closed: connect
  /// again.
  Status call(const wire::Request& req, wire::Reply* reply, int64_t timeoutMs);
  const std::string& address() const { return addr_; }

 private:
  FabricClient() = default;
  Status sendAll(const std::string& bytes, int64_t deadlineNs);
  Status recvAll(void* p, size_t n, int64_t deadlineNs);
  int fd_ = -1;
  std::string addr_;
  wire::Session session_;
  uint64_t sendSeq_ = 0, recvSeq_ = 0;
};

}  // namespace c4::plan
