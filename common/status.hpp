// Internal status helpers: propagation macros and formatted error construction.
#pragma once

#include <cstdarg>
#include <string>

#include "c4comm/status.hpp"

namespace c4 {

/// printf-style formatting into a std::string.
std::string strFormat(const char* fmt, ...) __attribute__((format(printf, 1, 2)));
std::string strFormatV(const char* fmt, va_list ap);

/// Builds a failed Status with a printf-style message.
Status makeError(Code code, const char* fmt, ...) __attribute__((format(printf, 2, 3)));

/// A system error built from errno: "<what>: <strerror(err)>".
Status sysError(const char* what, int err);

}  // namespace c4

/// Propagates a failed Status to the caller.
#define C4_CHECK(expr)                         \
  do {                                         \
    ::c4::Status c4_status_ = (expr);          \
    if (!c4_status_.isOk()) return c4_status_; \
  } while (0)

/// Evaluates a Result<T>; on failure returns its Status, else moves the value into `lhs`.
#define C4_ASSIGN_OR_RETURN(lhs, expr) C4_ASSIGN_OR_RETURN_IMPL_(C4_CONCAT_(c4_res_, __LINE__), lhs, expr)
#define C4_CONCAT_INNER_(a, b) a##b
#define C4_CONCAT_(a, b) C4_CONCAT_INNER_(a, b)
#define C4_ASSIGN_OR_RETURN_IMPL_(tmp, lhs, expr) \
  auto tmp = (expr);                              \
  if (!tmp.isOk()) return tmp.status();           \
  lhs = tmp.take()

/// Retries a system call while it fails with EINTR.
#define C4_SYSCALL_RETRY(call)                \
  ({                                          \
    decltype(call) c4_rc_;                    \
    do {                                      \
      c4_rc_ = (call);                        \
    } while (c4_rc_ == -1 && errno == EINTR); \
    c4_rc_;                                   \
  })
