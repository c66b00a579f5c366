// Whole reads and writes on a blocking descriptor (a pipe, a file), retried on EINTR. Header-only
// and async-signal-safe (no allocation, no lock): the tracer's crash dump uses them, and so do the
// test and benchmark programs that pass ids and results between forked ranks through pipes. For
// sockets with deadlines and an abort descriptor see common/socket.hpp (sendAll / recvAll).
#pragma once

#include <unistd.h>

#include <cerrno>
#include <cstddef>

namespace c4 {

/// Writes all `n` bytes; false on an error or when nothing more can be written.
inline bool writeAll(int fd, const void* data, size_t n) {
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    const ssize_t k = write(fd, p, n);
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0) return false;
    p += k;
    n -= static_cast<size_t>(k);
  }
  return true;
}

/// Reads exactly `n` bytes; false on an error or at the end of the input before that.
inline bool readAll(int fd, void* data, size_t n) {
  char* p = static_cast<char*>(data);
  while (n > 0) {
    const ssize_t k = read(fd, p, n);
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0) return false;
    p += k;
    n -= static_cast<size_t>(k);
  }
  return true;
}

}  // namespace c4
